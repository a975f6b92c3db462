"""Training precision of a layer's linear layers (GEMMs): BF16, or an FP8 recipe; and which GPUs
run each (the FP8 peak, MX block scaling)."""
from __future__ import annotations

from enum import StrEnum
from typing import Any, Iterable

from specs.errors import SpecError


class Precision(StrEnum):
    """The arithmetic of a layer's linear layers (QKV, projection, MLP, experts). Attention
    (flash), norms, the embedding, the head and the optimizer stay in BF16/FP32 under every
    value, as Transformer Engine and torchao run them."""

    BF16 = "bf16"
    """BF16 GEMMs (mixed precision with FP32 master weights)."""
    FP8_DELAYED = "fp8-delayed"
    """FP8 GEMMs, one scale per tensor taken from an amax history of earlier iterations
    (Transformer Engine's DelayedScaling, E4M3 forward and E5M2 gradients): the amax is a
    by-product of the cast, no extra pass."""
    FP8_CURRENT = "fp8-current"
    """FP8 GEMMs, one scale per tensor from the tensor's own amax (Transformer Engine's
    Float8CurrentScaling, torchao float8 ``tensorwise``): an amax pass before each cast."""
    MXFP8 = "mxfp8"
    """FP8 GEMMs with one E8M0 scale per 32 consecutive elements (OCP microscaling, Transformer
    Engine's MXFP8BlockScaling): tensor cores apply the scales, so it needs a GPU that has them
    (``gpu.mxfp8``: Blackwell)."""

    @property
    def is_fp8(self) -> bool:
        return self != Precision.BF16


PRECISIONS = tuple(Precision)
FP8_RECIPES = tuple(p for p in Precision if p.is_fp8)


def precision(value: Any, field: str = "precision") -> Precision:
    """``value`` as a Precision; a one-line SpecError naming ``field`` otherwise."""
    try:
        return Precision(value)
    except ValueError:
        raise SpecError(field, f"{value!r} is not a precision; choose from {', '.join(PRECISIONS)}") from None


def gpu_refusal(p: Precision, gpu: Any) -> str:
    """Why ``gpu`` (a GPUSpec) cannot run ``p`` ('' when it can): FP8 needs ``gpu.peak_fp8_tflops``,
    MXFP8 also ``gpu.mxfp8``."""
    if p.is_fp8 and gpu.peak_fp8_tflops is None:
        return f"{p} needs an FP8 peak, and gpu.peak_fp8_tflops of {gpu.name} is not stated"
    if p == Precision.MXFP8 and not gpu.mxfp8:
        return f"mxfp8 needs tensor cores with MX block scaling (gpu.mxfp8), which {gpu.name} lacks"
    return ""


def runnable_on(precisions: Iterable[str], gpu: Any) -> tuple[Precision, ...]:
    """The precisions of ``precisions`` that ``gpu`` runs, in order."""
    return tuple(p for p in map(Precision, precisions) if not gpu_refusal(p, gpu))


def default_recipe(gpu: Any) -> Precision:
    """The FP8 recipe ``fp8`` stands for on ``gpu``: MXFP8 where its tensor cores take MX scales
    (Transformer Engine's recommendation on Blackwell), per-tensor current scaling otherwise
    (Megatron-Bridge's FP8-CS, torchao's tensorwise)."""
    return Precision.MXFP8 if gpu.mxfp8 else Precision.FP8_CURRENT


def fp8_recipe(values: Iterable[str]) -> Precision:
    """The one FP8 recipe among ``values`` (BF16 when none); a SpecError when there are two:
    frameworks run one recipe per training run."""
    used = {Precision(v) for v in set(values)}  # a plan's layers repeat a few values
    recipes = [p for p in FP8_RECIPES if p in used]
    if len(recipes) > 1:
        raise SpecError("precision", f"a plan takes one FP8 recipe beside bf16, got {', '.join(recipes)}")
    return recipes[0] if recipes else Precision.BF16


__all__ = ["FP8_RECIPES", "PRECISIONS", "Precision", "default_recipe", "fp8_recipe", "gpu_refusal", "precision", "runnable_on"]
