"""The profiled cost model (Galvatron style): per-layer forward/backward ms fitted in batch size,
parameter and activation bytes per tp, all-reduce and p2p bandwidth tables and an overlap
coefficient, read from our profile file or from Galvatron's own profile folder.
"""
from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Sequence

from cost_models import collectives as coll
from cost_models import context
from cost_models import experts, stacks
from cost_models import memory as mem
from cost_models.analytical import relayout_time
from cost_models.base import BYTES_PER_ACTIVATION, CostModel, LayerTime, MemoryBreakdown, in_flight
from cost_models.ops import tp_collectives_per_pass
from cost_models.vocab import (layout_for, vocab_dp_type, vocab_ends, vocab_relayout_s, vocab_relayouts_s,
                               vocab_tp_comm_s, weight_split)
from cost_models.galvatron_profile import MIB, PROFILED_DTYPE_BYTES, linear_fit, read_galvatron_dir
from cost_models.memo import Memo
from cost_models import sequence as seq
from cost_models.sp_time import SpTimeTable, find_sp_time, read_sp_time
from specs.profile_format import Profile, ProfileError, load_profile
from cost_models.registry import register
from specs import (ClusterSpec, DPType, LayerSpec, LayerStrategy, ModelSpec, Plan, Recompute, SequenceParallel,
                   SpecError, load_model)
from specs.capabilities import ALL_TO_ALL_ONLY, BF16_ONLY, NO_TP_OVERLAP, Capabilities
from specs.schedules import chunk_holdings
from specs.stack import SoftwareStack

VOCAB_HEAD_SHARE = 0.9
"""Share of the measured embedding+head time that belongs to the head (logits GEMM and
loss); the lookup on the first stage is small and memory-bound."""
ADAM_TEMPORARY_BYTES = 8
"""Per element of one master tensor during the executor's Adam step (foreach off): sqrt of the
second moment and its quotient by the bias correction, two fp32 temporaries, one tensor at a
time (the largest is a module's flat master, or its shard under ZeRO-1/2)."""
LOOKUP_GRADIENT_COPIES = 1
"""Transient copies of a token (or position) table its lookup's backward makes beyond the
table's gradient state: torch's embedding backward returns a dense gradient of the whole
table, then summed into ``.grad``."""
TIED_LOOKUP_GRADIENT_COPIES = 3
"""The same for a tied matrix whose head runs on the same stage: the head's gradient waits in
autograd's input buffer for the lookup's, and the two are summed out of place (measured with
MemTracker, torch 2.13, tests/executor/test_memory_terms.py)."""
LOGIT_KEPT_BYTES = 4
"""Our profile has no head activation table: the loss keeps an fp32 softmax per logit."""
LOSS_GRADIENT_BYTES = 8
"""Per logit at the start of the loss's backward (executor, torch cross-entropy): the fp32
gradients of the log-softmax output and of the fp32 logits (the logits themselves are not
kept: the log-softmax keeps its output)."""
VOCAB_PARALLEL_LOSS_FP32_COPIES = 2
"""The executor's vocab-parallel cross-entropy (executor/parallel/vocab.py, used whenever the
plan splits the vocabulary) makes, in its forward, a masked fp32 copy of the logits and their
shifted exponent, beside the logits themselves, before it keeps the softmax: three
logits-sized buffers beyond the kept one, where torch's cross-entropy has two in its backward
(LOSS_GRADIENT_BYTES). Measured with MemTracker on one process: 4.0 logits in all against
torch's 3.0 (benchmarks.loop_accuracy's tp2 vocab-tp2 plan, docs/results/executor.md)."""


def first_backward_overlap(memory: MemoryBreakdown, held: float, micro_batches: int,
                           gradients_bytes: float) -> MemoryBreakdown:
    """``memory`` (``held`` micro-batches' activations) at the stage's peak. When every
    micro-batch is in flight at once (one micro-batch, GPipe, 1F1B with m <= pp - k), the peak
    comes before the first backward has made any gradient, or after it, when the gradients
    have taken the place of one micro-batch's activations: (n - 1) A + max(A, G), not n A + G.
    The overlap min(A, G) comes off the activations."""
    if held < micro_batches or held <= 0:
        return memory
    overlap = min(memory.activations_bytes / held, gradients_bytes)
    return replace(memory, activations_bytes=memory.activations_bytes - overlap)


def head_held(plan: Plan, stage: int) -> float:
    """Micro-batches whose logits the head's stage keeps at its peak. With one chunk a stage,
    the stage's in-flight count; with several, the head's chunk (the stage's last local chunk:
    interleaved on the last stage, V-shaped on stage 0) at the moment its program holds the
    most chunk-micro-batches: under DualPipeV a micro-batch's head backward follows its head
    forward at once, so the head holds one while the first chunk holds the rest (stage
    in_flight counts chunk-micro-batches as 1/v of a stage, which is no count of the head's)."""
    v = plan.virtual_stages
    if v <= 1:
        return in_flight(plan.schedule, plan.pp, stage, plan.micro_batches, v)
    peak, at_peak = 0, 0
    for held in chunk_holdings(plan.schedule, plan.pp, stage, plan.micro_batches, v):
        total = sum(held)
        if total > peak:
            peak, at_peak = total, held[v - 1]
        elif total == peak:
            at_peak = max(at_peak, held[v - 1])
    return float(at_peak)


