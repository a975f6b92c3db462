"""The symmetry shortcut scales: a data-parallel ring over p ranks is looked up a number of times
that does not grow with its 2(p - 1) steps (it was O(p) lookups of p edges each: 16,384 GPUs
ran for minutes)."""
import simulator.collectives as collectives
from simulator.engine import simulate
from specs import load_cluster, load_model, uniform_plan


class _Counting(dict):
    lookups = 0

    def __contains__(self, key):
        _Counting.lookups += 1
        return dict.__contains__(self, key)


def test_a_ring_is_looked_up_fewer_times_than_it_has_ranks(monkeypatch):
    init = collectives.Fabric.__init__

    def counting_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._bundles = _Counting()
    monkeypatch.setattr(collectives.Fabric, "__init__", counting_init)
    dp = 256
    plan = uniform_plan(4, dp=dp, global_batch=dp, model="tiny-gpt", cluster="dgx-a100-80g")
    result = simulate(load_model("tiny-gpt"), load_cluster(f"dgx-a100-80g:{dp // 8}"), plan)
    assert result.iteration_time_s > 0
    assert _Counting.lookups < dp  # 1,130 before, for 2 x 255 ring steps of 256 edges each
