"""The symmetry shortcut against the full simulation, and the simulator against the cost-model
formula where nothing overlaps and nothing contends."""
from dataclasses import replace

import pytest

import cost_models
from simulator import simulate
from specs import SpecError, load_cluster, load_model, uniform_plan
from specs.plan import LayerStrategy, Plan


def _analytical(cluster, **constants):
    return cost_models.get("analytical", cluster, calibration=constants)


@pytest.mark.parametrize("kw", [
    dict(tp=2, dp=2, pp=2, micro_batches=4, dp_type="zero2", schedule="1f1b", recompute="full"),
    dict(tp=2, dp=4, pp=1, micro_batches=2, dp_type="zero3", schedule="gpipe", tp_consecutive=False),
    dict(tp=1, dp=2, pp=4, micro_batches=4, dp_type="ddp", schedule="1f1b"),
])
def test_symmetry_shortcut_matches_full_simulation(kw):
    # PCIe switches shared by TP and DP traffic: contention is real, and identical on every replica
    cluster = load_cluster("titan-8")
    model = load_model("tiny-gpt").scaled(hidden_size=512, num_layers=8, seq_len=256)
    plan = uniform_plan(model.num_layers, global_batch=16, **kw)
    cm = _analytical(cluster)
    short = simulate(model, cluster, plan, cm)
    full = simulate(model, cluster, plan, cm, full=True)
    assert short.simulated_gpus == plan.pp and full.simulated_gpus == 8
    assert short.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-9)
    assert short.peak_memory_bytes == pytest.approx(full.peak_memory_bytes, rel=1e-9)
    assert short.bubble_fraction == pytest.approx(full.bubble_fraction, rel=1e-6)
    assert short.link_utilisation  # the played-out ranks' links, equal to the full run's
    for link, value in short.link_utilisation.items():
        assert full.link_utilisation[link] == pytest.approx(value, rel=1e-6, abs=1e-12)
    assert short.events < full.events


@pytest.mark.parametrize("kw", [
    dict(tp=2, dp=4, pp=2, micro_batches=4, dp_type="zero1"),
    dict(tp=4, dp=4, pp=1, micro_batches=2, tp_consecutive=False),
    dict(tp=2, dp=2, pp=4, micro_batches=4, schedule="gpipe"),
])
def test_symmetry_shortcut_matches_full_simulation_across_nodes(kw):
    # two DGX nodes: strided TP and DP rings and pipeline sends share the NICs
    cluster = load_cluster("dgx-a100-80g:2")
    model = load_model("tiny-gpt").scaled(hidden_size=512, num_layers=8, seq_len=256)
    plan = uniform_plan(model.num_layers, global_batch=32, **kw)
    cm = _analytical(cluster)
    short, full = simulate(model, cluster, plan, cm), simulate(model, cluster, plan, cm, full=True)
    assert short.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-9)
    assert short.peak_memory_bytes == pytest.approx(full.peak_memory_bytes, rel=1e-9)
    assert any(link.startswith("nic_out") for link in short.link_utilisation)
    for link, value in short.link_utilisation.items():
        assert full.link_utilisation[link] == pytest.approx(value, rel=1e-6)


PLANS = [(1, 1, 2, True, "ddp", "1f1b"), (2, 2, 4, False, "ddp", "1f1b"), (4, 2, 8, True, "zero1", "gpipe"),
         (8, 1, 1, True, "ddp", "1f1b"), (1, 4, 8, False, "ddp", "gpipe"), (2, 4, 4, True, "zero1", "1f1b"),
         (1, 8, 16, True, "ddp", "1f1b")]


def assert_the_formulas_time_and_memory(model, cluster, plan, cm):
    """The simulator (gradient sync after backward) within 1% of plan_cost's iteration time, and
    its peak memory at most the formula's: same states and stashes, the formula also adds every
    temporary at once."""
    sim = simulate(model, cluster, plan, cm, overlap_dp=False, record_memory=False)
    formula = cm.plan_cost(model, plan)
    assert sim.iteration_time_s == pytest.approx(formula.iteration_time_s, rel=0.01), plan.summary()
    assert sim.peak_memory_gib * 2**30 <= formula.peak_memory_bytes * 1.001, plan.summary()


