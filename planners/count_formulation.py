"""The MILP of one group with integer counts in place of one binary per layer (issue 16, item 2).

The layers split into maximal runs j = 0..J-1 of consecutive layers of one type (one run for a
GPT, LLaMA, BERT or ViT stack; an encoder and a decoder run for T5; four for Swin). A *block*
(k, j) is run j's layers on stage k. Within a block layers differ only by position, so a block is
a sequence of *slot runs*: consecutive layers of one relayout class (strategies of the run's type
whose relayouts to and from every other strategy are equal, and zero between themselves), whose
order is free. A stage's cost depends on which strategies its blocks hold and how many (times,
tails, memory, the largest temporary), on the class of each slot run and of the next
(relayouts), on the relayout from each block's last layer to the next block's first (a change of
layer type inside the stage), and on which strategy comes first (stage 0: the embedding's delta)
and last (the pipeline sends, the head's delta on the last stage).

The model charges a relayout inside a block from class c to class d the cheapest chain of
relayouts from c to d (``shortest_paths``), which obeys the triangle inequality. Under such
costs an optimal block has at most C + 1 slot runs (C classes): a class seen twice can give its
later run's layers to its earlier run (dropping a detour X -> A -> Y for X -> Y costs no more),
or the earlier's to the later when the earlier is not the block's first, so only the first
class may come back, once, at the end; the block's first and last layers (all that its
neighbours, the sends and the vocabulary deltas see) stay where they are. Each block that may
hold layers (its run meets the layers its stage may hold) gets C + 1 slots:

- n[k,j,q,s] integer: layers of strategy s in slot q of block (k, j); x[k,j] = sum_q,s n[k,j,q,s];
- r[k,j,q,c] binary: slot q holds class c (at most one; used slots form a prefix; a used slot is
  non-empty; neighbours differ); u[k,j] binary: the block holds layers (= slot 0 is used);
- e[k,j,q,c,d] in [0, 1]: slot q of class c followed by slot q+1 of class d (marginals tie it to
  r, as the per-layer model's edges are tied to its w), paying the chained relayout R*[c, d];
- run order, by the north-west-corner rule: sum_k x[k,j] = L_j, and done[k,j] binary ("run j
  is complete by the end of stage k") with sum_{k'<=k} x[k',j] >= L_j done[k,j] and
  sum_{k'<=k} x[k',j+1] <= L_{j+1} done[k,j]: a stage holds a layer of run j+1 only once run j
  is placed, so the stages in order, each with its blocks in run order, are exactly one in-order
  assignment of the layers to stages (every stage holds one, sum_j u[k,j] >= 1); with ``even``
  each x[k,j] is fixed;
- first[k,j,s], last[k,j,s] binary: the block's first (in slot 0) and last (in its last used slot)
  strategy, each summing to u[k,j], where something sees them: first of block (0, 0) pays the
  embedding's delta; last of a stage's final block pays the sends (k < pp - 1: stage k ends in
  run j when u[k,j] = 1 and u[k,j+1] = 0) or, of block (pp-1, J-1), the head's delta;
- g[k,j,a,b] in [0, 1]: blocks (k, j) and (k, j+1) both used, the first's last layer in relayout
  source class a and the second's first in target class b, paying trans_s[type of run j][a, b]
  (the relayout of run j's output), tied to last and first as e is to r;
- p[k,ty,s] binary: strategy s is on stage k for a layer of type ty (its temporary counts in the
  stage's maximum);
- T_k, D_k, tmp_k, Tmax, Dmax and the objective as in formulation.build.

As R* <= R, the model's optimum is a lower bound on the group's, and every other term is exact.
Its plan is optimal when it uses no relayout whose chain is cheaper than the direct one
(``CountIndex.takes_a_shortcut``); where it does, the exact planners solve the group again with
the per-layer formulation. With one run (J = 1) every u is fixed at 1, there is no done and no g,
and the model is the one-type count model. The count model has about (C + 1) x S integers a block
where the per-layer one has (layers it may hold) x S binaries, and no symmetric copies.
"""
from __future__ import annotations

import numpy as np

from planners.count_index import Block, CountIndex, blocks, layer_runs, of_block
from planners.formulation import Formulation, charge, memory_row, minus, objective_rows, stage_variables
from planners.tables import ComboTables


