"""The profiler's collective benchmarks: which groups they time, the profile fields worked out by
hand from given medians, and one process group per set of ranks however often they are built."""
import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import specs
from executor import profile
from executor.collectives_bench import collective_entries, collective_fields, degrees, layouts, rank_sets
from executor.launch import launch
from executor.parallel.layout import GroupCache


def test_layouts_tile_the_world_consecutively_and_strided():
    assert layouts(8) == [(2, True), (2, False), (4, True), (4, False), (8, True)]
    assert layouts(2) == [(2, True)]  # strided over the whole world is the same group
    assert layouts(6) == [(2, True), (2, False)]  # only sizes that tile the world
    assert degrees(12) == [2, 4] and degrees(3) == []
    assert rank_sets(8, 4, True) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert rank_sets(8, 2, False) == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_profile_fields_from_the_median_times_by_hand():
    nbytes, world = 4_000_000, 4
    ms = {f"{kind}/{size}_{'consec' if c else 'strided'}": 1.0 for kind in ("all_reduce", "all_gather", "reduce_scatter")
          for size, c in layouts(world)}
    ms.update({"all_reduce/2_consec": 2.0,  # 2 (2-1)/2 x 4 MB in 2 ms: 2 GB/s
               "all_gather/4_consec": 3.0,  # (4-1)/4 x 4 MB in 3 ms: 1 GB/s
               "reduce_scatter/2_strided": 0.5,  # (2-1)/2 x 4 MB in 0.5 ms: 4 GB/s
               "p2p/2": 4.0, "p2p/4": 8.0,  # 4 MB in 4 ms: 1 GB/s; in 8 ms: 0.5 GB/s
               "all_reduce/latency": 0.05,
               "overlap/compute": 10.0, "overlap/comm": 4.0, "overlap/together": 12.0})
    f = collective_fields(ms, world, nbytes)
    assert f["allreduce_gbytes_per_s"]["2_consec"] == pytest.approx(2.0)
    assert f["allreduce_gbytes_per_s"]["4_consec"] == pytest.approx(1.5 * 4e6 / 1e-3 / 1e9)
    assert f["collective_gbytes_per_s"]["all_gather"]["4_consec"] == pytest.approx(1.0)
    assert f["collective_gbytes_per_s"]["reduce_scatter"]["2_strided"] == pytest.approx(4.0)
    assert f["p2p_gbytes_per_s"] == pytest.approx({"2": 1.0, "4": 0.5})
    assert f["allreduce_latency_us"] == pytest.approx(50.0)
    assert f["overlap_coefficient"] == pytest.approx(1 + (12 - 10) / 4)  # 1 + (together - max) / min
    ms["overlap/together"] = 9.0  # faster together than the longer alone: no slowdown, not a speed-up
    assert collective_fields(ms, world, nbytes)["overlap_coefficient"] == 1.0


def _groups_made(rank, world):
    """The process groups this rank joins while the benchmark is built twice and a tp-2 and a
    ZeRO-3 layer timing are set up, all from one cache; and the benchmark's keys."""
    before = set(c10d._world.pg_map)
    groups = GroupCache()
    entries = collective_entries(world, 1 << 12, groups, "cpu")
    collective_entries(world, 1 << 12, groups, "cpu")
    timings = profile.Timings("cpu", repeats=1, warmup=0)
    layer = specs.load_model("tiny-gpt").layers[0]
    for kwargs in ({"tp": 2}, {"zero3": True}, {"tp": 2}):
        profile.time_layer(layer, 0, [1], timings, torch.float32, groups=groups, **kwargs)
    made = [tuple(dist.get_process_group_ranks(pg)) for pg in c10d._world.pg_map if pg not in before]
    return sorted(made), sorted(entries)


def test_the_benchmark_and_the_layer_timings_make_one_group_per_set_of_ranks():
    made, keys = launch(_groups_made, 4, timeout_s=120)[0]
    assert made == [(0, 1), (0, 1, 2, 3), (0, 2)]  # rank 0's sets, each once
    assert keys == sorted(["all_reduce/latency", "p2p/2", "p2p/4", "overlap/compute", "overlap/comm",
                           "overlap/together"]
                          + [f"{kind}/{key}" for kind in ("all_reduce", "all_gather", "reduce_scatter")
                             for key in ("2_consec", "2_strided", "4_consec")])
