"""Expert parallelism in the cost models: the all-to-all on 2 nodes x 2 GPUs worked by hand, a MoE
layer's dispatch bytes, compute, gradient sync and memory under ep, and the refusals."""
from __future__ import annotations

from dataclasses import replace

import pytest

import cost_models
from cost_models import experts
from cost_models.memory import WEIGHT_BYTES_PER_PARAM, layer_memory
from cost_models.ops import forward_ops
from specs import (ClusterSpec, GPUSpec, InterNodeLink, IntraNodeLink, LayerSpec, LayerStrategy, SpecError,
                   load_cluster, load_model, uniform_plan)
from specs.layer_parts import MoESpec

# 2 nodes x 2 GPUs: 100 GB/s GPU ports, one 10 GB/s NIC per node; 5 us inside a node, 10 us across
TWO_BY_TWO = ClusterSpec(
    name="2x2", nodes=2, gpus_per_node=2,
    gpu=GPUSpec(name="g", peak_tflops=100.0, memory_gib=80.0, memory_bandwidth_gbytes_per_s=2000.0),
    intra_node=IntraNodeLink(kind="nvswitch", bandwidth_gbytes_per_s=100.0, latency_us=5.0),
    inter_node=InterNodeLink(nics_per_node=1, nic_bandwidth_gbytes_per_s=10.0, latency_us=10.0))
IDEAL = dict(bus_efficiency=1.0, network_efficiency=1.0, collective_base_latency_s=0.0)
"""Links at their data-sheet bandwidth and no launch cost, so the figures below are exact."""
MOE = LayerSpec(kind="moe", hidden_size=64, num_heads=4, ffn_hidden_size=128, gated_ffn=True, seq_len=32,
                bias=False, norm="rmsnorm", moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=128))


def test_all_to_all_across_two_nodes_by_hand():
    cm = cost_models.get("analytical", TWO_BY_TWO, **IDEAL)
    n = 4e8  # bytes each rank sends (1e8 to each of the 4 ranks, itself included)
    # One group of 4: each rank sends n/4 to each of 3 peers. Node 0's NIC carries ranks 0 and 1's
    # blocks for ranks 2 and 3: 4 x n/4 = n = 4e8 B at 10 GB/s = 40 ms; a GPU port carries 3/4 n
    # = 3e8 B at 100 GB/s = 3 ms. The NIC is the bottleneck; 3 pairwise steps of 10 us latency.
    assert cm.all_to_all_time(n, [[0, 1, 2, 3]]) == pytest.approx(0.040 + 3 * 10e-6)
    # Two groups inside the nodes ({0,1}, {2,3}): n/2 over a GPU port at 100 GB/s = 2 ms, 1 step of 5 us
    assert cm.all_to_all_time(n, [[0, 1], [2, 3]]) == pytest.approx(0.002 + 5e-6)
    # Two groups across the nodes ({0,2}, {1,3}) at once: both of node 0's ranks send n/2 through the
    # one NIC: n = 4e8 B at 10 GB/s = 40 ms (twice one group alone, which would take 20 ms)
    assert cm.all_to_all_time(n, [[0, 2], [1, 3]]) == pytest.approx(0.040 + 10e-6)
    assert cm.all_to_all_time(n, [[0, 2]]) == pytest.approx(0.020 + 10e-6)



def test_all_to_all_on_links_past_float_range_is_latency_alone():
    """1e300 GB/s is 1e309 B/s, past float range: no time per byte is left, only the steps'
    latency (this divided by zero before)."""
    fast = replace(TWO_BY_TWO, intra_node=replace(TWO_BY_TWO.intra_node, bandwidth_gbytes_per_s=1e300))
    cm = cost_models.get("analytical", fast, **IDEAL)
    assert cm.all_to_all_time(4e8, [[0, 1], [2, 3]]) == pytest.approx(5e-6)


def test_dispatch_bytes_and_time_of_a_layer_by_hand():
    cm = cost_models.get("analytical", TWO_BY_TWO, **IDEAL)
    s = LayerStrategy(dp=4, ep=4)
    # 2 samples x 32 tokens x top-2 copies x 64 wide x 2 bytes = 16384 bytes per rank and all-to-all
    assert experts.all_to_all_bytes(MOE, s, 2) == 2 * 32 * 2 * 64 * 2
    lt = cm.layer_time(MOE, s, 2, 1, 0)
    # forward + backward, dispatch + combine each: 4 all-to-alls over the group of all 4 ranks
    assert lt.ep_comm_s == pytest.approx(4 * cm.all_to_all_time(16384, [[0, 1, 2, 3]]))
    assert lt.micro_batch_s == pytest.approx(lt.forward_s + lt.backward_s + lt.ep_comm_s)
    full = cm.layer_time(MOE, replace(s, recompute="full"), 2, 1, 0)
    assert full.ep_comm_s == pytest.approx(1.5 * lt.ep_comm_s)  # the recomputed forward dispatches again


