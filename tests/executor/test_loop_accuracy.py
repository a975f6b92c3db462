"""benchmarks.loop_accuracy's pure parts: its plans are valid and runnable on its models, both
predictors price every one of them, and its metrics on hand-worked numbers. The loop itself
(profile, --check, runs) is slow: one plan of each model end to end."""
import math

import pytest

from benchmarks import loop_accuracy as loop
from executor.checks import check_runnable
from specs import load_cluster
from specs.profile_format import LayerSignature, Profile


def test_twenty_plans_the_nine_of_2022_first():
    names = list(loop.plans())
    assert len(names) == 20 and len(set(names)) == 20
    assert tuple(names[:9]) == loop.SPACE_2022


def test_every_plan_is_valid_and_runnable_on_its_model():
    models, cluster = loop.models(), load_cluster(loop.CLUSTER)
    for name, plan in loop.plans().items():
        model = models[plan.model]
        plan.validate(model, cluster)
        check_runnable(model, plan, 2)
        assert plan.global_batch == loop.BATCH, name


def test_todays_plans_use_the_axes_they_are_named_for():
    p = loop.plans()
    assert p["tp2 vocab-tp2 m2"].vocab_tp == 2
    assert p["pp2 zb_h1 m4"].schedule == "zb_h1"
    assert {s.sp for s in p["ulysses2 m2"].layers} == {"ulysses"} and p["ulysses2 m2"].layers[0].ulysses == 2
    assert {(s.tp, s.sp) for s in p["tp2 sp m2"].layers} == {(2, "megatron")}
    assert p["pp2 v2 interleaved m8"].schedule == "interleaved_1f1b" and p["pp2 v2 interleaved m8"].virtual_stages == 2
    assert {(s.cp, s.cp_comm) for s in p["cp2 ring m4"].layers} == {(2, "p2p")}
    assert {s.recompute for s in p["tp2 sp selective m4"].layers} == {"selective"}
    v = p["pp2 dualpipev m8"]
    assert v.schedule == "dualpipev" and v.virtual_stages == 2
    assert {s.ep for s in p["moe ep2 m2"].layers} == {2} and {s.dp for s in p["moe ep2 m2"].layers} == {2}
    assert {s.tp for s in p["moe tp2 m2"].layers} == {2}
    assert {pl.model for n, pl in p.items() if n.startswith("moe")} == {loop.MOE_MODEL}
    assert {pl.model for n, pl in p.items() if not n.startswith("moe")} == {loop.MODEL}


def test_the_moe_model_is_scaled_like_the_dense_one():
    dense, moe = loop.models()[loop.MODEL], loop.models()[loop.MOE_MODEL]
    assert len(moe.layers) == len(dense.layers) == 4
    assert moe.layers[0].moe is not None and moe.layers[0].hidden_size == dense.layers[0].hidden_size == 384
    assert moe.seq_len == dense.seq_len == 128
    assert moe.embedding.vocab_size == dense.embedding.vocab_size == loop.VOCAB
    # a token's two experts do the dense MLP's work
    assert moe.layers[0].moe.top_k * moe.layers[0].moe.expert_ffn_hidden_size == dense.layers[0].ffn_hidden_size


def test_selected_plans_by_name_and_refuses_unknown_ones():
    assert list(loop.selected("tp2 sp m2, dp2")) == ["dp2", "tp2 sp m2"]  # in the loop's order
    assert len(loop.selected(None)) == 20
    with pytest.raises(RuntimeError, match="unknown 'pp9'"):
        loop.selected("dp2,pp9")


def test_mape_on_hand_worked_numbers():
    # |110-100|/100 + |90-100|/100 + |200-100|/100 = 0.1 + 0.1 + 1.0, over 3
    assert loop.mape([110, 90, 200], [100, 100, 100]) == pytest.approx(0.4)
    assert loop.mape([50.0], [100.0]) == pytest.approx(0.5)
    assert loop.mape([1, 2, 3], [1, 2, 3]) == 0


