"""The MILP of one group with integer counts in place of one binary per layer (issue 16, item 2).

When every layer has the same type (a GPT, LLaMA, BERT or ViT stack), layers differ only by
position, so a stage is a sequence of *runs*: consecutive layers of one relayout class (strategies
whose relayouts to and from every other strategy are equal, and zero between themselves). Within a
run the order is free. A stage's cost depends on which strategies it holds and how many (times,
tails, memory, the largest temporary), on the class of each run and of the next (relayouts), and
on which strategy comes first (stage 0: the embedding's delta) and last (the pipeline sends, the
head's delta on the last stage).

The model charges a relayout from class c to class d the cheapest chain of relayouts from c to
d (``shortest_paths``), which obeys the triangle inequality. Under such costs an optimal stage has
at most C + 1 runs (C classes): a class seen twice can give its later run's layers to its earlier
run (dropping a detour X -> A -> Y for X -> Y costs no more), unless the earlier run is the
stage's first and the later its last; so only the first class may come back, once, at the end.
The formulation gives each stage C + 1 slots:

- n[k,q,s] integer: layers of strategy s in slot q of stage k;
- r[k,q,c] binary: slot q holds class c (at most one; used slots form a prefix; a used slot is
  non-empty; neighbours differ);
- e[k,q,c,d] in [0, 1]: slot q of class c followed by slot q+1 of class d (marginals tie it to r,
  as the per-layer model's edges are tied to its w), paying the chained relayout R*[c, d];
- p[k,s] binary: strategy s is on stage k (its temporary counts in the stage's maximum);
- first[s] binary: layer 0 runs s (in slot 0 of stage 0), paying the embedding's delta;
- last[k,s] binary: stage k ends with s (in its last used slot), paying the sends (k < pp - 1) or
  the head's delta (k = pp - 1);
- T_k, D_k, tmp_k, Tmax, Dmax and the objective as in formulation.build.

As R* <= R, the model's optimum is a lower bound on the group's. Its plan is optimal when it uses
no relayout whose chain is cheaper than the direct one (``CountIndex.takes_a_shortcut``); where
it does, the exact planners solve the group again with the per-layer formulation. Where the
layers are not of one type, ``applies`` says no and the per-layer formulation is used. The count
model has about (C + 1) x S integers a stage where the per-layer one has (layers it may hold) x S
binaries, and no symmetric copies.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planners.formulation import Formulation, charge, memory_row, minus, objective_rows, stage_variables
from planners.tables import ComboTables
from specs import even_stage_layers


def run_classes(t: ComboTables, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(class of each allowed strategy, class-to-class relayout times) of stage k's only layer
    type, or None when a relayout is unknown (not finite) or a class would not relayout to
    itself for free."""
    key = ("run_classes", k)  # asked by applies, pays and every vocab choice's build: once a stage
    hit = t.shared.get(key)
    if hit is not None and hit[0] is t.stages[k] and hit[1] is t.allowed:
        return hit[2]
    ty = int(t.layer_type[0])
    out = _run_classes(t.stages[k].trans_s[ty], np.flatnonzero(t.allowed[ty]))
    t.shared[key] = (t.stages[k], t.allowed, out)
    return out