def test_imbalance_defaults_from_the_capacity_factor_and_scales_the_busiest_rank():
    padded = replace(MOE, moe=replace(MOE.moe, capacity_factor=1.25))
    assert experts.imbalance(MOE) == experts.DROPLESS_IMBALANCE == 1.0
    assert experts.imbalance(padded) == 1.25
    assert experts.imbalance(MOE, 1.5) == 1.5
    with pytest.raises(SpecError, match="expert_imbalance"):
        experts.imbalance(MOE, 0.5)
    s = LayerStrategy(dp=4, ep=4)
    assert experts.all_to_all_bytes(MOE, s, 2, 1.5) == 1.5 * experts.all_to_all_bytes(MOE, s, 2)
    split = experts.compute_split(MOE, s, 1.5)
    routed = {op.name: op.flops for op in forward_ops(MOE, 1, 2, split)}
    plain = {op.name: op.flops for op in forward_ops(MOE, 1, 2)}
    assert routed["experts_fc1"] == pytest.approx(1.5 * plain["experts_fc1"])
    assert routed["router"] == plain["router"]


def test_expert_tp_splits_the_expert_width_only():
    s = LayerStrategy(tp=2, dp=2, sp="megatron", ep=2, expert_tp=1)
    ops = {op.name: op.flops for op in forward_ops(MOE, 2, 2, experts.compute_split(MOE, s))}
    plain = {op.name: op.flops for op in forward_ops(MOE, 2, 2)}
    # experts whole (etp 1) on half the tokens (each rank keeps its own sequence half): same FLOPs
    assert ops["experts_fc1"] == pytest.approx(plain["experts_fc1"])
    assert ops["qkv"] == plain["qkv"]
    assert experts.compute_split(MOE, LayerStrategy(dp=4)) is None


def test_expert_states_split_by_ep_and_sharded_over_expert_dp():
    e_params = experts.expert_params(MOE)
    assert e_params == 8 * 3 * 64 * 128  # 8 gated experts of 3 matrices 64 x 128
    dense = MOE.param_count() - e_params
    s = LayerStrategy(dp=4, ep=2, dp_type="zero3", expert_dp_type="zero1")
    mem = layer_memory(MOE, s, 1, 0)
    # dense: ZeRO-3 over 4 ranks (16/4 B per param); experts: 1/2 of them per rank, ZeRO-1 over
    # the expert dp of 2 (4 + 12/2 B per param)
    assert mem.states_bytes == pytest.approx(dense * 16 / 4 + e_params / 2 * (4 + 12 / 2))
    assert mem.temporary_bytes == pytest.approx(WEIGHT_BYTES_PER_PARAM * dense)  # only the dense part is gathered
    plain = layer_memory(MOE, LayerStrategy(dp=4, dp_type="zero3"), 1, 0)
    assert plain.states_bytes == pytest.approx(MOE.param_count() * 16 / 4)


def test_expert_gradient_sync_runs_over_the_expert_dp_groups():
    cm = cost_models.get("analytical", TWO_BY_TWO, **IDEAL)
    parts = experts.sync_parts(MOE, LayerStrategy(dp=4, ep=2), 0, [[0, 1, 2, 3]])
    assert [p.groups for p in parts] == [((0, 1, 2, 3),), ((0, 2), (1, 3))]
    assert [p.size for p in parts] == [4, 2]
    lt = cm.layer_time(MOE, LayerStrategy(dp=4, ep=2), 1, 1, 0)
    dense, expert = parts
    want = cm.dp_traffic(dense.params, "ddp", dense.groups).total_s(1) + \
        cm.dp_traffic(expert.params, "ddp", expert.groups).total_s(1)
    assert lt.dp_comm_s == pytest.approx(want)


