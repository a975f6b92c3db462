"""The exact model of one (global batch, pp, micro-batches, vocab tp) group as a MILP, solver-neutral.

Data -> variables -> constraints -> objective, each in plain dicts, so PuLP (HiGHS/CBC) and CP-SAT
solve the same model. w[l,k,s]: layer l on stage k under strategy s. e[l,k,G,H]: layers l-1 and l
both on stage k, l-1 in relayout class G and l in class H (marginals tie it to w; classes group
strategies with identical relayout costs). z[l,k,g]: layer l ends stage k in send class g (pays
the pipeline sends). T[k], D[k], tmp[k]: stage time, tail and largest temporary; Tmax, Dmax.
Objective: the schedule's formula in its linear form fill sum_k T_k + steady Tmax + Dmax, or
m T_0 + D_0 when pp = 1 (specs.schedules.PipelineFormula, as plan_cost scores it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planners.partition import stage_windows
from planners.tables import ComboTables
from specs.schedules import PipelineFormula


@dataclass
class Formulation:
    """Variables (name -> (lower, upper, integer)), linear rows (coefs, sense, rhs), objective."""

    variables: dict[str, tuple[float, float, bool]] = field(default_factory=dict)
    rows: list[tuple[dict[str, float], str, float]] = field(default_factory=list)
    var_unit: dict[str, str] = field(default_factory=dict)
    """time (seconds), mem (bytes) or count (0/1 choices); CP-SAT scales each its own way."""
    row_unit: list[str] = field(default_factory=list)
    objective: dict[str, float] = field(default_factory=dict)
    objective_constant: float = 0.0
    memory_rows: list[int] = field(default_factory=list)
    """Indices of the per-stage memory rows (bytes; CP-SAT rounds them conservatively)."""
    w_index: dict[tuple[int, int, int], str] = field(default_factory=dict)
    y_index: dict[tuple[int, int], list[str]] = field(default_factory=dict)
    """(layer, stage) -> the w variables of that layer on that stage."""
    counts: Any = None
    """The count model's index (count_formulation.CountIndex) when this is that model: it reads
    plans back and warm-starts in place of w_index."""

    def var(self, name: str, lo: float = 0.0, hi: float = 1.0, integer: bool = True, unit: str = "count") -> str:
        self.variables[name] = (lo, hi, integer)
        self.var_unit[name] = unit
        return name

    def row(self, coefs: dict[str, float], sense: str, rhs: float, memory: bool = False,
            unit: str = "count") -> None:
        if memory:
            self.memory_rows.append(len(self.rows))
        self.rows.append(({k: v for k, v in coefs.items() if v != 0.0}, sense, rhs))
        self.row_unit.append("mem" if memory else unit)


def _classes(R: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    R = np.where(np.isfinite(R), R, 0.0)
    _, src = np.unique(R, axis=0, return_inverse=True)
    _, dst = np.unique(R, axis=1, return_inverse=True)
    return src.ravel(), dst.ravel()


def build(t: ComboTables, v: int, even: bool = False, cutoff_s: float | None = None) -> Formulation:
    """The MILP of group ``t`` under vocab tp ``v``; ``cutoff_s`` adds objective <= cutoff."""
    f = Formulation()
    n, pp = len(t.layer_type), t.combo.pp
    wins = stage_windows(n, pp, even)
    stage_of = [sorted({l for a, b in wins[k] for l in range(a, b)}) for k in range(pp)]
    T = {k: {} for k in range(pp)}
    D = {k: {} for k in range(pp)}
    M = {k: {} for k in range(pp)}
    _assign(f, t, stage_of, T, D, M, n, pp)
    if pp > 1:
        _contiguity(f, stage_of, n, pp, t, even, wins)
    _edges(f, t, stage_of, T, n, pp)
    if pp > 1:
        _sends(f, t, stage_of, T, n, pp)
    _vocab_terms(f, t, v, T, D, M, n, pp)
    _stage_rows(f, t, v, stage_of, T, D, M, pp)
    objective_rows(f, pp, t.combo.formula, cutoff_s)
    return f


def objective_rows(f: Formulation, pp: int, formula: PipelineFormula, cutoff_s: float | None) -> None:
    """plan_cost's objective over the stage variables T_k, D_k; ``cutoff_s`` adds objective <= it."""
    if pp == 1:
        f.objective = {"T_0": float(formula.micro_batches), "D_0": 1.0}
    else:
        f.var("Tmax", 0.0, np.inf, False, unit="time")
        f.var("Dmax", -np.inf, np.inf, False, unit="time")
        for k in range(pp):
            f.row({"Tmax": 1.0, f"T_{k}": -1.0}, ">=", 0.0, unit="time")
            f.row({"Dmax": 1.0, f"D_{k}": -1.0}, ">=", 0.0, unit="time")
        f.objective = {**{f"T_{k}": formula.fill for k in range(pp)}, "Tmax": formula.steady, "Dmax": 1.0}
    if cutoff_s is not None:
        f.row(dict(f.objective), "<=", cutoff_s, unit="time")


