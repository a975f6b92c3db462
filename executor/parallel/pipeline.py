"""Pipeline parallelism with torch.distributed.pipelining, the plan's schedule's class (named in
specs.schedules): one model chunk per rank (uneven layer partitions as the plan says) or v chunks
per rank, placed as the schedule says (chunk j is pipeline stage j of pp * v: rank j % pp
round-robin, or a V: ranks 0 .. pp - 1 and back)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleMulti

from specs.schedules import schedule_entry


def apply_pp(chunks: dict[int, nn.Module], num_chunks: int, group: dist.ProcessGroup,
             device: torch.device, micro_batches: int, schedule: str,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """The plan's ``schedule`` (its torch class) running this rank's ``chunks`` ({pipeline
    stage index: module}) of ``num_chunks`` over the lane ``group``; a multi-stage class takes
    them all, a single-stage class the one.

    Gradients are not rescaled by the schedule: the loss already carries 1/global_batch.
    """
    stages = [PipelineStage(module, j, num_chunks, device, group=group) for j, module in sorted(chunks.items())]
    cls = getattr(pipelining, schedule_entry(schedule).torch_class)
    held = stages if issubclass(cls, PipelineScheduleMulti) else stages[0]  # torch's V classes place the V themselves
    return cls(held, n_microbatches=micro_batches, loss_fn=loss_fn, scale_grads=False)


def run_schedule(schedule, stage: int, head_stage: int, inputs: torch.Tensor, targets: torch.Tensor
                 ) -> list[torch.Tensor]:
    """One iteration; returns the per-micro-batch losses on the rank of the last chunk (else []).
    Rank 0 feeds the inputs (it holds the first chunk), rank ``head_stage`` scores (pp - 1, or
    rank 0 itself under a V-shaped schedule)."""
    losses: list[torch.Tensor] = []
    # the last stage's outputs (the logits) are not kept for the caller: training reads only
    # the losses, and keeping them would hold every micro-batch's logits until the step ends
    feeds = (inputs,) if stage == 0 else ()
    scores = {"target": targets, "losses": losses} if stage == head_stage else {}
    schedule.step(*feeds, return_outputs=False, **scores)
    return losses