def _run_classes(trans_s: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    R = trans_s[np.ix_(allowed, allowed)]
    if not np.all(np.isfinite(R)) or np.any(np.diag(R) != 0.0):
        return None
    _, cls = np.unique(np.hstack([R, R.T]), axis=0, return_inverse=True)
    cls = cls.ravel()
    reps = [int(np.flatnonzero(cls == c)[0]) for c in range(cls.max() + 1)]
    return cls, R[np.ix_(reps, reps)]


def shortest_paths(Rc: np.ndarray) -> np.ndarray:
    """The cheapest chain of relayouts between every two classes (Floyd-Warshall): it obeys the
    triangle inequality, and is at most Rc."""
    out = Rc.copy()
    for b in range(len(out)):
        out = np.minimum(out, out[:, b:b + 1] + out[b:b + 1, :])
    return out


def applies(t: ComboTables) -> bool:
    """Whether the count model can stand for this group: one layer type and finite relayouts
    (free within a class) on every stage."""
    return len(set(t.layer_type.tolist())) == 1 and all(run_classes(t, k) is not None for k in range(t.combo.pp))


def pays(t: ComboTables, even: bool) -> bool:
    """Whether the count model is worth it here: its slots are at most half the (layer, stage)
    positions the per-layer model has. On few layers its extra rows (slot classes, edges between
    slots, first and last layers) cost more than the symmetry saves (tiny-gpt on 8 CPUs: 5 s
    against 1.6 s)."""
    n, pp = len(t.layer_type), t.combo.pp
    positions = n if even else pp * (n - pp + 1)
    return 2 * sum(_slot_count(t, k, n, pp, even) for k in range(pp)) <= positions


def _most_layers(n: int, pp: int, even: bool) -> list[int]:
    """The most layers each stage may hold."""
    return [int(x) for x in even_stage_layers(n, pp)] if even else [n - (pp - 1)] * pp


def _slot_count(t: ComboTables, k: int, n: int, pp: int, even: bool) -> int:
    return min(int(run_classes(t, k)[0].max()) + 2, _most_layers(n, pp, even)[k])


@dataclass
class CountIndex:
    """Where the count model keeps each choice, to read a plan back and to warm-start it."""

    strategies: np.ndarray
    """Allowed strategy indices (the s of n[k,q,s] indexes this array)."""
    classes: list[np.ndarray]
    """Per stage: class of each allowed strategy."""
    slots: list[int]
    """Per stage: number of slots."""
    relayout_s: list[np.ndarray]
    """Per stage: class-to-class relayout times."""
    chained_s: list[np.ndarray]
    """Per stage: the cheapest chains of them (shortest_paths), which the model charges."""
    n: dict[tuple[int, int, int], str] = field(default_factory=dict)
    r: dict[tuple[int, int, int], str] = field(default_factory=dict)
    first: dict[int, str] = field(default_factory=dict)
    last: dict[tuple[int, int], str] = field(default_factory=dict)
    presence: dict[tuple[int, int], str] = field(default_factory=dict)
    single: str | None = None

    def read_plan(self, values: dict[str, float], n_layers: int, pp: int) -> tuple[list[int], list[int]]:
        """(strategy per layer, layers per stage): each stage's slots in order, the first and
        last strategies where the solution put them."""
        choice: list[int] = []
        sizes = []
        for k in range(pp):
            runs = [self._slot(values, k, q) for q in range(self.slots[k])]
            runs = [run for run in runs if run]
            if k == 0 and self.first:
                _to_front(runs[0], self._chosen(values, self.first))
            ends = {s: name for (kk, s), name in self.last.items() if kk == k}
            if ends:
                _to_back(runs[-1], self._chosen(values, ends), keep_front=k == 0 and bool(self.first))
            stage = [int(self.strategies[s]) for run in runs for s in run]
            choice += stage
            sizes.append(len(stage))
        assert len(choice) == n_layers, (len(choice), n_layers)
        return choice, sizes

    def takes_a_shortcut(self, choice: list[int], stage_layers: list[int]) -> bool:
        """Whether the plan relayouts between two classes whose direct relayout costs more than
        a chain through others: the model charged it the chain, so its objective is a lower
        bound there, not the plan's time."""
        where = {int(s): i for i, s in enumerate(self.strategies)}
        start = 0
        for k, size in enumerate(stage_layers):
            cls = [int(self.classes[k][where[int(s)]]) for s in choice[start:start + size]]
            start += size
            for c, d in zip(cls, cls[1:]):
                if self.chained_s[k][c, d] < self.relayout_s[k][c, d]:
                    return True
        return False

    def _slot(self, values, k, q) -> list[int]:
        out = []
        for s in range(len(self.strategies)):
            name = self.n.get((k, q, s))
            out += [s] * int(round(values.get(name, 0.0))) if name else []
        return out

    @staticmethod
    def _chosen(values, names: dict) -> int:
        return max(names, key=lambda s: values.get(names[s], 0.0))

    def warm_values(self, choice: list[int], stage_layers: list[int]) -> dict[str, float]:
        """The integer variables' values for a known plan, or {} when its stages have more runs
        than slots."""
        where = {int(s): i for i, s in enumerate(self.strategies)}
        out = {name: 0.0 for d in (self.n, self.r, self.first, self.last, self.presence) for name in d.values()}
        start = 0
        for k, size in enumerate(stage_layers):
            stage = [where.get(int(s)) for s in choice[start:start + size]]
            start += size
            if None in stage:
                return {}
            runs = _runs(stage, self.classes[k])
            if len(runs) > self.slots[k]:
                return {}
            for q, run in enumerate(runs):
                out[self.r[(k, q, int(self.classes[k][run[0]]))]] = 1.0
                for s in run:
                    out[self.n[(k, q, s)]] += 1.0
                    out[self.presence[(k, s)]] = 1.0
            if k == 0 and self.first:
                out[self.first[stage[0]]] = 1.0
            if (k, stage[-1]) in self.last:
                out[self.last[(k, stage[-1])]] = 1.0
        if self.single is not None:
            out[self.single] = 1.0 if stage_layers[0] == 1 else 0.0
        return out


def _runs(stage: list[int], cls: np.ndarray) -> list[list[int]]:
    runs: list[list[int]] = []
    for s in stage:
        if runs and cls[runs[-1][0]] == cls[s]:
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


def _to_front(run: list[int], s: int) -> None:
    run.remove(s)
    run.insert(0, s)


def _to_back(run: list[int], s: int, keep_front: bool) -> None:
    """Move one layer of s to the run's end; with ``keep_front`` not the run's first layer
    (layer 0's), unless it is the run's only one."""
    lowest = 1 if keep_front and len(run) > 1 else 0
    j = max(i for i in range(lowest, len(run)) if run[i] == s)
    run.append(run.pop(j))


def build(t: ComboTables, v, even: bool = False, cutoff_s: float | None = None) -> Formulation:
    """The count MILP of group ``t`` under vocab choice ``v`` (call only where ``applies``)."""
    # data
    n_layers, pp, m = len(t.layer_type), t.combo.pp, t.combo.micro_batches
    ty = int(t.layer_type[0])
    allowed = np.flatnonzero(t.allowed[ty])
    sizes = even_stage_layers(n_layers, pp) if even else None
    most = _most_layers(n_layers, pp, even)
    classes = [run_classes(t, k) for k in range(pp)]
    slots = [_slot_count(t, k, n_layers, pp, even) for k in range(pp)]
    f = Formulation()
    index = CountIndex(allowed, [c for c, _ in classes], slots, [Rc for _, Rc in classes],
                       [shortest_paths(Rc) for _, Rc in classes])
    f.counts = index
    T = {k: {} for k in range(pp)}
    D = {k: {} for k in range(pp)}
    M = {k: {} for k in range(pp)}
    # variables and constraints, stage by stage
    for k in range(pp):
        _slots(f, t, index, k, ty, most[k], T, D, M)
        _relayouts(f, index, k, index.chained_s[k], T)
    _stage_sizes(f, index, n_layers, pp, sizes)
    _ends(f, t, index, v, ty, most, T, D, M)
    _stage_rows(f, t, v, index, ty, T, D, M)
    # objective
    objective_rows(f, pp, m, cutoff_s)
    return f


def _slot_used(index: CountIndex, k: int, q: int) -> dict[str, float]:
    """Coefficients of a[k,q] = sum_c r[k,q,c] (1 when slot q of stage k holds layers)."""
    return {index.r[(k, q, c)]: 1.0 for c in range(int(index.classes[k].max()) + 1)}


def _slots(f, t, index: CountIndex, k, ty, most, T, D, M) -> None:
    st, cls = t.stages[k], index.classes[k]
    for s in range(len(index.strategies)):
        index.presence[(k, s)] = f.var(f"p_{k}_{s}")
    for q in range(index.slots[k]):
        for c in range(int(cls.max()) + 1):
            index.r[(k, q, c)] = f.var(f"r_{k}_{q}_{c}")
        used = _slot_used(index, k, q)
        f.row(used, "==" if q == 0 else "<=", 1.0)  # every stage holds a layer, so slot 0 is used
        if q > 0:
            f.row(minus(used, _slot_used(index, k, q - 1)), "<=", 0.0)  # used slots form a prefix
            for c in range(int(cls.max()) + 1):  # neighbours differ (equal ones are one run)
                f.row({index.r[(k, q, c)]: 1.0, index.r[(k, q - 1, c)]: 1.0}, "<=", 1.0)
        filled = {}
        for s, g in enumerate(index.strategies):
            name = index.n[(k, q, s)] = f.var(f"n_{k}_{q}_{s}", 0.0, float(most))
            filled[name] = 1.0
            T[k][name] = float(st.time_s[ty, g])
            D[k][name] = float(st.tail_s[ty, g])
            M[k][name] = float(st.memory_bytes[ty, g])
        f.row(minus(filled, used), ">=", 0.0)  # a used slot is not empty
        for c in range(int(cls.max()) + 1):  # and holds its class only
            row = {index.n[(k, q, s)]: 1.0 for s in np.flatnonzero(cls == c)}
            f.row({**row, index.r[(k, q, c)]: -float(most)}, "<=", 0.0)
    for s in range(len(index.strategies)):
        row = {index.n[(k, q, s)]: 1.0 for q in range(index.slots[k])}
        f.row({**row, index.presence[(k, s)]: -float(most)}, "<=", 0.0)


def _relayouts(f, index: CountIndex, k, Rc: np.ndarray, T) -> None:
    C = Rc.shape[0]
    for q in range(1, index.slots[k]):
        e = {(c, d): f.var(f"e_{k}_{q}_{c}_{d}", integer=False) for c in range(C) for d in range(C) if c != d}
        for (c, d), name in e.items():
            if Rc[c, d]:
                T[k][name] = float(Rc[c, d])
        for c in range(C):
            f.row({**{e[(c, d)]: 1.0 for d in range(C) if d != c}, index.r[(k, q - 1, c)]: -1.0}, "<=", 0.0)
            f.row({**{e[(d, c)]: 1.0 for d in range(C) if d != c}, index.r[(k, q, c)]: -1.0}, "<=", 0.0)
        f.row(minus({name: 1.0 for name in e.values()}, _slot_used(index, k, q)), ">=", 0.0)


def _stage_sizes(f, index: CountIndex, n_layers, pp, sizes) -> None:
    total: dict[str, float] = {}
    for k in range(pp):
        stage = {name: 1.0 for (kk, _, _), name in index.n.items() if kk == k}
        total.update(stage)
        if sizes is not None:
            f.row(stage, "==", float(sizes[k]))
    f.row(total, "==", float(n_layers))


def _ends(f, t, index: CountIndex, v, ty, most, T, D, M) -> None:
    """first[s] (layer 0) and last[k,s] (each stage's final layer), with what they pay."""
    pp = t.combo.pp
    first, final = t.vocab[v][0], t.vocab[v][pp - 1]
    S = len(index.strategies)
    if first.first_delta is not None:
        for s, g in enumerate(index.strategies):
            name = index.first[s] = f.var(f"first_{s}")
            f.row({name: 1.0, index.n[(0, 0, s)]: -1.0}, "<=", 0.0)  # layer 0 sits in slot 0
            charge(T[0], D[0], M[0], name, first.first_delta[g])
        f.row({name: 1.0 for name in index.first.values()}, "==", 1.0)
    for k in range(pp):
        if k == pp - 1 and final.last_delta is None:
            continue
        for s, g in enumerate(index.strategies):
            name = index.last[(k, s)] = f.var(f"last_{k}_{s}")
            for q in range(index.slots[k]):  # in the last used slot: last <= n + most (1 - a_q + a_q+1)
                row = {name: 1.0, index.n[(k, q, s)]: -1.0}
                row.update({nm: float(most[k]) for nm in _slot_used(index, k, q)})
                if q + 1 < index.slots[k]:
                    row.update({nm: -float(most[k]) for nm in _slot_used(index, k, q + 1)})
                f.row(row, "<=", float(most[k]))
            if k < pp - 1:
                T[k][name] = float(t.stages[k].send_next_s[ty, g])
                T[k + 1][name] = float(t.stages[k].send_prev_s[ty, g])
            else:
                charge(T[k], D[k], M[k], name, final.last_delta[g])
        f.row({index.last[(k, s)]: 1.0 for s in range(S)}, "==", 1.0)
    if index.first and (0, 0) in index.last:
        _first_and_last_apart(f, index, most[0])


def _first_and_last_apart(f, index: CountIndex, most: int) -> None:
    """Layer 0 and stage 0's final layer are one layer only on a one-layer stage 0: where slot 0
    is stage 0's only run, first = last = s needs two layers of s, or a stage of one layer."""
    single = index.single = f.var("single_0")
    stage0 = {name: 1.0 for (k, _, _), name in index.n.items() if k == 0}
    f.row({**stage0, single: float(most)}, "<=", 1.0 + float(most))  # single = 1 only if 1 layer
    later = _slot_used(index, 0, 1) if index.slots[0] > 1 else {}
    for s in range(len(index.strategies)):
        row = {index.first[s]: 1.0, index.last[(0, s)]: 1.0, index.n[(0, 0, s)]: -1.0, single: -1.0}
        row.update({nm: -2.0 for nm in later})
        f.row(row, "<=", 0.0)


def _stage_rows(f, t, v, index: CountIndex, ty, T, D, M) -> None:
    for k in range(t.combo.pp):
        vc = t.vocab[v][k]
        tmp = stage_variables(f, k, vc, T[k], D[k])
        for s, g in enumerate(index.strategies):
            temp = float(t.stages[k].temp_bytes[ty, g])
            if temp > vc.temp_bytes:
                f.row({tmp: 1.0, index.presence[(k, s)]: -temp}, ">=", 0.0, unit="mem")
        memory_row(f, t, vc, tmp, M[k])