def test_kendall_tau_on_hand_worked_numbers():
    # six pairs; only (2, 3) is swapped: (5 concordant - 1 discordant) / 6
    assert loop.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert loop.kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert loop.kendall_tau([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    # three pairs, one swapped: (2 - 1) / 3
    assert loop.kendall_tau([1, 2, 3], [2, 1, 3]) == pytest.approx(1 / 3)


def test_memory_error_compares_the_largest_peaks():
    assert loop.memory_error((90.0, 110.0), (100.0, 100.0)) == pytest.approx(0.1)
    assert loop.memory_error((95.0,), (80.0, 100.0)) == pytest.approx(0.05)


def _synthetic_profile(model) -> Profile:
    """A profile with made-up but plausible numbers for every layer type of ``model`` (tables at
    tp 1 and 2, ZeRO-3 at 2, both collectives, p2p), enough for both predictors."""
    layers = []
    for layer in model.layer_types():
        act = 40 * layer.seq_len * layer.hidden_size * 4
        times = lambda ms: {"1": ms, "2": 2 * ms, "4": 4 * ms}  # noqa: E731
        layers.append({"signature": LayerSignature.of(layer).to_dict(), "forward_ms": times(10.0),
                       "backward_ms": times(20.0), "parameter_bytes": 4 * layer.param_count(),
                       "activation_bytes_per_sample": {"1": act, "2": act / 2, "ckpt": layer.seq_len * layer.hidden_size * 4},
                       "tp_forward_ms": {"2": times(6.0)}, "tp_backward_ms": {"2": times(12.0)},
                       "zero3_forward_ms": {"2": times(11.0)}, "zero3_backward_ms": {"2": times(23.0)}})
    vocab_params = model.embedding.vocab_size * model.embedding.hidden_size
    return Profile.from_dict({
        "format": "hybridpar-profile", "version": 1,
        "hardware": {"device": "cpu-process", "world_size": 2, "dtype": "fp32"}, "layers": layers,
        "vocab": {"forward_ms": {"1": 5.0, "2": 10.0, "4": 20.0}, "backward_ms": {"1": 10.0, "2": 20.0, "4": 40.0},
                  "parameter_bytes": 4 * vocab_params},
        "allreduce_gbytes_per_s": {"2_consec": 1.0}, "allreduce_latency_us": 100.0,
        "collective_gbytes_per_s": {"all_gather": {"2_consec": 0.8}, "reduce_scatter": {"2_consec": 0.5}},
        "p2p_gbytes_per_s": {"2": 1.0}, "overlap_coefficient": 1.1, "optimizer_ms_per_mparam": 2.0})


def test_both_predictors_price_every_plan():
    models, cluster = loop.models(), load_cluster(loop.CLUSTER)
    profiles = {name: _synthetic_profile(model) for name, model in models.items()}
    for name, plan in loop.plans().items():
        for p in loop.predict_plan(models[plan.model], cluster, plan, profile=profiles[plan.model]):
            assert math.isfinite(p.time_s) and p.time_s > 0, name
            assert p.peak_memory_bytes and all(math.isfinite(b) and b > 0 for b in p.peak_memory_bytes), name


def test_the_simulator_plays_an_fp32_runs_messages_at_its_bytes():
    """The loop's runs are fp32: the profiled model charges each TP all-reduce, expert all-to-all
    and pipeline send at 4-byte activations (wire_scale 2 over the formulas' 16-bit bytes), and the
    simulator plays the same bytes over links calibrated to the model, so one layer's forward
    all-reduces take the model's two all-reduce times (they took one half-size each)."""
    import cost_models
    import simulator
    from simulator.work import tp_allreduce_bytes
    models, cluster = loop.models(), load_cluster(loop.CLUSTER)
    model, plan = models[loop.MODEL], loop.plans()["tp2 ckpt m2"]
    cm = cost_models.get("profiled", cluster, profile=_synthetic_profile(model))
    assert cm.wire_scale == 2.0
    res = simulator.simulate(model, cluster, plan, cm, keep_spans=True)
    span = next(b - a for _, stream, name, a, b in res.spans if stream == "tp" and name.startswith("F0 L0 tp"))
    one = cm.collective_time("all_reduce", tp_allreduce_bytes(model.layers[0], plan.micro_batch_size(0)), [[0, 1]])
    assert span == pytest.approx(2 * one)


def test_the_simulator_syncs_gradients_in_the_cost_models_buckets():
    """The profiled model describes our executor, which reduces each layer's gradients on their own
    (sync_bucket_bytes 0): the simulator then syncs layer by layer, and a slow ZeRO-2 reduce-scatter
    no longer holds every layer's unsharded gradients; the analytical model keeps DDP's 25 MiB
    buckets, which hold the loop model's four layers at once."""
    import re

    import cost_models
    import simulator
    models, cluster = loop.models(), load_cluster(loop.CLUSTER)
    model, plan = models[loop.MODEL], loop.plans()["dp2 zero2 m2"]

    def synced(cm) -> set[str]:
        spans = simulator.simulate(model, cluster, plan, cm, keep_spans=True).spans
        return {re.match(r"grad sync (\S+) ", name).group(1) for _, stream, name, _, _ in spans
                if stream == "dp" and name.startswith("grad sync L")}

    profiled = cost_models.get("profiled", cluster, profile=_synthetic_profile(model))
    assert synced(profiled) == {f"L{i}-L{i}" for i in range(4)}
    assert synced(cost_models.get("analytical", cluster)) == {"L0-L3"}


@pytest.mark.slow
def test_loop_end_to_end_on_one_plan_of_each_model(capsys):
    """Both profiles, --check, one round: the loop's whole path (minutes on 2 cores)."""
    assert loop.main(["--rounds", "1", "--steps", "1", "--repeats", "1", "--plans", "tp2 sp m2,moe ep2 m2"]) == 0
    out = capsys.readouterr().out
    assert "check: 2/2 passed" in out and "Kendall tau" in out and "moe ep2 m2" in out


def test_the_head_holds_its_own_chunks_micro_batches():
    """DualPipeV on 2 stages, 8 micro-batches: stage 0 runs the head's chunk's backward right
    after its forward, so at the stage's peak (4 first-chunk and 1 head micro-batches) the head
    keeps one micro-batch's logits; with one chunk a stage, the stage's in-flight count."""
    from cost_models import in_flight
    from cost_models.profiled import head_held
    p = loop.plans()
    assert head_held(p["pp2 dualpipev m8"], 0) == 1
    assert in_flight("dualpipev", 2, 0, 8, 2) == 2.5  # chunk-micro-batches in stage units
    gpipe = p["pp2 m4 gpipe"]
    assert head_held(gpipe, 1) == in_flight("gpipe", 2, 1, 4) == 4


def test_round_spread_on_hand_worked_numbers():
    # run medians 90, 100, 120 ms around a plan time of 100 ms: (120 - 90) / 100
    assert loop.round_spread([0.09, 0.1, 0.12], 0.1) == pytest.approx(0.3)
    assert loop.round_spread([0.1], 0.1) == 0
