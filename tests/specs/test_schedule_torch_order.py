"""The registry's stage programs against the order torch.distributed.pipelining's multi-stage
classes build (their ``pipeline_order``), on stand-in stages: the memory model's in-flight
counts read the registry's order, the executor runs torch's."""
from types import SimpleNamespace

import pytest
import torch
from torch.distributed import pipelining

from specs.schedules import OpKind, schedule_entry

KIND = {"FORWARD": OpKind.FORWARD, "BACKWARD_INPUT": OpKind.BACKWARD, "BACKWARD_WEIGHT": OpKind.WEIGHT}


def torch_program(schedule: str, stage: int, pp: int, micro_batches: int, v: int) -> list[tuple]:
    """(kind, local chunk, micro-batch) of torch's program for ``stage``; a full backward reads
    as B, or under a split-backward schedule (DualPipeV's overlapped pairs) as B then W, as the
    registry writes them."""
    entry = schedule_entry(schedule)
    chunks = entry.stage_chunks(stage, pp, v)
    stand_ins = [SimpleNamespace(group_size=pp, group_rank=stage, num_stages=pp * v, stage_index=j,
                                 is_first=j == 0, is_last=j == pp * v - 1, submod=torch.nn.Identity())
                 for j in chunks]
    built = getattr(pipelining, entry.torch_class)(stand_ins, n_microbatches=micro_batches,
                                                   loss_fn=lambda out, target: out)
    full = (OpKind.BACKWARD, OpKind.WEIGHT) if entry.splits_backward else (OpKind.BACKWARD,)
    program = []
    for action in built.pipeline_order[stage]:
        for a in (action.sub_actions or [action]) if action is not None else ():
            local, name = chunks.index(a.stage_index), a.computation_type.name
            kinds = full if name == "FULL_BACKWARD" else (KIND[name],)
            program += [(kind, local, a.microbatch_index) for kind in kinds]
    return program


@pytest.mark.parametrize("schedule,v", [("interleaved_1f1b", 2), ("zb_h1", 1), ("zbv", 2), ("dualpipev", 2),
                                        ("looped_bfs", 2)])
@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8)])
def test_registry_runs_torchs_order(schedule, v, pp, m):
    entry = schedule_entry(schedule)
    for stage in range(pp):
        registry = [(op.kind, op.chunk, op.micro_batch) for op in entry.ops(stage, pp, m, v)]
        assert registry == torch_program(schedule, stage, pp, m, v), (schedule, stage)
