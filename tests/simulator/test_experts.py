"""Expert all-to-alls in the simulator: flows on the links that contend with data-parallel traffic,
worked by hand on 2 nodes x 2 GPUs, and the dispatch/combine of a MoE layer on its timeline."""
from __future__ import annotations

from dataclasses import replace

import pytest
import simpy

import cost_models
from cost_models import experts
from simulator import simulate
from simulator.collectives import Fabric, LinkCalibration
from simulator.network import Network
from simulator.work import build_stages
from specs import (ClusterSpec, GPUSpec, InterNodeLink, IntraNodeLink, LayerStrategy, layer_grid, model_from_dict,
                   uniform_plan)
from tests.simulator.handmade import HandCostModel, timeline


def two_by_two(nic_bytes_per_s: float, port_bytes_per_s: float) -> ClusterSpec:
    """2 nodes x 2 GPUs, one NIC per node, no latency."""
    return ClusterSpec(name="2x2", nodes=2, gpus_per_node=2,
                       gpu=GPUSpec(name="g", peak_tflops=100.0, memory_gib=80.0, memory_bandwidth_gbytes_per_s=1e3),
                       intra_node=IntraNodeLink(kind="nvswitch", bandwidth_gbytes_per_s=port_bytes_per_s / 1e9,
                                                latency_us=0.0),
                       inter_node=InterNodeLink(nics_per_node=1, nic_bandwidth_gbytes_per_s=nic_bytes_per_s / 1e9,
                                                latency_us=0.0))


def _play(cluster, *collectives):
    """Run (name, kind, bytes, groups) collectives from t = 0; returns {name: end time}."""
    env = simpy.Environment()
    fabric = Fabric(env, cluster, Network(env, {}), calibration=LinkCalibration())
    ends = {}

    def one(name, kind, nbytes, groups):
        yield from fabric.collective(name, kind, nbytes, groups)
        ends[name] = round(env.now, 9)
    for c in collectives:
        env.process(one(*c))
    env.run()
    return ends


def test_one_all_to_all_alone_takes_the_nic_time():
    # ep 4 over both nodes: group (0, 1, 2, 3), 4 GB per rank, 1 GB to each rank. Pairwise steps:
    # k=1 sends 1->2 over node 0's NIC (1 stream: 1 GB at 1 GB/s = 1 s), k=2 sends 0->2 and 1->3
    # (2 streams: 2 s), k=3 sends 0->3 (1 s): 4 s = 4 GB through a 1 GB/s NIC, as the cost model says.
    cluster = two_by_two(nic_bytes_per_s=1e9, port_bytes_per_s=10e9)
    groups = layer_grid(0, LayerStrategy(dp=4, ep=4).degrees).groups("ep")
    assert groups == ((0, 1, 2, 3),)
    assert _play(cluster, ("a2a", "all_to_all", 4e9, groups)) == {"a2a": 4.0}


def test_dispatch_and_dp_all_reduce_sharing_a_nic_slow_each_other():
    # tp 2 x dp 2 with ep 2: the expert group (0, 2) and the dense dp group (1, 3) both cross
    # node 0's NIC (1 GB/s). Alone: the all-to-all sends 1 GB each way (1 s); the all-reduce of
    # 2 GB is 2 ring steps of 1 GB (2 s). Together the NIC is shared 0.5/0.5: the all-to-all ends
    # at 2 s with the all-reduce's first step, whose second step then runs alone: 3 s.
    cluster = two_by_two(nic_bytes_per_s=1e9, port_bytes_per_s=10e9)
    strategy = LayerStrategy(tp=2, dp=2, ep=2)
    ep_group = layer_grid(0, strategy.degrees).groups("ep")[0]
    dp_group = layer_grid(0, strategy.degrees).groups("dp")[1]
    assert (ep_group, dp_group) == ((0, 2), (1, 3))
    a2a, ar = ("a2a", "all_to_all", 2e9, [ep_group]), ("ar", "all_reduce", 2e9, [dp_group])
    assert _play(cluster, a2a) == {"a2a": 1.0}
    assert _play(cluster, ar) == {"ar": 2.0}
    assert _play(cluster, a2a, ar) == {"a2a": 2.0, "ar": 3.0}
    # a NIC ten times faster (as fast as the ports): the same sharing, ten times shorter
    fast = two_by_two(nic_bytes_per_s=10e9, port_bytes_per_s=10e9)
    assert _play(fast, a2a, ar) == {"a2a": 0.2, "ar": 0.3}


def one_moe_layer_ep4():
    """(model, cluster, plan): one Mixtral-style layer, 4 experts, top-2, hidden 64, 32 tokens; dp 4
    ep 4 on 2 nodes x 2 GPUs (8192 B/s NICs, 81920 B/s ports), one sample per rank."""
    model = model_from_dict(dict(model_type="mixtral", vocab_size=96, hidden_size=64, intermediate_size=160,
                                 num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                 seq_length=32, num_local_experts=4), name="moe-1")
    base = uniform_plan(1, dp=4, global_batch=4)
    return (model, two_by_two(nic_bytes_per_s=8192.0, port_bytes_per_s=81920.0),
            replace(base, layers=(replace(base.layers[0], ep=4),)))


def test_moe_layer_dispatch_and_combine_on_the_tp_stream():
    # each all-to-all sends 32 x 2 x 64 x 2 = 8192 bytes per rank; through an 8192 B/s NIC, 1 s each.
    model, cluster, plan = one_moe_layer_ep4()
    assert experts.all_to_all_bytes(model.layers[0], plan.layers[0], 1) == 8192
    result = simulate(model, cluster, plan, HandCostModel(cluster), keep_spans=True)
    # forward 1 s, dispatch + combine 2 s; backward 2 s, their transposes 2 s
    assert timeline(result, 0, "tp") == [("F0 L0 ep a2a x2", 1.0, 3.0), ("B0 L0 ep a2a x2", 5.0, 7.0)]
    assert result.iteration_time_s == pytest.approx(7.0)


def test_expert_gradients_sync_over_the_expert_dp_groups():
    # dp 4 ep 2: the dense part all-reduces over (0, 1, 2, 3), the experts over (0, 2) and (1, 3)
    model = model_from_dict(dict(model_type="mixtral", vocab_size=96, hidden_size=64, intermediate_size=160,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 seq_length=32, num_local_experts=4), name="moe-2")
    cluster = two_by_two(nic_bytes_per_s=1e9, port_bytes_per_s=10e9)
    base = uniform_plan(2, dp=4, global_batch=4)
    plan = replace(base, layers=tuple(replace(s, ep=2) for s in base.layers))
    cm = cost_models.get("analytical", cluster)
    (stage,) = build_stages(model, cluster, plan, cm)
    dense, expert = stage.layers[0].parts
    assert dense.dp_groups == ((0, 1, 2, 3),) and expert.dp_groups == ((0, 2), (1, 3))
    layer = model.layers[0]
    share = experts.expert_params(layer) / layer.param_count()
    # expert gradients: 1/ep of the experts per rank; dense gradients whole (tp 1), 16-bit
    assert expert.grad_bytes == pytest.approx(2 * experts.expert_params(layer) / 2)
    assert dense.grad_bytes == pytest.approx(2 * layer.param_count() * (1 - share))
    names = [name for _, s, name, _, _ in simulate(model, cluster, plan, cm, keep_spans=True).spans if s == "dp"]
    assert any("experts" in n for n in names) and any("experts" not in n for n in names if "grad sync" in n)
