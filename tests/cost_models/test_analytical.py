"""The analytical model: topology effects, caching, calibration file use, memory and relayouts."""
import json

import pytest

import cost_models
from cost_models.analytical import AnalyticalModel
from cost_models.constants import AnalyticalConstants, load_calibration
from specs import LayerStrategy, SpecError, load_cluster, load_model, stage_grid, uniform_plan

EXACT = dict(bus_efficiency=1.0, network_efficiency=1.0, step_latency_factor=1.0, collective_base_latency_s=0.0)


def test_strided_tp_across_nodes_is_slower_than_consecutive_tp_inside_a_node():
    cluster = load_cluster("dgx-a100-80g:2")
    model = cost_models.get("analytical", cluster)
    layer = load_model("gpt-1.7b").layers[0]
    inside = model.layer_time(layer, LayerStrategy(tp=8, dp=2, tp_consecutive=True), 2, 4)
    across = model.layer_time(layer, LayerStrategy(tp=8, dp=2, tp_consecutive=False), 2, 4)
    assert across.tp_comm_s > 1.5 * inside.tp_comm_s
    # ... and the DP groups swap roles: strided DP crosses the nodes under consecutive TP
    assert inside.dp_comm_s > across.dp_comm_s


def test_ring_allreduce_on_4_gpus_of_a_node_matches_the_formula():
    cluster = load_cluster("dgx-a100-80g")
    model = AnalyticalModel(cluster, constants=AnalyticalConstants(**EXACT))
    n = 256e6
    ring = 6 * 5e-6 + 1.5 * n / 300e9
    tree = 4 * 5e-6 + 1.5 * n / 300e9  # NCCL may pick the tree: fewer latency steps
    assert model.collective_time("all_reduce", n, [[0, 1, 2, 3]]) == pytest.approx(min(ring, tree))
    assert model.collective_time("all_gather", n, [[0, 1, 2, 3]]) == pytest.approx(3 * 5e-6 + 0.75 * n / 300e9)


def test_gpus_behind_one_pcie_switch_share_its_uplink():
    cluster = load_cluster("titan-8")  # 4 GPUs per switch, 5 GB/s uplink, 12 GB/s slots
    model = AnalyticalModel(cluster, constants=AnalyticalConstants(**EXACT))
    same_switch = model.collective_time("all_reduce", 1e9, [[0, 1, 2, 3]])
    two_switches = model.collective_time("all_reduce", 1e9, [[0, 1, 4, 5]])
    two_groups = model.collective_time("all_reduce", 1e9, [[0, 4], [1, 5]])
    assert two_switches > 2 * same_switch
    assert two_groups > model.collective_time("all_reduce", 1e9, [[0, 4]])


def test_inter_node_allreduce_uses_the_nics():
    cluster = load_cluster("dgx-a100-80g:4")
    model = AnalyticalModel(cluster, constants=AnalyticalConstants(**EXACT))
    dp_groups = stage_grid(0, 32, tp=8).groups("dp")  # 8 rings of 4 ranks, one rank per node
    t = model.collective_time("all_reduce", 1e9, dp_groups)
    nic_share = 8 * 25.0 / 8  # 8 NICs of 25 GB/s per node shared by 8 rings
    assert t == pytest.approx(1.5 * 1e9 / (nic_share * 1e9), rel=0.05)


def test_calibration_file_of_the_zoo_cluster_is_used():
    cluster = load_cluster("dgx-a100-80g")
    assert cluster.calibration.endswith("a100.json")
    fitted = load_calibration(cluster.calibration)["constants"]
    model = cost_models.get("analytical", cluster)
    for name, value in fitted.items():
        assert getattr(model.constants, name) == pytest.approx(value)
    assert cost_models.get("analytical", load_cluster("titan-8")).constants == AnalyticalConstants()