@pytest.mark.parametrize("name", ["gpt-1.7b", "bert-large", "llama2-7b", "t5-large-48", "vit-large-24"])
def test_no_overlap_no_contention_matches_the_cost_model_within_one_percent(name):
    # dp_overlap_fraction = 0: the formula puts all gradient sync after backward, as the
    # simulator does with overlap_dp=False; one GPU per pipeline send and per ring edge.
    cluster = load_cluster("dgx-a100-80g")
    cm = _analytical(cluster, dp_overlap_fraction=0.0)
    model = load_model(name)
    for tp, pp, m, ckpt, dp_type, schedule in PLANS:
        plan = uniform_plan(model.num_layers, tp=tp, dp=8 // (tp * pp), pp=pp, global_batch=64, micro_batches=m,
                            recompute="full" if ckpt else "none", dp_type=dp_type, schedule=schedule)
        assert_the_formulas_time_and_memory(model, cluster, plan, cm)


def test_overlapping_gradient_sync_with_backward_saves_time():
    cluster = load_cluster("dgx-a100-80g")
    model = load_model("gpt-1.7b")
    plan = uniform_plan(model.num_layers, dp=8, global_batch=32, micro_batches=2)
    cm = _analytical(cluster)
    overlapped = simulate(model, cluster, plan, cm).iteration_time_s
    serial = simulate(model, cluster, plan, cm, overlap_dp=False).iteration_time_s
    assert overlapped < serial * 0.99


def test_tp_and_dp_traffic_on_one_pcie_switch_slow_each_other():
    # tp4 inside a switch, dp2 across the two switches: gradient buckets synced during backward
    # share GPU ports with the TP all-reduces, which then take longer than in forward.
    cluster = load_cluster("titan-8")
    model = load_model("tiny-gpt").scaled(hidden_size=1024, num_layers=8, seq_len=512)
    plan = uniform_plan(model.num_layers, tp=4, dp=2, global_batch=2, micro_batches=1)
    result = simulate(model, cluster, plan, _analytical(cluster), keep_spans=True, bucket_bytes=1.0)
    tp = [(name, end - start) for gpu, stream, name, start, end in result.spans
          if gpu == "GPU 0" and stream == "tp"]
    forward = max(d for n, d in tp if n.startswith("F"))
    backward = max(d for n, d in tp if n.startswith("B"))
    assert backward > 1.05 * forward  # the DP edges hold ~1.25 of a port's 12 GB/s
    assert result.link_utilisation["uplink_up 0.0"] > 0


def test_heterogeneous_plan_with_a_relayout_runs_and_matches_full():
    cluster = load_cluster("dgx-a100-80g")
    model = load_model("gpt-1.7b").scaled(num_layers=4)
    layers = [LayerStrategy(tp=2, dp=2), LayerStrategy(tp=4, dp=1), LayerStrategy(tp=1, dp=4, dp_type="zero3"),
              LayerStrategy(tp=1, dp=4, dp_type="zero3", recompute="full")]
    plan = Plan(pp=2, stage_layers=(2, 2), layers=tuple(layers), global_batch=8, micro_batches=2)
    cm = _analytical(cluster)
    short, full = simulate(model, cluster, plan, cm), simulate(model, cluster, plan, cm, full=True)
    assert short.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-9)
    assert short.peak_memory_bytes == pytest.approx(full.peak_memory_bytes, rel=1e-9)


@pytest.mark.parametrize("tp, pp, m, recompute, precision", [(8, 1, 4, "none", "fp8-current"),
                                                             (4, 2, 4, "full", "bf16"),
                                                             (2, 2, 8, "selective", "fp8-current")])
