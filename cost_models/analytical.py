"""The analytical cost model: kernel FLOPs and bytes over a size-dependent efficiency, alpha-beta
collectives on the cluster topology, and the mixed-precision memory formulas.

Constants: cost_models/constants.py (defaults from public figures; a cluster's calibration
file, written by ``python -m cost_models.calibrate``, overrides the fitted ones).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from cost_models import collectives as coll
from cost_models import context
from cost_models import experts, fp8, op_selective, stacks, tp_overlap
from cost_models import memory as mem
from cost_models import sequence as seq
from cost_models.base import BYTES_PER_ACTIVATION, CostModel, LayerTime, MemoryBreakdown, PipelineMessage
from cost_models.constants import AnalyticalConstants, calibration_status, constants_for
from cost_models.memo import Memo
from cost_models.ops import Op, backward_ops, forward_ops, is_weight_gradient, tp_collectives_per_pass
from cost_models.registry import register
from cost_models.vocab import vocab_cost, vocab_relayout_s
from specs import (MEGATRON_RECOMPUTE, ClusterSpec, DPType, LayerSpec, LayerStrategy, ModelSpec, Plan, RankGroups,
                   Recompute, SequenceParallel, SpecError)
from specs.precision import Precision
from specs.stack import SELECTIVE_OP_STACKS, SoftwareStack, software_stack



@dataclass(frozen=True)
class DPTraffic:
    """Data-parallel collective time of one layer (seconds), by when it runs."""

    micro_batch_bwd_s: float = 0.0
    """Every micro-batch, overlappable with that micro-batch's backward (ZeRO-3: the gather and
    the reduce-scatter at once, each on its own stream)."""
    micro_batch_fwd_s: float = 0.0
    """Every micro-batch, overlappable with its forward (ZeRO-3 parameter prefetch)."""
    iteration_bwd_s: float = 0.0
    """Once, overlappable with the last micro-batch's backward."""
    after_step_s: float = 0.0
    """Once, after the optimizer step (re-gathering updated ZeRO-1/2 parameters)."""

    def total_s(self, micro_batches: int) -> float:
        return (micro_batches * (self.micro_batch_bwd_s + self.micro_batch_fwd_s)
                + self.iteration_bwd_s + self.after_step_s)


@lru_cache(maxsize=16384)
def _ring_link(cluster: ClusterSpec, groups: tuple[tuple[int, ...], ...]):
    """Topology only (no constants): shared by every model instance of the cluster."""
    return cluster.ring_link(groups)


@lru_cache(maxsize=4096)
def _lanes_link(cluster: ClusterSpec, src: int, dst: int, senders: int):
    """The link ``senders`` lanes src + i -> dst + i leave each (keyed by the three numbers: the
    pairs of a 1024-rank stage are too many to build and hash per question)."""
    return cluster.transfers_link(tuple((src + i, dst + i) for i in range(senders)))


