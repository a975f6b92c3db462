"""Activation checkpointing per layer: full (keep the block's input, recompute the rest in backward)
or selective (torch.utils.checkpoint with a selective-checkpoint policy over each attention
sub-layer: matmul outputs and collectives kept, the attention core recomputed). A selective
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


def selective_policy(_ctx, op, *_args, **_kwargs) -> CheckpointPolicy:
    """Korthikanti et al.'s selective recomputation: keep every matmul output, recompute the rest
    of the attention sub-layer (QK^T, softmax, attention over V and the reshapes around them)."""
    if op in SAVED_OPS or getattr(op, "namespace", "") in SAVED_NAMESPACES:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class Checkpointed(nn.Module):
    """``inner`` with its activations recomputed in backward (non-reentrant checkpoint); with a
    ``policy`` only what the policy does not save is recomputed."""

    def __init__(self, inner: nn.Module, policy=None) -> None:
        super().__init__()
        self.inner, self.policy = inner, policy
        if policy is not None:
            _hoist_pre_hooks(inner, self)

    def forward(self, *args, **kwargs) -> torch.Tensor:
        if self.policy is None:
            return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)
        context_fn = partial(create_selective_checkpoint_contexts, self.policy)
        return checkpoint(self.inner, *args, use_reentrant=False, context_fn=context_fn, **kwargs)


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
    """full: checkpoint the whole block; selective: each attention sub-layer under the selective
    policy (its core recomputed, its projections kept); none: as is."""
    if recompute == "full":
        return Checkpointed(block)
    if recompute == "selective":
        for name in ("attn", "cross"):
            if getattr(block, name, None) is not None:
                setattr(block, name, Checkpointed(getattr(block, name), selective_policy))
    return block