def _assign(f, t, stage_of, T, D, M, n, pp) -> None:
    for l in range(n):
        ty = t.layer_type[l]
        coefs = {}
        for k in range(pp):
            if l not in stage_of[k]:
                continue
            st = t.stages[k]
            for s in np.flatnonzero(t.allowed[ty]):
                name = f.var(f"w_{l}_{k}_{s}")
                f.w_index[(l, k, int(s))] = name
                f.y_index.setdefault((l, k), []).append(name)
                coefs[name] = 1.0
                T[k][name] = T[k].get(name, 0.0) + float(st.time_s[ty, s])
                D[k][name] = D[k].get(name, 0.0) + float(st.tail_s[ty, s])
                M[k][name] = M[k].get(name, 0.0) + float(st.memory_bytes[ty, s])
        f.row(coefs, "==", 1.0)


def _y(f, l, k) -> dict[str, float]:
    """Coefficients of y[l,k] = sum_s w[l,k,s]."""
    return {name: 1.0 for name in f.y_index.get((l, k), [])}


def _contiguity(f, stage_of, n, pp, t, even, wins) -> None:
    ys = {(l, k): _y(f, l, k) for l in range(n) for k in range(pp)}

    def cum(l, k):
        out: dict[str, float] = {}
        for kk in range(k + 1):
            for name, c in ys[(l, kk)].items():
                out[name] = out.get(name, 0.0) + c
        return out

    for l in range(1, n):
        for k in range(pp - 1):
            # stage(l) >= stage(l-1): c[l,k] <= c[l-1,k]
            f.row(minus(cum(l, k), cum(l - 1, k)), "<=", 0.0)
            # stage(l) <= stage(l-1) + 1: c[l,k+1] >= c[l-1,k]
            f.row(minus(cum(l, k + 1), cum(l - 1, k)), ">=", 0.0)