def test_ep_plan_on_mixtral_saves_memory_and_pays_all_to_alls():
    model, cluster = load_model("mixtral-8x7b").scaled(num_layers=2), load_cluster("dgx-h100:2")
    cm = cost_models.get("analytical", cluster)
    base = uniform_plan(2, tp=2, dp=8, global_batch=16, micro_batches=2, dp_type="zero1", sp="megatron")
    ep4 = replace(base, layers=tuple(replace(s, ep=4) for s in base.layers))
    plain, split = cm.plan_cost(model, base), cm.plan_cost(model, ep4)
    assert split.peak_memory_bytes < plain.peak_memory_bytes
    assert cm.layer_time(model.layers[0], ep4.layers[0], 1, 2, 0).ep_comm_s > 0
    profiled_like = cost_models.get("analytical", cluster)
    profiled_like.expert_imbalance = 2.0  # a skewed router: the busiest rank does twice its share
    assert profiled_like.plan_cost(model, ep4).iteration_time_s > split.iteration_time_s


def test_galvatron_cost_model_refuses_ep_plans_in_one_line():
    cm = cost_models.get("galvatron", load_cluster("dgx-a100-80g:1"))
    model = load_model("tiny-moe")
    plan = uniform_plan(model.num_layers, dp=8, global_batch=16, dp_type="zero2")
    plan = replace(plan, layers=tuple(replace(s, ep=2) for s in plan.layers))
    with pytest.raises(SpecError) as err:
        cm.gplan(plan)
    assert "expert_parallel ep2/etp1 (supported: off)" in str(err.value) and "\n" not in str(err.value)
    assert cm.layer_memory(model.layers[0], plan.layers[0], 1, 1).total_bytes == float("inf")


def test_profiled_model_splits_the_experts_too():
    import json
    import re
    from pathlib import Path

    from cost_models.profiled import ProfiledModel
    from specs.profile_format import LayerSignature, Profile
    doc = (Path(__file__).resolve().parents[2] / "docs" / "profile_format.md").read_text()
    raw = json.loads(re.search(r"```json\n(.*?)```", doc, re.S).group(1))
    raw["layers"][0]["signature"] = LayerSignature.of(MOE).to_dict()
    raw["layers"][0]["parameter_bytes"] = 2 * MOE.param_count()
    cm = ProfiledModel(TWO_BY_TWO, profile=Profile.from_dict(raw))
    s = LayerStrategy(dp=4, ep=4)
    lt, plain = cm.layer_time(MOE, s, 2, 1, 0), cm.layer_time(MOE, LayerStrategy(dp=4), 2, 1, 0)
    assert lt.ep_comm_s == pytest.approx(4 * cm.collective_time("all_to_all", 16384, [[0, 1, 2, 3]]))
    assert plain.ep_comm_s == 0.0
    assert lt.forward_s == pytest.approx(plain.forward_s)  # balanced, etp = tp: the same kernels
    e = experts.expert_params(MOE)
    assert cm.layer_memory(MOE, s, 2, 0).states_bytes == pytest.approx(16 * (MOE.param_count() - e) + 16 * e / 4)


def _walked_load(cluster, groups):
    """pairwise_load by its definition: every ordered pair's path, 1/p of a buffer per pair."""
    load, caps = {}, {}
    for g in groups:
        for a in g:
            for b in g:
                if a != b:
                    for res, cap in cluster.path(a, b):
                        load[res] = load.get(res, 0.0) + 1.0 / len(g)
                        caps[res] = cap
    return {r: (n, caps[r]) for r, n in load.items()}


@pytest.mark.parametrize("name, strides", [("titan-16", (1, 2, 4)), ("dgx-a100-80g:4", (1, 4, 8)),
                                           ("gb200-nvl72:2", (1, 9, 36)), ("2x2", (1, 2))])
def test_pairwise_load_counted_per_place_equals_walking_every_pair(name, strides):
    # groups of 4 or 8 ranks laid out with each stride: inside a switch, a node, a domain, across
    cluster = TWO_BY_TWO if name == "2x2" else load_cluster(name)
    n = cluster.world_size
    for stride in strides:
        for size in (2, 4, 8):
            if size * stride > n:
                continue
            groups = [tuple(start + stride * i for i in range(size)) for start in range(stride)]
            counted, walked = experts.pairwise_load(cluster, groups), _walked_load(cluster, groups)
            assert counted.keys() == walked.keys(), (name, stride, size)
            for r, (share, cap) in walked.items():
                assert counted[r][0] == pytest.approx(share) and counted[r][1] == cap, (name, stride, size, r)