def test_bad_calibration_file_is_a_one_line_error(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": "hybridpar-calibration", "version": 1, "constants": {"nope": 1}}))
    with pytest.raises(SpecError, match="constants.nope"):
        AnalyticalModel(load_cluster("titan-8"), calibration=str(path))
    with pytest.raises(SpecError, match="bus_efficiency"):
        AnalyticalConstants(bus_efficiency=1.5)


def test_layer_time_is_cached_and_grows_with_batch():
    model = cost_models.get("analytical", load_cluster("dgx-a100-80g"))
    layer = load_model("gpt-1.7b").layers[0]
    s = LayerStrategy(tp=2, dp=4, recompute="full")
    a, b = model.layer_time(layer, s, 2, 4), model.layer_time(layer, s, 2, 4)
    assert a is b
    big = model.layer_time(layer, s, 8, 4)
    assert big.forward_s > 2 * a.forward_s
    no_ckpt = model.layer_time(layer, LayerStrategy(tp=2, dp=4), 2, 4)
    assert a.backward_s == pytest.approx(no_ckpt.backward_s + no_ckpt.forward_s)
    assert a.tp_comm_s == pytest.approx(1.5 * no_ckpt.tp_comm_s)  # recompute repeats the forward's


def test_small_gemms_do_not_reach_peak():
    model = AnalyticalModel(load_cluster("dgx-a100-80g"), calibration={})
    from cost_models.ops import gemm
    peak = 312e12
    small, large = gemm("s", 256, 256, 256), gemm("l", 8192, 8192, 8192)
    assert small.flops / model.op_time(small) < 0.1 * peak
    assert large.flops / model.op_time(large) > 0.75 * peak


def test_zero_levels_shrink_memory_and_zero3_adds_traffic():
    model = cost_models.get("analytical", load_cluster("dgx-a100-80g"))
    layer = load_model("gpt-1.7b").layers[0]
    mems = [model.layer_memory(layer, LayerStrategy(dp=8, dp_type=t), 1, 1) for t in ("ddp", "zero1", "zero2", "zero3")]
    states = [m.states_bytes for m in mems]
    assert states == sorted(states, reverse=True) and states[0] == pytest.approx(16 * layer.param_count())
    assert mems[3].temporary_bytes == pytest.approx(2 * layer.param_count())
    t_ddp = model.layer_time(layer, LayerStrategy(dp=8), 1, 1)
    t_z3 = model.layer_time(layer, LayerStrategy(dp=8, dp_type="zero3"), 1, 1)
    groups = [list(range(8))]
    nbytes = 2 * layer.param_count()
    ag = model.collective_time("all_gather", nbytes, groups)
    rs = model.collective_time("reduce_scatter", nbytes, groups)
    (ag_alpha, ag_beta), (rs_alpha, rs_beta) = (model.ring_terms(k, nbytes, groups)
                                                for k in ("all_gather", "reduce_scatter"))
    assert ag_alpha + ag_beta == pytest.approx(ag) and rs_alpha + rs_beta == pytest.approx(rs)
    # the forward's gather; the backward's gather and reduce-scatter at once: latencies overlap,
    # bytes share the link (here bandwidth-bound: one latency and both transfers)
    backward = max(ag, rs, min(ag_alpha, rs_alpha) + ag_beta + rs_beta)
    assert backward == pytest.approx(ag_alpha + ag_beta + rs_beta) and backward < ag + rs
    assert t_z3.dp_comm_s == pytest.approx(ag + backward)
    assert 1.3 < t_z3.dp_comm_s / t_ddp.dp_comm_s < 1.7           # ~1.5x the bytes of DP
    # ZeRO-2/3 sync every micro-batch (gradients stay sharded); DDP once per iteration
    t_z2_m4 = model.layer_time(layer, LayerStrategy(dp=8, dp_type="zero2"), 1, 4)
    assert t_z2_m4.dp_comm_s == pytest.approx(4 * rs + ag)
    assert model.layer_time(layer, LayerStrategy(dp=8), 1, 4).dp_comm_s == pytest.approx(t_ddp.dp_comm_s)
    assert t_z2_m4.exposed_micro_batch_dp_s > 0 and t_ddp.exposed_micro_batch_dp_s == 0


def test_tp_collectives_on_another_link_widen_the_gather_window():
    # gamma 1.5: 30 ms of traffic beside 20 ms of compute and 5 ms of TP on NVLink take
    # max(20 + 5, 30) + 0.5 * min(20, 30) = 40 ms, 15 ms more than the window (20 without the TP)
    gamma = dict(overlap_coefficient=1.5, dp_overlap_fraction=1.0)
    model = cost_models.get("analytical", load_cluster("dgx-h100:2"), **gamma)
    assert model.exposed_time(30e-3, 20e-3, 5e-3) == pytest.approx(15e-3)
    assert model.exposed_time(30e-3, 20e-3) == pytest.approx(20e-3)
    # ZeRO-3 across two nodes, tp 8 inside each: the forward's gather hides behind the forward's
    # TP collectives too; on one node (tp 2 x dp 4) both share NVLink: no such window
    layer = load_model("llama3-8b").with_seq_len(1024).layers[0]  # the gathers outlast its compute
    for nodes, tp, beside in ((2, 8, True), (1, 2, False)):
        model = cost_models.get("analytical", load_cluster(f"dgx-h100:{nodes}"), **gamma)
        gpus = 8 * nodes
        t = model.layer_time(layer, LayerStrategy(tp=tp, dp=gpus // tp, dp_type="zero3"), 1, 1)
        traffic = model.dp_traffic(layer.param_count() / tp, "zero3", [list(range(r, gpus, tp)) for r in range(tp)])
        forward_tp_s = t.tp_comm_s / 2 if beside else 0.0
        assert traffic.micro_batch_fwd_s > t.forward_s + forward_tp_s or not beside
        want = (model.exposed_time(traffic.micro_batch_bwd_s, t.backward_s)
                + model.exposed_time(traffic.micro_batch_fwd_s, t.forward_s, forward_tp_s))
        assert t.exposed_micro_batch_dp_s == pytest.approx(want)


def test_overlap_hides_dp_traffic_only_when_allowed():
    cluster = load_cluster("dgx-a100-80g")
    layer = load_model("gpt-1.7b").layers[0]
    s = LayerStrategy(dp=8)
    hidden = cost_models.get("analytical", cluster, dp_overlap_fraction=1.0).layer_time(layer, s, 8, 1)
    exposed = cost_models.get("analytical", cluster, dp_overlap_fraction=0.0).layer_time(layer, s, 8, 1)
    assert exposed.exposed_dp_comm_s == pytest.approx(exposed.dp_comm_s)
    assert hidden.exposed_dp_comm_s < 0.5 * hidden.dp_comm_s


def test_transition_costs_nothing_for_equal_strategies_and_something_otherwise():
    model = cost_models.get("analytical", load_cluster("dgx-a100-80g"))
    layer = load_model("gpt-1.7b").layers[0]
    a, b = LayerStrategy(tp=2, dp=4), LayerStrategy(tp=4, dp=2)
    assert model.transition_time(layer, a, a, 2) == 0.0
    assert model.transition_time(layer, a, b, 2) > 0.0
    assert model.transition_time(layer, a, LayerStrategy(tp=2, dp=4, tp_consecutive=False), 2) > 0.0


def test_plan_cost_puts_the_head_on_the_last_stage_and_fits_the_formula():
    model_spec = load_model("gpt-1.7b").with_seq_len(1024)
    cluster = load_cluster("dgx-a100-80g")
    model = cost_models.get("analytical", cluster)
    plan = uniform_plan(model_spec.num_layers, tp=2, dp=2, pp=2, global_batch=16, micro_batches=4, recompute="full")
    cost = model.plan_cost(model_spec, plan)
    assert cost.stage_time_s[1] > cost.stage_time_s[0]  # logits + loss
    assert cost.iteration_time_s == pytest.approx(sum(cost.stage_time_s) + 3 * max(cost.stage_time_s)
                                                  + max(cost.stage_tail_s))
    assert cost.stage_memory[0].activations_bytes > cost.stage_memory[1].activations_bytes / 2
    with pytest.raises(SpecError):
        model.collective_time("gossip", 1.0, [[0, 1]])


@pytest.mark.parametrize("dp_type, per_param", [("zero1", 4 + 12 / 64), ("zero2", 2 + 14 / 64), ("zero3", 16 / 64)])
def test_whole_7_5b_model_states_under_zero_at_dp_64_equal_the_formula(dp_type, per_param):
    model_spec = load_model("gpt-7.5b")
    cluster = load_cluster("dgx-a100-80g:8")
    plan = uniform_plan(model_spec.num_layers, dp=64, global_batch=64, dp_type=dp_type)
    memory = cost_models.get("analytical", cluster).plan_cost(model_spec, plan).stage_memory[0]
    assert memory.states_bytes == pytest.approx(per_param * model_spec.param_count(), rel=1e-12)


def test_16_gpu_allreduce_inside_an_nvl72_rack_vs_across_two_dgx_b200_nodes():
    """Same GPUs and 900 GB/s NVLink ports; the rack keeps all 16 ranks on NVLink, two DGX nodes
    send two ring edges through each node's 8 x 50 GB/s NICs. Default constants: bus efficiency
    0.76, network efficiency 0.96, 20 us per collective; the double binary tree (2 log2 16 = 8
    steps) beats the ring's 30 steps at the same bandwidth term 2 (p-1)/p n / B."""
    c = AnalyticalConstants()
    n = float(2**30)
    rack = AnalyticalModel(load_cluster("gb200-nvl72:4"), constants=c)  # 4 trays of 4 GPUs, one domain
    dgx = AnalyticalModel(load_cluster("dgx-b200:2"), constants=c)
    ranks = [list(range(16))]
    inside = 20e-6 + 8 * 5e-6 + 1.875 * n / (900e9 * 0.76)   # 3.003 ms
    across = 20e-6 + 8 * 6e-6 + 1.875 * n / (400e9 * 0.96)   # 5.311 ms (the hierarchical form: 5.645 ms)
    assert rack.collective_time("all_reduce", n, ranks) == pytest.approx(inside)
    assert dgx.collective_time("all_reduce", n, ranks) == pytest.approx(across)
    # the rack's trays are separate nodes, yet a tray-to-tray pipeline send stays on NVLink
    assert rack.p2p_time(n, 0, 4) == pytest.approx(5e-6 + 20e-6 + n / (900e9 * c.p2p_efficiency))


def test_calibration_status_says_whether_the_constants_were_fitted_on_this_gpu(tmp_path):
    a100 = load_cluster("dgx-a100-80g")
    h100 = load_cluster("dgx-h100")
    assert AnalyticalModel(a100).calibration_status() == "calibrated: a100 (vtrain)"
    assert load_cluster("dgx-a100-40g").calibration == a100.calibration  # 40 GB parts share the A100 fit
    assert AnalyticalModel(h100, calibration=a100.calibration).calibration_status() == \
        "uncalibrated: A100-fitted constants on H100"
    assert AnalyticalModel(h100).calibration_status() == "calibrated: h100 (nemo-24.07)"
    assert AnalyticalModel(h100, calibration="").calibration_status() == \
        "defaults: public-figure constants, uncalibrated on H100"
    assert AnalyticalModel(h100, constants=AnalyticalConstants()).calibration_status().startswith("custom:")
    raw = json.loads(open(a100.calibration).read())
    raw.pop("gpu")
    path = tmp_path / "unstated.json"
    path.write_text(json.dumps(raw))
    assert AnalyticalModel(a100, calibration=str(path)).calibration_status().startswith(
        "uncalibrated: constants fitted on an unstated GPU")


def test_list_clusters_shows_gpu_memory_and_calibration_of_every_zoo_cluster():
    from cost_models.listing import cluster_lines
    import specs
    lines = cluster_lines()
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == set(specs.cluster_names())
    assert "B200-SXM-180GB" in rows["dgx-b200"] and "4500" in rows["dgx-b200"]
    assert rows["gb200-nvl72"].split()[3:6] == ["4", "72", "18"]  # GPUs per tray, NVLink domain, trays
    assert rows["dgx-a100-80g"].endswith("calibrated: a100 (vtrain)")
    assert rows["dgx-h100"].endswith("calibrated: h100 (nemo-24.07)")
    assert rows["dgx-h200"].startswith("dgx-h200") and "transferred: H100-fitted" in rows["dgx-h200"]
    assert rows["h100-500w"].endswith("uncalibrated on H100")  # 500 W, HBM2e, torchtitan: not the fit's GPU
