"""Galvatron's DP for one (global batch, pp, micro-batches) group: Pareto passes per stage,
segment options, and the partition DP that picks stage boundaries; plans come back as choices."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from planners.deadline import DeadlinePassed, passed
from planners.memory_floor import memory_floor
from planners.pareto import Completion, PassRunner, SegmentPass, _staircase_keep, argmin_low_tail
from planners.partition import StageOptions, partition_floor, search_partition, stage_windows
from planners.seed import uniform_seed
from planners.space import VocabChoice
from planners.tail_floor import tail_floor
from planners.tables import ComboTables, StageTables, VocabCost, temp_levels
from specs import even_stage_layers


@dataclass
class GroupSolution:
    """One plan of a group: a strategy index per layer, the stage sizes, the vocab tp, its objective."""

    vocab_tp: VocabChoice
    """The embedding/head choice (tp, ZeRO-3, sp)."""
    choice: list[int]
    stage_layers: list[int]
    objective_s: float


def _last_mem_floor(vc) -> float:
    return float(vc.last_delta[:, 2].min()) if vc.last_delta is not None else 0.0


GAP_RTOL = 1e-9
"""A relative gap this small is rounding (group objectives vs plan_cost's re-score): proven
optimal; a vocab choice whose bound comes this close to the incumbent is not searched."""
OPTIMISTIC_CUT_RTOL = 1e-4
"""Where the search is exact (``GroupDP.proven``) and a lower bound is known, it runs first with
its cut this far above the bound: a plan it finds there is the optimum (the search is exact below
its cut), and a tight cut prunes most points (a one-stage group's count bound is its optimum
when the best plan needs no relayout). Nothing found: the search runs again under the incumbent."""


class GroupDP:
    """Runs the passes once per group (stage 0 once per vocab tp) and answers every vocab tp."""

    def __init__(self, t: ComboTables, exact: bool, even: bool, granularity_bytes: float = 0.0,
                 stage_imbalance: float | None = None, max_temp_levels: int | None = None,
                 deadline: float | None = None, max_candidates: int | None = None) -> None:
        self.t, self.exact, self.even = t, exact, even
        self.deadline = deadline
        """time.monotonic() past which the search raises DeadlinePassed between passes."""
        self.max_candidates = max_candidates
        """Points the passes may hand to Pareto pruning (None: any), past which the search raises
        DeadlinePassed part-way: a budget of work that, unlike the deadline, stops at the same
        place on every machine (pruning is most of the work: about 1 us a candidate here)."""
        self.candidates = 0
        self.n = len(t.layer_type)
        self.m = t.combo.micro_batches
        self.formula = t.combo.formula
        """The schedule's iteration-time formula: the partition search's objective."""
        self.weight = 1.0 / self.m
        # fast mode offers each segment's best under several time/tail weights (T + lam * D):
        # 1/m is exact when pp = 1; 0 and 1 cover bottleneck stages and tail-heavy stages.
        self.lambdas = [self.weight] + ([0.0, 1.0] if t.combo.pp > 1 and not exact else [])
        self.stages = [_rounded(s, granularity_bytes) for s in t.stages] if granularity_bytes else t.stages
        self.levels = temp_levels(t) if not granularity_bytes else _round_up(temp_levels(t), granularity_bytes)
        if max_temp_levels is not None and len(self.levels) > max_temp_levels:
            self.levels, self.stages = _coarse_levels(self.levels, self.stages, max_temp_levels)
        self.dp_index = {d: i for i, d in enumerate(t.dp_values)}
        self.strat_g = np.array([self.dp_index[s.dp] for s in t.strategies])
        max_len = None if stage_imbalance is None else math.ceil(stage_imbalance * self.n / t.combo.pp)
        self.windows = stage_windows(self.n, t.combo.pp, even, max_len)
        self.bound_windows = stage_windows(self.n, t.combo.pp, even)
        """Every partition of the space (even partitions only when the space is restricted to them):
        the bounds cover the whole space, not only the windows fast mode's stage_imbalance keeps."""
        exact_levels = max_temp_levels is None and not granularity_bytes  # rounding changes the problem
        self.proven = exact_levels and (exact or t.combo.pp == 1)
        """Whether solve() is exact over the space (then a group's optimum is its own lower bound)."""
        self.incumbent_s = np.inf
        """The best objective known from elsewhere; Pareto points that cannot beat it are dropped."""
        self.bounds: dict = {}
        """vocab choice -> a lower bound on the group's objective over the whole space (inf: no plan)."""
        self.points = 0
        self.skipped = 0
        """Vocab tps skipped because the memory-blind objective could not beat the incumbent."""
        self.passes: dict[tuple[int, int | None], dict] = {}
        self.time_twin = _time_twins(self.stages)
        """[k] the first stage whose time, tail and relayout tables equal stage k's."""
        self._blind_passes: dict[tuple, list[SegmentPass]] = {}
        """(time twin, vocab choice on stage 0, weight) -> memory-blind passes read for time only."""
        self._relaxed: dict[tuple, tuple] = {}
        """relaxed_options by (stage, weight, the stage's embedding/head cost or vocab choice)."""
        self._recvs: dict[int, np.ndarray] = {}
        """_recv by stage."""

    # -- passes -----------------------------------------------------------------------------
    def _cap_by_level(self, k: int, vocab_tps) -> np.ndarray:
        B = self.t.budget_bytes
        caps = [B - np.maximum(self.levels, self.t.vocab[v][k].temp_bytes) - self.t.vocab[v][k].memory_bytes
                - _last_mem_floor(self.t.vocab[v][k]) for v in vocab_tps]
        return np.max(caps, axis=0)

    def _stage_passes(self, k: int, v: int, scalar: float | None = None, blind: bool = False) -> dict:
        """start -> (pass, pass id) for stage k; stage 0 depends on the vocab tp, the others do not.
        ``scalar``: the memory-blind pass (one point per strategy) under weight ``scalar``.
        ``blind``: its points are read for time, tail and strategy only (not memory), so stages
        whose time tables are equal (``time_twin``) share the passes."""
        cut = self.incumbent_s if scalar is None else np.inf
        key = (k, v if k == 0 else None, scalar, cut, blind)
        if key in self.passes:
            return self.passes[key]
        lt = self.t.layer_type
        vocab_tps = [v] if k == 0 else list(self.t.vocab)
        first_extra = self.t.vocab[v][0].first_delta if k == 0 else None
        runner = PassRunner(self.stages[k], lt, self.t.allowed, self.levels, self._cap_by_level(k, vocab_tps),
                            self.weight if scalar is None else scalar, self.exact, first_extra,
                            check=(lambda: self.check_deadline(runner.candidates))
                            if self.deadline is not None or self.max_candidates is not None else None)
        stop_of: dict[int, int] = {}
        for a, b in (self.windows if scalar is None else self.bound_windows)[k]:
            stop_of[a] = self.n if blind else max(stop_of.get(a, 0), b)  # blind: to the end, for every twin
        # one start: its pass is read only at the stage's last layer (a pass reused for a later
        # start is read before its end, where what later layers add is not owed)
        runner.cut_above(self.m, self._cut_offset(k, vocab_tps), cut,
                         self._completion(k) if len(stop_of) == 1 and k == self.t.combo.pp - 1 else None,
                         self.least_layer_s if self.t.combo.pp > 1 else 0.0)
        done: list[SegmentPass] = self._blind_passes.setdefault(
            (self.time_twin[k], v if k == 0 else None, scalar), []) if blind else []
        by_start: dict[int, tuple[SegmentPass, int]] = {}
        try:
            for a in sorted(stop_of):
                self.check_deadline(runner.candidates)
                stop = stop_of[a]
                reuse = next((p for p in done if len(p.frontiers) >= stop - a
                              and np.array_equal(lt[p.start:p.start + stop - a], lt[a:stop])), None)
                if reuse is None:
                    reuse = (runner.run if scalar is None else runner.run_scalar)(k, a, stop)
                    done.append(reuse)
                by_start[a] = (reuse, id(reuse))
        finally:  # a pass stopped part-way has done its work too
            self.points += runner.points
            self.candidates += runner.candidates
        self.passes[key] = by_start
        return by_start

    def check_deadline(self, running: int = 0) -> None:
        """Raise DeadlinePassed past the deadline or once the candidates pruned (``running`` of a
        pass under way besides) exceed max_candidates."""
        if passed(self.deadline):
            raise DeadlinePassed
        if self.max_candidates is not None and self.candidates + running > self.max_candidates:
            raise DeadlinePassed

    def _cut_offset(self, k: int, vocab_tps) -> np.ndarray:
        """[layer j] what a stage-k point after layer j must still add to m T + D at least: the
        embedding/head on the stage (the layers after j: ``_completion``)."""
        m = self.m
        vocab = []
        for v in vocab_tps:
            vc = self.t.vocab[v][k]
            d = vc.last_delta
            vocab.append(m * vc.time_s + vc.tail_s + (float(np.min(m * d[:, 0] + d[:, 1])) if d is not None else 0.0))
        return np.full(self.n, min(vocab))

    @cached_property
    def least_layer_s(self) -> float:
        """The least per-micro-batch time of any layer on any stage (a layer off a stage adds at
        least this to the objective's sum over stages); once per group, for every pass's cut."""
        ok = self.t.allowed[self.t.layer_type]
        return float(min(np.min(np.where(ok, st.time_s[self.t.layer_type], np.inf)) for st in self.stages))

    def _completion(self, k: int) -> Completion:
        """What the layers after j add on stage k, for a pass read only at its last layer (one
        start on the last stage: a pass reused for a later start is read before its end)."""
        st = self.stages[k]
        ok = self.t.allowed
        cost = np.where(ok, self.m * st.time_s + st.tail_s, np.inf)
        return Completion.of(cost, np.where(ok, st.memory_bytes, np.inf), self.t.layer_type)

    # -- options ----------------------------------------------------------------------------
    def _options(self, k: int, v: int, cache: dict, lam: float | None) -> tuple[StageOptions, "OptionRefs"]:
        """Stage k's options: per window and dp of its last layer, every (T, D) Pareto point that
        fits (exact mode, lam None) or the best one under T + lam D (fast mode)."""
        if lam is not None:
            return self._fast_options(k, v, cache, lam)
        vc, st, B = self.t.vocab[v][k], self.stages[k], self.t.budget_bytes
        passes = self._stage_passes(k, v)
        unique = list({pid: p for p, pid in passes.values()}.items())  # (pass id, pass)
        position = {pid: i for i, (pid, _) in enumerate(unique)}
        parts = []
        for a, b in self.windows[k]:
            p, pid = passes[a]
            key = (pid, b - a, None)
            if key not in cache:  # (g, T, D, point) columns
                cache[key] = _columns(self._segment(p, b - a - 1, st, vc, B, k, None))
            parts.append(cache[key])
        W, count = self.windows[k], [len(part[0]) for part in parts]
        g, T, D, point = (np.concatenate([part[i] for part in parts]) for i in range(4))
        opts = StageOptions(np.repeat(W.starts, count), np.repeat(W.stops, count), g, T, D)
        origin = np.repeat([position[passes[a][1]] for a in W.starts], count).astype(int)
        return opts, OptionRefs([p for _, p in unique], origin, opts.b - opts.a - 1, point)

    def _fast_options(self, k: int, v: int, cache: dict, lam: float) -> tuple[StageOptions, "OptionRefs"]:
        """Fast mode's options of stage k, all windows at once: where every dp's best point of the
        memory-blind pass fits (``_scalar_segments``), those points; elsewhere the best point that fits
        from the Pareto pass (``_segment``). The same options, in the same order, as asking
        ``_segment`` window by window (each window's dps in order)."""
        W = self.windows[k]
        a, b = W.starts, W.stops
        last = b - a - 1
        passes: list[SegmentPass] = []
        index: dict[int, int] = {}  # pass id -> position in ``passes``

        def source(p: SegmentPass, pid: int) -> int:
            if pid not in index:
                index[pid] = len(passes)
                passes.append(p)
            return index[pid]

        scalar = self._stage_passes(k, v, scalar=lam)
        starts = np.unique(a)
        pass_of = np.array([source(*scalar[int(s)]) for s in starts])[np.searchsorted(starts, a)]
        best = [self._scalar_segments(p, k, v, lam, self.t.budget_bytes) for p in passes]
        T, D, point, fits = (np.stack([_padded(x[i], self.n) for x in best])[pass_of, last] for i in range(4))
        origin = np.repeat(pass_of[:, None], T.shape[1], axis=1)  # [window, dp] position in passes
        vc, st, B = self.t.vocab[v][k], self.stages[k], self.t.budget_bytes
        pareto = self._stage_passes(k, v)
        for w in np.flatnonzero(~fits.astype(bool)):  # a dp's best does not fit: the Pareto pass
            p, pid = pareto[int(a[w])]
            key = (pid, int(b[w] - a[w]), lam)
            if key not in cache:
                cache[key] = self._segment(p, int(last[w]), st, vc, B, k, lam)
            T[w], D[w], point[w], origin[w] = np.inf, np.inf, -1, source(p, pid)
            for g, T_g, D_g, i in cache[key]:
                T[w, g], D[w, g], point[w, g] = T_g, D_g, i
        w, g = np.nonzero(np.isfinite(T))
        return (StageOptions(a[w], b[w], g, T[w, g], D[w, g]),
                OptionRefs(passes, origin[w, g], last[w], point[w, g].astype(int)))

    def relaxed_options(self, k: int, v, lam: float) -> tuple[StageOptions, "OptionRefs"]:
        """Stage k's options over every partition's segments (``bound_windows``), memory ignored:
        per segment the memory-blind pass's best T + lam D per dp of its last layer (what
        ``_segment`` gives with no budget), for every pass and length at once. A stage past the
        first whose embedding/head has no per-strategy delta answers alike for every vocab choice
        with the same time and tail (the middle stages): computed once for them."""
        vc = self.t.vocab[v][k]
        key = (k, lam) + ((vc.time_s, vc.tail_s) if k > 0 and vc.last_delta is None else (v,))
        if key not in self._relaxed:
            self._relaxed[key] = self._relaxed_options(k, v, lam)
        return self._relaxed[key]

    def _relaxed_options(self, k: int, v, lam: float) -> tuple[StageOptions, "OptionRefs"]:
        passes = self._stage_passes(k, v, scalar=lam, blind=True)
        a, b = self.bound_windows[k].starts, self.bound_windows[k].stops
        unique = list({id(p): p for p, _ in passes.values()}.values())
        index = {id(p): i for i, p in enumerate(unique)}
        starts = np.unique(a)
        pass_of = np.array([index[id(passes[int(s)][0])] for s in starts])[np.searchsorted(starts, a)]
        best = [self._scalar_segments(p, k, v, lam)[:3] for p in unique]
        T, D, point = (np.stack([_padded(x[i], self.n) for x in best]) for i in range(3))  # [pass, last, dp]
        last = b - a - 1
        seg, g = np.nonzero(np.isfinite(T[pass_of, last]))  # segment by segment, dp by dp
        where = (pass_of[seg], last[seg], g)
        opts = StageOptions(a[seg], b[seg], g, T[where], D[where])
        return opts, OptionRefs(unique, pass_of[seg], last[seg], point[where].astype(int))

    def _scalar_segments(self, p: SegmentPass, k: int, v, lam: float, budget_bytes: float | None = None
                         ) -> tuple[np.ndarray, ...]:
        """[last layer, dp] T, D and point index of the memory-blind pass ``p``'s best T + lam D
        among the points whose strategy has that dp (inf / -1 where none), with the
        embedding/head and the send to the next stage; ties go to the smaller tail. With
        ``budget_bytes``, among the points that fit it, and [last layer] whether each dp's
        cheapest point fits (the first in strategy order among equal costs; where one does not,
        fast mode takes the window's options from the Pareto pass); else memory is ignored."""
        vc, st, n_strat = self.t.vocab[v][k], self.stages[k], len(self.t.strategies)
        G, L = len(self.t.dp_values), len(p.frontiers)
        T, D = p.scalar_arrays(n_strat)  # T inf: no point
        present = np.isfinite(T)
        extra = vc.last_delta if vc.last_delta is not None else np.zeros((n_strat, 3))
        send = st.send_next_s[self.t.layer_type[p.start:p.start + L]] if k < self.t.combo.pp - 1 else 0.0
        T = T + vc.time_s + send + extra[None, :, 0]
        D = D + vc.tail_s + extra[None, :, 1]
        fit = present
        if budget_bytes is not None:
            mem, level = p.scalar_memory(n_strat)
            mem = mem + extra[None, :, 2] + np.maximum(self.levels[level], vc.temp_bytes) + vc.memory_bytes
            fit = present & (mem <= budget_bytes)
        position = np.cumsum(present, axis=1) - 1  # a strategy's index in its frontier
        out_T, out_D, out_p = np.full((L, G), np.inf), np.full((L, G), np.inf), np.full((L, G), -1.0)
        fits = np.ones(L)
        rows = np.arange(L)
        for g in range(G):
            cols = np.flatnonzero(self.strat_g == g)
            if not len(cols):
                continue
            cost = np.where(present[:, cols], T[:, cols] + lam * D[:, cols], np.inf)
            if budget_bytes is not None:
                cheapest = cols[np.argmin(cost, axis=1)]
                fits[present[:, cols].any(axis=1) & ~fit[rows, cheapest]] = 0.0
            pick = cols[argmin_low_tail(np.where(fit[:, cols], cost, np.inf).T, D[:, cols].T)]
            found = fit[rows, pick]
            out_T[found, g], out_D[found, g] = T[rows, pick][found], D[rows, pick][found]
            out_p[found, g] = position[rows, pick][found]
        return out_T, out_D, out_p, fits

    def _segment(self, p: SegmentPass, last: int, st: StageTables, vc, B: float, k: int,
                 lam: float | None) -> list:
        """Options of one segment: per dp of its last layer, the best point (fast) or the (T, D)
        Pareto points (exact) that fit."""
        f = p.frontiers[last]
        if not len(f):
            return []
        ty_last = self.t.layer_type[p.start + last]
        extra = vc.last_delta[f.strat] if vc.last_delta is not None else np.zeros((len(f), 3))
        mem = f.mem + extra[:, 2] + np.maximum(self.levels[f.level], vc.temp_bytes) + vc.memory_bytes
        send = st.send_next_s[ty_last, f.strat] if k < self.t.combo.pp - 1 else 0.0
        T = f.T + vc.time_s + send + extra[:, 0]
        D = f.D + vc.tail_s + extra[:, 1]
        out = []
        for g in range(len(self.t.dp_values)):
            idx = np.flatnonzero((mem <= B) & (self.strat_g[f.strat] == g))
            if not len(idx):
                continue
            if self.exact:
                keep = idx[_staircase_keep(T[idx], D[idx])]
            else:
                keep = idx[[argmin_low_tail(T[idx] + lam * D[idx], D[idx])]]
            out.extend((g, float(T[i]), float(D[i]), int(i)) for i in keep)
        return out

    def _mixed(self, runs: list, recv: list, best: tuple) -> tuple:
        opts, refs = _merge(runs)
        choice0 = best[0]
        D_all = np.concatenate([o.D for o in opts])
        tails = [best[1][k].D[o] for k, o in enumerate(choice0.option)]
        deltas = np.unique(D_all)
        if len(deltas) > MIXED_ALL_TAILS:
            deltas = np.unique(np.concatenate((np.quantile(D_all, np.linspace(0, 1, MIXED_TAIL_CAPS)), tails)))
        choice = search_partition(opts, recv, self.n, len(self.t.dp_values), self.formula, exact=True, deltas=deltas)
        if choice is not None and choice.objective_s < choice0.objective_s:
            return choice, opts, refs
        return best

    def _recv(self, k: int) -> np.ndarray:
        """[a, g']: gradient sent back to stage k when the previous stage ends at layer a-1 with dp g'."""
        if k not in self._recvs:
            G = len(self.t.dp_values)
            sp = np.where(self.t.allowed, self.stages[k - 1].send_prev_s, np.inf)  # [type, strategy]
            least = np.stack([sp[:, self.strat_g == g].min(axis=1, initial=np.inf) for g in range(G)], axis=1)
            out = np.full((self.n + 1, G), np.inf)
            out[1:] = least[self.t.layer_type]
            self._recvs[k] = out
        return self._recvs[k]

    # -- answer -----------------------------------------------------------------------------
    def relaxed_objective(self, v: int) -> float:
        """A lower bound on the group's objective under vocab tp ``v`` over every partition,
        memory ignored (memory-blind passes only). pp = 1: m * min (T + D/m), the optimum itself.
        pp > 1: max_k D_k >= sum_k D_k / pp, so the objective is at least the least
        sum_k (T_k + D_k / pp) over partitions plus (m - 1) x the least bottleneck. Memory-blind,
        so computed once per group and vocab choice of a search (ComboTables.shared)."""
        key = ("relaxed_objective", v, self.even)
        if key not in self.t.shared:
            self.t.shared[key] = self._relaxed_objective(v)
        return self.t.shared[key]

    def _relaxed_objective(self, v: int) -> float:
        recv = [None] + [self._recv(k) for k in range(1, len(self.windows))]

        def options(lam: float) -> list[StageOptions]:
            return [self.relaxed_options(k, v, lam)[0] for k in range(len(self.windows))]

        G = len(self.t.dp_values)
        if len(self.windows) == 1:
            choice = search_partition(options(self.weight), recv, self.n, G, self.formula, exact=False)
            return np.inf if choice is None else choice.objective_s
        lam = 1.0 / len(self.windows)  # max_k D_k >= the mean over the pp stages
        summed = [StageOptions(o.a, o.b, o.g, o.T + lam * o.D, np.zeros_like(o.D)) for o in options(lam)]
        return partition_floor(summed, options(0.0), recv, self.n, G, self.formula)

    def any_vocab_floor(self, incumbent_s: float | None = None, tails: bool = True) -> float:
        """A lower bound for every vocab choice at once: ``relaxed_objective`` with each stage's
        embedding/head at its least over the choices (the bound only grows with them: times,
        tails and memory fall, the memory caps rise), kept for the search (ComboTables.shared);
        with ``incumbent_s``, ``lower_bound`` (the Lagrangian too). One computation can then rule
        the whole group out."""
        least = [_least_vocab([costs[k] for costs in self.t.vocab.values()]) for k in range(self.t.combo.pp)]
        merged = GroupDP(replace(self.t, vocab={ANY_VOCAB: least}), exact=False, even=self.even,
                         deadline=self.deadline)
        if incumbent_s is None:
            return merged.relaxed_objective(ANY_VOCAB)
        return merged.lower_bound(ANY_VOCAB, incumbent_s, tails)

    def lower_bound(self, v, incumbent_s: float = np.inf, tails: bool = True) -> float:
        """The largest of the per-segment memory bound (memory_floor; its integer count bound on
        short segments of identical layers, and on a one-stage group's whole stage, asked only
        when the LP one cannot rule the group out),
        the memory-blind bound and, with ``tails``, the tail-cap bound (tail_floor), each asked
        only when the ones before cannot; the count bound at once where order_key has computed it
        (it is at least the LP one: each segment's is the larger of the two). The two memory-blind
        bounds are asked only below ``blind_plan_s``, which neither can exceed."""
        relaxed = self.t.shared.get(self._memory_floor_key(v, counts=True))
        if relaxed is None:
            relaxed = self._memory_floor(v, counts=False)
            if relaxed < incumbent_s:
                relaxed = max(relaxed, self._memory_floor(v, counts=True, incumbent_s=incumbent_s))
        reach = incumbent_s if relaxed >= incumbent_s else min(incumbent_s, self.blind_plan_s(v))
        if relaxed < reach:
            relaxed = max(relaxed, self.relaxed_objective(v))
        if relaxed < reach and self.t.combo.pp > 1 and tails:
            relaxed = self.tail_floor(v, incumbent_s, known_s=relaxed)
        return relaxed

    def blind_plan_s(self, v) -> float:
        """The objective of the group's best uniform plan under vocab choice ``v`` (even stages),
        memory ignored (inf: no strategy every layer allows). A memory-blind bound bounds the
        objective of every plan of the group with memory ignored, this one's too, so it never
        exceeds it: where the memory floor reaches it (memory binds: llama3-70b's pp 1, 2 and 4
        groups on 1024 H100), the memory-blind and tail-cap bounds cannot lift the bound."""
        found = uniform_seed(self.t, v, budget_bytes=np.inf)
        return np.inf if found is None else found[0]

    def order_key(self, v) -> float:
        """lower_bound's per-segment memory floors (LP, and the count bound for pp > 1) without
        the memory-blind and tail-cap bounds: cheaper, to order the vocab choices by."""
        return self._memory_floor(v, counts=self.t.combo.pp > 1)

    def _memory_floor(self, v, counts: bool, incumbent_s: float = np.inf) -> float:
        """memory_floor over every partition, kept per budget in ComboTables.shared (one computed
        under an incumbent, at most that incumbent where the bound reaches it, still bounds the
        group, and decides as well against any smaller incumbent: within a search they only fall)."""
        key = self._memory_floor_key(v, counts)
        if key not in self.t.shared:
            recv = [None] + [self._recv(k) for k in range(1, len(self.windows))]
            self.t.shared[key] = memory_floor(self.t, v, self.bound_windows, recv, counts=counts,
                                              incumbent_s=incumbent_s)
        return self.t.shared[key]

    def _memory_floor_key(self, v, counts: bool) -> tuple:
        return ("memory_floor", v, counts, self.even, self.t.budget_bytes)

    def tail_floor(self, v, incumbent_s: float = np.inf, known_s: float = -np.inf) -> float:
        """tail_floor.tail_floor on this group's memory-blind options over every partition
        (``known_s``: a bound already held, returned where the tail caps cannot beat it)."""
        recv = [None] + [self._recv(k) for k in range(1, len(self.windows))]

        def options(lam: float) -> list[StageOptions]:
            return [self.relaxed_options(k, v, lam)[0] for k in range(len(self.windows))]

        return tail_floor(options, recv, self.n, self.formula, self.t.combo.pp, incumbent_s, known_s)

    def solve(self, v: int, incumbent_s: float = np.inf, bound: bool = True) -> GroupSolution | None:
        """Best plan of this group under vocab tp ``v``. Fast mode runs the partition search once
        per weight lam (each segment offering its best T + lam * D) and keeps the best; it skips
        the group when its lower bound (``lower_bound``) cannot beat ``incumbent_s``. ``bound``
        False: no lower bound (nor ``bounds[v]``), for a cost model the bounds do not bound."""
        if bound and (not self.exact or not self.proven):
            if v not in self.bounds:  # one computed earlier under a larger incumbent still holds
                self.bounds[v] = self.lower_bound(v, incumbent_s)
            if not self.exact and self.bounds[v] >= incumbent_s * (1.0 - GAP_RTOL):
                self.skipped += 1
                return None
        seed = uniform_seed(self.t if self.stages is self.t.stages else replace(self.t, stages=self.stages), v)
        seeded = None
        if seed is not None and seed[0] < incumbent_s:
            sizes = list(even_stage_layers(self.n, self.t.combo.pp))
            seeded = GroupSolution(v, [seed[1]] * self.n, sizes, seed[0])
            incumbent_s = seed[0]
        found = None
        hint_s = self.bounds.get(v, np.inf) * (1.0 + OPTIMISTIC_CUT_RTOL)
        if self.proven and hint_s < incumbent_s:  # first under a cut just above the bound: cheap
            self.incumbent_s = hint_s
            found = self._solve(v)
        if found is None:
            self.incumbent_s = incumbent_s
            found = self._solve(v)
        if found is None or (seeded is not None and seeded.objective_s <= found.objective_s):
            found = seeded
        if self.proven:  # with the cut, a plan at or above the incumbent proves only that nothing beats it
            self.bounds[v] = incumbent_s if found is None else min(incumbent_s, found.objective_s)
        return found

    def _solve(self, v: int) -> GroupSolution | None:
        caches: list[dict] = [{} for _ in self.windows]
        recv = [None] + [self._recv(k) for k in range(1, len(self.windows))]
        best = None
        runs = []
        for lam in (self.lambdas if not self.exact else [None]):
            built = [self._options(k, v, caches[k], lam) for k in range(len(self.windows))]
            opts, refs = [b[0] for b in built], [b[1] for b in built]
            runs.append((opts, refs))
            choice = search_partition(opts, recv, self.n, len(self.t.dp_values), self.formula, exact=self.exact)
            if choice is not None and (best is None or choice.objective_s < best[0].objective_s):
                best = (choice, opts, refs)
        if best is None:
            return None
        if len(runs) > 1:  # stages may want different weights: all options, a few tail caps
            best = self._mixed(runs, recv, best)
        choice, opts, refs = best
        layers: list[int] = []
        sizes = []
        for k, o in enumerate(choice.option):
            p, last, point = refs[k][o]
            layers.extend(p.strategies(last, point))
            sizes.append(int(opts[k].b[o] - opts[k].a[o]))
        return GroupSolution(v, layers, sizes, choice.objective_s)


@dataclass(frozen=True)
class OptionRefs:
    """Where each option of a stage comes from: its pass, its last layer within the pass, its
    point there (``refs[o]`` as for a list of (pass, last, point))."""

    passes: list[SegmentPass]
    pass_index: np.ndarray
    last: np.ndarray
    point: np.ndarray

    def __getitem__(self, o: int) -> tuple[SegmentPass, int, int]:
        return self.passes[self.pass_index[o]], int(self.last[o]), int(self.point[o])

    @staticmethod
    def concat(parts: list["OptionRefs"]) -> "OptionRefs":
        """The options of ``parts`` one after the other."""
        offsets = np.cumsum([0] + [len(r.passes) for r in parts[:-1]])
        return OptionRefs([p for r in parts for p in r.passes],
                          np.concatenate([r.pass_index + off for r, off in zip(parts, offsets)]),
                          np.concatenate([r.last for r in parts]), np.concatenate([r.point for r in parts]))


ANY_VOCAB = "any"
"""Key of the merged vocab costs in ``any_vocab_floor``'s tables."""


def _least_vocab(costs: list[VocabCost]) -> VocabCost:
    """Per field, the least over one stage's VocabCosts (the deltas entry by entry)."""
    def least(arrays):
        return None if arrays[0] is None else np.min(np.stack(arrays), axis=0)
    return replace(costs[0], time_s=min(c.time_s for c in costs), tail_s=min(c.tail_s for c in costs),
                   memory_bytes=min(c.memory_bytes for c in costs), temp_bytes=min(c.temp_bytes for c in costs),
                   first_delta=least([c.first_delta for c in costs]), last_delta=least([c.last_delta for c in costs]))


def _time_twins(stages: list[StageTables]) -> list[int]:
    """[k] the first stage whose time_s, tail_s and trans_s equal stage k's."""
    out: list[int] = []
    for k, st in enumerate(stages):
        out.append(next(j for j in range(k + 1) if all(
            np.array_equal(getattr(stages[j], f), getattr(st, f), equal_nan=True) for f in ("time_s", "tail_s", "trans_s"))))
    return out


def _columns(options: list) -> tuple[np.ndarray, ...]:
    """``_segment``'s (g, T, D, point) options as four columns."""
    return tuple(np.array([o[i] for o in options], dtype=dt) for i, dt in enumerate((int, float, float, int)))


def _padded(x: np.ndarray, rows: int) -> np.ndarray:
    """``x`` [r, ...] with rows r..rows-1 added as inf."""
    return np.concatenate((x, np.full((rows - len(x),) + x.shape[1:], np.inf)))


def _merge(runs: list) -> tuple[list[StageOptions], list["OptionRefs"]]:
    opts, refs = [], []
    for k in range(len(runs[0][0])):
        parts = [r[0][k] for r in runs]
        opts.append(StageOptions(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("a", "b", "g", "T", "D"))))
        refs.append(OptionRefs.concat([r[1][k] for r in runs]))
    return opts, refs


