"""Megatron tensor parallelism with DTensor: q/k/v and fc1 (gate/up) split by columns, o and
fc2 (down) by rows, so each block needs one all-reduce in forward and one in backward per
sub-layer (the sub-layer's input enters as one replicated DTensor, Megatron's f, so the
column-parallel projections' input gradients are summed before that one all-reduce). Norms and
Swin's patch merging stay replicated on the TP group.

With sequence parallelism the residual stream and the norms are split along the sequence
between the TP ranks (all-gather before attention/MLP, reduce-scatter after). The block's
entry and exit layouts are declared (sequence-sharded inside; outside replicated, or this rank's
sequence chunk where the neighbouring block keeps the same split, as Megatron keeps the residual
stream: specs.keeps_sequence_split): without that, gradients come out silently wrong.
"""
from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)


def tp_plan(block: nn.Module, sequence_parallel: bool = False) -> dict[str, object]:
    """Split style of each submodule of ``block`` (by name)."""
    # with SP the row-parallel outputs are reduce-scattered and kept as DTensors for the residual
    row = RowwiseParallel(output_layouts=Shard(1), use_local_output=False) if sequence_parallel else RowwiseParallel()
    plan: dict[str, object] = {}
    for attn in ("attn", "cross"):
        if getattr(block, attn, None) is not None:
            plan.update({f"{attn}.{n}": ColwiseParallel() for n in ("q", "k", "v")})
            plan[f"{attn}.o"] = row
    # a MoE splits only its shared experts like a dense MLP (routed ones: parallel/expert.py)
    mlp, prefix = (block.mlp.shared, "mlp.shared") if hasattr(block.mlp, "experts") else (block.mlp, "mlp")
    if mlp is not None:
        names = ("gate", "up", "down") if mlp.gated else ("fc1", "fc2")
        plan.update({f"{prefix}.{n}": ColwiseParallel() for n in names[:-1]})
        plan[f"{prefix}.{names[-1]}"] = row
    if sequence_parallel:
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan.update({"attn": gather, "mlp": gather, "norm1": SequenceParallel(), "norm2": SequenceParallel()})
    else:  # Megatron's f: one replicated DTensor feeds q, k and v (fc1, or gate and up), so their
        # partial input gradients add up before the one all-reduce of the sub-layer's backward
        entry = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),))
        plan.update({"attn": entry} if getattr(block, "attn", None) is not None else {})
        plan.update({"mlp": entry} if mlp is not None and prefix == "mlp" else {})
    return plan


def apply_tp(block: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool = False, *, split_in: bool = False,
             split_out: bool = False) -> nn.Module:
    """Shard ``block`` over ``tp_mesh`` (no-op on a 1-rank mesh). With sequence parallelism
    ``split_in``: its input arrives as this rank's sequence chunk (else whole, cut on entry);
    ``split_out``: its output leaves as this rank's chunk (else gathered whole on exit)."""
    if tp_mesh.size() == 1:
        return block
    if sequence_parallel:  # a local chunk is a Shard(1) DTensor's: from_local/to_local, no collective
        outside_in, outside_out = (Shard(1) if split else Replicate() for split in (split_in, split_out))
        parallelize_module(block, tp_mesh, PrepareModuleInput(input_layouts=(outside_in,),
                                                              desired_input_layouts=(Shard(1),)))
        parallelize_module(block, tp_mesh, PrepareModuleOutput(output_layouts=(Shard(1),),
                                                               desired_output_layouts=(outside_out,)))
    return parallelize_module(block, tp_mesh, tp_plan(block, sequence_parallel))