def run_classes(t: ComboTables, k: int, ty: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(class of each allowed strategy, class-to-class relayout times) of layer type ``ty`` on
    stage k, or None when a relayout is unknown (not finite) or a class would not relayout to
    itself for free."""
    key = ("run_classes", k, ty)  # asked by applies, pays and every vocab choice's build: once
    hit = t.shared.get(key)
    if hit is not None and hit[0] is t.stages[k] and hit[1] is t.allowed:
        return hit[2]
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
    """Whether the count model can stand for this group: finite relayouts, free within a class,
    for every layer type on every stage."""
    types = set(t.layer_type.tolist())
    return all(run_classes(t, k, ty) is not None for k in range(t.combo.pp) for ty in types)


def pays(t: ComboTables, even: bool) -> bool:
    """Whether the count model is worth it here: its slots are at most half the (layer, stage)
    positions the per-layer model has. On few layers its extra rows (slot classes, edges between
    slots, first and last layers) cost more than the symmetry saves (tiny-gpt on 8 CPUs: 5 s
    against 1.6 s)."""
    n, pp = len(t.layer_type), t.combo.pp
    positions = n if even else pp * (n - pp + 1)
    runs = layer_runs(t.layer_type)
    slots = sum(_slot_count(t, k, runs[j].type, b.most) for (k, j), b in blocks(n, pp, even, runs).items())
    return 2 * slots <= positions


def _slot_count(t: ComboTables, k: int, ty: int, most: int) -> int:
    return min(int(run_classes(t, k, ty)[0].max()) + 2, most)


def build(t: ComboTables, v, even: bool = False, cutoff_s: float | None = None) -> Formulation:
    """The count MILP of group ``t`` under vocab choice ``v`` (call only where ``applies``)."""
    # data
    n_layers, pp = len(t.layer_type), t.combo.pp
    runs = layer_runs(t.layer_type)
    where = blocks(n_layers, pp, even, runs)
    pairs = {(k, runs[j].type) for k, j in where}
    classes = {kt: run_classes(t, *kt) for kt in pairs}
    index = CountIndex(runs, {ty: np.flatnonzero(t.allowed[ty]) for _, ty in pairs},
                       {kt: c for kt, (c, _) in classes.items()},
                       {(k, j): _slot_count(t, k, runs[j].type, b.most) for (k, j), b in where.items()},
                       {kt: Rc for kt, (_, Rc) in classes.items()},
                       {kt: shortest_paths(Rc) for kt, (_, Rc) in classes.items()})
    f = Formulation()
    f.counts = index
    T = {k: {} for k in range(pp)}
    D = {k: {} for k in range(pp)}
    M = {k: {} for k in range(pp)}
    # variables and constraints, block by block, then what ties blocks together
    x = {}
    for (k, j), b in where.items():
        x[(k, j)] = _slots(f, t, index, k, j, b, T, D, M)
        _relayouts(f, index, k, j, T)
    _presence(f, index, where)
    _in_order(f, index, where, x, pp, even)
    _ends(f, t, index, v, where, x, T, D, M)
    _between_runs(f, t, index, T)
    _stage_rows(f, t, v, index, T, D, M)
    # objective
    objective_rows(f, pp, t.combo.formula, cutoff_s)
    return f


def _slot_used(index: CountIndex, k: int, j: int, q: int) -> dict[str, float]:
    """Coefficients of a[k,j,q] = sum_c r[k,j,q,c] (1 when slot q of block (k, j) holds layers)."""
    C = int(index.classes[(k, index.runs[j].type)].max()) + 1
    return {index.r[(k, j, q, c)]: 1.0 for c in range(C)}


def _slots(f, t, index: CountIndex, k, j, b: Block, T, D, M) -> dict[str, float]:
    """Block (k, j)'s slots; returns the coefficients of x[k,j] (its layers)."""
    ty = index.runs[j].type
    st, cls = t.stages[k], index.classes[(k, ty)]
    C, most = int(cls.max()) + 1, float(b.most)
    u = index.u[(k, j)] = f.var(f"u_{k}_{j}", 1.0 if b.forced else 0.0, 1.0)
    x = {}
    for q in range(index.slots[(k, j)]):
        for c in range(C):
            index.r[(k, j, q, c)] = f.var(f"r_{k}_{j}_{q}_{c}")
        used = _slot_used(index, k, j, q)
        if q == 0:
            f.row(minus(used, {u: 1.0}), "==", 0.0)  # slot 0 is used iff the block is
        else:
            f.row(minus(used, _slot_used(index, k, j, q - 1)), "<=", 0.0)  # used slots form a prefix
            for c in range(C):  # neighbours differ (equal ones are one run)
                f.row({index.r[(k, j, q, c)]: 1.0, index.r[(k, j, q - 1, c)]: 1.0}, "<=", 1.0)
        filled = {}
        for s, g in enumerate(index.strategies[ty]):
            name = index.n[(k, j, q, s)] = f.var(f"n_{k}_{j}_{q}_{s}", 0.0, most)
            filled[name] = 1.0
            T[k][name] = float(st.time_s[ty, g])
            D[k][name] = float(st.tail_s[ty, g])
            M[k][name] = float(st.memory_bytes[ty, g])
        f.row(minus(filled, used), ">=", 0.0)  # a used slot is not empty
        for c in range(C):  # and holds its class only
            row = {index.n[(k, j, q, s)]: 1.0 for s in np.flatnonzero(cls == c)}
            f.row({**row, index.r[(k, j, q, c)]: -most}, "<=", 0.0)
        x.update(filled)
    return x


def _relayouts(f, index: CountIndex, k, j, T) -> None:
    """Edges between block (k, j)'s consecutive slots, paying the chained relayouts."""
    Rc = index.chained_s[(k, index.runs[j].type)]
    C = Rc.shape[0]
    for q in range(1, index.slots[(k, j)]):
        e = {(c, d): f.var(f"e_{k}_{j}_{q}_{c}_{d}", integer=False) for c in range(C) for d in range(C) if c != d}
        for (c, d), name in e.items():
            if Rc[c, d]:
                T[k][name] = float(Rc[c, d])
        for c in range(C):
            f.row({**{e[(c, d)]: 1.0 for d in range(C) if d != c}, index.r[(k, j, q - 1, c)]: -1.0}, "<=", 0.0)
            f.row({**{e[(d, c)]: 1.0 for d in range(C) if d != c}, index.r[(k, j, q, c)]: -1.0}, "<=", 0.0)
        f.row(minus({name: 1.0 for name in e.values()}, _slot_used(index, k, j, q)), ">=", 0.0)


def _presence(f, index: CountIndex, where: dict) -> None:
    """p[k,ty,s] >= (layers of type ty under s on stage k) / (the most such layers)."""
    held: dict[tuple[int, int, int], dict[str, float]] = {}
    most: dict[tuple[int, int], int] = {}
    for (k, j, q, s), name in index.n.items():
        held.setdefault((k, index.runs[j].type, s), {})[name] = 1.0
    for (k, j), b in where.items():
        most[(k, index.runs[j].type)] = most.get((k, index.runs[j].type), 0) + b.most
    for (k, ty, s), row in held.items():
        name = index.presence[(k, ty, s)] = f.var(f"p_{k}_{ty}_{s}")
        f.row({**row, name: -float(most[(k, ty)])}, "<=", 0.0)


def _in_order(f, index: CountIndex, where: dict, x: dict, pp: int, even: bool) -> None:
    """Every run placed whole, every stage non-empty, and the runs in order (north-west corner)."""
    J = len(index.runs)
    for j, run in enumerate(index.runs):
        f.row({nm: 1.0 for k in range(pp) if (k, j) in x for nm in x[(k, j)]}, "==", float(run.length))
    if even:  # the stages' sizes, so every block's, are fixed
        for kj, b in where.items():
            f.row(x[kj], "==", float(b.most))
        return
    for k in range(pp):
        if sum((k, j) in where for j in range(J)) > 1:
            f.row({index.u[(k, j)]: 1.0 for j in range(J) if (k, j) in where}, ">=", 1.0)
    for k in range(pp - 1):
        for j in range(J - 1):
            cum = {nm: 1.0 for kk in range(k + 1) if (kk, j) in x for nm in x[(kk, j)]}
            cum_next = {nm: 1.0 for kk in range(k + 1) if (kk, j + 1) in x for nm in x[(kk, j + 1)]}
            if cum_next:
                _run_done(f, index, k, j, cum, cum_next)


def _run_done(f, index: CountIndex, k: int, j: int, cum: dict, cum_next: dict) -> None:
    """done[k,j]: run j is complete by the end of stage k, as it must be once run j + 1 starts."""
    done = index.done[(k, j)] = f.var(f"done_{k}_{j}")
    f.row({**cum, done: -float(index.runs[j].length)}, ">=", 0.0)
    f.row({**cum_next, done: -float(index.runs[j + 1].length)}, "<=", 0.0)
    if (k, j + 1) in index.u:  # implied for integers; tightens the LP
        f.row({index.u[(k, j + 1)]: 1.0, done: -1.0}, "<=", 0.0)
    if (k + 1, j) in index.u:
        f.row({index.u[(k + 1, j)]: 1.0, done: 1.0}, "<=", 1.0)


def _between_runs(f, t, index: CountIndex, T) -> None:
    """g[k,j,a,b]: blocks (k, j) and (k, j+1) both used pay the relayout of run j's output from
    the first's last layer (source class a) into the second's first (target class b)."""
    for (k, j) in index.slots:
        if (k, j + 1) not in index.slots:
            continue
        ty, nxt = index.runs[j].type, index.runs[j + 1].type
        src, dst = t.stages[k].relayout_classes(ty)
        S, Sn = index.strategies[ty], index.strategies[nxt]
        last, first = of_block(index.last, k, j), of_block(index.first, k, j + 1)
        g = {}
        for a in sorted(set(src[S])):
            for b in sorted(set(dst[Sn])):
                name = g[(a, b)] = f.var(f"g_{k}_{j}_{a}_{b}", integer=False)
                cost = float(t.stages[k].trans_s[ty][S[src[S] == a][0], Sn[dst[Sn] == b][0]])
                if cost:
                    T[k][name] = cost
        for a in sorted(set(src[S])):
            row = {g[(a, b)]: 1.0 for aa, b in g if aa == a}
            f.row({**row, **{last[s]: -1.0 for s in np.flatnonzero(src[S] == a)}}, "<=", 0.0)
        for b in sorted(set(dst[Sn])):
            row = {g[(a, b)]: 1.0 for a, bb in g if bb == b}
            f.row({**row, **{first[s]: -1.0 for s in np.flatnonzero(dst[Sn] == b)}}, "<=", 0.0)
        both = {index.u[(k, j)]: -1.0, index.u[(k, j + 1)]: -1.0}
        f.row({**{name: 1.0 for name in g.values()}, **both}, ">=", -1.0)


def _ends(f, t, index: CountIndex, v, where: dict, x: dict, T, D, M) -> None:
    """first[k,j,s] and last[k,j,s] where something sees them, with what they pay."""
    pp, J = t.combo.pp, len(index.runs)
    embedding, head = t.vocab[v][0].first_delta, t.vocab[v][pp - 1].last_delta
    for (k, j), b in where.items():
        later = (k, j + 1) in where
        may_end = not (later and where[(k, j + 1)].forced)  # stage k may end in run j
        sends = k < pp - 1 and may_end
        pays_head = (k, j) == (pp - 1, J - 1) and head is not None
        if ((k, j) == (0, 0) and embedding is not None) or (k, j - 1) in where:
            _first(f, index, k, j, embedding if (k, j) == (0, 0) else None, T, D, M)
        if later or sends or pays_head:
            _last(f, index, k, j, b.most)
        if sends:
            _sends(f, t, index, k, j, T)
        if pays_head:
            for s, g in enumerate(index.strategies[index.runs[j].type]):
                charge(T[k], D[k], M[k], index.last[(k, j, s)], head[g])
        if (k, j, 0) in index.first and (k, j, 0) in index.last:
            _first_and_last_apart(f, index, k, j, x[(k, j)], b.most)


def _first(f, index: CountIndex, k, j, delta, T, D, M) -> None:
    """first[k,j,s]: block (k, j) starts with s (in slot 0); ``delta``: the embedding's."""
    names = {}
    for s, g in enumerate(index.strategies[index.runs[j].type]):
        name = index.first[(k, j, s)] = f.var(f"first_{k}_{j}_{s}")
        names[name] = 1.0
        f.row({name: 1.0, index.n[(k, j, 0, s)]: -1.0}, "<=", 0.0)
        if delta is not None:
            charge(T[k], D[k], M[k], name, delta[g])
    f.row({**names, index.u[(k, j)]: -1.0}, "==", 0.0)


def _last(f, index: CountIndex, k, j, most: int) -> None:
    """last[k,j,s]: block (k, j) ends with s, in its last used slot."""
    names, slots = {}, index.slots[(k, j)]
    for s in range(len(index.strategies[index.runs[j].type])):
        name = index.last[(k, j, s)] = f.var(f"last_{k}_{j}_{s}")
        names[name] = 1.0
        for q in range(slots):  # last <= n + most (1 - a_q + a_q+1)
            row = {name: 1.0, index.n[(k, j, q, s)]: -1.0}
            row.update({nm: float(most) for nm in _slot_used(index, k, j, q)})
            if q + 1 < slots:
                row.update({nm: -float(most) for nm in _slot_used(index, k, j, q + 1)})
            f.row(row, "<=", float(most))
    f.row({**names, index.u[(k, j)]: -1.0}, "==", 0.0)


def _sends(f, t, index: CountIndex, k, j, T) -> None:
    """Stage k's pipeline sends, paid by the strategy of its last layer where that is block
    (k, j)'s: directly where no later run may follow on the stage, else through z[k,j,c] >=
    (block's last in send class c) - u[k,j+1], one per class of equal sends (as _sends of the
    per-layer model)."""
    st, ty = t.stages[k], index.runs[j].type
    S = index.strategies[ty]
    if (k, j + 1) not in index.u:
        for s, g in enumerate(S):
            T[k][index.last[(k, j, s)]] = float(st.send_next_s[ty, g])
            T[k + 1][index.last[(k, j, s)]] = float(st.send_prev_s[ty, g])
        return
    by_send: dict[tuple[float, float], list[int]] = {}
    for s, g in enumerate(S):
        by_send.setdefault((float(st.send_next_s[ty, g]), float(st.send_prev_s[ty, g])), []).append(s)
    for c, ((fwd, bwd), members) in enumerate(by_send.items()):
        name = f.var(f"z_{k}_{j}_{c}", integer=False)
        f.row({name: 1.0, **{index.last[(k, j, s)]: -1.0 for s in members}, index.u[(k, j + 1)]: 1.0}, ">=", 0.0)
        T[k][name] = fwd
        T[k + 1][name] = bwd


def _first_and_last_apart(f, index: CountIndex, k: int, j: int, x: dict, most: int) -> None:
    """A block's first and last layers are one layer only in a block of one layer: where slot 0
    is the block's only run, first = last = s needs two layers of s, or a block of one layer."""
    single = index.single[(k, j)] = f.var(f"single_{k}_{j}")
    f.row({**x, single: float(most)}, "<=", 1.0 + float(most))  # single = 1 only if 1 layer
    later = _slot_used(index, k, j, 1) if index.slots[(k, j)] > 1 else {}
    for s in range(len(index.strategies[index.runs[j].type])):
        row = {index.first[(k, j, s)]: 1.0, index.last[(k, j, s)]: 1.0, index.n[(k, j, 0, s)]: -1.0, single: -1.0}
        row.update({nm: -2.0 for nm in later})
        f.row(row, "<=", 0.0)


def _stage_rows(f, t, v, index: CountIndex, T, D, M) -> None:
    for k in range(t.combo.pp):
        vc = t.vocab[v][k]
        tmp = stage_variables(f, k, vc, T[k], D[k])
        for (kk, ty, s), name in index.presence.items():
            temp = float(t.stages[k].temp_bytes[ty, index.strategies[ty][s]])
            if kk == k and temp > vc.temp_bytes:
                f.row({tmp: 1.0, name: -temp}, ">=", 0.0, unit="mem")
        memory_row(f, t, vc, tmp, M[k])
