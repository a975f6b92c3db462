"""The search space every planner shares: Galvatron's decision tree, its pruning rules and switches.

A Combo is one outer-loop point (global batch, pp, micro-batches, vocab tp, schedule); within it
each layer picks one of ``strategies(...)``; the pipeline partition is chosen by the planner.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterator, NamedTuple

from cost_models.memo import HashOnce, hash_once
from specs import (DP_TYPES, SCHEDULES, MEGATRON_RECOMPUTE, ClusterSpec, CPComm, DPType, LayerSpec, LayerStrategy,
                   ModelSpec, Recompute, Schedule, SequenceParallel, SpecError)
from specs.axes import EPDispatcher
from specs.capabilities import OFF, ON, Capabilities
from specs.cluster import NVLINK_KINDS
from specs.hashing import cached_hash, without_cached_hash
from specs.precision import PRECISIONS, Precision, default_recipe, fp8_recipe, gpu_refusal, runnable_on
from specs.schedules import PipelineFormula, schedule_entry
from specs.stack import SoftwareStack, overlaps_tp_comm

DEGREE_RULES = ("powers_of_two", "divisors")
"""How degrees and micro-batch counts are enumerated: Galvatron's powers of two, or every divisor."""


def powers_of_two(limit: int) -> list[int]:
    out, p = [], 1
    while p <= limit:
        out.append(p)
        p *= 2
    return out


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Divisors of ``n`` up to ``limit`` (all when None), ascending."""
    top = n if limit is None else min(n, limit)
    return [d for d in range(1, top + 1) if n % d == 0]


CP_DEGREES = (1, 2, 4, 8, 16, 32)
"""Context-parallel degrees of the full preset: published long-context runs use 2-32
(Llama 3's 128k stage: 16)."""
CP_MIN_TOKENS = 4096
"""Tokens a cp rank keeps at least (SearchSpace.cp_min_tokens): smaller blocks leave each ring
step latency-bound, and no published run splits sequences finer (Llama 3's 128k stage keeps 8192
per rank; the 8192-token runs use no cp): cp 2 at 8192 tokens, up to 32 at 131072."""


class VocabChoice(NamedTuple):
    """The embedding/head strategy of a plan: tp degree, ZeRO-3 flag, sequence parallelism."""

    tp: int
    zero3: bool = False
    sp: str = "none"


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Which plans a planner may return."""

    max_tp: int = 8
    """Largest tensor-parallel degree (Galvatron: 8, one node)."""
    max_pp: int = 8
    """Largest pipeline degree."""
    pp_degrees: tuple[int, ...] | None = None
    """Explicit pipeline degrees; None: every power of two up to max_pp."""
    tp_degrees: tuple[int, ...] | None = None
    """Explicit tp degrees; None: every power of two up to max_tp."""
    dp_types: tuple[str, ...] = DP_TYPES
    """Data-parallel flavours a layer may use when its dp > 1."""
    recompute: tuple[str, ...] = (Recompute.NONE, Recompute.FULL)
    """Activation recomputation choices per layer (Recompute values)."""
    sp: tuple[str, ...] = (SequenceParallel.NONE,)
    """Sequence-parallel choices per layer (megatron and ulysses only where tp > 1)."""
    virtual_stages: tuple[int, ...] = (1,)
    """Interleaved 1F1B model chunks per rank; v > 1 is searched over uniform plans (one strategy
    for every layer, as Megatron runs it) in an even partition."""
    vocab_zero3: tuple[bool, ...] = (False,)
    """Embedding/head ZeRO-3 choices (Galvatron's embed_sdp); False follows the neighbouring layer."""
    vocab_sp: tuple[str, ...] = (SequenceParallel.NONE,)
    """Embedding/head sequence-parallel choices (where vocab tp > 1)."""
    degrees: str = "powers_of_two"
    """powers_of_two (Galvatron's pruning, the default) or divisors: every divisor of the stage
    for tp and vocab tp, of the world for pp, of the global batch for micro-batch counts."""
    tp_consecutive: tuple[bool, ...] = (True, False)
    """TP rank layouts tried when tp > 1 and dp > 1."""
    schedule: str = Schedule.ONE_F_ONE_B
    """Pipeline schedule of one chunk per rank and a whole backward (gpipe, 1f1b: the tables'
    linear objective is its formula; specs.schedules gives its micro-batch rule); the
    groups whose layers and micro-batches allow it are also tried under interleaved_1f1b with
    each ``virtual_stages`` > 1 when that schedule is 1f1b."""
    uniform_schedules: tuple[str, ...] = ()
    """Schedules tried besides ``schedule`` and interleaving, over uniform plans in Megatron's
    chunk layout, scored by plan_cost (zb_h1, zbv, dualpipev, looped_bfs): their bubble depends
    on the layers' W, which the tables' linear objective does not carry."""
    micro_batches: tuple[int, ...] | None = None
    """Explicit micro-batch counts; None: powers of two dividing the batch, up to max_micro_batches."""
    max_micro_batches: int = 64
    """Largest micro-batch count (default 64; the full preset lifts it to the global batch)."""
    micro_batch_degrees: str | None = None
    """How micro-batch counts are enumerated (one of DEGREE_RULES); None: as ``degrees``. The
    full preset takes every divisor of the global batch: Megatron's micro-batch size is a power
    of two, so counts like 96 (batch 1536 over dp 16 at size 1) are what people run."""
    vocab_tp: tuple[int, ...] | None = None
    """Explicit embedding/head tp degrees; None: degrees up to the stage size and max_tp (the
    vocabulary is padded as Megatron pads it, so it need not divide)."""
    expert_parallel: tuple[int, ...] | None = None
    """Expert-parallel degrees a MoE layer may take (ep carved out of its dp ranks, expert tp =
    the layer's weight tp, expert dp type = its dp type); None: every degree of the ``degrees``
    rule dividing the experts and the dp room; (1,): no expert parallelism. Dense models get
    no extra strategies either way."""
    expert_tp: tuple[int, ...] = (0,)
    """Expert tensor-parallel degrees tried with each ep > 1 (0 = the layer's weight tp, as
    Megatron-Core defaults; 1 = whole experts)."""
    cp: tuple[int, ...] = (1,)
    """Context-parallel degrees a layer may take (1 = none), each beside every tp (or Ulysses)
    degree whose product divides the stage; layer_allows keeps those whose 2 * cp chunks divide
    the sequence."""
    cp_comm: tuple[str, ...] = (CPComm.P2P, CPComm.A2A_P2P)
    """K/V exchanges tried with cp > 1: p2p beside tp, a2a+p2p beside Ulysses (the only type
    there), all_gather when listed (no preset lists it: it exposes all of its traffic and holds
    the whole sequence's K/V, and would double the cp strategies)."""
    cp_min_tokens: int = CP_MIN_TOKENS
    """cp degrees are tried only where each rank keeps at least this many tokens of the model's
    sequence (seq_len / cp >= it): below, a ring step's block is latency-bound."""
    precisions: tuple[str, ...] = (Precision.BF16,)
    """Precisions (specs.precision): bf16 and at most one FP8 recipe (a plan runs one); the
    planners drop what the cluster's GPU cannot run (``for_gpu``). Every preset is bf16: FP8 is
    searched when asked (``--precision search``, ``with_precision``), as the FP8 speed-up is the
    least validated term (over-predicted on the published pairs) and its searches are the slowest."""
    tp_comm_overlap: tuple[bool, ...] = (False,)
    """TP communication overlap (Plan.tp_comm_overlap) off and/or on. A plan makes the choice once,
    so each value is a search of its own (as ``precision_per=plan`` searches each precision); under
    on, a tp > 1 strategy takes Megatron-SP only and the tables take each layer's hidden TP time
    off (LayerTime.tp_hidden_s). Every preset but ``moe`` is off (on alone could lose their tp > 1
    plans without Megatron-SP, and both ways searches twice): asked for with ``with_tp_overlap``
    (--option galvatron.tp_comm_overlap=search); ``moe`` is on (its Megatron-Core recipes run
    Megatron-SP whenever tp > 1). ``within`` drops on for a cost model that cannot score it or
    whose stack does not run it (off is every consumer's)."""
    ep_dispatcher: tuple[str, ...] = (EPDispatcher.ALL_TO_ALL,)
    """Expert dispatchers (Plan.ep_dispatcher), each a search of its own as a plan makes the choice
    once; the tables charge each MoE layer's dispatch under it and the plans with an ep > 1 layer
    state it. Every preset is all_to_all; deepep is searched when asked (``with_ep_dispatcher``,
    --option galvatron.ep_dispatcher=deepep|search): with DeepEP's cheaper dispatch many more
    groups come close to the best, and DeepSeek-V3's search on 2048 H100 takes ~45 s against ~5 s
    and stops with a gap (docs/search.md). ``within`` keeps the dispatchers a consumer scores,
    ``for_cluster`` deepep only on NVLink nodes (all_to_all where none is left)."""

    def __post_init__(self) -> None:
        for name in ("max_tp", "max_pp", "max_micro_batches", "cp_min_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise SpecError(name, f"must be a positive integer, got {v!r}")
        bad = [t for t in self.dp_types if t not in DP_TYPES]
        if bad or not self.dp_types:
            raise SpecError("dp_types", f"must be a non-empty subset of {', '.join(DP_TYPES)}; got {self.dp_types!r}")
        flat = [s for s in SCHEDULES if schedule_entry(s).max_virtual_stages == 1
                and not schedule_entry(s).splits_backward]
        if self.schedule not in flat:
            raise SpecError("schedule", f"must be one of {', '.join(flat)} (interleaving is searched through "
                            f"virtual_stages, the others through uniform_schedules), got {self.schedule!r}")
        if any(s not in SCHEDULES for s in self.uniform_schedules):
            raise SpecError("uniform_schedules", f"must be among {', '.join(SCHEDULES)}, got {self.uniform_schedules!r}")
        if not self.recompute or not self.tp_consecutive or not self.sp or not self.virtual_stages:
            raise SpecError("recompute", "recompute, sp, virtual_stages and tp_consecutive need at least one choice")
        bad = [r for r in self.recompute if r not in tuple(Recompute)] + [x for x in self.sp + self.vocab_sp
                                                                          if x not in tuple(SequenceParallel)]
        if bad:
            raise SpecError("recompute/sp", f"unknown choice {bad[0]!r}")
        for name in ("degrees", "micro_batch_degrees"):
            rule = getattr(self, name)
            if rule not in DEGREE_RULES and not (name == "micro_batch_degrees" and rule is None):
                raise SpecError(name, f"must be one of {', '.join(DEGREE_RULES)}, got {rule!r}")
        if any(not isinstance(v, int) or v < 1 for v in self.virtual_stages):
            raise SpecError("virtual_stages", f"must be positive integers, got {self.virtual_stages!r}")
        if self.expert_parallel is not None and (not self.expert_parallel or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in self.expert_parallel)):
            raise SpecError("expert_parallel", f"must be positive integers (1 = no expert parallelism), "
                            f"got {self.expert_parallel!r}")
        if not self.cp or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in self.cp):
            raise SpecError("cp", f"must be positive integers (1 = no context parallelism), got {self.cp!r}")
        if not self.cp_comm or any(c not in tuple(CPComm) for c in self.cp_comm):
            raise SpecError("cp_comm", f"must be a non-empty subset of {', '.join(CPComm)}, got {self.cp_comm!r}")
        if not self.precisions or any(p not in PRECISIONS for p in self.precisions):
            raise SpecError("precisions", f"must be a non-empty subset of {', '.join(PRECISIONS)}, got {self.precisions!r}")
        fp8_recipe(self.precisions)
        if not self.tp_comm_overlap or any(not isinstance(v, bool) for v in self.tp_comm_overlap) \
                or len(set(self.tp_comm_overlap)) < len(self.tp_comm_overlap):
            raise SpecError("tp_comm_overlap", f"must be distinct booleans (off False, on True), got "
                            f"{self.tp_comm_overlap!r}")
        if not self.ep_dispatcher or any(d not in tuple(EPDispatcher) for d in self.ep_dispatcher) \
                or len(set(self.ep_dispatcher)) < len(self.ep_dispatcher):
            raise SpecError("ep_dispatcher", f"must be distinct members of {', '.join(EPDispatcher)}, got "
                            f"{self.ep_dispatcher!r}")
        if not self.expert_tp or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in self.expert_tp):
            raise SpecError("expert_tp", f"must be integers >= 0 (0 = the layer's tp), got {self.expert_tp!r}")

    # -- presets and switches -------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> "SearchSpace":
        """full (default: every dimension, caps lifted, context parallelism of CP_DEGREES where
        ranks keep cp_min_tokens), galvatron (the 2022 paper's: ddp+zero3,
        no checkpointing, no expert parallelism), galvatron2 (Galvatron-2's: ZeRO-1/2/3, full
        checkpointing, Megatron-SP and Ulysses per layer, Ulysses and ZeRO-3 for the vocabulary), classic (the 2022 space
        with every dp type and full checkpointing: this project's default before issue 15), dp+tp,
        dp+pp, 3d (tp x pp x dp, plain DDP), the pure dimensions dp, zero3, and moe (Megatron-Core's
        MoE dimensions per layer: ZeRO-1/2, Megatron-SP, none/selective/full recompute, interleaving,
        ep with expert tp = tp or 1). full searches every recompute, torchtitan's per-op policy
        (selective-op) only where the cost model prices it (within: an eager or compile stack); moe
        Megatron's (MEGATRON_RECOMPUTE). Every preset but galvatron searches expert parallelism on MoE
        layers (``expert_parallel`` None). Only full searches precision (bf16 or FP8 with current
        scaling per layer, where the GPU has an FP8 peak); the others are bf16."""
        classic = cls()
        paper = cls(dp_types=(DPType.DDP, DPType.ZERO3), recompute=(Recompute.NONE,), expert_parallel=(1,))
        galvatron2 = replace(classic, sp=tuple(SequenceParallel), vocab_zero3=(False, True),
                             vocab_sp=(SequenceParallel.NONE, SequenceParallel.ULYSSES))
        full = replace(galvatron2, recompute=tuple(Recompute), vocab_sp=tuple(SequenceParallel),
                       virtual_stages=(1, 2, 4), max_pp=1 << 20, max_micro_batches=1 << 20,
                       micro_batch_degrees="divisors", expert_tp=(0, 1), cp=CP_DEGREES,
                       uniform_schedules=(Schedule.ZB_H1, Schedule.ZBV, Schedule.DUALPIPE_V))
        # Megatron-Core's MoE dimensions per layer: the megatron_moe grid, pp up to the layer
        # count and micro-batches uncapped as in it (until 2026-12-03 classic's caps, pp 8 and
        # 64 micro-batches, which kept megatron_moe's pp 32 DeepSeek-V3 plan out of reach); TP
        # communication overlap on, as its MoE recipes run tp > 1 (Megatron-SP whenever tp > 1,
        # Megatron-Core's MoELayer refuses to train tp > 1 without it)
        moe = replace(classic, dp_types=(DPType.ZERO1, DPType.ZERO2), recompute=MEGATRON_RECOMPUTE,
                      sp=(SequenceParallel.NONE, SequenceParallel.MEGATRON), tp_consecutive=(True,),
                      virtual_stages=(1, 2, 4), vocab_sp=(SequenceParallel.NONE, SequenceParallel.MEGATRON),
                      expert_tp=(0, 1), max_pp=1 << 20, max_micro_batches=1 << 20, tp_comm_overlap=(True,))
        presets = {
            "full": full, "moe": moe, "galvatron": paper, "galvatron2": galvatron2, "classic": classic,
            "dp+tp": replace(classic, pp_degrees=(1,), dp_types=(DPType.DDP,)),
            "dp+pp": replace(classic, tp_degrees=(1,), dp_types=(DPType.DDP,)),
            "3d": replace(classic, dp_types=(DPType.DDP,)),
            "dp": replace(classic, pp_degrees=(1,), tp_degrees=(1,), dp_types=(DPType.DDP,)),
            "zero3": replace(classic, pp_degrees=(1,), tp_degrees=(1,), dp_types=(DPType.ZERO3,)),
        }
        if name not in presets:
            raise SpecError("space", f"unknown preset {name!r}; choose from {', '.join(presets)}")
        return presets[name]

    def for_target(self, name: str) -> "SearchSpace":
        """This space restricted to what framework ``name`` runs (planners.targets.TARGETS)."""
        from planners.targets import target_space
        return target_space(name, self)

    def widened(self, *, zero2: bool = False, checkpoint: bool = False) -> "SearchSpace":
        """The same space plus ZeRO-2 and/or full activation checkpointing."""
        out = self
        if zero2 and DPType.ZERO2 not in out.dp_types:
            out = replace(out, dp_types=out.dp_types + (DPType.ZERO2,))
        if checkpoint and Recompute.FULL not in out.recompute:
            out = replace(out, recompute=out.recompute + (Recompute.FULL,))
        return out

    def within(self, capabilities: Capabilities) -> "SearchSpace":
        """The same space less the values ``capabilities`` lacks (what the cost model cannot
        score), so no table is built for them; an axis that would be left empty stays as it is
        (the cost model then refuses it, or gives it infinite memory)."""
        changes: dict = {}
        for field, axis in (("dp_types", "dp_type"), ("recompute", "recompute"), ("sp", "sp"),
                            ("vocab_sp", "vocab_sp")):
            kept = tuple(v for v in getattr(self, field) if capabilities.supports(axis, v))
            if kept and kept != getattr(self, field):
                changes[field] = kept
        if not capabilities.supports("schedule", Schedule.INTERLEAVED_1F1B):
            changes["virtual_stages"] = (1,)
        kept = tuple(s for s in self.uniform_schedules if capabilities.supports("schedule", s))
        if kept != self.uniform_schedules:
            changes["uniform_schedules"] = kept
        comms = tuple(c for c in self.cp_comm if capabilities.supports("cp_comm", c))
        if not comms:
            changes["cp"] = (1,)  # a consumer without context parallelism
        elif comms != self.cp_comm:
            changes["cp_comm"] = comms
        if capabilities.expert_parallel == frozenset({OFF}):
            changes["expert_parallel"] = (1,)  # a consumer without any expert split
        kept = tuple(p for p in self.precisions if capabilities.supports("precision", p))
        if kept and kept != self.precisions:
            changes["precisions"] = kept
        if True in self.tp_comm_overlap and not runs_tp_overlap(capabilities):
            changes["tp_comm_overlap"] = (False,)  # off is every consumer's
        dispatchers = tuple(d for d in self.ep_dispatcher if capabilities.supports("ep_dispatcher", d))
        if dispatchers != self.ep_dispatcher:
            changes["ep_dispatcher"] = dispatchers or (EPDispatcher.ALL_TO_ALL,)  # every consumer's
        return replace(self, **changes) if changes else self

    @property
    def overlaps_tp_comm(self) -> bool:
        """Whether this space's plans run TP communication overlap: ``tp_comm_overlap`` is (True,)
        (a space with both values is searched once per value, each search's space holding one)."""
        return self.tp_comm_overlap == (True,)

    @property
    def dispatcher(self) -> str:
        """The expert dispatcher this space's plans use (a space with several is searched once per
        dispatcher, each search's space holding one)."""
        return self.ep_dispatcher[0]

    def with_tp_overlap(self, value: str) -> "SearchSpace":
        """The space with TP communication overlap ``off``, ``on`` or ``search`` (both)."""
        values = {"off": (False,), "on": (True,), "search": (False, True)}
        if value not in values:
            raise SpecError("tp_comm_overlap", f"{value!r}: choose from {', '.join(values)}")
        return replace(self, tp_comm_overlap=values[value])

    def with_ep_dispatcher(self, value: str) -> "SearchSpace":
        """The space with expert dispatcher ``all_to_all``, ``deepep`` or ``search`` (both)."""
        values = {EPDispatcher.ALL_TO_ALL: (EPDispatcher.ALL_TO_ALL,), EPDispatcher.DEEPEP: (EPDispatcher.DEEPEP,),
                  "search": (EPDispatcher.ALL_TO_ALL, EPDispatcher.DEEPEP)}
        if value not in values:
            raise SpecError("ep_dispatcher", f"{value!r}: choose from {', '.join(values)}")
        return replace(self, ep_dispatcher=values[value])

    def one_choice_spaces(self, per_precision: bool) -> list[tuple[str, "SearchSpace"]]:
        """The spaces searched one after another for the choices a plan makes once, with a label
        each: every TP-overlap value and, with ``per_precision``, every precision (each space
        holding one value); this space alone when there is nothing to split."""
        precisions = [(p,) for p in self.precisions] if per_precision else [self.precisions]
        out = []
        for p in precisions:
            for overlap in self.tp_comm_overlap:
                for dispatcher in self.ep_dispatcher:
                    label = ", ".join(p) + (", tp overlap on" if overlap else "") + (
                        f", {dispatcher}" if dispatcher != EPDispatcher.ALL_TO_ALL else "")
                    out.append((label, replace(self, precisions=p, tp_comm_overlap=(overlap,),
                                               ep_dispatcher=(dispatcher,))))
        return out

    def for_gpu(self, gpu) -> "SearchSpace":
        """The same space less the precisions ``gpu`` cannot run (FP8 without gpu.peak_fp8_tflops,
        MXFP8 without gpu.mxfp8); bf16 when none is left."""
        kept = runnable_on(self.precisions, gpu) or (Precision.BF16,)
        return self if kept == self.precisions else replace(self, precisions=kept)

    def for_cluster(self, cluster: ClusterSpec) -> "SearchSpace":
        """``for_gpu`` of the cluster's GPU, and deepep only where its nodes are NVLink
        (Plan.validate's rule)."""
        space = self.for_gpu(cluster.gpu)
        if EPDispatcher.DEEPEP in space.ep_dispatcher and cluster.intra_node.kind not in NVLINK_KINDS:
            kept = tuple(d for d in space.ep_dispatcher if d != EPDispatcher.DEEPEP)
            space = replace(space, ep_dispatcher=kept or (EPDispatcher.ALL_TO_ALL,))
        return space

    def with_precision(self, value: str, gpu) -> "SearchSpace":
        """The space with its precisions set by ``value``: ``search`` (bf16 or the GPU's FP8
        recipe per layer, bf16 alone on a GPU without FP8), ``fp8`` (the GPU's recipe:
        specs.precision.default_recipe) or one Precision for every layer (refused in one line
        where ``gpu`` cannot run it)."""
        if value == "search":
            return replace(self, precisions=(Precision.BF16, default_recipe(gpu))).for_gpu(gpu)
        p = default_recipe(gpu) if value == "fp8" else value
        if p not in PRECISIONS:
            raise SpecError("precision", f"{value!r} is not a precision; choose from search, fp8, "
                            f"{', '.join(PRECISIONS)}")
        refused = gpu_refusal(Precision(p), gpu)
        if refused:
            raise SpecError("precision", refused)
        return replace(self, precisions=(Precision(p),))

    def _degrees(self, n: int, limit: int, rule: str | None = None) -> list[int]:
        if (rule or self.degrees) == "divisors":
            return divisors(n, limit)
        return [d for d in powers_of_two(limit) if n % d == 0]

    # -- enumeration ------------------------------------------------------------------------
    def pp_choices(self, model: ModelSpec, cluster: ClusterSpec) -> list[int]:
        world = cluster.world_size
        base = self.pp_degrees or tuple(self._degrees(world, min(self.max_pp, model.num_layers)))
        return [p for p in base if p <= model.num_layers and world % p == 0 and p <= self.max_pp]

    def tp_choices(self, gpus: int) -> list[int]:
        base = self.tp_degrees or tuple(self._degrees(gpus, self.max_tp))
        return [t for t in base if gpus % t == 0 and t <= gpus]

    def stage_strategies(self, gpus: int, model: ModelSpec | None = None) -> list[LayerStrategy]:
        """Every strategy of a layer on a stage of ``gpus`` GPUs (before per-layer filters);
        with a ``model`` that has MoE layers, each also with the expert-parallel degrees."""
        return list(_stage_strategies(self, gpus, hash_once(model) if model is not None else None))

    def _stage_strategies(self, gpus: int, model: ModelSpec | None) -> tuple[LayerStrategy, ...]:
        base = self._dense_strategies(gpus, model.seq_len if model is not None else None)
        experts = self.ep_choices(model) if model is not None else []
        return tuple(base + [with_ep(s, ep, etp) for ep in experts for etp in self.expert_tp for s in base
                             if _expert_tp_fits(s, ep, etp)])

    def ep_choices(self, model: ModelSpec) -> list[int]:
        """Expert-parallel degrees > 1 to try: dividing some MoE layer's experts (layer_allows
        checks each layer)."""
        counts = {l.moe.num_experts for l in model.layer_types() if l.moe is not None}
        if not counts:
            return []
        wanted = self.expert_parallel or tuple(d for e in counts for d in self._degrees(e, e))
        return sorted({ep for ep in wanted if ep > 1 and any(e % ep == 0 for e in counts)})

    def cp_choices(self, seq_len: int | None) -> list[int]:
        """cp degrees to try for a model of ``seq_len`` tokens (every listed one when None)."""
        return [c for c in self.cp if c == 1 or seq_len is None or seq_len // c >= self.cp_min_tokens]

    def _dense_strategies(self, gpus: int, seq_len: int | None = None) -> list[LayerStrategy]:
        out = []
        cps = self.cp_choices(seq_len)
        for tp in self.tp_choices(gpus):
            for cp in (c for c in cps if gpus % (tp * c) == 0):
                out += self._split_strategies(tp, cp, gpus // (tp * cp))
        return out

    def _split_strategies(self, tp: int, cp: int, dp: int) -> list[LayerStrategy]:
        """Strategies of one (tp or Ulysses degree, cp, dp): sp, K/V exchange, dp type, layout, recompute."""
        out = []
        layouts = self.tp_consecutive if tp * cp > 1 and dp > 1 else (True,)
        for sp in (self._tp_sp() if tp > 1 else (SequenceParallel.NONE,)):
            # a Ulysses group of this size splits tokens, not weights: its own axis, tp 1
            split = {"tp": 1, "ulysses": tp} if sp == SequenceParallel.ULYSSES else {"tp": tp}
            uly = sp == SequenceParallel.ULYSSES
            comms = [c for c in self.cp_comm if (c == CPComm.A2A_P2P) == uly] if cp > 1 else [CPComm.P2P]
            sharded = dp * cp > 1 or uly  # weights are whole over ulysses * cp * dp
            for comm in comms:
                for dp_type in (self.dp_types if sharded else (DPType.DDP,)):
                    for consec in layouts:
                        for recompute in self.recompute:
                            for precision in self.precisions:
                                out.append(LayerStrategy(dp=dp, dp_type=dp_type, tp_consecutive=consec, cp=cp,
                                                         cp_comm=comm, recompute=recompute, sp=sp,
                                                         precision=precision, **split))
        return out

    def _tp_sp(self) -> tuple[str, ...]:
        """Sequence-parallel choices beside tp > 1: under TP communication overlap not none (its
        collectives are Megatron-SP's; Ulysses, whose weights are whole, has tp 1)."""
        if not self.overlaps_tp_comm:
            return self.sp
        return tuple(sp for sp in self.sp if sp != SequenceParallel.NONE)

    def micro_batch_choices(self, global_batch: int, pp: int, virtual_stages: int = 1) -> list[int]:
        limit = min(self.max_micro_batches, global_batch)
        base = self.micro_batches or tuple(self._degrees(global_batch, limit, self.micro_batch_degrees))
        entry = schedule_entry(self.schedule if virtual_stages == 1 else Schedule.INTERLEAVED_1F1B)
        return [m for m in base if global_batch % m == 0 and entry.micro_batch_error(pp, m) is None]

    def vocab_tp_choices(self, model: ModelSpec, gpus: int) -> list[int]:
        base = self.vocab_tp or tuple(self._degrees(gpus, min(gpus, self.max_tp)))
        return [v for v in base if v <= gpus and gpus % v == 0]

    def vocab_choices(self, model: ModelSpec, gpus: int) -> list[VocabChoice]:
        """Every (vocab tp, ZeRO-3, sp) the embedding/head may take on a stage of ``gpus`` GPUs."""
        out = []
        for v in self.vocab_tp_choices(model, gpus):
            for sp in (self.vocab_sp if v > 1 else (SequenceParallel.NONE,)):
                if sp != SequenceParallel.NONE and model.seq_len % v:
                    continue
                replicas = gpus // v if sp != SequenceParallel.ULYSSES else gpus
                for zero3 in (self.vocab_zero3 if replicas > 1 else (False,)):
                    out.append(VocabChoice(v, zero3, sp))
        return out


def runs_tp_overlap(capabilities: Capabilities) -> bool:
    """Whether a consumer scores TP communication overlap: ``on`` supported and a declared stack
    that runs it (its plans state the stack; a consumer declaring none states none)."""
    stacks = capabilities.stack
    return (capabilities.supports("tp_comm_overlap", ON) and stacks is not None
            and any(overlaps_tp_comm(SoftwareStack(s)) for s in stacks))


@lru_cache(maxsize=256)
def _stage_strategies(space: SearchSpace, gpus: int, model: HashOnce | None) -> tuple[LayerStrategy, ...]:
    """SearchSpace.stage_strategies, worked out once per (space, stage size, model): every group
    of a search and the table-memory estimate ask for it."""
    return space._stage_strategies(gpus, model.value if model is not None else None)


def _expert_tp_fits(s: LayerStrategy, ep: int, etp: int) -> bool:
    """ep * etp divides the stage; an explicit etp differs from the layer's own (else it is 0)."""
    if etp and etp == s.tp:
        return False
    return s.gpus % (ep * (etp or s.tp)) == 0


def with_ep(s: LayerStrategy, ep: int, expert_tp: int = 0) -> LayerStrategy:
    """``s`` with its routed experts over ``ep`` ranks at expert tp ``expert_tp`` (0 = the layer's);
    with no expert-dp replicas left the experts cannot be ZeRO-sharded, so their dp type is DDP."""
    lone = s.gpus // (ep * (expert_tp or s.tp)) == 1
    return replace(s, ep=ep, expert_tp=expert_tp,
                   expert_dp_type=DPType.DDP if lone and s.dp_type != DPType.DDP else None)


def tp_splits(layer: LayerSpec, tp: int) -> bool:
    """tp divides the heads, the kv heads and the MLP width: the executor splits each of them
    (kv heads are not replicated over tp > kv heads), so a plan outside this never runs."""
    return not (layer.num_heads % tp or layer.kv_heads % tp or layer.ffn_hidden_size % tp)


def layer_allows(layer: LayerSpec, s: LayerStrategy, global_batch: int, micro_batches: int) -> bool:
    """The per-layer rules of Plan.validate and the executor: tp_splits, batch divisible by dp*m,
    sequence and context parallelism only on plain blocks whose sequence the degree divides
    (2 * cp chunks for cp, times the Ulysses degree under a2a+p2p)."""
    split = s.tp * s.ulysses  # Ulysses' degree divides the heads, kv heads and width as tp's would
    if not tp_splits(layer, split):
        return False
    if s.sp != SequenceParallel.NONE and (layer.seq_len % split or layer.cross_attention_seq_len
                                          or layer.downsample_to):
        return False
    if s.cp > 1 and (layer.seq_len % (2 * s.cp * s.ulysses) or layer.cross_attention_seq_len
                     or layer.downsample_to):
        return False
    if s.has_expert_split and not expert_split_allowed(layer, s):
        return False
    return global_batch % (s.dp * micro_batches) == 0


def expert_split_allowed(layer: LayerSpec, s: LayerStrategy) -> bool:
    """Plan.validate's expert rules: a MoE layer, ep divides its experts, ep * etp the stage,
    etp the expert width."""
    moe = layer.moe
    return (moe is not None and moe.num_experts % s.ep == 0 and s.gpus % (s.ep * s.etp) == 0
            and moe.expert_ffn_hidden_size % s.etp == 0)


@dataclass(frozen=True)
class Combo:
    """One outer-loop point of the search."""

    global_batch: int
    pp: int
    micro_batches: int
    vocab: VocabChoice
    schedule: str

    __hash__ = cached_hash  # a key of the tables' caches, asked per probe and relayout
    __getstate__ = without_cached_hash

    @property
    def vocab_tp(self) -> int:
        return self.vocab.tp

    @property
    def formula(self) -> PipelineFormula:
        """The schedule's iteration-time formula at these micro-batches (one chunk per rank: the
        segment search's bounds, m T_k + D_k per stage among them, rest on fill 1 and steady m - 1)."""
        return schedule_entry(self.schedule).formula(self.micro_batches)


def combos(model: ModelSpec, cluster: ClusterSpec, global_batches: tuple[int, ...],
           space: SearchSpace) -> Iterator[Combo]:
    """Every outer-loop point where each layer has at least one allowed strategy."""
    kinds = model.layer_types()
    for gb in global_batches:
        for pp in space.pp_choices(model, cluster):
            gpus = cluster.world_size // pp
            strategies = space.stage_strategies(gpus, model)
            for m in space.micro_batch_choices(gb, pp):
                if not all(any(layer_allows(k, s, gb, m) for s in strategies) for k in kinds):
                    continue
                for v in space.vocab_choices(model, gpus):
                    yield Combo(gb, pp, m, v, space.schedule)
