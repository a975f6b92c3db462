"""Pipeline parallelism with torch.distributed.pipelining, the plan's schedule's class (named in
specs.schedules): one model chunk per rank (uneven layer partitions as the plan says) or v chunks
per rank, layers round-robin (chunk j is pipeline stage j of pp * v and runs on rank j % pp)."""
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
    held = stages if issubclass(cls, PipelineScheduleMulti) else stages[0]
    return cls(held, n_microbatches=micro_batches, loss_fn=loss_fn, scale_grads=False)


def run_schedule(schedule, stage: int, pp: int, inputs: torch.Tensor, targets: torch.Tensor
                 ) -> list[torch.Tensor]:
    """One iteration; returns the per-micro-batch losses on the last rank (else []). Rank 0
    feeds the inputs (it holds the first chunk), rank pp - 1 scores (it holds the last)."""
    losses: list[torch.Tensor] = []
    # the last stage's outputs (the logits) are not kept for the caller: training reads only
    # the losses, and keeping them would hold every micro-batch's logits until the step ends
    if stage == 0:
        schedule.step(inputs, return_outputs=False)
    elif stage == pp - 1:
        schedule.step(target=targets, losses=losses, return_outputs=False)
    else:
        schedule.step(return_outputs=False)
    return losses