def recompute_share(layer: LayerSpec, strategy: LayerStrategy, mbs: int) -> float:
    """Share of the measured forward re-run in backward: 1 (full), the share of the forward's
    FLOPs and bytes by the kernel formulas of the attention core (selective) or of what
    selective-op re-runs (seq.recompute_ops, both on the PyTorch block's kernels), 0 (none)."""
    if strategy.recompute == "none":
        return 0.0
    if strategy.checkpoint:
        return 1.0
    ops = seq.rank_ops(layer, strategy, mbs)
    if strategy.recompute == Recompute.SELECTIVE_OP:
        ops = stacks.forward_ops(ops, layer, SoftwareStack.EAGER)
    core = seq.recompute_ops(layer, strategy, mbs)
    weight = lambda xs: sum(op.flops + op.nbytes for op in xs)  # noqa: E731
    return weight(core) / weight(ops)


def activation_ratio(layer: LayerSpec, strategy: LayerStrategy, mbs: int) -> float:
    """Formula activations of ``strategy`` over those of plain tp (same degree): what sequence
    parallelism and selective recomputation keep of the measured tp table."""
    plain = replace(strategy, sp="none", recompute="none", ep=1, expert_tp=0, expert_dp_type=None)
    return mem.activation_bytes(layer, strategy, mbs) / mem.activation_bytes(layer, plain, mbs)


def expert_compute_ratio(layer: LayerSpec, strategy: LayerStrategy, mbs: int, imbalance: float | None) -> float:
    """The measured (all experts on every rank) compute rescaled to an expert split: the kernel
    formulas' FLOPs and bytes with the split over those without it (1 without a split)."""
    split = experts.compute_split(layer, strategy, imbalance)
    if split is None:
        return 1.0
    weight = lambda xs: sum(op.flops + op.nbytes for op in xs)  # noqa: E731
    return weight(seq.rank_ops(layer, strategy, mbs, split)) / weight(seq.rank_ops(layer, strategy, mbs))


WEIGHT_GRAD_SHARE = 0.5
"""W's share of a profiled backward (recompute excluded) where the profile does not split it: a
GEMM's backward is an input-gradient and a weight-gradient GEMM of equal FLOPs."""


@register

