"""Plan: how a model is trained on a cluster: pipeline stages and one strategy per layer."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specs.axes import (MEGATRON_RECOMPUTE, CPComm, CPLoadBalance, DPType, Degrees, EPDispatcher, Recompute,
                        SequenceParallel)
from specs.cluster import NVLINK_KINDS
from specs.errors import SpecError, check_fields, load_json_with, member, one_of, positive_int
from specs.files import atomic_write_text
from specs.hashing import cached_hash, without_cached_hash
from specs.precision import Precision, fp8_recipe, gpu_refusal
from specs.precision import precision as to_precision
from specs.stack import SELECTIVE_OP_STACKS, TP_OVERLAP_STACKS, SoftwareStack, overlaps_tp_comm, software_stack
from specs.limits import MAX_GLOBAL_BATCH, MAX_LAYERS, MAX_MICRO_BATCHES, at_most
from specs.chunks import chunk_layout
from specs.schedules import SCHEDULES, Schedule, schedule_entry, upgrade_schedule
from specs.schema import PlanFile, check

if TYPE_CHECKING:
    from specs.model import ModelSpec

PLAN_VERSION = 2
"""2: a Ulysses layer has its own degree (``ulysses``) and tp 1; version 1 files gave the Ulysses
degree as ``tp`` and are upgraded on load (a file without a version key is version 1)."""


VOCAB_PAD_MULTIPLE = 128
"""Megatron pads the vocabulary to a multiple of 128 * tp (--make-vocab-size-divisible-by)."""

DP_TYPES = tuple(DPType)


def padded_vocab(vocab: int, tp: int, multiple: int = VOCAB_PAD_MULTIPLE) -> int:
    """The vocabulary rounded up to a multiple of ``multiple * tp`` (50257 -> 50304 at tp 1..)."""
    step = multiple * tp
    return -(-vocab // step) * step


@dataclass(frozen=True, kw_only=True)
class LayerStrategy:
    """How one layer is split over the GPUs of its pipeline stage."""

    tp: int = 1
    """Tensor (Megatron column/row) parallel degree: the weights' split."""
    dp: int = 1
    """Data parallel degree; dp * tp * cp * ulysses = GPUs of the stage."""
    dp_type: DPType = DPType.DDP
    """One of DPType (a plain string is converted)."""
    tp_consecutive: bool = True
    """TP (or Ulysses) group on neighbouring ranks (True) or strided across the stage (False)."""
    recompute: Recompute = Recompute.NONE
    """Activation recomputation in backward (Recompute: none, selective, full, selective-op)."""
    sp: SequenceParallel = SequenceParallel.NONE
    """Sequence parallelism: none, megatron (over the tp group), ulysses (over ``ulysses``)."""
    ulysses: int = 1
    """DeepSpeed-Ulysses degree (> 1 exactly when sp is ulysses; tp is then 1)."""
    cp: int = 1
    """Context-parallel degree: the sequence split over cp ranks that hold the same weights
    (gradients sync over dp * cp * ulysses); attention exchanges K/V as ``cp_comm`` says."""
    cp_comm: CPComm = CPComm.P2P
    """How the cp group exchanges K/V: p2p (ring), all_gather, a2a+p2p (Ulysses, then a ring
    over cp). Per layer, as Megatron-Core accepts one type per layer; p2p when cp is 1."""
    ep: int = 1
    """Expert-parallel degree of a MoE layer: its routed experts are split over ``ep`` groups
    carved out of the stage's data-parallel ranks (Megatron-Core and DeepSpeed-MoE); tokens
    reach their experts by all-to-all. 1 = every rank holds every expert."""
    expert_tp: int = 0
    """Tensor-parallel degree of each expert's MLP; 0 = the dense part's (``tp``,
    Megatron-Core's default). ``ep * expert_tp`` must divide the stage's GPUs."""
    expert_dp_type: DPType | None = None
    """How the expert data-parallel group holds the expert states; None = ``dp_type``."""
    precision: Precision = Precision.BF16
    """Arithmetic of the layer's linear layers (specs.precision): bf16 or an FP8 recipe. A plan
    takes one FP8 recipe; some layers may stay in bf16 (often the first and last)."""

    __hash__ = cached_hash  # a cache key of the cost models and planners
    __getstate__ = without_cached_hash

    def __post_init__(self) -> None:
        positive_int(self.tp, "tp")
        positive_int(self.dp, "dp")
        object.__setattr__(self, "dp_type", member(self.dp_type, DPType, "dp_type"))
        if not isinstance(self.tp_consecutive, bool):
            raise SpecError("tp_consecutive", f"must be true or false, got {self.tp_consecutive!r}")
        object.__setattr__(self, "recompute", member(self.recompute, Recompute, "recompute"))
        object.__setattr__(self, "sp", member(self.sp, SequenceParallel, "sp"))
        positive_int(self.ulysses, "ulysses")
        positive_int(self.cp, "cp")
        object.__setattr__(self, "cp_comm", member(self.cp_comm, CPComm, "cp_comm"))
        positive_int(self.ep, "ep")
        if isinstance(self.expert_tp, bool) or not isinstance(self.expert_tp, int) or self.expert_tp < 0:
            raise SpecError("expert_tp", f"must be an integer >= 0 (0 = tp), got {self.expert_tp!r}")
        if self.expert_dp_type is not None:
            object.__setattr__(self, "expert_dp_type", member(self.expert_dp_type, DPType, "expert_dp_type"))
        object.__setattr__(self, "precision", to_precision(self.precision))

    @cached_property
    def degrees(self) -> Degrees:
        """The named degrees of this layer (specs.axes); one shared record per distinct value."""
        return _layer_degrees(self.dp, self.dp_type, self.tp, self.tp_consecutive, self.sp, self.ulysses, self.cp,
                              self.ep, self.etp, self.expert_dp_kind)

    @property
    def gpus(self) -> int:
        return self.degrees.gpus

    @property
    def checkpoint(self) -> bool:
        """Full recomputation (only the layer input is kept)."""
        return self.recompute == Recompute.FULL

    @property
    def megatron_sp(self) -> bool:
        return self.sp == SequenceParallel.MEGATRON

    @property
    def etp(self) -> int:
        """Tensor-parallel degree of the experts (``expert_tp``, or ``tp`` when 0)."""
        return self.expert_tp or self.tp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same expert shard (the experts' gradient-sync and ZeRO group):
        the stage's GPUs / (ep * etp)."""
        return self.degrees.edp

    @property
    def expert_dp_kind(self) -> DPType:
        """The experts' effective dp type (``expert_dp_type`` or ``dp_type``)."""
        return self.expert_dp_type or self.dp_type

    @property
    def has_expert_split(self) -> bool:
        """Any expert field set away from its default (meaningful on MoE layers only)."""
        return self.ep != 1 or self.expert_tp != 0 or self.expert_dp_type is not None

    def short(self) -> str:
        """Compact text, e.g. ``tp2/dp2 zero3 ckpt``, ``tp2/dp1 sp cp4`` (``cp4/ag``: all-gather)."""
        parts = [f"tp{self.tp}" + ("" if self.tp_consecutive or self.tp == 1 or self.dp == 1 else "s")
                 + f"/dp{self.dp}"]
        if self.degrees.grad_sync > 1 and self.dp_type != DPType.DDP:
            parts.append(self.dp_type)
        if self.recompute == Recompute.FULL:
            parts.append("ckpt")
        elif self.recompute == Recompute.SELECTIVE:
            parts.append("sel")
        elif self.recompute == Recompute.SELECTIVE_OP:
            parts.append("sel-op")
        if self.sp != SequenceParallel.NONE:
            parts.append("sp" if self.megatron_sp else f"uly{self.ulysses}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}" + ("/ag" if self.cp_comm == CPComm.ALL_GATHER else ""))
        if self.has_expert_split:
            expert = f"ep{self.ep}" + (f"/etp{self.etp}" if self.etp != self.tp else "")
            if self.expert_dp_type is not None and self.expert_dp > 1:
                expert += f" e:{self.expert_dp_kind}"
            parts.append(expert)
        if self.precision.is_fp8:
            parts.append(str(self.precision))
        return " ".join(parts)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Pipeline degree and partition, per-layer strategies, batch and schedule."""

    pp: int
    """Pipeline degree (number of stages)."""
    stage_layers: tuple[int, ...]
    """Layers in each stage, in order; sums to the number of layers."""
    layers: tuple[LayerStrategy, ...]
    """One strategy per layer."""
    global_batch: int
    """Samples per iteration."""
    micro_batches: int
    """Micro-batches per iteration (Galvatron's 'chunks')."""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    """One of Schedule (a plain string is converted); specs.schedules defines each."""
    vocab_tp: int = 1
    """Tensor parallel degree of the embedding and the head (vocabulary padded as Megatron
    pads it, so any degree dividing the stage works)."""
    vocab_zero3: bool = False
    """Embedding and head parameters sharded ZeRO-3 over their data-parallel replicas
    (Galvatron's embed_sdp)."""
    vocab_sp: SequenceParallel = SequenceParallel.NONE
    """Sequence parallelism of the embedding and head over the vocab_tp group (Galvatron's
    vsp is Ulysses: tokens split, weights replicated)."""
    cp_load_balance: CPLoadBalance = CPLoadBalance.ZIGZAG
    """Token order of context-parallel layers under a causal mask: zigzag (head-tail chunks,
    balanced) or none (contiguous chunks). Per plan: the batch is permuted once, before the
    embedding, and every layer sees that order."""
    virtual_stages: int = 1
    """The schedule's parameter: model chunks per pipeline rank (> 1 only under a schedule of
    several chunks per rank; the schedule places them: round-robin, or V-shaped)."""
    chunk_layers: tuple[int, ...] = ()
    """Layers of each of the pp * virtual_stages model chunks, in model order (Megatron's
    uneven first/last chunks, e.g. 3 + 4 x 30 + 3 for 126 layers on 32 chunks); each stage's
    chunks sum to its ``stage_layers``. The first and last chunk may hold no layer (only the
    embedding, only the output layer and loss: Llama 3's 126 layers on 128 chunks) under a
    schedule without a split backward. Empty: each stage's layers split evenly over its chunks,
    the earlier chunks taking one more (a list equal to that is stored empty)."""
    stack: SoftwareStack | None = None
    """The software stack its times assume (specs.stack): megatron-te, eager or compile; None:
    not stated (a planner states its cost model's). A cost model built for one stack refuses a
    plan that states another."""
    tp_comm_overlap: bool = False
    """The Megatron-SP all-gathers and reduce-scatters of the tp > 1 layers run chunked beside the
    GEMMs that consume or produce their tensors (specs.stack.overlaps_tp_comm: Transformer Engine's
    userbuffers under megatron-te, torchtitan's async TP under compile). Needs a tp > 1 layer,
    Megatron-SP on every tp > 1 layer and a stated stack that runs it."""
    ep_dispatcher: EPDispatcher = EPDispatcher.ALL_TO_ALL
    """How the MoE layers' tokens reach their experts (EPDispatcher): ``all_to_all`` (every routed copy
    sent on its own) or ``deepep`` (DeepEP: once per destination scale-up domain over the network, then
    over NVLink inside it). ``deepep`` needs a layer with ep > 1 and a cluster whose nodes are NVLink."""
    model: str = ""
    """Zoo name or config path of the model this plan is for (informative)."""
    cluster: str = ""
    """Zoo name or file of the cluster (informative)."""
    version: int = PLAN_VERSION
    """The file format; a Plan in memory is always the current one (older files upgrade on load)."""
    model_spec: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    """The ModelSpec the plan was made for, as data (specs.embedded), so the file loads anywhere."""
    cluster_spec: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    """The ClusterSpec the plan was made for, as data (specs.embedded)."""

    def __post_init__(self) -> None:
        if self.version != PLAN_VERSION:
            raise SpecError("version", f"a Plan is format {PLAN_VERSION}, got {self.version!r} (load older files "
                            f"with Plan.from_dict)")
        positive_int(self.pp, "pp")
        positive_int(self.global_batch, "global_batch")
        positive_int(self.micro_batches, "micro_batches")
        positive_int(self.vocab_tp, "vocab_tp")
        positive_int(self.virtual_stages, "virtual_stages")
        at_most(self.global_batch, MAX_GLOBAL_BATCH, "global_batch", "samples per iteration")
        at_most(self.micro_batches, MAX_MICRO_BATCHES, "micro_batches", "each is played per stage")
        at_most(len(self.layers), MAX_LAYERS, "layers", "planners keep per-layer tables")
        object.__setattr__(self, "schedule", Schedule(one_of(self.schedule, SCHEDULES, "schedule")))
        schedule_entry(self.schedule).check_virtual_stages(self.virtual_stages)
        if not isinstance(self.vocab_zero3, bool):
            raise SpecError("vocab_zero3", f"must be true or false, got {self.vocab_zero3!r}")
        object.__setattr__(self, "cp_load_balance", member(self.cp_load_balance, CPLoadBalance, "cp_load_balance"))
        object.__setattr__(self, "vocab_sp", member(self.vocab_sp, SequenceParallel, "vocab_sp"))
        if self.stack is not None:
            object.__setattr__(self, "stack", software_stack(self.stack))
        self._check_tp_comm_overlap()
        self._check_ep_dispatcher()
        self._check_selective_op_stack()
        if not isinstance(self.stage_layers, (list, tuple)):
            raise SpecError("stage_layers", f"must be a list of layer counts, got {self.stage_layers!r}")
        object.__setattr__(self, "stage_layers", tuple(self.stage_layers))
        object.__setattr__(self, "layers", tuple(self.layers))
        if len(self.stage_layers) != self.pp:
            raise SpecError("stage_layers", f"{len(self.stage_layers)} stages listed for pp({self.pp})")
        for i, n in enumerate(self.stage_layers):
            positive_int(n, f"stage_layers[{i}]")
        if sum(self.stage_layers) != len(self.layers):
            raise SpecError("stage_layers", f"sum {sum(self.stage_layers)} != {len(self.layers)} layers")
        object.__setattr__(self, "chunk_layers", self._checked_chunk_layers())

    def _check_selective_op_stack(self) -> None:
        """A selective-op layer needs a stack that runs it, or none stated."""
        if self.stack is None or self.stack in SELECTIVE_OP_STACKS:
            return
        for i, s in enumerate(self.layers):
            if s.recompute == Recompute.SELECTIVE_OP:
                raise SpecError(f"layers[{i}].recompute", f"selective-op is torchtitan's per-op policy, which stack "
                                f"{self.stack} does not run; state one of {', '.join(SELECTIVE_OP_STACKS)}")

    def _check_tp_comm_overlap(self) -> None:
        """tp_comm_overlap: a boolean; when on, a tp > 1 layer, Megatron-SP on each and a stack that runs it."""
        value = self.tp_comm_overlap
        if not isinstance(value, bool):
            raise SpecError("tp_comm_overlap", f"must be true or false, got {value!r}")
        if not value:
            return
        if not overlaps_tp_comm(self.stack):
            raise SpecError("tp_comm_overlap", f"true needs a stack that runs it ({', '.join(TP_OVERLAP_STACKS)}), "
                            f"got {self.stack or 'none stated'}")
        tp_layers = [(i, s) for i, s in enumerate(self.layers) if s.tp > 1]
        if not tp_layers:
            raise SpecError("tp_comm_overlap", "true needs a layer with tp > 1 (no layer has one)")
        for i, s in tp_layers:
            if not s.megatron_sp:
                raise SpecError("tp_comm_overlap", f"true needs sp megatron on every tp > 1 layer: layer {i} "
                                f"has tp {s.tp}, sp {s.sp}")

    def _check_ep_dispatcher(self) -> None:
        """ep_dispatcher: an EPDispatcher; deepep only where a layer splits its experts over ep > 1 ranks."""
        object.__setattr__(self, "ep_dispatcher", member(self.ep_dispatcher, EPDispatcher, "ep_dispatcher"))
        if self.ep_dispatcher == EPDispatcher.DEEPEP and not any(s.ep > 1 for s in self.layers):
            raise SpecError("ep_dispatcher", f"deepep needs a layer with ep > 1 (ep {max(s.ep for s in self.layers)} "
                            "on every layer): with no expert split there is nothing to dispatch")

    def _checked_chunk_layers(self) -> tuple[int, ...]:
        """``chunk_layers`` validated against the stages, stored empty when it is the default split."""
        if not isinstance(self.chunk_layers, (list, tuple)):
            raise SpecError("chunk_layers", f"must be a list of layer counts, got {self.chunk_layers!r}")
        given, v = tuple(self.chunk_layers), self.virtual_stages
        if not given:
            self._even_chunk_layers()  # refuses a stage of fewer layers than chunks
            return ()
        if min(self.stage_layers) >= v and given == self._even_chunk_layers():
            return ()
        if len(given) != self.pp * v:
            raise SpecError("chunk_layers", f"{len(given)} chunks listed for pp({self.pp}) * "
                            f"virtual_stages({v}) = {self.pp * v}")
        ends = (0, len(given) - 1)
        for j, n in enumerate(given):
            if n == 0 and j in ends and not schedule_entry(self.schedule).splits_backward:
                continue  # the embedding's or the loss's own chunk
            positive_int(n, f"chunk_layers[{j}]")
        for k, n in enumerate(self.stage_layers):
            chunks = self.stage_chunks(k)
            if sum(given[j] for j in chunks) != n:
                raise SpecError("chunk_layers", f"stage {k} runs chunks {chunks} of {[given[j] for j in chunks]} "
                                f"layers, sum {sum(given[j] for j in chunks)} != stage_layers[{k}] {n}")
        return given

    def _even_chunk_layers(self) -> tuple[int, ...]:
        """The default: each stage's layers split evenly over its chunks, earlier chunks first."""
        if self.virtual_stages == 1:  # every schedule of one chunk per rank runs chunk k on stage k
            return self.stage_layers
        counts = [0] * (self.pp * self.virtual_stages)
        for k, n in enumerate(self.stage_layers):
            if n < self.virtual_stages:
                raise SpecError("stage_layers", f"stage {k} has {n} layers for virtual_stages "
                                f"{self.virtual_stages} chunks (at least one layer each)")
            for j, share in zip(self.stage_chunks(k), even_stage_layers(n, self.virtual_stages)):
                counts[j] = share
        return tuple(counts)

    # -- structure --------------------------------------------------------------------
    def stage_chunks(self, stage: int) -> list[int]:
        """Global indices of the chunks ``stage`` runs, in its local order (the schedule places
        them: j % pp round-robin, or V-shaped)."""
        return schedule_entry(self.schedule).stage_chunks(stage, self.pp, self.virtual_stages)

    def chunk_stage(self, chunk: int) -> int:
        """The stage that runs global chunk ``chunk``."""
        return self._chunk_stages[chunk]

    @cached_property
    def _chunk_stages(self) -> tuple[int, ...]:
        """The stage of every global chunk."""
        if self.virtual_stages == 1:
            return tuple(range(self.pp))
        stages = [0] * (self.pp * self.virtual_stages)
        for k in range(self.pp):
            for j in self.stage_chunks(k):
                stages[j] = k
        return tuple(stages)

    @cached_property
    def head_stage(self) -> int:
        """The stage holding the model's last chunk (the head): pp - 1, or 0 under a V-shape."""
        return self.chunk_stage(self.pp * self.virtual_stages - 1)

    def layers_per_chunk(self) -> tuple[int, ...]:
        """Layers of each chunk in model order (``chunk_layers``, or the even default)."""
        return self.chunk_layers or self._even_chunk_layers()

    def chunk_ranges(self) -> list[range]:
        """Layer indices of each model chunk in model order (v = 1: one chunk per stage)."""
        return list(self._chunk_ranges)

    @cached_property
    def _chunk_ranges(self) -> tuple[range, ...]:
        """chunk_ranges, worked out once per plan (a cost model asks for it per stage)."""
        out, start = [], 0
        for n in self.layers_per_chunk():
            out.append(range(start, start + n))
            start += n
        return tuple(out)

    def stage_ranges(self) -> list[list[int] | range]:
        """Layer indices of each stage (its chunks, in its local order)."""
        chunks = self.chunk_ranges()
        if self.virtual_stages == 1:
            return chunks
        return [[i for j in self.stage_chunks(k) for i in chunks[j]] for k in range(self.pp)]

    def chunk_starts(self) -> set[int]:
        """First layer of every chunk that holds one (a pipeline message arrives there, no re-layout)."""
        return {r.start for r in self.chunk_ranges() if r}

    def boundary_layer(self, chunk: int) -> int:
        """The layer whose output crosses from ``chunk`` to the next one (and whose gradient
        comes back): the chunk's last layer; the embedding's own chunk sends what layer 0 takes
        in, of layer 0's shape."""
        return max(self._chunk_ranges[chunk].stop - 1, 0)

    def stage_first_rank(self, stage: int, world_size: int) -> int:
        return stage * (world_size // self.pp)

    def micro_batch_size(self, layer: int) -> int:
        """Samples per micro-batch per data-parallel replica at ``layer``."""
        return self.global_batch // (self.layers[layer].dp * self.micro_batches)

    def summary(self) -> str:
        """One line: ``pp2 m4 [16/16] vocab tp2/sp | L0-15 tp2/dp2 zero3 | L16-31 dp4 ckpt``
        (stage sizes when pp > 1 without interleaving, a cp token order other than zigzag, TP
        communication overlap, the embedding/head strategy when not the default, then runs of equal layers)."""
        head = f"pp{self.pp}" + (f"v{self.virtual_stages}" if self.virtual_stages > 1 else "") + f" m{self.micro_batches}"
        if self.pp > 1 and (self.virtual_stages == 1 or self.chunk_layers):
            head += f" [{'/'.join(map(str, self.chunk_layers or self.stage_layers))}]"
        if self.cp_load_balance != CPLoadBalance.ZIGZAG and any(s.cp > 1 for s in self.layers):
            head += f" cp-order {self.cp_load_balance}"
        if self.tp_comm_overlap:
            head += " tp-overlap"
        if self.ep_dispatcher != EPDispatcher.ALL_TO_ALL:
            head += f" {self.ep_dispatcher}"
        vocab = [f"tp{self.vocab_tp}"] if self.vocab_tp > 1 else []
        vocab += {"megatron": ["sp"], "ulysses": ["uly"]}.get(self.vocab_sp, []) + (["zero3"] if self.vocab_zero3 else [])
        parts = [head + (f" vocab {'/'.join(vocab)}" if vocab else "")]
        start = 0
        for i in range(1, len(self.layers) + 1):
            if i == len(self.layers) or self.layers[i] != self.layers[start]:
                span = f"L{start}" if i - 1 == start else f"L{start}-{i - 1}"
                parts.append(f"{span} {self.layers[start].short()}")
                start = i
        return " | ".join(parts)

    @property
    def precision(self) -> Precision:
        """The plan's FP8 recipe (the one its FP8 layers use), or bf16 when no layer is FP8."""
        return fp8_recipe(s.precision for s in self.layers)

    def with_precision(self, value: str, bf16_ends: int = 0) -> "Plan":
        """Every layer in ``value``, but the first and last ``bf16_ends`` layers kept in bf16
        (Megatron's --first-last-layers-bf16 with --num-layers-at-start/end-in-bf16)."""
        p, n = to_precision(value), len(self.layers)
        layers = tuple(replace(s, precision=Precision.BF16 if i < bf16_ends or i >= n - bf16_ends else p)
                       for i, s in enumerate(self.layers))
        return replace(self, layers=layers)

    # -- validation -------------------------------------------------------------------
    def validate(self, model: Any, cluster: Any) -> None:
        """Raise SpecError naming the field and the numbers if the plan cannot run."""
        world, n_layers = cluster.world_size, model.num_layers
        if len(self.layers) != n_layers:
            raise SpecError("layers", f"{len(self.layers)} strategies for a model of {n_layers} layers")
        if world % self.pp:
            raise SpecError("pp", f"pp({self.pp}) does not divide the world size {world}")
        per_stage = world // self.pp
        schedule_entry(self.schedule).check(self.pp, self.micro_batches, self.virtual_stages)
        stage_of = {i: k for k, ids in enumerate(self.stage_ranges()) for i in ids}
        passed = set()  # (strategy, layer spec, stage) objects checked: a repeat passes as well
        for i, (s, spec) in enumerate(zip(self.layers, model.layers)):
            key = (id(s), id(spec), stage_of[i])
            if key in passed:
                continue
            s.degrees.check(per_stage, f"layer {i}", stage_of[i])
            _check_layer(i, s, spec, self.global_batch, self.micro_batches)
            passed.add(key)
        self._check_vocab(model, per_stage)
        if self.ep_dispatcher == EPDispatcher.DEEPEP and cluster.intra_node.kind not in NVLINK_KINDS:
            raise SpecError("ep_dispatcher", f"deepep needs NVLink between a node's GPUs (DeepEP's intranode "
                            f"kernels): cluster {cluster.name}'s intra-node link is {cluster.intra_node.kind}")
        refused = gpu_refusal(self.precision, cluster.gpu) if self.precision.is_fp8 else None
        if refused:
            first = next(i for i, s in enumerate(self.layers) if s.precision == self.precision)
            raise SpecError(f"layer {first}", refused)

    def _check_vocab(self, model: Any, per_stage: int) -> None:
        vtp = self.vocab_tp
        if vtp > per_stage or per_stage % vtp:
            raise SpecError("vocab_tp", f"vocab_tp({vtp}) must divide the {per_stage} GPUs per stage")
        if self.vocab_sp != SequenceParallel.NONE and vtp == 1:
            raise SpecError("vocab_sp", f"vocab_sp {self.vocab_sp} needs vocab_tp > 1 (vocab_tp is 1)")
        if self.vocab_sp != SequenceParallel.NONE and model.seq_len % vtp:
            raise SpecError("vocab_sp", f"vocab_sp {self.vocab_sp}: vocab_tp {vtp} does not divide seq {model.seq_len}")
        if self.vocab_zero3 and per_stage // vtp == 1 and self.vocab_sp != SequenceParallel.ULYSSES:
            raise SpecError("vocab_zero3", f"vocab_zero3 needs data-parallel replicas: {per_stage} GPUs per "
                            f"stage / vocab_tp {vtp} = 1")

    def vocab_degrees(self, per_stage: int) -> Degrees:
        """The embedding/head's degrees on a stage of ``per_stage`` GPUs: vocab_tp splits the rows,
        or, under vocab_sp ulysses, is the Ulysses degree (rows whole); the rest data parallel."""
        return _vocab_degrees(self.vocab_tp, self.vocab_sp, self.vocab_zero3, per_stage)

    @property
    def vocab_asks_split(self) -> bool:
        """The vocab_* fields ask for more than vocab_tp 1, no sp, no ZeRO-3."""
        return self.vocab_tp > 1 or self.vocab_sp != SequenceParallel.NONE or self.vocab_zero3

    def vocab_in_own_layout(self, model: ModelSpec, per_stage: int) -> bool:
        """Embedding and head run in the vocabulary's layout (vocab_tp ranks per group, the
        stage's other ranks data parallel), relaid out to a first or last layer laid out
        otherwise: when the plan asks for a split (vocab_tp > 1, vocab_sp or vocab_zero3) or, for
        a token model with an LM head, when the micro-batch divides over that dp. Else they run in
        the first/last layer's layout. The executor runs them so; the cost models charge so."""
        if self.vocab_asks_split:
            return True
        if model.embedding.kind != "token" or model.head.kind != "lm":
            return False
        return (self.global_batch // self.micro_batches) % (per_stage // self.vocab_tp) == 0

    def vocab_relaid_out(self, model: ModelSpec, per_stage: int) -> bool:
        """Embedding and head run in the vocabulary's layout with relayouts to the layers: where
        vocab_in_own_layout says so and it is not already the first and last layers' layout (the
        same slice groups and dp; their order matters only where both exceed 1). Else they run
        in the first/last layer's layout. The executor runs them so; --check expects so."""
        if self.vocab_asks_split:
            return True
        if not self.vocab_in_own_layout(model, per_stage):
            return False
        tp, dp = self.vocab_tp, per_stage // self.vocab_tp
        return any((s.degrees.split, s.dp) != (tp, dp) or not (s.tp_consecutive or tp == 1 or dp == 1)
                   for s in (self.layers[0], self.layers[-1]))

    def padded_vocab_size(self, vocab: int) -> int:
        """The embedding/head rows: ``vocab`` padded as Megatron pads it at vocab_tp."""
        if self.vocab_sp == SequenceParallel.ULYSSES:
            return padded_vocab(vocab, 1)
        return padded_vocab(vocab, self.vocab_tp)

    # -- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stage_layers"] = list(self.stage_layers)
        d["chunk_layers"] = list(self.chunk_layers)
        if not self.chunk_layers:  # written only when not the even split
            del d["chunk_layers"]
        d["layers"] = [asdict(s) for s in self.layers]
        for key in ("model_spec", "cluster_spec", "stack"):  # written only when embedded / stated
            if d[key] is None:
                del d[key]
        if not self.tp_comm_overlap:  # written only when on: older files and hashes stay as they were
            del d["tp_comm_overlap"]
        if self.ep_dispatcher == EPDispatcher.ALL_TO_ALL:  # written only when not the default, likewise
            del d["ep_dispatcher"]
        else:
            d["ep_dispatcher"] = str(self.ep_dispatcher)
        return d

    @classmethod
    def from_dict(cls, raw: Any) -> "Plan":
        if isinstance(raw, dict) and "tp_sizes_enc" in raw and "layers" not in raw:
            raise SpecError("(top level)", "this is a Galvatron plan file (pp_deg, tp_sizes_enc, ...), not a hybridpar "
                            "plan; convert it: specs.load_galvatron_plan(path, world_size=N).save('plan.json')")
        check(PlanFile, raw)
        version = raw.get("version", 1)  # files before version 2 carry no version key
        if version not in (1, PLAN_VERSION):
            raise SpecError("version", f"unsupported plan version {version!r} (this code reads 1 and {PLAN_VERSION})")
        layers_raw = raw.get("layers")
        if not isinstance(layers_raw, list):
            raise SpecError("layers", f"must be a list of strategies, got {layers_raw!r}")
        layers = tuple(_strategy(i, _upgrade_layer(item, version)) for i, item in enumerate(layers_raw))
        fields = {k: v for k, v in upgrade_schedule(raw).items() if k not in ("layers", "version")}
        check_fields(cls, [*fields, "layers"])
        return cls(layers=layers, **fields)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def save(self, path: str | Path) -> None:
        """Write atomically (a crash never leaves half a plan)."""
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        return load_json_with(path, cls.from_dict)


def even_stage_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible, the first stages taking one more: (3, 3, 2) for 8/3."""
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if i < extra else 0) for i in range(pp))


def uniform_plan(num_layers: int, *, tp: int = 1, dp: int = 1, pp: int = 1, global_batch: int,
                 micro_batches: int = 1, dp_type: str = DPType.DDP, recompute: str = Recompute.NONE,
                 sp: str = SequenceParallel.NONE, schedule: str = Schedule.ONE_F_ONE_B, tp_consecutive: bool = True,
                 ulysses: int = 1, cp: int = 1, cp_comm: str = "p2p", precision: str = Precision.BF16,
                 **meta: Any) -> Plan:
    """Every layer the same strategy; layers split as evenly as possible over pp stages (over
    the chunks as Megatron lays them out, ``chunk_layout``, with virtual_stages > 1 in ``meta``)."""
    positive_int(pp, "pp")
    if num_layers < pp:
        raise SpecError("pp", f"pp({pp}) exceeds the {num_layers} layers")
    stage_layers = even_stage_layers(num_layers, pp)
    if meta.get("virtual_stages", 1) > 1 and "chunk_layers" not in meta:
        stage_layers, meta["chunk_layers"] = chunk_layout(num_layers, pp, meta["virtual_stages"], schedule)
    strategy = LayerStrategy(tp=tp, dp=dp, dp_type=dp_type if dp * cp > 1 else DPType.DDP,
                             tp_consecutive=tp_consecutive, recompute=recompute, sp=sp, ulysses=ulysses,
                             cp=cp, cp_comm=cp_comm, precision=precision)
    return Plan(pp=pp, stage_layers=stage_layers, layers=(strategy,) * num_layers,
                global_batch=global_batch, micro_batches=micro_batches, schedule=schedule, **meta)


@lru_cache(maxsize=4096)
def _layer_degrees(dp: int, dp_type: DPType, tp: int, tp_consecutive: bool, sp: SequenceParallel, ulysses: int,
                   cp: int, ep: int, etp: int, edp_type: DPType) -> Degrees:
    """A layer's Degrees, shared: a search builds tens of thousands of strategies over a few
    hundred distinct records, and the grid caches are keyed by them."""
    return Degrees(dp=dp, dp_type=dp_type, tp=tp, tp_consecutive=tp_consecutive, sp=sp, ulysses=ulysses, cp=cp,
                   ep=ep, etp=etp, edp_type=edp_type)


@lru_cache(maxsize=4096)
def _vocab_degrees(vocab_tp: int, sp: SequenceParallel, zero3: bool, per_stage: int) -> Degrees:
    dp_type = DPType.ZERO3 if zero3 else DPType.DDP
    if sp == SequenceParallel.ULYSSES:
        return Degrees(ulysses=vocab_tp, dp=per_stage // vocab_tp, sp=sp, dp_type=dp_type)
    return Degrees(tp=vocab_tp, dp=per_stage // vocab_tp, sp=sp, dp_type=dp_type)


def _check_layer(i: int, s: LayerStrategy, spec: Any, batch: int, micro: int) -> None:
    if s.sp != SequenceParallel.NONE or s.ulysses > 1:
        _check_sequence_parallel(i, s, spec)
    if s.cp > 1 or s.cp_comm != CPComm.P2P:
        _check_context_parallel(i, s, spec)
    if spec.num_heads % s.tp:
        raise SpecError(f"layer {i}", f"tp({s.tp}) does not divide heads({spec.num_heads})")
    if spec.kv_heads % s.tp and s.tp % spec.kv_heads:
        raise SpecError(f"layer {i}", f"tp({s.tp}) and kv heads({spec.kv_heads}) do not divide each other")
    if batch % (s.dp * micro):
        raise SpecError(f"layer {i}", f"global_batch({batch}) is not divisible by "
                        f"dp({s.dp})*micro_batches({micro}) = {s.dp * micro}")
    if s.degrees.grad_sync == 1 and s.dp_type != DPType.DDP:
        raise SpecError(f"layer {i}", f"dp_type {s.dp_type} needs dp > 1 (dp is 1)")
    if s.has_expert_split:
        _check_experts(i, s, spec)


def _check_experts(i: int, s: LayerStrategy, spec: Any) -> None:
    """ep and expert_tp: a MoE layer only; ep divides the experts, ep * etp the stage, etp the
    expert width; a sharded expert dp type needs expert data-parallel replicas."""
    if spec.moe is None:
        raise SpecError(f"layer {i}", f"ep {s.ep}, expert_tp {s.expert_tp}, expert_dp_type "
                        f"{s.expert_dp_type} set on a {spec.kind} layer without experts")
    if spec.moe.num_experts % s.ep:
        raise SpecError(f"layer {i}", f"ep {s.ep} does not divide num_experts {spec.moe.num_experts}")
    if s.gpus % (s.ep * s.etp):
        raise SpecError(f"layer {i}", f"ep({s.ep})*expert_tp({s.etp}) = {s.ep * s.etp} does not divide "
                        f"the {s.gpus} GPUs per stage")
    if spec.moe.expert_ffn_hidden_size % s.etp:
        raise SpecError(f"layer {i}", f"expert_tp {s.etp} does not divide expert_ffn_hidden_size "
                        f"{spec.moe.expert_ffn_hidden_size}")
    if s.expert_dp == 1 and s.expert_dp_kind != DPType.DDP:
        raise SpecError(f"layer {i}", f"expert dp type {s.expert_dp_kind} needs expert data-parallel "
                        f"replicas: {s.gpus} GPUs / (ep {s.ep} * expert_tp {s.etp}) = 1")


def _check_sequence_parallel(i: int, s: LayerStrategy, spec: Any) -> None:
    """Ulysses: its own degree > 1, tp 1, the degree divides heads and seq; Megatron-SP: tp > 1
    and divides seq."""
    uly = s.sp == SequenceParallel.ULYSSES
    if uly != (s.ulysses > 1):
        raise SpecError(f"layer {i}", f"sp {s.sp} with ulysses {s.ulysses}: a Ulysses degree > 1 goes with "
                        f"sp ulysses only")
    if uly and s.tp > 1:
        raise SpecError(f"layer {i}", f"ulysses({s.ulysses}) with tp({s.tp}) > 1 is not modelled "
                        f"(Ulysses keeps the weights whole)")
    degree, name = (s.ulysses, "ulysses degree") if uly else (s.tp, "sp megatron: tp")
    if not uly and s.tp == 1:
        raise SpecError(f"layer {i}", f"sp {s.sp} needs tp > 1 (tp is 1)")
    if uly and spec.num_heads % degree:
        raise SpecError(f"layer {i}", f"ulysses degree {degree} does not divide heads {spec.num_heads}")
    if spec.seq_len % degree:
        raise SpecError(f"layer {i}", f"{name} {degree} does not divide seq {spec.seq_len}")
    if spec.cross_attention_seq_len or spec.downsample_to:
        raise SpecError(f"layer {i}", f"sp {s.sp} is not modelled for blocks with cross-attention or patch merging")


def _check_context_parallel(i: int, s: LayerStrategy, spec: Any) -> None:
    """cp: a comm type only with cp > 1; a2a+p2p exactly with Ulysses; the sequence in 2 * cp
    chunks (zigzag's head and tail per rank; Megatron asks it of every causal cp run), times the
    Ulysses degree under a2a+p2p; no cross-attention or patch merging."""
    if s.cp == 1:
        raise SpecError(f"layer {i}", f"cp_comm {s.cp_comm} needs cp > 1 (cp is 1)")
    if (s.cp_comm == CPComm.A2A_P2P) != (s.ulysses > 1):
        raise SpecError(f"layer {i}", f"cp_comm {s.cp_comm} with ulysses {s.ulysses}: Ulysses beside cp > 1 is "
                        f"cp_comm a2a+p2p, and a2a+p2p needs ulysses > 1")
    chunks, named = (2 * s.cp * s.ulysses, f"2*cp*ulysses (2*{s.cp}*{s.ulysses})") if s.ulysses > 1 \
        else (2 * s.cp, f"2*cp (2*{s.cp})")
    if spec.seq_len % chunks:
        raise SpecError(f"layer {i}", f"seq {spec.seq_len} not divisible by {named}")
    if spec.cross_attention_seq_len or spec.downsample_to:
        raise SpecError(f"layer {i}", f"cp {s.cp} is not modelled for blocks with cross-attention or patch merging")


def _upgrade_layer(item: Any, version: int) -> Any:
    """Older spellings of a strategy: boolean ``checkpoint`` -> recompute full/none, boolean
    ``sp`` -> megatron/none (both spellings load in version 1); version 1's Ulysses degree in
    ``tp`` -> ``ulysses``, tp 1."""
    if not isinstance(item, dict):
        return item
    out = dict(item)
    if version == 1 and out.get("sp") == SequenceParallel.ULYSSES:
        if "ulysses" in out:
            raise SpecError("ulysses", "version 1 plans give the Ulysses degree as tp; ulysses is a version 2 field")
        out["ulysses"], out["tp"] = out.get("tp", 1), 1
    if "checkpoint" in out:
        flag = out.pop("checkpoint")
        if not isinstance(flag, bool):
            raise SpecError("checkpoint", f"must be true or false, got {flag!r}")
        if "recompute" in out and out["recompute"] != (Recompute.FULL if flag else Recompute.NONE):
            raise SpecError("checkpoint", f"checkpoint {flag} contradicts recompute {out['recompute']!r}")
        out["recompute"] = Recompute.FULL if flag else Recompute.NONE
    if isinstance(out.get("sp"), bool):
        out["sp"] = SequenceParallel.MEGATRON if out["sp"] else SequenceParallel.NONE
    return out


def _strategy(i: int, item: Any) -> LayerStrategy:
    if not isinstance(item, dict):
        raise SpecError(f"layers[{i}]", f"must be an object, got {item!r}")
    check_fields(LayerStrategy, item, f"layers[{i}]")
    try:
        return LayerStrategy(**item)
    except SpecError as err:
        raise SpecError(f"layers[{i}].{err.field}", err.message) from None

