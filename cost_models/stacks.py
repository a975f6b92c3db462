"""Each software stack's kernels for one Transformer block: the fused list of cost_models.ops
(Megatron-Core with Transformer Engine) rewritten as PyTorch eager or torch.compile runs it.

Facts used (docs/cost_models.md, "Software stacks"):
- torchtitan's Llama block (and Hugging Face's) holds separate Q, K, V projections and separate
  gate and up projections (w1, w3) where Megatron fuses one QKV GEMM and one FC1 GEMM; the GEMMs
  stay separate under torch.compile (Inductor fuses pointwise and reduction kernels, not
  matmuls).
- Eager RMSNorm is ATen's composite ``rms_norm`` (PyTorch 2.4-2.7, the versions of the published
  eager runs; a fused CUDA kernel came later): the input cast to fp32, squared, a row mean, the
  rsqrt, the product, the cast back and the weight product, one kernel each. LayerNorm has a
  fused ATen kernel in eager as well.
- Eager SwiGLU is ``silu(w1 x) * w3 x``: the SiLU and the product are two kernels.
- torch.compile fuses each norm and the SiLU-product into one kernel: the fused list's bytes.
- Attention goes through ``scaled_dot_product_attention``, whose default fused kernel is the
  flash backend (FlashAttention-2; cuDNN attention has been opt-in since PyTorch 2.5.1, in every
  build the published eager and compile runs used): it runs at ``gpu.sdpa_flash_tflops`` where
  the cluster states it (``Op.sdpa``). Megatron-TE runs cuDNN's fused attention.
"""
from __future__ import annotations

from dataclasses import replace

from cost_models.ops import ELEMENT_BYTES, Op, gemm
from specs import LayerSpec
from specs.stack import SoftwareStack

RMSNORM_EAGER_BYTES = (("to_fp32", 2 + 4), ("pow", 4 + 4), ("mean", 4), ("scale", 4 + 4), ("to_bf16", 4 + 2),
                       ("weight", 2 + 2))
"""ATen's composite rms_norm over a bf16 input, per element: (kernel, bytes read plus written).
The eps add and the rsqrt run per row (two more kernels, bytes left out)."""
RMSNORM_EAGER_ROW_KERNELS = ("add_eps", "rsqrt")
"""Its per-row kernels (one fp32 read and write per row)."""
NORMS = ("norm1", "norm2", "norm_x")
"""The block's norm kernels in the fused list (cost_models.ops.forward_ops)."""
FUSED_NORM_BYTES = 2 * ELEMENT_BYTES
"""The fused norm reads and writes each bf16 element once."""


def shares_input_casts(stack: SoftwareStack) -> bool:
    """Whether one FP8 cast of an input serves every GEMM that reads it (fp8.SHARED_INPUTS):
    torch.compile's graph common-subexpression pass (AOTAutograd's ``fx_graph_cse``, on by
    default) merges the identical casts torchao's separate Q/K/V and gate/up linears each ask for;
    eager runs each; Megatron-TE's fused QKV and FC1 GEMMs have one input cast already."""
    return stack == SoftwareStack.COMPILE


def forward_ops(ops: list[Op], layer: LayerSpec, stack: SoftwareStack) -> list[Op]:
    """``ops`` (ops.forward_ops: the Megatron-TE list) as ``stack`` runs the block."""
    if stack == SoftwareStack.MEGATRON_TE:
        return ops
    out: list[Op] = []
    for op in ops:
        out += _as_run(op, layer, stack)
    return out


def _as_run(op: Op, layer: LayerSpec, stack: SoftwareStack) -> list[Op]:
    """One fused-list kernel as ``stack`` (eager or compile) runs it."""
    if op.name.endswith("qkv") and layer.mla is None:
        return _split_gemm(op, "qkv", ("q", "k", "v"), (layer.q_width, layer.kv_width, layer.kv_width))
    if layer.gated_ffn and op.name.endswith("fc1"):
        return _split_gemm(op, "fc1", ("w1", "w3"), (1, 1))
    if op.name.endswith("flash_attn"):
        return [replace(op, sdpa=True)]
    if stack != SoftwareStack.EAGER:
        return [op]
    if layer.gated_ffn and op.name.endswith("act"):
        gated = op.nbytes / ELEMENT_BYTES / 3  # the fused kernel reads 2 x and writes x per element x
        return [Op(f"{op.name}_silu", 0.0, ELEMENT_BYTES * (gated + gated)),
                Op(f"{op.name}_mul", 0.0, ELEMENT_BYTES * (2 * gated + gated))]
    if op.name in NORMS and layer.norm == "rmsnorm":
        elements = op.nbytes / FUSED_NORM_BYTES
        rows = elements / layer.hidden_size
        return ([Op(f"{op.name}_{kernel}", 0.0, nbytes * elements) for kernel, nbytes in RMSNORM_EAGER_BYTES]
                + [Op(f"{op.name}_{kernel}", 0.0, 4 * 2 * rows) for kernel in RMSNORM_EAGER_ROW_KERNELS])
    return [op]


def _split_gemm(op: Op, suffix: str, names: tuple[str, ...], widths: tuple[float, ...]) -> list[Op]:
    """The fused linear GEMM ``op`` (named ...``suffix``) as one GEMM per output slice, in the
    ratio of ``widths``."""
    m, n, k = op.linear
    stem, total = op.name.removesuffix(suffix), sum(widths)
    return [gemm(f"{stem}{name}", m, n * w / total, k) for name, w in zip(names, widths)]
