"""Pipeline parallelism with torch.distributed.pipelining: one model chunk per rank (GPipe or
1F1B, uneven layer partitions as the plan says) or v chunks per rank, layers round-robin
(interleaved 1F1B: chunk j is pipeline stage j of pp * v and runs on rank j % pp)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from specs import Schedule

SCHEDULE_CLASSES = {Schedule.GPIPE: ScheduleGPipe, Schedule.ONE_F_ONE_B: Schedule1F1B}


def apply_pp(chunks: dict[int, nn.Module], num_chunks: int, group: dist.ProcessGroup,
             device: torch.device, micro_batches: int, schedule: str,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """The schedule that runs this rank's ``chunks`` ({pipeline stage index: module}) of
    ``num_chunks`` over the lane ``group``: the plan's schedule for one chunk per rank,
    ScheduleInterleaved1F1B (depth first, Megatron's order) for several.

    Gradients are not rescaled by the schedule: the loss already carries 1/global_batch.
    """
    stages = [PipelineStage(module, j, num_chunks, device, group=group) for j, module in sorted(chunks.items())]
    if len(stages) > 1:
        return ScheduleInterleaved1F1B(stages, n_microbatches=micro_batches, loss_fn=loss_fn, scale_grads=False)
    return SCHEDULE_CLASSES[schedule](stages[0], n_microbatches=micro_batches, loss_fn=loss_fn,
                                      scale_grads=False)


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
