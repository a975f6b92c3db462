"""DeepEP's dispatch (Plan.ep_dispatcher deepep) in the analytical model: the expected destinations of a
token under each routing worked by hand and against brute force, DeepSeek-V3's closed forms, and a
layer's time on 2 nodes x 2 GPUs by hand; plan_cost charges it only where the plan says deepep."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace
from fractions import Fraction

import pytest

import cost_models
from cost_models import ep_dispatch, experts
from specs import LayerStrategy, load_cluster, load_model, uniform_plan
from specs.layer_parts import MoESpec
from tests.cost_models.test_experts import IDEAL, MOE, TWO_BY_TWO

FOUR = MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=128)


def test_hit_probabilities_by_hand():
    # unrestricted: 1 - C(E - n, k) / C(E, k); one expert of 4, k 2: 1 - 3/6; two experts: 1 - 1/6
    assert ep_dispatch.hit_probability(FOUR, 0, 1) == pytest.approx(1 / 2)
    assert ep_dispatch.hit_probability(FOUR, 0, 2) == pytest.approx(5 / 6)
    # 2 groups of 2, a token in 1 of them: both its experts in one group, each group half the tokens
    limited = replace(FOUR, expert_groups=2, groups_per_token=1)
    assert ep_dispatch.hit_probability(limited, 0, 2) == pytest.approx(1 / 2)
    assert ep_dispatch.hit_probability(limited, 1, 3) == pytest.approx(1.0)  # one expert of each group
    # AutoModel's fake gate: token t to experts 2t, 2t+1 (mod 4): windows {0,1} and {2,3} in turn
    fake = replace(FOUR, routing="fake_balanced")
    assert ep_dispatch.hit_probability(fake, 0, 2) == pytest.approx(1 / 2)
    assert ep_dispatch.hit_probability(fake, 1, 3) == pytest.approx(1.0)


def _brute_force(moe: MoESpec, lo: int, hi: int) -> Fraction:
    """The group-limited definition walked: every T-subset of groups, then every k-subset of its experts."""
    size = moe.num_experts // moe.expert_groups
    subsets = list(itertools.combinations(range(moe.expert_groups), moe.groups_per_token))
    hit = Fraction(0)
    for groups in subsets:
        pool = [g * size + j for g in groups for j in range(size)]
        picks = list(itertools.combinations(pool, moe.top_k))
        hit += Fraction(sum(any(lo <= e < hi for e in p) for p in picks), len(picks) * len(subsets))
    return hit


@pytest.mark.parametrize("lo, hi", [(0, 1), (0, 3), (2, 5), (1, 8), (5, 12), (0, 12)])
def test_group_limited_hits_equal_walking_every_choice(lo, hi):
    moe = MoESpec(num_experts=12, top_k=3, expert_ffn_hidden_size=8, expert_groups=4, groups_per_token=2)
    assert ep_dispatch.hit_probability(moe, lo, hi) == pytest.approx(float(_brute_force(moe, lo, hi)))


def test_deepseek_v3_over_eight_nodes_closed_forms():
    """ep 64 over 8 nodes of 8 H100: 4 experts a GPU, 32 a node, DeepSeek's groups of 32 on one node each."""
    moe = next(s.moe for s in load_model("deepseek-v3").layers if s.moe is not None)
    split = ep_dispatch.domain_split(load_cluster("dgx-h100:8"), range(64), moe.num_experts)
    assert len(split.parts) == 8 and split.domain_experts[1] == (32, 64) and split.rank_experts[1] == (4, 8)
    domains, gpus = ep_dispatch.expected_destinations(moe, split)
    # group-limited (4 of 8 groups = nodes, then 8 of their 128 experts): 8 x 1/2 x (1 - C(96,8)/C(128,8))
    assert domains == pytest.approx(4 * (1 - math.comb(96, 8) / math.comb(128, 8)))
    assert gpus == pytest.approx(32 * (1 - math.comb(124, 8) / math.comb(128, 8)))
    free = replace(moe, expert_groups=1, groups_per_token=None)
    assert ep_dispatch.expected_destinations(free, split)[0] == pytest.approx(
        8 * (1 - math.comb(224, 8) / math.comb(256, 8)))
    assert domains < 4 < ep_dispatch.expected_destinations(free, split)[0]  # at most 4 nodes a token
    # the fake gate: 8 consecutive experts, 2 adjacent GPUs of one node
    assert ep_dispatch.expected_destinations(replace(moe, routing="fake_balanced"), split) == (1.0, 2.0)


def test_a_layers_deepep_time_by_hand():
    cm = cost_models.get("analytical", TWO_BY_TWO, **IDEAL)
    layer = replace(MOE, moe=FOUR)
    s = LayerStrategy(dp=4, ep=4)
    copy = 2 * 32 * 64 * 2  # 64 tokens of a rank x 64 wide x 2 bytes
    # E[domains] = 2 x 5/6 = 5/3 (each node holds 2 of the 4 experts), E[GPUs] = 4 x 1/2 = 2.
    # Network leg, rails {0,2} {1,3}: node 0's NIC carries both its ranks' halves, 5/3 copy B at 10 GB/s,
    # one 10 us step; NVLink leg, {0,1} {2,3}: a port carries half of 2 copy B at 100 GB/s, one 5 us step.
    network, nvlink = copy * 5 / 3 / 10e9 + 10e-6, copy * 2 / 2 / 100e9 + 5e-6
    leg = experts.deepep_leg(cm.all_to_all_time, TWO_BY_TWO, layer, s, 2, 0)
    assert leg.groups == ((0, 2), (1, 3)) and leg.time_s == pytest.approx(max(network, nvlink))
    lt = cm.layer_time(layer, s, 2, 1, 0)
    assert lt.ep_deepep_s == pytest.approx(4 * network)  # dispatch + combine, forward and backward
    assert lt.ep_comm_s == pytest.approx(4 * cm.all_to_all_time(copy * 2, [[0, 1, 2, 3]]))  # unchanged
    assert lt.ep_deepep_s < lt.ep_comm_s
    # inside one node only the NVLink leg is left: 2 experts a rank, E[GPUs] = 2 x 5/6
    inside = experts.deepep_leg(cm.all_to_all_time, TWO_BY_TWO, layer, LayerStrategy(dp=2, ep=2), 2, 0)
    assert inside.groups == ((0, 1),) and inside.time_s == pytest.approx(copy * 5 / 3 / 2 / 100e9 + 5e-6)
    assert cm.layer_time(layer, LayerStrategy(dp=4), 2, 1, 0).ep_deepep_s == 0.0  # no expert split


def test_plan_cost_charges_deepep_only_where_the_plan_says_so():
    cm = cost_models.get("analytical", TWO_BY_TWO, **IDEAL)
    model = load_model("tiny-moe")
    plan = uniform_plan(model.num_layers, dp=4, global_batch=4)
    plan = replace(plan, layers=tuple(replace(s, ep=4) if spec.moe else s for s, spec in zip(plan.layers, model.layers)))
    deepep = replace(plan, ep_dispatcher="deepep")
    lts = [cm.layer_time(spec, s, 1, 1, 0) for spec, s in zip(model.layers, plan.layers)]
    saved = sum(lt.ep_comm_s - lt.ep_deepep_s for lt in lts)
    assert saved > 0
    assert cm.plan_cost(model, plan).iteration_time_s - cm.plan_cost(model, deepep).iteration_time_s == \
        pytest.approx(saved)
