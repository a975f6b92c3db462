"""Cost tables of one Combo, built from the cost model's per-layer answers (cached per cost model).

Every number a planner adds up comes from the same calls ``CostModel.plan_cost`` makes, so the
planners' objective is plan_cost's formula exactly (tests re-score every plan to check this).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from cost_models import CostModel, in_flight
from cost_models.memo import hash_once
from planners.deadline import check
from planners.space import Combo, SearchSpace, VocabChoice, layer_allows
from specs import DPType, LayerSpec, LayerStrategy, ModelSpec, Plan, even_stage_layers
from specs.axes import EPDispatcher
from specs.stack import SoftwareStack

_CACHES: "weakref.WeakKeyDictionary[CostModel, dict]" = weakref.WeakKeyDictionary()


def memo(cost_model: CostModel) -> dict:
    """Memo of cost-model calls, kept as long as the cost model lives (shared across budgets)."""
    if cost_model not in _CACHES:
        _CACHES[cost_model] = {}
    return _CACHES[cost_model]


@dataclass
class StageTables:
    """Arrays of one pipeline stage, indexed [layer type, strategy] (and [type, from, to])."""

    first_rank: int
    in_flight: int
    time_s: np.ndarray
    """Per-micro-batch time of a layer (inf where the strategy is not allowed)."""
    tail_s: np.ndarray
    """Per-iteration tail of a layer."""
    memory_bytes: np.ndarray
    """States + in-flight activations of a layer."""
    temp_bytes: np.ndarray
    """Temporary buffers of a layer (the stage counts the largest)."""
    activation_bytes: np.ndarray | None
    """Of memory_bytes, the activations of one micro-batch in flight (memory_bytes = states +
    in_flight x these) for a cost model whose memory is linear in the in-flight count; else None."""
    trans_s: np.ndarray | None = None
    """[producer type, from strategy, to strategy]: relayout between consecutive layers (None in
    layer tables: build_layer_tables)."""
    send_next_s: np.ndarray | None = None
    """[type, strategy]: p2p of this layer's output to the next stage (0 on the last stage; None
    in layer tables)."""
    send_prev_s: np.ndarray | None = None
    """[type, strategy]: the gradient of this layer's output sent back to it from the next stage
    (a term of the NEXT stage's time; None in layer tables)."""
    classes: dict = field(default_factory=dict, compare=False, repr=False)
    """[type] -> (source, target) relayout classes (``relayout_classes``), and ("finite", type) ->
    ``finite_relayouts``, computed once (shared by the stages of a group whose relayouts are the
    same table)."""
    classes_from: "StageTables | None" = field(default=None, compare=False, repr=False)
    """Tables whose relayouts these scale by a positive factor (the Lagrangian's priced tables):
    their classes serve (equal rows stay equal when scaled)."""

    def relayout_classes(self, ty: int) -> tuple[np.ndarray, np.ndarray]:
        """Class of each strategy by its relayout row (as a source) and column (as a target) for
        layer type ``ty``: strategies of one class move activations alike."""
        base = self.classes_from or self
        if ty not in base.classes:
            R = base.finite_relayouts(ty)
            _, src = np.unique(R, axis=0, return_inverse=True)
            _, dst = np.unique(R, axis=1, return_inverse=True)
            base.classes[ty] = (src.ravel(), dst.ravel())
        return base.classes[ty]

    def finite_relayouts(self, ty: int) -> np.ndarray:
        """trans_s[ty] with 0 where it is infinite (a strategy not allowed), computed once and
        kept with the classes (read only); tables whose relayouts are scaled from others' (which
        may share their classes) compute theirs each time."""
        R = self.trans_s[ty]
        if self.classes_from is not None:
            return np.where(np.isfinite(R), R, 0.0)
        if ("finite", ty) not in self.classes:
            self.classes["finite", ty] = np.where(np.isfinite(R), R, 0.0)
        return self.classes["finite", ty]


@dataclass
class VocabCost:
    """Embedding/head on one stage under one vocab tp.

    ``vocab_cost`` gives the embedding the dp type of the model's first layer and the head that
    of its last layer, so the cost splits into a base (all layers DDP) plus per-strategy deltas
    attached to layer 0 (on stage 0) and to the last layer (on the last stage).
    """

    time_s: float
    tail_s: float
    memory_bytes: float
    """States and activations."""
    temp_bytes: float
    first_delta: np.ndarray | None = None
    """[strategy, (T, D, memory)] added when layer 0 runs under that strategy (stage 0 only)."""
    last_delta: np.ndarray | None = None
    """[strategy, (T, D, memory)] added when the last layer runs under that strategy (last stage)."""

@dataclass
class ComboTables:
    """Everything a planner needs for one Combo."""

    combo: Combo
    """The group's global batch, pp, micro-batches and schedule (its vocab_tp is the first of ``vocab``)."""
    strategies: list[LayerStrategy]
    types: list
    """Distinct LayerSpecs, in order of first appearance."""
    layer_type: np.ndarray
    """Type index of each layer."""
    allowed: np.ndarray
    """[type, strategy] bool."""
    stages: list[StageTables]
    vocab: dict[VocabChoice, list[VocabCost]]
    """embedding/head choice -> one VocabCost per stage (empty in layer tables: build_layer_tables)."""
    budget_bytes: float
    """Memory a stage may use, runtime overhead already taken off."""
    dp_values: list[int]
    """Distinct dp degrees of the strategies."""
    overhead_bytes: float = 0.0
    """The cost model's runtime overhead (already taken off budget_bytes)."""
    overlap_stack: SoftwareStack | None = None
    """The stack whose TP communication overlap the layer times assume (SearchSpace.overlaps_tp_comm:
    each layer's hidden TP time taken off, LayerTime.overlapped_micro_batch_s), which the group's
    plans with a tp > 1 layer state with tp_comm_overlap on; None: no overlap."""
    ep_dispatcher: str = EPDispatcher.ALL_TO_ALL
    """The expert dispatcher the layer times assume (SearchSpace.dispatcher), which the group's
    plans with an ep > 1 layer state."""
    shared: dict = field(default_factory=dict, compare=False, repr=False)
    """Answers that do not depend on the budget (memory-blind bounds), computed once per search
    (one budget) and seen by every GroupDP over these tables (``replace`` keeps the same dict).
    Not kept across searches: a search's work (states_explored) then does not depend on which
    searches ran before in the same process, so a sweep's records are the same with any number
    of workers."""

    def plan(self, choice: list[int], stage_layers: list[int], vocab: VocabChoice, meta: dict) -> Plan:
        """The Plan that picks strategy index ``choice[l]`` for layer l and ``vocab`` for the
        embedding/head."""
        c = self.combo
        layers = tuple(self.strategies[i] for i in choice)
        overlap = self.overlap_stack is not None and any(s.tp > 1 for s in layers)
        dispatched = self.ep_dispatcher != EPDispatcher.ALL_TO_ALL and any(s.ep > 1 for s in layers)
        return Plan(pp=c.pp, stage_layers=tuple(stage_layers), layers=layers,
                    global_batch=c.global_batch, micro_batches=c.micro_batches, schedule=c.schedule,
                    vocab_tp=vocab.tp, vocab_zero3=vocab.zero3, vocab_sp=vocab.sp,
                    **({"tp_comm_overlap": True, "stack": self.overlap_stack} if overlap else {}),
                    **({"ep_dispatcher": self.ep_dispatcher} if dispatched else {}), **meta)


def temp_levels(t: ComboTables) -> np.ndarray:
    """The group's distinct temporary sizes (every stage's layers, every embedding/head, and 0),
    sorted: a Pareto point's level indexes them."""
    vocab = [np.array([vc.temp_bytes for vc in v]) for v in t.vocab.values()]
    return np.unique(np.concatenate([layer_temp_levels(t)] + vocab))


def layer_temp_levels(t: ComboTables) -> np.ndarray:
    """The distinct temporary sizes of the group's layers (every stage's) and 0, sorted: what the
    largest temporary of some layers can be, whatever the embedding/head (so that sums of layers
    indexed by them serve every vocab choice)."""
    vals = [s.temp_bytes[np.isfinite(s.temp_bytes)] for s in t.stages]
    return np.unique(np.concatenate(vals + [np.zeros(1)]))


def build_tables(model: ModelSpec, cost_model: CostModel, combo: Combo, vocab_tps: list[VocabChoice],
                 space: SearchSpace, budget_bytes: float, deadline: float | None = None) -> ComboTables:
    """Query the cost model (through the cache) for every layer type x strategy of ``combo``'s
    (global batch, pp, micro-batches), and the embedding/head under each of ``vocab_tps``: the
    layer tables (build_layer_tables) completed with the relayouts, the pipeline sends and the
    vocabulary. The tables do not depend on the budget: built once per cost model and shared by
    every budget and planner of a run (planners read them, never write them); each call gets its
    own ``shared`` memo (ComboTables.shared). Past ``deadline`` (time.monotonic) the build stops
    with DeadlinePassed before the next layer-time or relayout question the cache cannot answer,
    or between stages and vocab choices (the cost model's answers so far stay cached)."""
    key = ("tables", model, combo, tuple(vocab_tps), space)
    cache = memo(cost_model)
    if key not in cache:
        layers = build_layer_tables(model, cost_model, combo, space, budget_bytes, deadline)
        cache[key] = _complete(model, cost_model, layers, vocab_tps, deadline)
        arrays = {id(st.trans_s): st.trans_s.nbytes for st in cache[key].stages}
        cache[TABLE_BYTES] = cache.get(TABLE_BYTES, 0.0) + sum(arrays.values())
    return replace(cache[key], budget_bytes=budget_bytes - cost_model.runtime_overhead_bytes, shared={})


def build_layer_tables(model: ModelSpec, cost_model: CostModel, combo: Combo, space: SearchSpace,
                       budget_bytes: float, deadline: float | None = None) -> ComboTables:
    """``combo``'s tables of the layers alone: per stage their time, tail, memory and temporaries
    (no relayouts, sends or vocabulary: build_tables adds them), what the uniform plans of the
    other schedules and a layers-only bound read. Cached and stopped by ``deadline`` as
    build_tables."""
    key = ("layer tables", model, combo, space)
    cache = memo(cost_model)
    if key not in cache:
        cache[key] = _layer_tables(model, cost_model, combo, space, deadline)
    return replace(cache[key], budget_bytes=budget_bytes - cost_model.runtime_overhead_bytes, shared={})


def is_built(model: ModelSpec, cost_model: CostModel, combo: Combo, vocab_tps: list[VocabChoice],
             space: SearchSpace) -> bool:
    """Whether build_tables would answer from the cost model's cache."""
    return ("tables", model, combo, tuple(vocab_tps), space) in memo(cost_model)


def cached_table_bytes(cost_model: CostModel) -> float:
    """Bytes the relayout tables cached for ``cost_model`` hold (build_tables counts them)."""
    return memo(cost_model).get(TABLE_BYTES, 0.0)


TABLE_BYTES = ("table bytes",)
"""The memo key under which build_tables adds up the relayout tables it caches."""


def relayout_table_bytes(model: ModelSpec, cost_model: CostModel, space: SearchSpace, pp: int) -> float:
    """Bytes of one group's relayout tables at ``pp``: a [type, from, to] float64 array per distinct
    stage-local rank (canonical_first_rank), quadratic in the strategies per stage."""
    gpus = cost_model.cluster.world_size // pp
    strategies = len(space.stage_strategies(gpus, model))
    ranks = {canonical_first_rank(cost_model, k * gpus, gpus) for k in range(pp)}
    return len(model.layer_types()) * strategies ** 2 * 8.0 * len(ranks)


def _layer_tables(model: ModelSpec, cost_model: CostModel, combo: Combo, space: SearchSpace,
                  deadline: float | None) -> ComboTables:
    gpus = cost_model.cluster.world_size // combo.pp
    strategies = space.stage_strategies(gpus, model)
    types = model.layer_types()
    index = {t: i for i, t in enumerate(types)}
    layer_type = np.array([index[l] for l in model.layers])
    allowed = np.array([[layer_allows(t, s, combo.global_batch, combo.micro_batches) for s in strategies]
                        for t in types])
    shared = {"mbs": _micro_batch_sizes(combo, strategies), "overlap": space.overlaps_tp_comm,
              "dispatcher": space.dispatcher}
    stages = []
    for k in range(combo.pp):
        check(deadline)
        stages.append(_stage(cost_model, combo, types, strategies, allowed, k, gpus, shared, deadline))
    return ComboTables(combo=combo, strategies=strategies, types=types, layer_type=layer_type,
                       allowed=allowed, stages=stages, vocab={}, budget_bytes=np.inf,
                       dp_values=sorted({s.dp for s in strategies}),
                       overhead_bytes=cost_model.runtime_overhead_bytes,
                       overlap_stack=cost_model.stack if space.overlaps_tp_comm else None,
                       ep_dispatcher=space.dispatcher)


def _complete(model: ModelSpec, cost_model: CostModel, t: ComboTables, vocab_tps: list[VocabChoice],
              deadline: float | None) -> ComboTables:
    """Layer tables ``t`` with each stage's relayouts and sends and the vocabulary under each of
    ``vocab_tps``."""
    combo, strategies = t.combo, t.strategies
    shared: dict = {"mbs": _micro_batch_sizes(combo, strategies), "layouts": layout_classes(strategies),
                    "dp_types": dp_type_classes(strategies)}
    stages = []
    for st in t.stages:
        check(deadline)
        stages.append(_stage_moves(cost_model, combo, t.types, strategies, t.allowed, st, shared, deadline))
    vocab = {}
    for v in vocab_tps:
        check(deadline)
        vocab[v] = _vocab_stages(cost_model, model, replace(combo, vocab=v), strategies, shared)
    return replace(t, stages=stages, vocab=vocab)


def _micro_batch_sizes(combo: Combo, strategies: list[LayerStrategy]) -> np.ndarray:
    """Each strategy's micro-batch size in ``combo``."""
    return np.array([_mbs(combo, s) for s in strategies])


def _mbs(combo: Combo, s: LayerStrategy) -> int:
    return max(1, combo.global_batch // (s.dp * combo.micro_batches))


def canonical_first_rank(cm: CostModel, first: int, gpus: int) -> int:
    """An equivalent first rank for a stage of ``gpus`` ranks starting at ``first``: 0 for whole
    scale-up domains (nodes, or NVLink racks) starting at a domain boundary, the same place in
    domain 0 for a stage inside one domain (domains are identical), else ``first`` itself. Only
    for cost models that declare ``rank_symmetric`` (tested against the true ranks); any other is
    asked at the true ranks."""
    if not cm.rank_symmetric:
        return first
    per_node = cm.cluster.domain_gpus
    if first % per_node == 0 and gpus % per_node == 0:
        return 0
    if first % per_node + gpus <= per_node:
        return first % per_node
    return first


def node_shift(cm: CostModel, first: int) -> int:
    """Whole scale-up domains' worth of ranks a question about ranks from ``first`` on may be
    moved down by (to domain 0) without changing its answer: domains are identical, so for a cost
    model that declares ``rank_symmetric`` every rank can move by the same number of domains (a
    node unless the cluster's NVLink domain spans nodes); 0 otherwise."""
    if not cm.rank_symmetric:
        return 0
    return first - first % cm.cluster.domain_gpus


def layout_key(s: LayerStrategy) -> tuple:
    """What a relayout between two layers depends on (CostModel.transition_time: the strategies'
    tp, dp and rank layout; the sequence split shapes the activation too); dp type, recompute
    and the expert fields (the experts hand tokens back in the layer's layout) do not."""
    return (s.tp, s.cp, s.ulysses, s.dp, s.tp_consecutive, s.sp)


def layout_classes(strategies: list[LayerStrategy]) -> tuple[np.ndarray, list[int]]:
    """Class index of each strategy by layout_key, and one representative strategy per class."""
    index: dict[tuple, int] = {}
    cls = np.array([index.setdefault(layout_key(s), len(index)) for s in strategies])
    reps = [int(np.flatnonzero(cls == c)[0]) for c in range(len(index))]
    return cls, reps


def dp_type_classes(strategies: list[LayerStrategy]) -> tuple[np.ndarray, list[str]]:
    """Index of each strategy's dp type in the sorted list of the dp types they use, and that list."""
    types = sorted({s.dp_type for s in strategies})
    index = {d: i for i, d in enumerate(types)}
    return np.array([index[s.dp_type] for s in strategies], dtype=int), types


def _stage(cm: CostModel, combo: Combo, types: list, strategies: list[LayerStrategy], allowed: np.ndarray,
           k: int, gpus: int, shared: dict, deadline: float | None) -> StageTables:
    """Stage k's layer tables. Its layer times depend on the stage only through its (canonical)
    first rank, its memory only through its in-flight count: ``shared`` (one dict per group,
    holding each strategy's micro-batch size) keeps both parts for the group's other stages.
    ``deadline`` is checked before each layer-time question the cache cannot answer."""
    first = k * gpus
    local = canonical_first_rank(cm, first, gpus)
    held = in_flight(combo.schedule, combo.pp, k, combo.micro_batches)
    mbs = shared["mbs"]
    if ("local", local) not in shared:
        shared["local", local] = _stage_times(cm, combo, types, strategies, allowed, mbs, local,
                                              (shared["overlap"], shared["dispatcher"]),
                                              deadline)
    if ("memory", held) not in shared:
        shared["memory", held] = _stage_memory(cm, combo, types, strategies, allowed, mbs, held, shared)
    (time_s, tail_s), (memory, temp) = shared["local", local], shared["memory", held]
    activations = shared["per_micro_batch"][1] if cm.linear_in_flight else None
    return StageTables(first_rank=first, in_flight=held, time_s=time_s, tail_s=tail_s, memory_bytes=memory,
                       temp_bytes=temp, activation_bytes=activations)


def _stage_moves(cm: CostModel, combo: Combo, types: list, strategies: list[LayerStrategy], allowed: np.ndarray,
                 st: StageTables, shared: dict, deadline: float | None) -> StageTables:
    """Layer tables ``st`` of one stage with its relayouts (which depend on the stage only through
    its canonical first rank: ``shared``, the group's dict with the strategies' micro-batch sizes
    and layout classes, keeps them for the other stages) and its sends to the next stage.
    ``deadline`` is checked before each relayout question the cache cannot answer, and between
    layer types."""
    gpus = cm.cluster.world_size // combo.pp
    first, mbs = st.first_rank, shared["mbs"]
    local = canonical_first_rank(cm, first, gpus)  # stage-local questions; sends keep the true ranks
    if ("trans", local) not in shared:
        shared["trans", local] = _stage_relayouts(cm, combo, types, strategies, allowed, mbs, shared["layouts"],
                                                  local, deadline)
    send_next, send_prev = np.zeros(st.time_s.shape), np.zeros(st.time_s.shape)
    if first // gpus < combo.pp - 1:
        cache = memo(cm)
        for ti, layer in enumerate(types):
            check(deadline)
            if ("messages", ti) not in shared:
                shared["messages", ti] = _by_message(cm, layer, strategies, allowed[ti], mbs)
            src = first - node_shift(cm, first)  # the same pair of stages, moved by whole nodes
            for msg, cols in shared["messages", ti].items():
                s, b = strategies[cols[0]], int(mbs[cols[0]])
                send_next[ti, cols] = _send(cm, cache, msg, layer, s, b, src, src + gpus, gpus)
                send_prev[ti, cols] = _send(cm, cache, msg, layer, s, b, src + gpus, src, gpus)
    return replace(st, trans_s=shared["trans", local], send_next_s=send_next, send_prev_s=send_prev,
                   classes=shared.setdefault(("classes", local), {}))  # one per trans


def _by_message(cm: CostModel, layer: LayerSpec, strategies: list[LayerStrategy], allowed: np.ndarray,
                mbs: np.ndarray) -> dict:
    """Pipeline message -> the allowed strategies whose output crosses a stage boundary as it."""
    out: dict = {}
    for si in np.flatnonzero(allowed):
        out.setdefault(cm.pipeline_message(layer, strategies[si], int(mbs[si])), []).append(si)
    return out


def _stage_times(cm: CostModel, combo: Combo, types: list, strategies: list[LayerStrategy], allowed: np.ndarray,
                 mbs: np.ndarray, local: int, choices: tuple[bool, str], deadline: float | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """[type, strategy] per-micro-batch time (LayerTime.overlapped_micro_batch_s: as plan_cost
    charges it under the space's ``choices``, its TP communication overlap and expert dispatcher)
    and tail, asked at ``local``."""
    cache = memo(cm)
    time_s, tail_s = np.full((len(types), len(strategies)), np.inf), np.full((len(types), len(strategies)), np.inf)
    for ti, layer in enumerate(types):
        for si in np.flatnonzero(allowed[ti]):
            key = ("lt", layer, strategies[si], int(mbs[si]), combo.micro_batches, local)
            lt = cache.get(key)
            if lt is None:
                check(deadline)
                lt = cache[key] = cm.layer_time(layer, strategies[si], int(mbs[si]), combo.micro_batches, local)
            time_s[ti, si], tail_s[ti, si] = lt.overlapped_micro_batch_s(*choices), lt.tail_s
    return time_s, tail_s


def _stage_relayouts(cm: CostModel, combo: Combo, types: list, strategies: list[LayerStrategy],
                     allowed: np.ndarray, mbs: np.ndarray, layouts: tuple[np.ndarray, list[int]], local: int,
                     deadline: float | None) -> np.ndarray:
    """[type, from, to] relayouts (over the strategies' ``layouts``: layout_classes), asked at ``local``."""
    cache = memo(cm)
    ns = len(strategies)
    trans = np.full((len(types), ns, ns), np.inf)
    cls, reps = layouts
    for ti, layer in enumerate(types):
        rows = allowed[ti]
        if rows.any():
            small = _trans_classes(cm, cache, layer, combo, strategies, reps, local, deadline)
            trans[ti][rows] = small[cls[rows]][:, cls]
    return trans


def _stage_memory(cm: CostModel, combo: Combo, types: list, strategies: list[LayerStrategy], allowed: np.ndarray,
                  mbs: np.ndarray, held: float, shared: dict) -> tuple[np.ndarray, np.ndarray]:
    """[type, strategy] states + ``held`` micro-batches' activations, and temporaries. A cost model
    whose memory is linear in the in-flight count (``CostModel.linear_in_flight``) is asked once
    per group, at one micro-batch in flight."""
    if cm.linear_in_flight:
        if "per_micro_batch" not in shared:
            shared["per_micro_batch"] = _memory_parts(cm, combo, types, strategies, allowed, mbs, 1)
        states, activations, temp = shared["per_micro_batch"]
        return states + held * activations, temp
    states, activations, temp = _memory_parts(cm, combo, types, strategies, allowed, mbs, held)
    return states + activations, temp


def _memory_parts(cm: CostModel, combo: Combo, types: list, strategies: list[LayerStrategy], allowed: np.ndarray,
                  mbs: np.ndarray, held: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[type, strategy] states, activations of ``held`` micro-batches, temporaries (inf where not allowed)."""
    cache = memo(cm)
    parts = [np.full((len(types), len(strategies)), np.inf) for _ in range(3)]
    for ti, layer in enumerate(types):
        for si in np.flatnonzero(allowed[ti]):
            key = ("lm", layer, strategies[si], int(mbs[si]), held, combo.micro_batches)
            lm = cache.get(key)
            if lm is None:
                lm = cache[key] = cm.layer_memory_in(layer, strategies[si], int(mbs[si]), held, combo.micro_batches)
            parts[0][ti, si], parts[1][ti, si], parts[2][ti, si] = lm.states_bytes, lm.activations_bytes, lm.temporary_bytes
    return parts[0], parts[1], parts[2]


def _trans_classes(cm: CostModel, cache: dict, layer, combo: Combo, strategies: list[LayerStrategy],
                   reps: list[int], first: int, deadline: float | None) -> np.ndarray:
    """[from class, to class] relayout times of ``layer``'s output, one call per layout pair
    (``deadline`` checked before each call the cache cannot answer)."""
    out = np.zeros((len(reps), len(reps)))
    layouts = [(layout_key(strategies[i]), _layout(strategies[i])) for i in reps]
    for a, (src_key, src) in enumerate(layouts):
        mbs = _mbs(combo, src)
        for b, (dst_key, dst) in enumerate(layouts):
            key = ("tr", layer, src_key, dst_key, mbs, first)
            value = cache.get(key)
            if value is None:
                check(deadline)
                value = cache[key] = cm.transition_time(layer, src, dst, mbs, first)
            out[a, b] = value
    return out


@lru_cache(maxsize=65536)
def _layout(s: LayerStrategy) -> LayerStrategy:
    """What a relayout depends on: the expert fields do not change a layer's output layout."""
    return replace(s, ep=1, expert_tp=0, expert_dp_type=None) if s.has_expert_split else s


def _send(cm: CostModel, cache: dict, msg, layer: LayerSpec, s: LayerStrategy, mbs: int, src: int, dst: int,
          senders: int) -> float:
    key = ("send", msg, src, dst, senders)
    if key not in cache:
        cache[key] = cm.pipeline_send_time(layer, s, mbs, src, dst, senders)
    return cache[key]


def _vocab_stages(cm: CostModel, model: ModelSpec, combo: Combo, strategies: list[LayerStrategy],
                  shared: dict) -> list[VocabCost]:
    """One VocabCost per stage; for a rank-symmetric cost model the stages that hold neither the
    embedding nor the head are alike (its contract), so they share one answer. ``shared``: the
    group's dict (_stage)."""
    out, middle = [], None
    for k in range(combo.pp):
        if 0 < k < combo.pp - 1 and cm.rank_symmetric:
            middle = middle or _vocab(cm, model, combo, k, strategies, shared)
            out.append(middle)
        else:
            out.append(_vocab(cm, model, combo, k, strategies, shared))
    return out


def _vocab(cm: CostModel, model: ModelSpec, combo: Combo, stage: int, strategies: list[LayerStrategy],
           shared: dict) -> VocabCost:
    """vocab_cost under probe plans: all layers DDP (the base), then layer 0 / the last layer
    under each dp type (the deltas; shared["dp_types"]: dp_type_classes of the strategies)."""
    base = _vocab_probe(cm, model, combo, stage, DPType.DDP, DPType.DDP)
    cls, types = shared["dp_types"]
    out = VocabCost(time_s=base[0], tail_s=base[1], memory_bytes=base[2], temp_bytes=base[3])
    if stage == 0:
        delta = np.array([_delta(_vocab_probe(cm, model, combo, stage, d, DPType.DDP), base) for d in types])
        out.first_delta = delta[cls] + _relayout_delta(cm, model, combo, 0, strategies, shared)
    if stage == combo.pp - 1:
        delta = np.array([_delta(_vocab_probe(cm, model, combo, stage, DPType.DDP, d), base) for d in types])
        out.last_delta = delta[cls] + _relayout_delta(cm, model, combo, model.num_layers - 1, strategies, shared)
    return out


def _relayout_delta(cm: CostModel, model: ModelSpec, combo: Combo, index: int, strategies: list[LayerStrategy],
                    shared: dict) -> np.ndarray:
    """[strategy, (T, 0, 0)] (read only): the relayout between the vocabulary's layout and layer
    ``index`` under each strategy, less the probe layer's (which the base holds); computed once
    per layout a strategy can have (shared["layouts"]: layout_classes) and micro-batch, and
    kept in the group's ``shared`` for the vocab choices that differ only in ZeRO-3
    (CostModel.vocab_relayout_time's contract)."""
    plan = _cached_probe_plan(cm, model, combo, DPType.DDP, DPType.DDP)
    own = plan.vocab_in_own_layout(model, cm.cluster.world_size // combo.pp)
    group_key = ("vocab relayout", combo.vocab.tp, combo.vocab.sp, own, index)
    if group_key not in shared:
        shared[group_key] = _layout_relayouts(cm, model, combo, index, strategies, shared["layouts"], plan, own)
    return shared[group_key]


def _layout_relayouts(cm: CostModel, model: ModelSpec, combo: Combo, index: int, strategies: list[LayerStrategy],
                      layouts: tuple[np.ndarray, list[int]], plan: Plan, own: bool) -> np.ndarray:
    """_relayout_delta's array, each layout's relayout cached per cost model."""
    cache = memo(cm)
    common = ("vocab relayout", hash_once(model), combo.pp, combo.vocab.tp, combo.vocab.sp, own,
              combo.global_batch // combo.micro_batches, index)

    def relayout(s: LayerStrategy) -> float:
        key = common + layout_key(s)
        if key not in cache:
            cache[key] = cm.vocab_relayout_time(model, plan, index, s)
        return cache[key]

    probe = relayout(plan.layers[index])
    cls, reps = layouts
    out = np.zeros((len(strategies), 3))
    out[:, 0] = np.array([relayout(strategies[i]) - probe for i in reps])[cls]
    return out


def _delta(probe: np.ndarray, base: np.ndarray) -> np.ndarray:
    """(time, tail, memory) of ``probe`` less ``base``; 0 where the base is infinite (a vocab
    choice the cost model cannot score, already ruled out by its base; inf - inf is no number)."""
    return np.subtract(probe[:3], base[:3], out=np.zeros(3), where=np.isfinite(base[:3]))


def _vocab_probe(cm: CostModel, model: ModelSpec, combo: Combo, stage: int, first: str, last: str
                 ) -> np.ndarray:
    cache = memo(cm)
    key = ("vocab", hash_once(model), combo, stage, first, last)
    if key not in cache:
        plan = _cached_probe_plan(cm, model, combo, first, last)
        lt, mem = cm.vocab_cost(model, plan, stage, cm.cluster.world_size)
        cache[key] = np.array([lt.micro_batch_s, lt.tail_s, mem.states_bytes + mem.activations_bytes,
                               mem.temporary_bytes])
    return cache[key]


def _cached_probe_plan(cm: CostModel, model: ModelSpec, combo: Combo, first: str, last: str) -> Plan:
    """_probe_plan, once per cost model (the same probe plan serves every stage)."""
    cache = memo(cm)
    key = ("probe", hash_once(model), combo, first, last)
    if key not in cache:
        cache[key] = _probe_plan(model, combo, cm.cluster.world_size, first, last)
    return cache[key]


def _probe_plan(model: ModelSpec, combo: Combo, world: int, first: str, last: str) -> Plan:
    n, pp = model.num_layers, combo.pp
    gpus = world // pp
    stage_layers = even_stage_layers(n, pp)
    layers = [_probe_strategy(gpus, DPType.DDP)] * n
    layers[-1] = _probe_strategy(gpus, last)
    layers[0] = _probe_strategy(gpus, first)
    return Plan(pp=pp, stage_layers=stage_layers, layers=tuple(layers), global_batch=combo.global_batch,
                micro_batches=combo.micro_batches, schedule=combo.schedule, vocab_tp=combo.vocab.tp,
                vocab_zero3=combo.vocab.zero3, vocab_sp=combo.vocab.sp)


@lru_cache(maxsize=1024)
def _probe_strategy(gpus: int, dp_type: str) -> LayerStrategy:
    """A probe plan's layer: plain data parallelism over the stage's ``gpus`` under ``dp_type``."""
    return LayerStrategy(tp=1, dp=gpus, dp_type=dp_type if gpus > 1 else DPType.DDP)
