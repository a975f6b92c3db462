"""How the executor and the profiler time: garbage collected outside the timed region, the
profiler's repeats in rounds over every quantity, the median repeat of the slowest rank."""
import gc
import weakref

import pytest

from executor.profile import Timings
from executor.train import collected_first


def test_garbage_is_collected_before_a_timed_block_and_not_inside_it():
    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    ref = weakref.ref(a)
    del a, b
    with collected_first():
        assert ref() is None
        assert not gc.isenabled()
    assert gc.isenabled()


def test_profile_repeats_run_in_rounds_over_every_quantity_and_keep_the_median(monkeypatch):
    from executor import profile
    monkeypatch.setattr(profile.time, "perf_counter", lambda: 100.0)  # a clock that stands still
    order: list[str] = []
    times = {"a": iter([3.0, 1.0, 2.0, 9.0]), "b": iter([5.0, 6.0, 4.0, 8.0])}
    timings = Timings("cpu", repeats=3, warmup=1)

    def timed(key):
        def fn():
            order.append(key)
            return 100.0 - next(times[key]) / 1e3  # a start that many ms ago
        return fn

    timings.time("a", timed("a"))
    timings.time("b", timed("b"))
    assert order == ["a", "b"]  # warm-up at once
    timings.run()
    assert order == ["a", "b", "a", "b", "a", "b", "a", "b"]  # rounds, not one quantity's repeats together
    stats = timings.reduce()
    assert stats["a"][0] == pytest.approx(2.0)  # median of 1, 2 and 9 ms (3 was the warm-up)
    assert stats["b"][0] == pytest.approx(6.0)  # of 6, 4 and 8 ms


def test_the_optimizer_cost_per_parameter_is_the_slope_between_two_probes_not_a_launch_bound_ratio():
    """A step of 0.5 ms fixed plus 0.02 ms per million parameters: probes of 16.8M and 67.1M
    take 0.84 and 1.84 ms. The slope is 1.01 ms / 50.3M = 0.02 ms per million; one probe's time
    over its size (what the profiler did) would give 0.84 / 16.8 = 0.050 ms."""
    from executor.profile import Timed, optimizer_ms_per_mparam, optimizer_probe_sizes
    small, large = optimizer_probe_sizes("cuda:0")

    def step_ms(n):
        return 0.5 + 0.02 * n / 1e6

    stats = {f"optimizer/{n}": Timed(step_ms(n), 0.0, 5) for n in (small, large)}
    assert optimizer_ms_per_mparam(stats, "cuda:0") == pytest.approx(0.02, rel=1e-9)
    assert step_ms(small) / (small / 1e6) > 2 * 0.02  # the old ratio, for contrast
    assert optimizer_probe_sizes("cpu")[1] < small  # a CPU rank times far smaller buffers
