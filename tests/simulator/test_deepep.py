"""DeepEP's dispatch (Plan.ep_dispatcher deepep) on the simulator's timeline: the leg the cost model finds
binding, played as the all-to-all it prices, worked by hand on 2 nodes x 2 GPUs."""
from __future__ import annotations

from dataclasses import replace

import pytest

import cost_models
from simulator import simulate
from tests.simulator.handmade import HandCostModel, timeline
from tests.simulator.test_experts import one_moe_layer_ep4

IDEAL = dict(bus_efficiency=1.0, network_efficiency=1.0, collective_base_latency_s=0.0)


class HandWithLinks(HandCostModel):
    """Hand-made compute (forward 1 s, backward 2 s), the analytical model's collectives at data-sheet rates."""

    def __init__(self, cluster):
        super().__init__(cluster)
        self._links = cost_models.get("analytical", cluster, **IDEAL)

    def collective_time(self, kind, nbytes, groups):
        return self._links.collective_time(kind, nbytes, groups)


def test_deepep_plays_its_network_leg_on_the_rails():
    # one Mixtral-style layer, 4 experts, top-2, hidden 64, 32 tokens a rank; dp 4 ep 4 over 2 nodes, one
    # sample per rank. Plain all-to-all: 32 x 2 x 64 x 2 = 8192 B a rank, 1 s through an 8192 B/s NIC.
    # DeepEP: a node holds 2 of the 4 experts, so a token reaches E[domains] = 2 (1 - C(2,2)/C(4,2)) = 5/3
    # of them; each rank sends 32 x 5/3 x 128 B over the rails (0, 2) and (1, 3), half of it to its peer,
    # and node 0's NIC carries both halves: 32 x 5/3 x 128 B at 8192 B/s = 5/6 s. The NVLink leg (2 GPUs
    # a token, 8192 B a rank, half of it over a 81920 B/s port: 0.05 s) runs beneath it.
    model, cluster, plain = one_moe_layer_ep4()
    plan = replace(plain, ep_dispatcher="deepep")
    result = simulate(model, cluster, plan, HandWithLinks(cluster), keep_spans=True)
    a2a = 32 * 5 / 3 * 128 / 8192
    assert a2a == pytest.approx(5 / 6)
    # forward 1 s, dispatch + combine 2 x 5/6 s; backward 2 s, their transposes 2 x 5/6 s
    f_end, b_start = 1.0 + 2 * a2a, 3.0 + 2 * a2a
    spans = timeline(result, 0, "tp")
    assert [name for name, _, _ in spans] == ["F0 L0 ep a2a x2", "B0 L0 ep a2a x2"]
    assert [t for _, *ts in spans for t in ts] == pytest.approx([1.0, f_end, b_start, b_start + 2 * a2a])
    assert result.iteration_time_s == pytest.approx(3.0 + 4 * a2a)  # 6.33 s; 7 s with the plain all-to-all
    plain = simulate(model, cluster, replace(plan, ep_dispatcher="all_to_all"), HandWithLinks(cluster))
    assert plain.iteration_time_s == pytest.approx(7.0)