class ProfiledModel(CostModel):
    """Cost model driven by measured tables."""

    name = "profiled"
    rank_symmetric = True
    capabilities = Capabilities(precision=BF16_ONLY, tp_comm_overlap=NO_TP_OVERLAP, ep_dispatcher=ALL_TO_ALL_ONLY)
    """Every axis but FP8, TP communication overlap and DeepEP: the profiles measure BF16 kernels and whole
    layers, not the GEMMs a TP collective would run beside (docs/profile_format.md), and its expert
    all-to-alls come from its own all-to-all table, which holds no DeepEP kernel."""
    lazy_gradients = True  # the executor's .grad (first_backward_overlap is the same fact)
    sync_bucket_bytes = 0.0  # the executor reduces each layer's gradients on their own (executor/parallel/data.py)
    # not linear_in_flight: with every micro-batch in flight the gradients take the place of
    # one micro-batch's activations (first_backward_overlap)

    def __init__(self, cluster: ClusterSpec, profile_path: str | Path | None = None,
                 profile: Profile | None = None, galvatron_dir: str | Path | None = None,
                 model: str | ModelSpec | None = None, sp_time: str | Path | SpTimeTable | None = None) -> None:
        """One source: ``profile_path`` (our format), ``profile`` (object), or ``galvatron_dir``
        with ``model`` (zoo name or ModelSpec; its layer is matched at the files' sequence).
        ``sp_time``: Galvatron-2's all-to-all/all-reduce table (found in galvatron_dir by default)."""
        super().__init__(cluster)
        if galvatron_dir is not None and sp_time is None:
            sp_time = find_sp_time(galvatron_dir, cluster.nodes, cluster.gpus_per_node)
        self.sp_time: SpTimeTable | None = read_sp_time(sp_time) if isinstance(sp_time, (str, Path)) else sp_time
        if sum(x is not None for x in (profile_path, profile, galvatron_dir)) != 1:
            raise SpecError("profiled", "give exactly one of profile_path, profile, galvatron_dir")
        self.vocab_memory_mib: dict = {}
        self.executor_adam = galvatron_dir is None
        """The profile is our executor's: charge its Adam step's temporaries (Galvatron's
        folders describe Megatron's fused optimizer, which has none)."""
        self.model_spec: ModelSpec | None = None
        if galvatron_dir is not None:
            if model is None:
                raise SpecError("model", "galvatron_dir needs model= (zoo name or ModelSpec)")
            spec = load_model(model) if isinstance(model, (str, Path)) else model
            source = read_galvatron_dir(galvatron_dir, cluster, spec.layers[0])
            self.model_spec = spec.with_seq_len(source.seq_len)
            profile, self.vocab_memory_mib = source.profile, source.vocab_memory_mib
        elif profile_path is not None:
            profile = load_profile(profile_path)
        self.profile: Profile = profile
        self._layer_time = Memo(self._compute_layer_time)
        self._layer_memory = Memo(self._compute_layer_memory)
        self._transition = Memo(self._compute_transition)
        self._fits = Memo(self._compute_fits)

    # -- tables -------------------------------------------------------------------------------
    @cached_property
    def bytes_per_param(self) -> int:
        """Bytes of one parameter in the profiled dtype (hardware.dtype; 16-bit if unnamed)."""
        dtype = str(self.profile.hardware.get("dtype", "bf16")).lower()
        return 4 if dtype in ("fp32", "float32", "float") else PROFILED_DTYPE_BYTES

    def _compute_fits(self, layer: LayerSpec, tp: int = 1, sequence_parallel: bool = False
                      ) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """Lines through the forward and backward tables at ``tp`` (1: the plain layer; > 1: the
        tensor-parallel tables, or with ``sequence_parallel`` the Megatron-SP ones; None when
        not profiled)."""
        entry = self.profile.layer(layer)
        if tp == 1:
            return linear_fit(entry.forward_ms), linear_fit(entry.backward_ms)
        forward, backward = ((entry.sp_forward_ms, entry.sp_backward_ms) if sequence_parallel
                             else (entry.tp_forward_ms, entry.tp_backward_ms))
        if tp not in forward or tp not in backward:
            return None
        return linear_fit(forward[tp]), linear_fit(backward[tp])

    def _compute_s(self, layer: LayerSpec, strategy: LayerStrategy, mbs: int, tp_groups) -> tuple[float, float]:
        """(forward, backward) compute of one micro-batch, recomputation excluded. The layer as
        run at its tp degree when the profile has it, less the TP collectives of the pass that
        the table holds (the model charges the layer's own collectives apart): Megatron-SP from
        the sequence-parallel tables (the block between two of the same split: its norms on the
        sequence chunk, its all-gathers and reduce-scatters, DTensor's layout copies around
        them), else, and Megatron TP, from the tp tables (the executor's DTensor projections
        with their all-reduces). Else Galvatron's line, slope * b / split + intercept (every
        rank of the split launches the same kernels, so the fixed part does not shrink):
        Ulysses and cp, whose ranks run the whole weights on a share of the tokens, or a tp
        the profile lacks."""
        split = strategy.degrees.split  # the ranks sharing the replica's work (tp, cp, Ulysses)
        measured_tp = split > 1 and split == strategy.tp
        sp_fits = self._fits(layer, split, True) if measured_tp and strategy.megatron_sp else None
        fits = sp_fits or (self._fits(layer, split) if measured_tp else None)
        if fits is not None:
            held = strategy if sp_fits else replace(strategy, sp=SequenceParallel.NONE)
            table_comm_s = seq.tp_comm_time(self.collective_time, layer, held, mbs, tp_groups,
                                            tp_collectives_per_pass(layer)) / seq.forward_passes(held)
            (fa, fb), (ba, bb) = fits
            return (max(0.0, (fa * mbs + fb) * 1e-3 - table_comm_s),
                    max(0.0, (ba * mbs + bb) * 1e-3 - table_comm_s))
        (fa, fb), (ba, bb) = self._fits(layer)
        return (fa * mbs / split + fb) * 1e-3, (ba * mbs / split + bb) * 1e-3

    def _recompute_s(self, layer: LayerSpec, strategy: LayerStrategy, mbs: int, forward_s: float) -> float:
        """What recomputation adds to one micro-batch's backward. Selective under Megatron-SP at
        a profiled degree: the measured backward with the executor's selective recomputation
        less the plain one (what it re-runs beyond the attention core's kernels: the sub-layer's
        DTensor dispatch around the projections, whose matmul results the policy's cache hands
        back; its input's all-gather runs once, before the checkpointed region); else
        ``forward_s`` times recompute_share."""
        entry, tp = self.profile.layer(layer), strategy.tp
        if (strategy.recompute == Recompute.SELECTIVE and strategy.megatron_sp and strategy.degrees.split == tp
                and tp in entry.sp_selective_backward_ms and tp in entry.sp_backward_ms):
            (sa, sb), (ba, bb) = linear_fit(entry.sp_selective_backward_ms[tp]), linear_fit(entry.sp_backward_ms[tp])
            return max(0.0, ((sa - ba) * mbs + sb - bb) * 1e-3)
        return forward_s * recompute_share(layer, strategy, mbs)

    def bus_bytes_per_s(self, kind: str, size: int, consecutive: bool) -> float:
        """Profiled bus bandwidth of ``kind`` (its own table, else the all-reduce's) over a
        group of ``size``; a missing layout falls back to the other one, a missing size to the
        nearest profiled size."""
        table = self.profile.collective_gbytes_per_s.get(kind) or self.profile.allreduce_gbytes_per_s
        if not table:
            raise ProfileError("allreduce_gbytes_per_s", "empty: the profile has no bandwidth table")
        wanted = [f"{size}_{'consec' if consecutive else 'strided'}", f"{size}_{'strided' if consecutive else 'consec'}"]
        for key in wanted:
            if key in table:
                return table[key] * 1e9
        nearest = min(table, key=lambda k: (abs(int(k.split("_")[0]) - size), k.endswith("consec") != consecutive))
        return table[nearest] * 1e9

    # -- per layer ------------------------------------------------------------------------------
    def layer_time(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                   micro_batches: int, first_rank: int = 0) -> LayerTime:
        return self._layer_time(layer, strategy, micro_batch_size, micro_batches, first_rank)

    def _compute_layer_time(self, layer: LayerSpec, strategy: LayerStrategy, mbs: int,
                            micro_batches: int, first_rank: int) -> LayerTime:
        """Compute from the profile's tables (_compute_s; backward + a forward if recomputed),
        TP collectives and data-parallel traffic from its bandwidth tables."""
        tp_groups, dp_groups = seq.sync_groups(first_rank, strategy)
        tp_comm_s = seq.tp_comm_time(self.collective_time, layer, strategy, mbs, tp_groups,
                                     tp_collectives_per_pass(layer))
        scale = expert_compute_ratio(layer, strategy, mbs, self.expert_imbalance)
        forward_s, backward_s = (t * scale for t in self._compute_s(layer, strategy, mbs, tp_groups))
        weight_grad_s = WEIGHT_GRAD_SHARE * backward_s  # the profile times the backward whole
        core_fwd_s, core_bwd_s = forward_s, backward_s  # scaled to the core's share in _cp_time
        backward_s += self._recompute_s(layer, strategy, mbs, forward_s)
        params = self.profile.layer(layer).parameter_bytes / self.bytes_per_param
        parts = experts.sync_parts(layer, strategy, first_rank, dp_groups, params)
        traffic = [self._dp_traffic_s(p.params, p.dp_type, p.groups) for p in parts]
        per_mb_fwd, per_mb_bwd, once = (sum(t[i] for t in traffic) for i in range(3))
        fsdp_fwd, fsdp_bwd = self._fsdp_overhead_s(layer, strategy, mbs, per_mb_fwd, per_mb_bwd)
        forward_s += fsdp_fwd
        backward_s += fsdp_bwd + fsdp_fwd * recompute_share(layer, strategy, mbs)
        a2a = lambda nbytes, groups: self.collective_time("all_to_all", nbytes, groups)  # noqa: E731
        cp = self._cp_time(layer, strategy, mbs, first_rank, core_fwd_s, core_bwd_s)
        return LayerTime(forward_s=forward_s, backward_s=backward_s, weight_grad_s=weight_grad_s, tp_comm_s=tp_comm_s,
                         cp_comm_s=cp.comm_s, cp_unbalanced_s=cp.unbalanced_s, cp_core_fwd_s=cp.core_fwd_s,
                         cp_core_bwd_s=cp.core_bwd_s,
                         update_s=sum(self.update_time(p.params, p.dp_type, p.size) for p in parts),
                         dp_comm_s=once + micro_batches * (per_mb_fwd + per_mb_bwd),
                         exposed_dp_comm_s=self.exposed_time(once, backward_s),
                         exposed_micro_batch_dp_s=self.exposed_time(per_mb_bwd, backward_s)
                         + self.exposed_time(per_mb_fwd, forward_s),
                         ep_comm_s=experts.dispatch_time_s(a2a, layer, strategy, mbs, first_rank,
                                                           self.expert_imbalance))

    def _cp_time(self, layer: LayerSpec, strategy: LayerStrategy, mbs: int, first_rank: int,
                 forward_s: float, backward_s: float) -> context.CPTime:
        """Context parallelism (context.cp_time) against the measured compute's attention-core
        share (the kernel formulas' share of the pass; the profile times whole layers)."""
        if strategy.cp <= 1:
            return context.CPTime()
        ops = seq.rank_ops(layer, strategy, mbs)
        weight = lambda xs: sum(op.flops + op.nbytes for op in xs)  # noqa: E731
        share = weight(context.blockwise_ops(ops)) / weight(ops)
        return context.cp_time(self.collective_time, layer, strategy, mbs, first_rank,
                               forward_s * share, backward_s * share)

    def _fsdp_overhead_s(self, layer: LayerSpec, strategy: LayerStrategy, mbs: int, gather_s: float,
                         gather_reduce_s: float) -> tuple[float, float]:
        """(forward, backward) of a ZeRO-3 layer beyond its compute and the collectives charged
        for it (FSDP2's per-pass bookkeeping: copies into and out of the flat buffers, hooks),
        when the profile timed the layer as the executor runs it at this dp (tp 1, no experts):
        the ZeRO-3 table less the plain layer less those collectives, never below 0."""
        entry = self.profile.layer(layer)
        dp = strategy.dp
        if (strategy.dp_type != DPType.ZERO3 or strategy.degrees.split > 1 or layer.moe is not None
                or dp not in entry.zero3_forward_ms or dp not in entry.zero3_backward_ms):
            return 0.0, 0.0
        (fa, fb), (ba, bb) = self._fits(layer)
        (za, zb), (wa, wb) = linear_fit(entry.zero3_forward_ms[dp]), linear_fit(entry.zero3_backward_ms[dp])
        forward = ((za - fa) * mbs + zb - fb) * 1e-3 - gather_s
        backward = ((wa - ba) * mbs + wb - bb) * 1e-3 - gather_reduce_s
        return max(0.0, forward), max(0.0, backward)

    def update_time(self, local_params: float, dp_type: str, dp: int) -> float:
        """The measured optimizer step (Profile.optimizer_ms_per_mparam) over the parameters this
        rank updates: all of them under DDP, 1/dp under ZeRO."""
        return self.profile.optimizer_ms_per_mparam * 1e-3 * local_params / mem.optimizer_shard(dp_type, dp) / 1e6

    def _dp_traffic_s(self, local_params: float, dp_type: str, dp_groups: Sequence[Sequence[int]]
                      ) -> tuple[float, float, float]:
        """(per micro-batch forward, per micro-batch backward, once per iteration) data-parallel time.

        Our memory model keeps ZeRO-2/3 gradients sharded (2 + 14/d and 16/d bytes per parameter), as
        FSDP2 does when it reduce-scatters every backward; so ZeRO-2 reduce-scatters every
        micro-batch and ZeRO-3 also all-gathers the parameters in every forward and backward
        (the analytical model's schedule). DDP all-reduces, ZeRO-1 reduce-scatters, once."""
        nbytes = local_params * mem.GRAD_BYTES_PER_PARAM
        if max((len(g) for g in dp_groups), default=1) <= 1 or nbytes <= 0:
            return 0.0, 0.0, 0.0
        rs = self.collective_time("reduce_scatter", nbytes, dp_groups)
        ag = self.collective_time("all_gather", nbytes, dp_groups)
        if dp_type == DPType.DDP:
            return 0.0, 0.0, self.collective_time("all_reduce", nbytes, dp_groups)
        if dp_type == DPType.ZERO1:
            return 0.0, 0.0, rs + ag
        if dp_type == DPType.ZERO2:
            return 0.0, rs, ag
        return ag, rs + ag, 0.0

    def exposed_time(self, comm_s: float, backward_s: float) -> float:
        """Galvatron: B and C together take max(B, C) + (gamma - 1) min(B, C)."""
        gamma = self.profile.overlap_coefficient
        return max(backward_s, comm_s) + (gamma - 1) * min(backward_s, comm_s) - backward_s

    def layer_memory(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                     in_flight: int) -> MemoryBreakdown:
        return self._layer_memory(layer, strategy, micro_batch_size, in_flight)

    def adam_temporary_bytes(self, params: float, dp_type: str, dp: int) -> float:
        """The executor's Adam step over ``params`` parameters' master (ADAM_TEMPORARY_BYTES),
        sharded under ZeRO; nothing for a Galvatron profile."""
        return ADAM_TEMPORARY_BYTES * params / mem.optimizer_shard(dp_type, dp) if self.executor_adam else 0.0

    def layer_memory_in(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                        in_flight: int, micro_batches: int) -> MemoryBreakdown:
        """layer_memory at the stage's peak: less what the first backward's gradients replace."""
        memory = self.layer_memory(layer, strategy, micro_batch_size, in_flight)
        return first_backward_overlap(memory, in_flight, micro_batches, memory.gradients_bytes)

    def weight_wait_bytes(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int) -> float:
        """The formula's, in the profiled run's gradient dtype."""
        return mem.weight_wait_bytes(layer, strategy, micro_batch_size, element_bytes=self.bytes_per_param)

    def _activation_per_sample(self, layer: LayerSpec, tp: int, checkpoint: bool) -> float:
        table = self.profile.layer(layer).activation_bytes_per_sample
        if checkpoint and "ckpt" in table:
            # Under Megatron-SP (how Galvatron's *_sp tables were measured) the kept input is split by tp.
            return table["ckpt"] / (tp if self.profile.hardware.get("sequence_parallel") else 1)
        if str(tp) in table:
            return table[str(tp)]
        base = min((int(k) for k in table if k != "ckpt"))
        return table[str(base)] * base / tp  # nearest profiled degree, scaled by 1/tp

    def _compute_layer_memory(self, layer: LayerSpec, strategy: LayerStrategy, mbs: int,
                              in_flight: int) -> MemoryBreakdown:
        params = self.profile.layer(layer).parameter_bytes / self.bytes_per_param
        split = strategy.degrees.split
        kept = mbs * self._activation_per_sample(layer, split, strategy.checkpoint)
        if not strategy.checkpoint:  # the measured table is tp-only: scale by the formula's ratio
            kept *= activation_ratio(layer, strategy, mbs)
        memory = mem.layer_memory(layer, strategy, mbs, in_flight, params=params, kept_bytes=kept,
                                  recomputed_bytes=mbs * self._activation_per_sample(layer, split, False),
                                  weight_bytes=self.bytes_per_param)
        adam = self.adam_temporary_bytes(params / split, strategy.dp_type, strategy.dp)
        return replace(memory, temporary_bytes=max(memory.temporary_bytes, adam))

    def transition_time(self, layer: LayerSpec, prev: LayerStrategy, nxt: LayerStrategy,
                        micro_batch_size: int, first_rank: int = 0) -> float:
        return self._transition(layer, prev, nxt, micro_batch_size, first_rank)

    def _compute_transition(self, layer, prev, nxt, mbs, first_rank) -> float:
        return relayout_time(self, layer, prev, nxt, mbs, first_rank)

    # -- communication --------------------------------------------------------------------------
    @cached_property
    def wire_scale(self) -> float:
        """Bytes a message of the profiled run moves per byte the formulas count: they count
        16-bit activations and gradients, an fp32 run sends 4-byte ones."""
        return self.bytes_per_param / BYTES_PER_ACTIVATION

    def collective_time(self, kind: str, nbytes: float, groups: Sequence[Sequence[int]]) -> float:
        """latency + factor(p) * n / profiled busbw of the group's size and layout (n in the
        profiled dtype)."""
        coll.check_kind(kind)
        group = max(groups, key=len, default=())
        p = len(group)
        if p <= 1 or nbytes <= 0:
            return 0.0
        nbytes *= self.wire_scale
        measured = self.sp_time.time_s(kind, p, nbytes) if self.sp_time and kind == "all_to_all" else None
        if measured is not None:
            return measured
        consecutive = all(b - a == 1 for a, b in zip(group, group[1:]))
        busbw = self.bus_bytes_per_s(kind, p, consecutive)
        return self.profile.allreduce_latency_us * 1e-6 + coll.BUS_FACTOR[kind](p) * nbytes / busbw

    def link_calibration(self) -> dict[str, float]:
        """The measured tables over the cluster's link figures: all-reduce bus bandwidth of the
        groups inside a scale-up domain and of the larger ones across domains, the pipeline
        sends, the measured latency once per collective (none per ring step), and how much
        slower than the all-reduce's bus bandwidth the other measured kinds run."""
        cluster, table = self.cluster, self.profile.allreduce_gbytes_per_s
        per_node = cluster.domain_gpus
        inside = [bw for key, bw in table.items() if int(key.split("_")[0]) <= per_node]
        across = [bw for key, bw in table.items() if int(key.split("_")[0]) > per_node]
        out = {"base_latency_s": self.profile.allreduce_latency_us * 1e-6, "step_latency_factor": 0.0,
               "overlap_coefficient": self.profile.overlap_coefficient,
               "collective_slowdown": {kind: _slowdown(table, own)
                                       for kind, own in self.profile.collective_gbytes_per_s.items() if own and table}}
        if inside:
            out["bus_efficiency"] = min(inside) / cluster.intra_node.bandwidth_gbytes_per_s
        if across:
            out["network_efficiency"] = min(across) / cluster.inter_node.nic_bandwidth_gbytes_per_s
        if self.profile.p2p_gbytes_per_s:
            out["p2p_efficiency"] = min(self.profile.p2p_gbytes_per_s.values()) / cluster.intra_node.bandwidth_gbytes_per_s
        return out

    def p2p_time(self, nbytes: float, src: int, dst: int, senders: int = 1) -> float:
        """Bandwidth of the pipeline degree whose stages are |dst - src| ranks apart (measured
        with every rank of a stage sending at once, so ``senders`` is in the figure)."""
        if src == dst or nbytes <= 0:
            return 0.0
        table = self.profile.p2p_gbytes_per_s
        if not table:
            raise ProfileError("p2p_gbytes_per_s", "empty: the profile has no p2p table")
        pp = max(2, self.cluster.world_size // abs(dst - src))
        key = min(table, key=lambda k: abs(int(k) - pp))
        return coll.p2p_time_s(nbytes * self.wire_scale, self.profile.allreduce_latency_us * 1e-6, table[key] * 1e9)

    # -- embedding and head -----------------------------------------------------------------------
    def vocab_relayout_time(self, model: ModelSpec, plan: Plan, layer_index: int, strategy: LayerStrategy) -> float:
        return vocab_relayout_s(self, model, plan, self.cluster.world_size, layer_index, strategy)

    def vocab_cost(self, model: ModelSpec, plan: Plan, stage: int, world_size: int
                   ) -> tuple[LayerTime, MemoryBreakdown]:
        vocab = self.profile.vocab
        last = plan.head_stage
        tp, dp, mbs, tp_groups, dp_groups = layout_for(plan, world_size, stage)
        weight_tp, sync_dp = weight_split(plan, world_size)  # Ulysses: weights whole, tokens split
        share = (1.0 - VOCAB_HEAD_SHARE if stage == 0 else 0.0) + (VOCAB_HEAD_SHARE if stage == last else 0.0)
        if vocab is None or share == 0.0:
            return LayerTime(0.0, 0.0), MemoryBreakdown()
        (fa, fb), (ba, bb) = linear_fit(vocab.forward_ms), linear_fit(vocab.backward_ms)
        fwd = share * (fa * mbs + fb) / tp * 1e-3
        bwd = share * (ba * mbs + bb) / tp * 1e-3
        sync_s = update_s = 0.0
        for params, dp_type in self._vocab_parts(model, plan, stage, weight_tp, sync_dp):
            per_mb_fwd, per_mb_bwd, once = self._dp_traffic_s(params, dp_type, dp_groups)
            sync_s += once + plan.micro_batches * (per_mb_fwd + per_mb_bwd)
            update_s += self.update_time(params, dp_type, sync_dp)
        tp_comm_s = (vocab_tp_comm_s(self, model, plan, stage, mbs, tp_groups)
                     + vocab_relayouts_s(self, model, plan, stage))
        return (LayerTime(forward_s=fwd, backward_s=bwd, tp_comm_s=tp_comm_s, dp_comm_s=sync_s, exposed_dp_comm_s=sync_s,
                          update_s=update_s),
                self._vocab_memory(model, plan, stage, mbs, tp, weight_tp, sync_dp))

    @staticmethod
    def _vocab_state_share(plan: Plan, stage: int, dp: int) -> float:
        """Embedding (stage 0) sharded as layer 0, head (last stage) as the last layer, both ZeRO-3
        under vocab_zero3 (vocab_dp_type); mean of both on one stage."""
        ends = ([0] if stage == 0 else []) + ([len(plan.layers) - 1] if stage == plan.head_stage else [])
        return sum(_state_share(vocab_dp_type(plan, i, dp), dp) for i in ends) / len(ends)

    def _vocab_memory(self, model: ModelSpec, plan: Plan, stage: int, mbs: float, tp: int, weight_tp: int,
                      dp: int) -> MemoryBreakdown:
        """Galvatron's measured other_memory tables when read from its folder, else our formula
        (``tp``: the vocabulary's tp; ``weight_tp``, ``dp``: weight_split's)."""
        last = plan.head_stage
        if self.vocab_memory_mib:
            key = "pp_off" if plan.pp == 1 else ("first" if stage == 0 else "last")
            table = self.vocab_memory_mib[key]

            def nearest(column: dict, degree: int) -> str:
                return str(degree) if str(degree) in column else min(column, key=lambda k: abs(int(k) - degree))
            # The tables hold unsharded states (16 B/param); the executor shards the embedding like the
            # first layer and the head like the last (executor/parallelize.py), so do we.
            share = self._vocab_state_share(plan, stage, dp)
            return MemoryBreakdown(
                parameters_bytes=table["model_states"][nearest(table["model_states"], weight_tp)] * MIB * share,
                activations_bytes=table["activation"][nearest(table["activation"], tp)] * MIB * mbs)
        states = self._vocab_states(model, plan, stage, weight_tp, dp)
        lookup = self.bytes_per_param * self._lookup_gradient_params(model, plan, weight_tp) if stage == 0 else 0.0
        if stage != last:
            return states + MemoryBreakdown(temporary_bytes=lookup)
        held = head_held(plan, stage)
        logits = mbs * model.head.seq_len * model.head.output_size / tp
        # each micro-batch in flight keeps its fp32 softmax for the loss, and under pp the
        # pipeline stage its output (the logits) until its backward; the loss's backward
        # starts with the gradients of the softmax and of the logits; the lookup's backward
        # (last of a micro-batch) comes after its softmax is freed
        kept = logits * (LOGIT_KEPT_BYTES + (self.bytes_per_param if plan.pp > 1 else 0))
        loss_bytes = LOSS_GRADIENT_BYTES
        if plan.vocab_asks_split:  # the vocab-parallel loss: its forward's copies (the logits, two fp32)
            loss_bytes = max(loss_bytes, self.bytes_per_param + VOCAB_PARALLEL_LOSS_FP32_COPIES * LOGIT_KEPT_BYTES)
        memory = states + MemoryBreakdown(activations_bytes=held * kept,
                                          temporary_bytes=max(logits * loss_bytes, lookup - kept))
        return first_backward_overlap(memory, held, plan.micro_batches, states.gradients_bytes)

    @staticmethod
    def _vocab_parts(model: ModelSpec, plan: Plan, stage: int, tp: int, dp: int) -> list[tuple[float, str]]:
        """(local parameters, dp type) of the embedding/head on ``stage`` (from the spec: the
        profile times an untied head), sharded like the neighbouring layer, except a tied
        matrix: the executor keeps it replicated, synced once per iteration with its own full
        Adam state (docs/executor.md, tied embeddings); it is in the stage's first end. Only the
        vocabulary's rows (the token table, the head's matrix) are split over ``tp``
        (executor/parallel/vocab.py pads and shards those); positions, token types and norms
        stay whole on every rank."""
        parts = []
        matrix = model.head.hidden_size * model.head.output_size
        tied = matrix if model.head.tied_lm else 0
        for i, (index, count) in enumerate(vocab_ends(model, plan, stage)):
            embedding = stage == 0 and i == 0
            if embedding:
                emb = model.embedding
                rows = emb.vocab_size * emb.hidden_size if emb.kind == "token" else 0
            else:  # the head's matrix is in its count unless tied and on the embedding's stage
                rows = min(matrix, count) if (not model.head.tied_lm or plan.head_stage != 0) else 0
            padded = rows / model.head.output_size * plan.padded_vocab_size(model.head.output_size) \
                if tp > 1 and rows and model.head.output_size else rows
            whole = count - rows
            own, tied = min(tied, count), 0
            if own:  # the tied matrix: the embedding's rows
                parts += [(padded / tp, DPType.DDP)]
                parts.append((whole, vocab_dp_type(plan, index, dp)))
            else:
                parts.append((padded / tp + whole, vocab_dp_type(plan, index, dp)))
        return parts

    def _vocab_states(self, model: ModelSpec, plan: Plan, stage: int, tp: int, dp: int) -> MemoryBreakdown:
        """States of _vocab_parts, with the largest transient of their gradient sync or Adam step."""
        w, states = self.bytes_per_param, MemoryBreakdown()
        for params, dp_type in self._vocab_parts(model, plan, stage, tp, dp):
            transient = max(mem.gradient_sync_transient_bytes(params, dp_type, dp, w),
                            self.adam_temporary_bytes(params, dp_type, dp))
            states = states + mem.model_state_bytes(params, dp_type, dp, w) + MemoryBreakdown(temporary_bytes=transient)
        return states

    def _lookup_gradient_params(self, model: ModelSpec, plan: Plan, tp: int) -> float:
        """Elements of the dense gradients the first stage's lookups make in backward, beyond
        the tables' gradient states (LOOKUP_GRADIENT_COPIES); none for a Galvatron profile."""
        emb = model.embedding
        if not self.executor_adam or emb.kind != "token":
            return 0.0
        copies = TIED_LOOKUP_GRADIENT_COPIES if model.head.tied_lm and plan.pp == 1 else LOOKUP_GRADIENT_COPIES
        tokens = copies * plan.padded_vocab_size(emb.vocab_size) / tp
        return (tokens + LOOKUP_GRADIENT_COPIES * emb.max_positions) * emb.hidden_size


def _slowdown(all_reduce: dict[str, float], kind: dict[str, float]) -> float:
    """The all-reduce's bus bandwidth over a kind's: the largest ratio over the groups both
    measured (the slowest of each table when they share none)."""
    shared = [all_reduce[k] / kind[k] for k in kind if k in all_reduce]
    return max(shared) if shared else min(all_reduce.values()) / min(kind.values())


def _state_share(dp_type: str, dp: int) -> float:
    """Share of the 16 B/param mixed-precision Adam states one GPU keeps (formulas.md)."""
    states = mem.model_state_bytes(1.0, dp_type if dp > 1 else "ddp", dp)
    return states.states_bytes / (mem.WEIGHT_BYTES_PER_PARAM + mem.GRAD_BYTES_PER_PARAM + mem.OPTIMIZER_BYTES_PER_PARAM)


def from_galvatron_dir(folder: str | Path, cluster: ClusterSpec, model: str | ModelSpec = "llama2-7b"
                       ) -> ProfiledModel:
    """The profiled model on exactly the inputs Galvatron's search engine reads."""
    return ProfiledModel(cluster, galvatron_dir=folder, model=model)