MIXED_TAIL_CAPS = 17
"""Fast mode's mixed-weight partition search tries every distinct tail cap when there are at most
MIXED_ALL_TAILS of them, else this many (quantiles of the options' tails) plus the tails of the
best single-weight plan."""
MIXED_ALL_TAILS = 400


def _coarse_levels(levels: np.ndarray, stages: list[StageTables], count: int) -> tuple:
    """Fewer temporary-buffer levels: each layer's temporary rounded UP to one of ``count``
    values (quantiles of the distinct ones, the largest kept), so plans stay within budget and
    the Pareto pruning compares fewer levels. Exactness is lost only for plans whose largest
    temporary would be rounded up across the budget."""
    pick = np.unique(np.quantile(levels, np.linspace(0, 1, count), method="higher"))

    def up(x: np.ndarray) -> np.ndarray:
        idx = np.minimum(np.searchsorted(pick, x, side="left"), len(pick) - 1)
        return np.where(np.isfinite(x), pick[idx], x)

    return pick, [replace(st, temp_bytes=up(st.temp_bytes)) for st in stages]


def _round_up(x: np.ndarray, g: float) -> np.ndarray:
    return np.where(np.isfinite(x), np.ceil(x / g) * g, x)


def _rounded(st: StageTables, g: float) -> StageTables:
    """Galvatron's bins: every layer's memory rounded up to whole multiples of ``g`` bytes."""
    return replace(st, memory_bytes=_round_up(st.memory_bytes, g), temp_bytes=_round_up(st.temp_bytes, g))