def test_tp_overlap_matches_the_cost_model_within_one_percent(tp, pp, m, recompute, precision):
    # H100 with its own calibration: each Megatron-SP collective beside its GEMM's chunks in the
    # simulator is the formula's max(0, C - G (tp - 1) / tp); the rest as in the test above
    cluster = load_cluster("dgx-h100")
    cm = cost_models.get("analytical", cluster, dp_overlap_fraction=0.0)
    model = load_model("llama3-70b").scaled(num_layers=4)
    plan = uniform_plan(model.num_layers, tp=tp, dp=8 // (tp * pp), pp=pp, global_batch=16, micro_batches=m,
                        sp="megatron", recompute=recompute, precision=precision, dp_type="zero1",
                        stack="megatron-te", tp_comm_overlap=True)
    sim = simulate(model, cluster, plan, cm, overlap_dp=False, record_memory=False)
    formula = cm.plan_cost(model, plan)
    assert sim.iteration_time_s == pytest.approx(formula.iteration_time_s, rel=0.01), plan.summary()
    without = cm.plan_cost(model, replace(plan, tp_comm_overlap=False)).iteration_time_s
    assert formula.iteration_time_s < without  # the overlap is played, not left out on both sides
    full = simulate(model, cluster, plan, cm, overlap_dp=False, record_memory=False, full=True)
    assert full.iteration_time_s == pytest.approx(sim.iteration_time_s, rel=1e-9)


@pytest.mark.parametrize("tp, precision, overlap", [(2, "bf16", False), (4, "fp8-current", True)])
def test_selective_op_matches_the_cost_model_within_one_percent(tp, precision, overlap):
    # torchtitan's per-op policy under torch.compile: the recomputed forward's kernels in B, its
    # all-gathers re-run and its reduce-scatters kept, in the simulator as in the formula
    cluster = load_cluster("dgx-h100")
    cm = cost_models.get("analytical", cluster, dp_overlap_fraction=0.0, stack="compile")
    model = load_model("llama3-70b").scaled(num_layers=4)
    plan = uniform_plan(model.num_layers, tp=tp, dp=8 // tp, global_batch=16, micro_batches=4, sp="megatron",
                        recompute="selective-op", precision=precision, dp_type="zero1", stack="compile",
                        tp_comm_overlap=overlap)
    assert_the_formulas_time_and_memory(model, cluster, plan, cm)


def test_a_layerless_end_chunk_matches_the_cost_model_within_one_percent():
    # Llama 3's layout in small: 6 layers on pp 2 x v 4 = 8 chunks, chunk 0 only the embedding
    # and chunk 7 only the loss; their messages have a layer's shape and cross every boundary
    cluster = load_cluster("dgx-a100-80g")
    cm = _analytical(cluster, dp_overlap_fraction=0.0)
    model = load_model("gpt-1.7b").scaled(num_layers=6)
    plan = uniform_plan(6, tp=2, dp=2, pp=2, global_batch=64, micro_batches=32, schedule="interleaved_1f1b",
                        virtual_stages=4)
    assert plan.layers_per_chunk() == (0, 1, 1, 1, 1, 1, 1, 0)
    assert_the_formulas_time_and_memory(model, cluster, plan, cm)
    # stage by stage too: the last stage's 3 layers sit in 3 of its 4 chunks, so its warm-up (7
    # chunk-micro-batches, 6 of them holding a layer) holds more than 7/4 of its activations
    sim = simulate(model, cluster, plan, cm, overlap_dp=False, record_memory=False)
    per_stage = [sim.peak_memory_bytes[k * 4] for k in range(plan.pp)]
    assert all(s <= f * 1.001 for s, f in zip(per_stage, cm.plan_cost(model, plan).stage_peak_bytes)), per_stage


def test_the_simulator_refuses_what_its_cost_model_cannot_price():
    # the Megatron-TE model has no per-op checkpointing to time the plan's layers with
    cluster = load_cluster("dgx-h100")
    model = load_model("llama3-8b").scaled(num_layers=2)
    plan = uniform_plan(2, dp=8, global_batch=8, recompute="selective-op")
    with pytest.raises(SpecError, match=r"analytical cost model cannot run layer 0: recompute selective-op"):
        simulate(model, cluster, plan)
