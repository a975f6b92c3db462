"""Activation checkpointing per layer: full (keep the block's input, recompute the rest in backward),
selective (torch.utils.checkpoint with a selective-checkpoint policy over each attention
sub-layer: matmul outputs and collectives kept, the attention core recomputed) or selective-op
(torchtitan's per-op policy over the whole block, cost_models/op_selective.py). A selective
sub-layer's input hooks (tensor parallelism's layout change at its entry: Megatron-SP's
all-gather) run before its checkpointed region, once, as Megatron gathers the input outside the
recomputed core: inside it, recomputation replays the gather's DTensor dispatch in backward (the
policy's cache hands back the kept result, so no second collective goes out, but torch.profiler
lists the replayed op)."""
from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

SAVED_OPS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default})
"""The projections' matmuls (q, k, v, o: nn.Linear lowers to mm/addmm); the core's own matmuls
run inside the attention kernel (or as bmm), so they are recomputed."""
SAVED_NAMESPACES = frozenset({"_c10d_functional"})
"""Functional collectives (tensor-parallel gathers, Ulysses' all-to-alls): never re-run in
backward. (In-place c10d collectives are re-run: a kept result of one would be lost.)"""


SDPA_OPS = frozenset(getattr(torch.ops.aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"))
"""The fused attention kernels whose outputs torchtitan's per-op policy keeps (the CPU one too)."""
KEPT_REDUCE_SCATTER = torch.ops._c10d_functional.reduce_scatter_tensor.default
"""The one collective whose result the per-op policy keeps (Megatron-SP's, after a row-parallel GEMM)."""


def op_selective_contexts():
    """torchtitan's per-op policy for one checkpointed call (a fresh matmul count per call): keep
    the 1st, 3rd, ... matmul of the block in forward order (``mm``, and ``addmm`` where the model has
    biases, which torchtitan's Llama has not), the fused attention's outputs and functional
    reduce-scatters; recompute the rest, all-gathers and all-reduces included."""
    counts = {False: 0, True: 0}  # forward, recompute

    def policy(ctx, op, *_args, **_kwargs) -> CheckpointPolicy:
        if op in SAVED_OPS:
            counts[ctx.is_recompute] += 1
            return CheckpointPolicy.MUST_SAVE if counts[ctx.is_recompute] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        if op in SDPA_OPS or op == KEPT_REDUCE_SCATTER:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


def selective_policy(_ctx, op, *_args, **_kwargs) -> CheckpointPolicy:
    """Korthikanti et al.'s selective recomputation: keep every matmul output, recompute the rest
    of the attention sub-layer (QK^T, softmax, attention over V and the reshapes around them)."""
    if op in SAVED_OPS or getattr(op, "namespace", "") in SAVED_NAMESPACES:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class Checkpointed(nn.Module):
    """``inner`` with its activations recomputed in backward (non-reentrant checkpoint); with a
    ``context_fn`` (a selective-checkpoint policy's contexts) only what it does not save is
    recomputed; ``hoist_hooks``: ``inner``'s input hooks run once, before the checkpoint."""

    def __init__(self, inner: nn.Module, context_fn=None, hoist_hooks: bool = False) -> None:
        super().__init__()
        self.inner, self.context_fn = inner, context_fn
        if hoist_hooks:
            _hoist_pre_hooks(inner, self)

    def forward(self, *args, **kwargs) -> torch.Tensor:
        if self.context_fn is None:
            return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)
        return checkpoint(self.inner, *args, use_reentrant=False, context_fn=self.context_fn, **kwargs)


def _hoist_pre_hooks(inner: nn.Module, outer: nn.Module) -> None:
    """Move ``inner``'s forward pre-hooks to ``outer`` (in order, kwargs flags kept): they then run
    before the checkpoint, on the arguments ``outer`` hands on to ``inner``."""
    for hook_id, hook in inner._forward_pre_hooks.items():
        outer._forward_pre_hooks[hook_id] = hook
        if hook_id in inner._forward_pre_hooks_with_kwargs:
            outer._forward_pre_hooks_with_kwargs[hook_id] = True
    inner._forward_pre_hooks.clear()
    inner._forward_pre_hooks_with_kwargs.clear()


def apply_ac(block: nn.Module, recompute: str) -> nn.Module:
    """full: checkpoint the whole block; selective-op: the whole block under torchtitan's per-op
    policy (its hooks inside, as torchtitan's checkpoint wrapper has them); selective: each
    attention sub-layer under the selective policy (its core recomputed, its projections kept);
    none: as is."""
    if recompute == "full":
        return Checkpointed(block)
    if recompute == "selective-op":
        return Checkpointed(block, op_selective_contexts)
    if recompute == "selective":
        contexts = partial(create_selective_checkpoint_contexts, selective_policy)
        for name in ("attn", "cross"):
            if getattr(block, name, None) is not None:
                setattr(block, name, Checkpointed(getattr(block, name), contexts, hoist_hooks=True))
    return block