def minus(a: dict, b: dict) -> dict:
    """Coefficients of a - b."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) - v
    return out


def _edges(f, t, stage_of, T, n, pp) -> None:
    classes: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # identical layers share them
    for l in range(1, n):
        src_ty, dst_ty = t.layer_type[l - 1], t.layer_type[l]
        for k in range(pp):
            if l - 1 not in stage_of[k] or l not in stage_of[k]:
                continue
            R = t.stages[k].trans_s[src_ty]
            if (k, src_ty) not in classes:
                classes[(k, src_ty)] = _classes(R)
            src, dst = classes[(k, src_ty)]
            S_prev = np.flatnonzero(t.allowed[src_ty])
            S_next = np.flatnonzero(t.allowed[dst_ty])
            G = sorted(set(src[S_prev]))
            H = sorted(set(dst[S_next]))
            e = {}
            for g in G:
                for h in H:
                    rep_s = S_prev[src[S_prev] == g][0]
                    rep_t = S_next[dst[S_next] == h][0]
                    name = f.var(f"e_{l}_{k}_{g}_{h}", integer=False)
                    e[(g, h)] = name
                    if R[rep_s, rep_t]:
                        T[k][name] = float(R[rep_s, rep_t])
            for g in G:
                row = {e[(g, h)]: 1.0 for h in H}
                for s in S_prev[src[S_prev] == g]:
                    row[f.w_index[(l - 1, k, int(s))]] = -1.0
                f.row(row, "==" if pp == 1 else "<=", 0.0)
            for h in H:
                row = {e[(g, h)]: 1.0 for g in G}
                for s in S_next[dst[S_next] == h]:
                    row[f.w_index[(l, k, int(s))]] = -1.0
                f.row(row, "==" if pp == 1 else "<=", 0.0)
            if pp > 1:  # both layers on stage k forces one edge: sum e >= y[l-1,k] + y[l,k] - 1
                row = {name: 1.0 for name in e.values()}
                for name in _y(f, l - 1, k):
                    row[name] = -1.0
                for name in _y(f, l, k):
                    row[name] = row.get(name, 0.0) - 1.0
                f.row(row, ">=", -1.0)


def _sends(f, t, stage_of, T, n, pp) -> None:
    """z[l,k,g] >= (layer l on stage k in send class g) - (layer l+1 on stage k): the stage's last
    layer pays its pipeline sends; strategies of one send class send alike (the message depends
    on dp, and under Megatron's scatter-gather on tp and sp too)."""
    for k in range(pp - 1):
        st = t.stages[k]
        for l in stage_of[k]:
            if l + 1 >= n:
                continue
            ty = t.layer_type[l]
            allowed = np.flatnonzero(t.allowed[ty])
            nxt = _y(f, l + 1, k)
            by_send: dict[tuple[float, float], list[int]] = {}
            for s in allowed:
                by_send.setdefault((float(st.send_next_s[ty, s]), float(st.send_prev_s[ty, s])), []).append(int(s))
            for g, ((fwd, bwd), strats) in enumerate(by_send.items()):
                name = f.var(f"z_{l}_{k}_{g}", integer=False)
                row = {name: 1.0}
                for s in strats:
                    row[f.w_index[(l, k, s)]] = -1.0
                for nm in nxt:
                    row[nm] = row.get(nm, 0.0) + 1.0
                f.row(row, ">=", 0.0)
                T[k][name] = T[k].get(name, 0.0) + fwd
                T[k + 1][name] = T[k + 1].get(name, 0.0) + bwd


def _vocab_terms(f, t, v, T, D, M, n, pp) -> None:
    first, last = t.vocab[v][0], t.vocab[v][pp - 1]
    for (l, k, s), name in f.w_index.items():
        if l == 0 and k == 0 and first.first_delta is not None:
            charge(T[k], D[k], M[k], name, first.first_delta[s])
        if l == n - 1 and k == pp - 1 and last.last_delta is not None:
            charge(T[k], D[k], M[k], name, last.last_delta[s])


def charge(T: dict, D: dict, M: dict, name: str, delta) -> None:
    """Add an embedding/head delta (T, D, memory) to the terms of variable ``name``."""
    dT, dD, dM = (float(x) for x in delta)
    T[name] = T.get(name, 0.0) + dT
    D[name] = D.get(name, 0.0) + dD
    M[name] = M.get(name, 0.0) + dM


def stage_variables(f: Formulation, k: int, vc, T: dict, D: dict) -> str:
    """T_k and D_k tied to the embedding/head's base (``vc``) plus their terms, and tmp_k (stage
    k's largest temporary, at least the embedding/head's), whose name is returned."""
    f.var(f"T_{k}", 0.0, np.inf, False, unit="time")
    f.var(f"D_{k}", -np.inf, np.inf, False, unit="time")
    f.row({f"T_{k}": 1.0, **{nm: -c for nm, c in T.items()}}, "==", vc.time_s, unit="time")
    f.row({f"D_{k}": 1.0, **{nm: -c for nm, c in D.items()}}, "==", vc.tail_s, unit="time")
    return f.var(f"tmp_{k}", float(vc.temp_bytes), np.inf, False, unit="mem")


def memory_row(f: Formulation, t: ComboTables, vc, tmp: str, M: dict) -> None:
    """Stage memory: tmp_k + its terms <= the budget less the embedding/head's memory."""
    f.row({tmp: 1.0, **M}, "<=", t.budget_bytes - vc.memory_bytes, memory=True)


def _stage_rows(f, t, v, stage_of, T, D, M, pp) -> None:
    for k in range(pp):
        vc = t.vocab[v][k]
        tmp = stage_variables(f, k, vc, T[k], D[k])
        for l in stage_of[k]:
            ty = t.layer_type[l]
            row = {tmp: 1.0}
            for s in np.flatnonzero(t.allowed[ty]):
                row[f.w_index[(l, k, int(s))]] = -float(t.stages[k].temp_bytes[ty, s])
            f.row(row, ">=", 0.0, unit="mem")
        memory_row(f, t, vc, tmp, M[k])


def warm_values(f: Formulation, t: ComboTables, choice: list[int], stage_layers: list[int]) -> dict[str, float]:
    """Values of the w variables (in the count model its integers) for a known plan (the DP's),
    for the solvers' warm start."""
    if f.counts is not None:
        return f.counts.warm_values(choice, stage_layers)
    out = {name: 0.0 for name in f.w_index.values()}
    stage = np.repeat(np.arange(len(stage_layers)), stage_layers)
    for l, s in enumerate(choice):
        name = f.w_index.get((l, int(stage[l]), int(s)))
        if name is None:
            return {}
        out[name] = 1.0
    return out


def read_plan(values: dict[str, float], f: Formulation, n: int, pp: int) -> tuple[list[int], list[int]]:
    """(strategy index per layer, layers per stage) from a solution."""
    if f.counts is not None:
        return f.counts.read_plan(values, n, pp)
    choice, stage = [0] * n, [0] * n
    for (l, k, s), name in f.w_index.items():
        if values.get(name, 0.0) > 0.5:
            choice[l], stage[l] = s, k
    return choice, [stage.count(k) for k in range(pp)]
