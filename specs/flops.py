"""The figures people compare: model FLOPs per iteration, tokens/s per GPU, TFLOP/s per GPU and
MFU, counted as Megatron-LM and PaLM count them (recomputation never counted)."""
from __future__ import annotations

from dataclasses import dataclass

from specs.cluster import ClusterSpec
from specs.model import ModelSpec

FLOP_FORMULA = ("per token 6 x active params + 12 x layers x seq x attention width (3 x the forward "
                "matmuls, as Megatron-LM and PaLM count); MFU against the GPU's dense BF16 peak; "
                "recomputation not counted")
"""One line naming the count, for tables and reports."""


def training_flops(model: ModelSpec, global_batch: int) -> float:
    """Model FLOPs of one training iteration of ``global_batch`` samples: three times the forward
    matmul FLOPs of every layer and the head (2 per multiply-add; attention over the whole
    sequence, not halved for a causal mask; MoE layers through their active experts only). For
    GPT this is 72 B s L h^2 (1 + s / 6h + V / 12 L h)."""
    return 3.0 * model.forward_flops(global_batch)


def tokens_per_sample(model: ModelSpec) -> int:
    """Tokens (or patches) one sample carries into the first layer."""
    return model.seq_len


@dataclass(frozen=True, kw_only=True)
class Throughput:
    """A plan's speed in the units papers and frameworks report."""

    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    """Model TFLOP/s each GPU achieves (``training_flops`` / iteration time / GPUs)."""
    mfu: float
    """tflops_per_gpu / the GPU's dense BF16 peak (a fraction)."""


def throughput(model: ModelSpec, cluster: ClusterSpec, global_batch: int, iteration_time_s: float) -> Throughput:
    """Tokens/s/GPU, TFLOP/s/GPU and MFU of one iteration of ``global_batch`` samples taking
    ``iteration_time_s`` on every GPU of ``cluster``."""
    gpus = cluster.world_size
    per_gpu_s = iteration_time_s * gpus
    tflops = training_flops(model, global_batch) / per_gpu_s / 1e12
    return Throughput(tokens_per_s_per_gpu=global_batch * tokens_per_sample(model) / per_gpu_s,
                      tflops_per_gpu=tflops, mfu=tflops / cluster.gpu.peak_tflops)