@lru_cache(maxsize=256)
def _domain_parts(groups: RankGroups, domain_gpus: int
                  ) -> tuple[int, int, RankGroups, RankGroups] | None:
    """(g, domains of the first group, each group's ranks in each of its domains, the groups of
    one rank per domain at the same place) when every group holds the same number g > 1 of
    ranks in each of its domains of ``domain_gpus`` ranks, else None. A group's domains come in
    order of first appearance, their ranks in the group's order (hierarchical all-reduce rings)."""
    sizes = [len(g) for g in groups]
    ranks = np.fromiter(chain.from_iterable(groups), dtype=np.int64, count=sum(sizes))
    owner = np.repeat(np.arange(len(groups)), sizes)
    key = owner * (int(ranks.max()) // domain_gpus + 1) + ranks // domain_gpus  # (group, domain), ascending
    _, first, part, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
    if counts.min() != counts.max() or counts[0] == 1:
        return None
    place = np.empty_like(first)
    place[np.argsort(first)] = np.arange(len(first))  # each part's place in order of first appearance
    by_part = ranks[np.argsort(place[part], kind="stable")].reshape(len(counts), int(counts[0])).tolist()
    domains = np.bincount(owner[first], minlength=len(groups)).tolist()
    starts = np.cumsum([0] + domains).tolist()
    across = [tuple(col) for i in range(len(groups)) for col in zip(*by_part[starts[i]:starts[i + 1]])]
    return int(counts[0]), domains[0], RankGroups(map(tuple, by_part)), RankGroups(across)


@dataclass(frozen=True)
class ComputeTime:
    """A layer's per-micro-batch time besides its data-parallel traffic (seconds; LayerTime's
    fields of the same names), and one forward pass's TP traffic (what hides host launches)."""

    forward_s: float
    backward_s: float
    weight_grad_s: float
    tp_comm_s: float
    pass_comm_s: float
    ep_comm_s: float
    cp: context.CPTime
    ep_deepep_s: float = 0.0
    tp_overlap: tuple[tp_overlap.OverlapPair, ...] = ()


@lru_cache(maxsize=65536)
def _compute_strategy(strategy: LayerStrategy) -> LayerStrategy:
    """``strategy`` under DDP: what _compute_compute reads (the strategies that differ only in
    their dp type share its answer)."""
    return replace(strategy, dp_type=DPType.DDP) if strategy.dp_type != DPType.DDP else strategy


def _sp_split(strategy: LayerStrategy) -> int:
    """Ranks a Megatron-SP all-gather collects its tokens from: tp under Megatron-SP, 1 otherwise
    (an FP8 layer casts the gathered inputs on that shard, fp8.forward_ops)."""
    return strategy.tp if strategy.megatron_sp else 1


@lru_cache(maxsize=65536)
def _sync_strategy(strategy: LayerStrategy) -> LayerStrategy:
    """``strategy`` without recomputation: what _compute_sync reads (the strategies of one layout
    and dp type that differ only in recompute share its answer)."""
    return replace(strategy, recompute=Recompute.NONE) if strategy.recompute != Recompute.NONE else strategy


@register
class AnalyticalModel(CostModel):
    """FLOPs/bytes and alpha-beta cost model for one cluster."""

    name = "analytical"
    rank_symmetric = True
    linear_in_flight = True  # memory.layer_memory: kept activations x in_flight

    def __init__(self, cluster: ClusterSpec, calibration: str | Path | Mapping[str, float] | None = None,
                 constants: AnalyticalConstants | None = None, stack: str = SoftwareStack.MEGATRON_TE,
                 **overrides: float) -> None:
        """``calibration`` (a file or a dict of constants) defaults to the cluster's own file;
        ``constants`` replaces everything; ``stack`` is the software whose kernels it times
        (specs.stack; it refuses plans that state another); ``overrides`` set single named
        constants last."""
        super().__init__(cluster)
        self.stack = software_stack(stack)
        recompute = None if self.stack in SELECTIVE_OP_STACKS else frozenset(MEGATRON_RECOMPUTE)
        self.capabilities = replace(type(self).capabilities, stack=frozenset({self.stack}), recompute=recompute)
        source = cluster.calibration if calibration is None else calibration
        self._calibration_source = source if constants is None else dict(constants.to_dict())
        """What the constants came from, for calibration_status (a file, a dict, '' = defaults)."""
        if constants is None:
            constants = constants_for(source)
        self.constants = constants.with_values(overrides) if overrides else constants
        self._layer_time = Memo(self._compute_layer_time)
        self._pass_kernels = Memo(self._compute_pass_kernels)
        self._op_selective_kernels = Memo(self._compute_op_selective_kernels)
        self._layer_memory = Memo(self._compute_layer_memory)
        self._transition = Memo(self._compute_transition)
        self._cp_core = Memo(self._compute_cp_core)
        self._sync = Memo(self._compute_sync)
        self._compute = Memo(self._compute_compute)
        self._collective = lru_cache(maxsize=4096)(self._compute_collective)
        self._all_to_all = lru_cache(maxsize=16384)(self._compute_all_to_all)

    def with_constants(self, constants: AnalyticalConstants) -> "AnalyticalModel":
        """The same model (cluster, reserve, runtime overhead, expert imbalance, calibration
        status) with other constants: a perturbed copy, with tables of its own."""
        other = type(self)(self.cluster, constants=constants, stack=self.stack)
        other._calibration_source = self._calibration_source
        other.reserve, other.runtime_overhead_bytes = self.reserve, self.runtime_overhead_bytes
        other.expert_imbalance = self.expert_imbalance
        return other

    def error_band(self) -> tuple[float, float]:
        return self.constants.cv_error_p10, self.constants.cv_error_p90

    def calibration_status(self) -> str:
        return calibration_status(self._calibration_source, self.cluster.gpu.name)

    def link_calibration(self) -> dict[str, float]:
        c = self.constants
        return {"bus_efficiency": c.bus_efficiency, "network_efficiency": c.network_efficiency,
                "p2p_efficiency": c.p2p_efficiency, "base_latency_s": c.collective_base_latency_s,
                "step_latency_factor": c.step_latency_factor, "overlap_coefficient": c.overlap_coefficient}

    # -- kernels --------------------------------------------------------------------------
    def op_time(self, op: Op) -> float:
        """Roofline of one kernel: FLOPs at a size-dependent efficiency, or bytes at the
        memory bandwidth, whichever is slower.

        GEMM efficiency eff(F) = eff_max * F / (F + F_half): small GEMMs do not reach peak
        (time = (F + F_half) / (peak * eff_max)). An FP8 GEMM runs at the FP8 peak and its own
        eff_max, with F_half scaled by the peaks' ratio (the same fixed time per kernel).
        Attention run by PyTorch's SDPA (Op.sdpa) runs at the kernel's measured rate on the GPU
        (gpu.sdpa_flash_tflops) where the cluster states one. Memory-bound kernels add a launch
        cost."""
        c, gpu = self.constants, self.cluster.gpu
        memory_s = op.nbytes / (gpu.memory_bandwidth_gbytes_per_s * 1e9 * c.memory_efficiency)
        if op.flops <= 0:
            return memory_s + c.kernel_overhead_s
        if op.sdpa and gpu.sdpa_flash_tflops is not None:  # a measured kernel rate, no efficiency curve
            return max(op.flops / (gpu.sdpa_flash_tflops * 1e12), memory_s)
        if op.fp8:
            fp8_peak = self._fp8_peak_tflops()
            half = c.gemm_half_efficiency_flops * fp8_peak / gpu.peak_tflops
            return max((op.flops + half) / (fp8_peak * 1e12 * c.fp8_gemm_efficiency_max), memory_s)
        compute_s = (op.flops + c.gemm_half_efficiency_flops) / (gpu.peak_tflops * 1e12 * c.gemm_efficiency_max)
        return max(compute_s, memory_s)

    def _fp8_peak_tflops(self) -> float:
        """gpu.peak_fp8_tflops; a one-line refusal where the cluster file states none."""
        gpu = self.cluster.gpu
        if gpu.peak_fp8_tflops is None:
            raise SpecError("gpu.peak_fp8_tflops", f"{gpu.name} states no FP8 peak: the analytical model "
                            f"cannot time FP8 GEMMs on it")
        return gpu.peak_fp8_tflops

    def ops_time(self, ops: Sequence[Op], hidden_host_s: float = 0.0) -> float:
        """GPU time of the kernels, or the host time to issue them if that is longer.

        ``hidden_host_s``: GPU time of collectives enqueued on the same stream between these
        kernels (Megatron's TP all-reduces). Launches are asynchronous, so the host keeps
        issuing while they run: a launch-bound pass's compute is host time minus that."""
        return self._launch_bound((sum(self.op_time(op) for op in ops), len(ops)), hidden_host_s)

    def _launch_bound(self, kernels: tuple[float, int], hidden_host_s: float) -> float:
        """ops_time of (GPU seconds, kernel count) of a kernel list."""
        gpu_s, count = kernels
        return max(gpu_s, count * self.constants.host_time_per_kernel_s - hidden_host_s)

    def _compute_pass_kernels(self, layer: LayerSpec, tp: int, mbs: int, split, cp: int = 1,
                              precision: Precision = Precision.BF16, sp: int = 1) -> tuple[tuple, ...]:
        """(GPU seconds, kernel count) of the layer's forward, of its backward and of the weight-
        gradient GEMMs within that backward (W of a split backward) on one of tp GPUs (s / cp
        tokens), and the GEMMs beside its TP collectives (tp_overlap.site_gemm_s): what every
        strategy of the same split, micro-batch size, expert split, precision and Megatron-SP split
        ``sp`` shares (FP8: cost_models/fp8.py; the norms and residual adds stay on all the rank's
        tokens, docs/cost_models.md, "FP8")."""
        bf16 = self._stack_forward_ops(layer, tp, mbs, split, cp)
        fwd = self._run_forward_ops(bf16, precision, sp)
        bwd = fp8.backward_ops(backward_ops(bf16), precision)
        wgrad = [op for op in bwd if is_weight_gradient(op)]
        return ((sum(map(self.op_time, fwd)), len(fwd)), (sum(map(self.op_time, bwd)), len(bwd)),
                (sum(map(self.op_time, wgrad)), len(wgrad)), tp_overlap.site_gemm_s(self.op_time, fwd, bwd))

    def _stack_forward_ops(self, layer: LayerSpec, tp: int, mbs: int, split, cp: int) -> list[Op]:
        """The layer's BF16 forward kernels as this model's stack runs them (cost_models/stacks.py)."""
        return stacks.forward_ops(forward_ops(layer, tp, mbs, split, cp), layer, self.stack)

    def _run_forward_ops(self, bf16: list[Op], precision: Precision, sp: int) -> list[Op]:
        """The stack's forward kernels ``bf16`` as ``precision`` runs them (cost_models/fp8.py)."""
        return fp8.forward_ops(bf16, precision, sp, stacks.shares_input_casts(self.stack))

    def _compute_op_selective_kernels(self, layer: LayerSpec, tp: int, mbs: int, split, cp: int,
                                      precision: Precision, sp: int) -> tuple[float, int]:
        """(GPU seconds, kernel count) of what selective-op re-runs of the forward
        (op_selective.recomputed_ops), per _pass_kernels' key."""
        bf16 = self._stack_forward_ops(layer, tp, mbs, split, cp)
        ops = op_selective.recomputed_ops(self._run_forward_ops(bf16, precision, sp))
        return sum(map(self.op_time, ops)), len(ops)

    def _memory_bound_s(self, nbytes: float) -> float:
        c = self.constants
        return nbytes / (self.cluster.gpu.memory_bandwidth_gbytes_per_s * 1e9 * c.memory_efficiency)

    # -- per layer --------------------------------------------------------------------------
    def layer_time(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                   micro_batches: int, first_rank: int = 0) -> LayerTime:
        return self._layer_time(layer, strategy, micro_batch_size, micro_batches, first_rank)

    def _compute_layer_time(self, layer: LayerSpec, strategy: LayerStrategy, mbs: int,
                            micro_batches: int, first_rank: int) -> LayerTime:
        tp_groups, traffic, update_s, tp_beside_dp = self._sync(layer, _sync_strategy(strategy), first_rank)
        c = self._compute(layer, _compute_strategy(strategy), mbs, first_rank, tp_groups)
        # the prefetched gather also hides behind the forward's TP collectives on their other link
        per_mb = self.exposed_time(traffic.micro_batch_bwd_s, c.backward_s) + \
            self.exposed_time(traffic.micro_batch_fwd_s, c.forward_s, c.pass_comm_s if tp_beside_dp else 0.0)
        tail = self.exposed_time(traffic.iteration_bwd_s, c.backward_s) + traffic.after_step_s
        cp = c.cp
        return LayerTime(forward_s=c.forward_s, backward_s=c.backward_s, weight_grad_s=c.weight_grad_s,
                         tp_comm_s=c.tp_comm_s, cp_comm_s=cp.comm_s, cp_unbalanced_s=cp.unbalanced_s,
                         cp_core_fwd_s=cp.core_fwd_s, cp_core_bwd_s=cp.core_bwd_s,
                         dp_comm_s=traffic.total_s(micro_batches), exposed_dp_comm_s=tail,
                         exposed_micro_batch_dp_s=per_mb, ep_comm_s=c.ep_comm_s,
                         ep_deepep_s=c.ep_deepep_s, update_s=update_s, tp_overlap=c.tp_overlap)

    def _compute_compute(self, layer: LayerSpec, strategy: LayerStrategy, mbs: int, first_rank: int,
                         tp_groups: RankGroups) -> "ComputeTime":
        """The layer's kernels with its TP, Ulysses, cp and expert traffic on ``tp_groups``: what
        its time shares across dp types (the strategies of one layout and recompute)."""
        per_pass = tp_collectives_per_pass(layer)
        tp_comm_s = seq.tp_comm_time(self.collective_time, layer, strategy, mbs, tp_groups, per_pass)
        pass_comm_s = tp_comm_s / seq.forward_passes(strategy)  # one pass's TP traffic hides host launches
        fwd, bwd, wgrad, gemms = self._pass_kernels(layer, strategy.degrees.split // strategy.cp, mbs,
                                                    experts.compute_split(layer, strategy, self.expert_imbalance),
                                                    strategy.cp, strategy.precision, _sp_split(strategy))
        forward_s = self._launch_bound(fwd, pass_comm_s)
        own_backward_s = self._launch_bound(bwd, pass_comm_s)
        backward_s = own_backward_s + self.recompute_time(layer, strategy, mbs, pass_comm_s)
        # W: the weight-gradient GEMMs' share of the backward's kernels (recompute stays in B)
        weight_grad_s = own_backward_s * wgrad[0] / bwd[0] if bwd[0] > 0 else 0.0
        ep_comm_s = experts.dispatch_time_s(self.all_to_all_time, layer, strategy, mbs, first_rank,
                                            self.expert_imbalance)
        ep_deepep_s = experts.deepep_time_s(self.all_to_all_time, self.cluster, layer, strategy, mbs, first_rank,
                                            self.expert_imbalance)
        return ComputeTime(forward_s=forward_s, backward_s=backward_s, weight_grad_s=weight_grad_s,
                           tp_comm_s=tp_comm_s, pass_comm_s=pass_comm_s, ep_comm_s=ep_comm_s, ep_deepep_s=ep_deepep_s,
                           cp=self.cp_time(layer, strategy, mbs, first_rank),
                           tp_overlap=self._tp_overlap(layer, strategy, mbs, tp_groups, gemms))

    def _tp_overlap(self, layer: LayerSpec, strategy: LayerStrategy, mbs: int, tp_groups: RankGroups,
                    gemms: tuple[tuple[float, float], ...]) -> tuple[tp_overlap.OverlapPair, ...]:
        """The layer's TP collectives beside their GEMMs (cost_models/tp_overlap.py), what a plan with
        tp_comm_overlap hides; none without Megatron-SP over tp > 1."""
        if strategy.tp <= 1 or not strategy.megatron_sp:
            return ()
        nbytes = seq.tp_message_bytes(layer, mbs) / strategy.cp
        comm_s = {kind: self.collective_time(kind, nbytes, tp_groups) for kind in ("all_gather", "reduce_scatter")}
        forward_bytes = seq.forward_gather_bytes(nbytes, strategy)
        forward_comm_s = comm_s if forward_bytes == nbytes else \
            comm_s | {"all_gather": self.collective_time("all_gather", forward_bytes, tp_groups)}
        return tp_overlap.overlap_pairs(gemms, comm_s, strategy.tp, strategy.recompute == Recompute.FULL,
                                        forward_comm_s)

    def _compute_sync(self, layer: LayerSpec, strategy: LayerStrategy, first_rank: int
                      ) -> tuple[RankGroups, DPTraffic, float, bool]:
        """The layer's TP groups, its data-parallel traffic, its optimizer step and whether its TP
        and data-parallel groups run on different link classes (one inside scale-up domains, the
        other across them): what its time shares across micro-batch sizes and counts (the dense
        part over dp; with an expert split the routed experts over their expert-dp groups)."""
        tp_groups, dp_groups = seq.sync_groups(first_rank, strategy)
        parts = experts.sync_parts(layer, strategy, first_rank, dp_groups)
        gather = fp8.gather_bytes_per_param(strategy.precision)
        traffic = _sum_traffic([self.dp_traffic(p.params, p.dp_type, p.groups, gather) for p in parts])
        update_s = sum(self.update_time(p.params, p.dp_type, p.size) for p in parts)
        tp_crosses, dp_crosses = (_ring_link(self.cluster, groups).crosses_nodes for groups in (tp_groups, dp_groups))
        return tp_groups, traffic, update_s, tp_crosses != dp_crosses

    def cp_time(self, layer: LayerSpec, strategy: LayerStrategy, mbs: int, first_rank: int) -> context.CPTime:
        """Context parallelism's exposed K/V traffic and causal imbalance (context.cp_time), against
        the rank's attention-core kernels (forward, and their backward)."""
        if strategy.cp <= 1:
            return context.CPTime()
        d = strategy.degrees
        return context.cp_time(self.collective_time, layer, strategy, mbs, first_rank,
                               *self._cp_core(layer, d.split // d.cp, d.cp, mbs))

    def _compute_cp_core(self, layer: LayerSpec, heads_split: int, cp: int, mbs: int) -> tuple[float, float]:
        """(forward, backward) time of a rank's attention core under cp (seq.rank_ops' kernels):
        what every strategy of the same split, cp and micro-batch size shares."""
        run = stacks.forward_ops(forward_ops(layer, heads_split, mbs, cp=cp), layer, self.stack)
        core = context.blockwise_ops(run)
        return self.ops_time(core), self.ops_time(backward_ops(core))

    def recompute_time(self, layer: LayerSpec, strategy: LayerStrategy, mbs: int,
                       pass_comm_s: float = 0.0) -> float:
        """Forward kernels re-run in backward: all of them (full, with its TP collectives hiding
        host launches as in the forward), all but the kept GEMMs and the fused attention
        (selective-op, op_selective.recomputed_ops of the stack's kernels, FP8 casts included) or
        the attention core (selective: no collective inside)."""
        if strategy.recompute.reruns_forward_collectives:  # experts split as in the forward
            split = experts.compute_split(layer, strategy, self.expert_imbalance)
            args = (layer, strategy.degrees.split // strategy.cp, mbs, split, strategy.cp, strategy.precision,
                    _sp_split(strategy))
            fwd = self._pass_kernels(*args)[0] if strategy.checkpoint else self._op_selective_kernels(*args)
            return self._launch_bound(fwd, pass_comm_s)
        ops = seq.recompute_ops(layer, strategy, mbs)
        return self.ops_time(ops) if ops else 0.0

    def dp_traffic(self, local_params: float, dp_type: str, dp_groups: Sequence[Sequence[int]],
                   gather_bytes_per_param: float = mem.WEIGHT_BYTES_PER_PARAM) -> "DPTraffic":
        """When each data-parallel collective runs, as DDP, Megatron's distributed optimizer,
        DeepSpeed ZeRO-2 and FSDP schedule them: DDP all-reduces once after the last
        micro-batch; ZeRO-1 reduce-scatters then and all-gathers the updated parameters after
        the step; ZeRO-2 keeps gradients sharded, so it reduce-scatters every micro-batch's
        gradients (and all-gathers parameters after the step); ZeRO-3 also all-gathers the
        parameters in every micro-batch's forward and backward, ``gather_bytes_per_param`` each
        (FP8 layers gather FP8 weights: fp8.gather_bytes_per_param). FSDP runs the backward's
        gather (the next layer's parameters) and reduce-scatter (this layer's gradients) on
        streams of their own, at once over the same links: coll.concurrent_time_s."""
        if coll.largest_group(dp_groups) <= 1 or local_params <= 0:
            return DPTraffic()
        nbytes = local_params * mem.GRAD_BYTES_PER_PARAM
        rs = self._bucketed("reduce_scatter", nbytes, dp_groups)
        ag = self._bucketed("all_gather", nbytes, dp_groups)
        if dp_type == DPType.DDP:
            return DPTraffic(iteration_bwd_s=self._bucketed("all_reduce", nbytes, dp_groups))
        if dp_type == DPType.ZERO1:
            return DPTraffic(iteration_bwd_s=rs, after_step_s=ag)
        if dp_type == DPType.ZERO2:
            return DPTraffic(micro_batch_bwd_s=rs, after_step_s=ag)
        gather = self._bucketed_terms("all_gather", local_params * gather_bytes_per_param, dp_groups)
        both = coll.concurrent_time_s([gather, self._bucketed_terms("reduce_scatter", nbytes, dp_groups)])
        return DPTraffic(micro_batch_bwd_s=both, micro_batch_fwd_s=sum(gather))

    def dp_sync_time(self, local_params: float, dp_type: str, dp_groups: Sequence[Sequence[int]]) -> float:
        """One iteration's data-parallel traffic of ``local_params`` parameters with one
        micro-batch (DDP: the gradient all-reduce)."""
        return self.dp_traffic(local_params, dp_type, dp_groups).total_s(1)

    def _bucketed(self, kind: str, nbytes: float, groups: Sequence[Sequence[int]]) -> float:
        """A collective over ``nbytes`` sent in buckets: the latency is paid once per
        dp_bucket_bytes (a layer smaller than a bucket pays its share of one)."""
        priced, share = self._bucket(nbytes)
        return self.collective_time(kind, priced, groups) * share

    def _bucketed_terms(self, kind: str, nbytes: float, groups: Sequence[Sequence[int]]) -> tuple[float, float]:
        """_bucketed's ring (all-gather, reduce-scatter) as its (latency, transfer) terms."""
        priced, share = self._bucket(nbytes)
        latency_s, transfer_s = self.ring_terms(kind, priced, groups)
        return latency_s * share, transfer_s * share

    def _bucket(self, nbytes: float) -> tuple[float, float]:
        """(bytes to price, share of their time): a layer smaller than dp_bucket_bytes pays its share of one."""
        bucket = self.constants.dp_bucket_bytes
        return (bucket, nbytes / bucket) if nbytes < bucket else (nbytes, 1.0)

    def exposed_time(self, comm_s: float, compute_s: float, other_link_s: float = 0.0) -> float:
        """What of ``comm_s`` the compute of ``compute_s`` and ``other_link_s`` of the layer's
        collectives on another link class (TP on NVLink beside data-parallel traffic across
        nodes) cannot hide. Galvatron's overlap, B and C together take max(B, C) + (gamma - 1)
        min(B, C), with the window widened by the other link's T, which C does not contend with:
        max(B + T, C) + (gamma - 1) min(B, C). Only dp_overlap_fraction of the traffic is
        eligible for overlap."""
        c = self.constants
        hidden = c.dp_overlap_fraction * comm_s
        window_s = compute_s + other_link_s
        together = max(window_s, hidden) + (c.overlap_coefficient - 1) * min(compute_s, hidden)
        return (comm_s - hidden) + together - window_s

    def update_time(self, local_params: float, dp_type: str, dp: int) -> float:
        """Optimizer step of the local (ZeRO-sharded) parameters: memory-bound."""
        return self._memory_bound_s(self.constants.optimizer_bytes_per_param * local_params
                                    / mem.optimizer_shard(dp_type, dp))

    def layer_memory(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                     in_flight: int) -> MemoryBreakdown:
        return self._layer_memory(layer, strategy, micro_batch_size, in_flight)

    def _compute_layer_memory(self, layer: LayerSpec, strategy: LayerStrategy, mbs: int,
                              in_flight: int) -> MemoryBreakdown:
        return mem.layer_memory(layer, strategy, mbs, in_flight, imbalance=self.expert_imbalance)

    def transition_time(self, layer: LayerSpec, prev: LayerStrategy, nxt: LayerStrategy,
                        micro_batch_size: int, first_rank: int = 0) -> float:
        return self._transition(layer, prev, nxt, micro_batch_size, first_rank)

    def _compute_transition(self, layer: LayerSpec, prev: LayerStrategy, nxt: LayerStrategy,
                            mbs: int, first_rank: int) -> float:
        return relayout_time(self, layer, prev, nxt, mbs, first_rank)

    # -- communication ------------------------------------------------------------------------
    def collective_time(self, kind: str, nbytes: float, groups: Sequence[Sequence[int]]) -> float:
        """An all-to-all is priced pairwise on the links its pairs cross (all_to_all_time): a
        ring's bytes understate one whose group spans scale-up domains, where every rank sends
        its share to each other node; the other kinds by ring, tree or hierarchy."""
        if kind == "all_to_all":
            return self.all_to_all_time(nbytes, groups)
        return self._collective(kind, float(nbytes), coll.rank_groups(groups))

    def _compute_collective(self, kind: str, nbytes: float, groups: tuple[tuple[int, ...], ...]) -> float:
        """Best of ring, tree (all-reduce) and hierarchical (all-reduce over whole nodes) on the
        bandwidth the concurrent groups leave each ring edge (ClusterSpec.ring_link). The kind is
        checked here, once per answer cached (a refusal is not cached)."""
        coll.check_kind(kind)
        p = coll.largest_group(groups)
        if p <= 1 or nbytes <= 0:
            return 0.0
        alpha, bandwidth, at_scale, crosses = self._ring_constants(p, groups)
        best = coll.ring_time_s(kind, p, nbytes, alpha, bandwidth)
        if kind == "all_reduce":
            best = min(best, coll.tree_allreduce_time_s(p, nbytes, alpha, bandwidth))
            if crosses:
                best = min(best, self._hierarchical_s(nbytes, groups, at_scale))
        return self.constants.collective_base_latency_s + best

    def ring_terms(self, kind: str, nbytes: float, groups: Sequence[Sequence[int]]) -> tuple[float, float]:
        """A ring collective's (latency, transfer) seconds, launch cost in the latency: what
        collective_time charges for the kinds that always run the ring (all-gather,
        reduce-scatter), split for coll.concurrent_time_s."""
        groups = coll.rank_groups(groups)
        p = coll.largest_group(groups)
        if p <= 1 or nbytes <= 0:
            return 0.0, 0.0
        alpha, bandwidth, _, _ = self._ring_constants(p, groups)
        latency_s, transfer_s = coll.ring_terms_s(kind, p, nbytes, alpha, bandwidth)
        return self.constants.collective_base_latency_s + latency_s, transfer_s

    def _ring_constants(self, p: int, groups: tuple[tuple[int, ...], ...]) -> tuple[float, float, float, bool]:
        """(alpha per step, bytes/s per ring edge at scale, the at-scale factor, crosses nodes) of
        ``groups``' rings on the bandwidth the concurrent groups leave each edge (ClusterSpec.ring_link)."""
        link = _ring_link(self.cluster, groups)
        at_scale = self.constants.at_scale_efficiency if p > self.constants.at_scale_ranks else 1.0
        bandwidth = self._effective_bandwidth(link.bandwidth_gbytes_per_s, link.crosses_nodes) * at_scale
        return link.latency_s * self._step_factor(link.crosses_nodes), bandwidth, at_scale, link.crosses_nodes

    def all_to_all_time(self, nbytes: float, groups: Sequence[Sequence[int]]) -> float:
        """Pairwise all-to-all (expert dispatch/combine, Ulysses) with every pair's bytes on its
        path's links (experts.topology_all_to_all_s), plus the launch cost; cached per (bytes,
        groups), whose hash RankGroups keeps (a planner asks the same one for many strategies)."""
        return self._all_to_all(float(nbytes), coll.rank_groups(groups))

    def _compute_all_to_all(self, nbytes: float, groups: tuple[tuple[int, ...], ...]) -> float:
        if coll.largest_group(groups) <= 1 or nbytes <= 0:
            return 0.0
        c = self.constants
        alpha = lambda crosses: (self.cluster.inter_node.latency_us if crosses  # noqa: E731
                                 else self.cluster.intra_node.latency_us) * 1e-6 * self._step_factor(crosses)
        efficiency = lambda nic: c.network_efficiency if nic else c.bus_efficiency  # noqa: E731
        return c.collective_base_latency_s + experts.topology_all_to_all_s(self.cluster, nbytes, groups, alpha,
                                                                           efficiency)

    def _step_factor(self, crosses_nodes: bool) -> float:
        c = self.constants
        return c.network_step_latency_factor if crosses_nodes else c.step_latency_factor

    def _effective_bandwidth(self, gbytes_per_s: float, crosses_nodes: bool) -> float:
        c = self.constants
        return gbytes_per_s * 1e9 * (c.network_efficiency if crosses_nodes else c.bus_efficiency)

    def _hierarchical_s(self, nbytes: float, groups: RankGroups, at_scale: float = 1.0) -> float:
        """Only for groups that hold the same number g > 1 of ranks in each of their scale-up
        domains (nodes, or NVLink racks); ``at_scale`` scales both levels' bandwidth."""
        cl = self.cluster
        found = _domain_parts(groups, cl.domain_gpus)
        if found is None:
            return float("inf")
        g, nodes, parts, across = found
        intra, inter = _ring_link(cl, parts), _ring_link(cl, across)
        return coll.hierarchical_allreduce_time_s(
            g, nodes, nbytes, intra.latency_s * self._step_factor(False),
            inter.latency_s * self._step_factor(True),
            self._effective_bandwidth(intra.bandwidth_gbytes_per_s, False) * at_scale,
            self._effective_bandwidth(inter.bandwidth_gbytes_per_s, True) * at_scale)

    def p2p_time(self, nbytes: float, src: int, dst: int, senders: int = 1) -> float:
        """alpha + n / B, with B the share of the path the concurrent senders leave this one
        (ClusterSpec.transfers_link): four PCIe GPUs behind one switch sending to another
        switch share its uplink."""
        if src == dst or nbytes <= 0:
            return 0.0
        cl = self.cluster
        bottleneck = _lanes_link(cl, src, dst, senders).bandwidth_gbytes_per_s
        crosses = cl.domain_of(src) != cl.domain_of(dst)
        latency_us = cl.inter_node.latency_us if crosses else cl.intra_node.latency_us
        eff = self.constants.network_efficiency if crosses else self.constants.p2p_efficiency
        return coll.p2p_time_s(nbytes, latency_us * 1e-6 * self._step_factor(crosses)
                               + self.constants.collective_base_latency_s, bottleneck * 1e9 * eff)

    def pipeline_message(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int) -> PipelineMessage:
        """Megatron's scatter-gather (``scatter_gather_tensors_in_pipeline``, on by default):
        under tp each rank sends its 1/tp slice and the receivers all-gather the activation over
        their tp group (NVLink); under sequence parallelism the output is already split by
        tp and nothing is gathered."""
        whole = super().pipeline_message(layer, strategy, micro_batch_size).send_bytes / strategy.cp
        tp = strategy.tp * strategy.ulysses  # each cp rank sends its own s / cp tokens
        if tp == 1:
            return PipelineMessage(send_bytes=whole)
        if strategy.sp != SequenceParallel.NONE:
            return PipelineMessage(send_bytes=whole / tp)
        return PipelineMessage(send_bytes=whole / tp, gather_tp=tp, gather_bytes=whole)

    # -- embedding and head -------------------------------------------------------------------
    def vocab_relayout_time(self, model: ModelSpec, plan: Plan, layer_index: int, strategy: LayerStrategy) -> float:
        return vocab_relayout_s(self, model, plan, self.cluster.world_size, layer_index, strategy)

    def vocab_cost(self, model: ModelSpec, plan: Plan, stage: int, world_size: int
                   ) -> tuple[LayerTime, MemoryBreakdown]:
        return vocab_cost(self, model, plan, stage, world_size)


def _sum_traffic(parts: list[DPTraffic]) -> DPTraffic:
    """The data-parallel traffic of a layer's sync parts together (each runs as its own collective)."""
    return DPTraffic(*(sum(getattr(t, f) for t in parts) for f in
                       ("micro_batch_bwd_s", "micro_batch_fwd_s", "iteration_bwd_s", "after_step_s")))


def relayout_time(model: CostModel, layer: LayerSpec, prev: LayerStrategy, nxt: LayerStrategy,
                  mbs: int, first_rank: int) -> float:
    """Same degrees and layout: free. Same dp, other layout: every rank fetches its batch
    shard (p2p, forward and backward). Different dp (ratio r): the smaller-dp side
    all-gathers r shards (forward when dp shrinks, gradients in backward when it grows)."""
    prev_split, next_split = prev.degrees.split, nxt.degrees.split
    gather_s = _sequence_gather_s(model, layer, prev, nxt, mbs, first_rank)
    same_degrees = prev_split == next_split and prev.dp == nxt.dp
    if gather_s > 0 and same_degrees:
        return gather_s
    layout_matters = prev_split > 1 and prev.dp > 1
    if same_degrees and (prev.tp_consecutive == nxt.tp_consecutive or not layout_matters):
        return 0.0
    nbytes = layer.output_elements(mbs) * BYTES_PER_ACTIVATION
    gpus = prev_split * prev.dp
    if prev.dp == nxt.dp:
        return 2 * model.p2p_time(nbytes, first_rank, first_rank + gpus - 1)
    ratio = max(prev.dp, nxt.dp) // min(prev.dp, nxt.dp)
    gathered = nbytes * ratio if prev.dp > nxt.dp else nbytes
    consecutive = nxt.tp_consecutive if next_split > prev_split else prev.tp_consecutive
    return gather_s + model.collective_time("all_gather", gathered,
                                            _gather_groups(first_rank, gpus, ratio, consecutive))


@lru_cache(maxsize=4096)
def _gather_groups(first_rank: int, gpus: int, ratio: int, consecutive: bool) -> RankGroups:
    """The groups of ``ratio`` ranks that gather a changed data-parallel split: neighbours
    (consecutive) or ranks ``gpus / ratio`` apart."""
    ranks = range(first_rank, first_rank + gpus)
    if consecutive:
        return coll.rank_groups([ranks[i:i + ratio] for i in range(0, gpus, ratio)])
    return coll.rank_groups([ranks[j::gpus // ratio] for j in range(gpus // ratio)])


def _sequence_gather_s(model: CostModel, layer: LayerSpec, prev: LayerStrategy, nxt: LayerStrategy,
                       mbs: int, first_rank: int) -> float:
    """A sequence-split output (Megatron-SP, Ulysses, cp) feeding a layer that wants whole
    sequences, or the reverse: one all-gather over the split side's group (the activation in
    forward or its gradient in backward; the other direction is a local slice)."""
    split = [s for s in (prev, nxt) if s.degrees.seq_split > 1]
    if len(split) != 1:
        return 0.0
    groups = seq.sequence_groups(first_rank, split[0])
    return model.collective_time("all_gather", layer.output_elements(mbs) * BYTES_PER_ACTIVATION, groups)
