"""The local launcher: results by rank, a failing or hung rank ends the run naming it."""
import time

import pytest
import torch
import torch.distributed as dist

from executor.launch import LaunchError, launch


def _sum_ranks(rank, world):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return rank, float(t)


def _fail_on_one(rank, world):
    if rank == 1:
        raise ValueError("boom on purpose")
    dist.barrier()  # rank 0 waits forever for rank 1: the launcher must still end the run
    return rank


def _hang_on_zero(rank, world):
    if rank == 0:
        time.sleep(60)
    return rank


def _die_on_one(rank, world):
    if rank == 1:
        import os
        os._exit(3)
    time.sleep(60)


def test_results_come_back_by_rank():
    assert launch(_sum_ranks, 3, timeout_s=60) == [(0, 3.0), (1, 3.0), (2, 3.0)]


def test_a_raising_rank_is_named():
    with pytest.raises(LaunchError, match="rank 1: ValueError: boom on purpose") as err:
        launch(_fail_on_one, 2, timeout_s=60)
    assert err.value.rank == 1


def test_a_hung_rank_times_out_with_its_name():
    with pytest.raises(LaunchError, match=r"rank 0: timed out after 3 s"):
        launch(_hang_on_zero, 2, timeout_s=3)


def test_a_dead_rank_is_named():
    with pytest.raises(LaunchError, match="rank 1: died"):
        launch(_die_on_one, 2, timeout_s=30)
