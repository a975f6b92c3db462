"""The profiler writes a valid profile file, profile -> plan -> run works as one loop, and
validate puts predictions next to measurements."""
import json

import pytest
import torch

import specs
from executor.model import Block
from executor.profile import build_profile, main as profile_main, saved_activation_bytes, shard_spec
from analysis.validate import format_validation, validate_plan
from specs import uniform_plan

from tests.executor.conftest import assert_matches_reference


def test_saved_activations_shrink_with_tp_and_exclude_parameters():
    layer = specs.load_model("tiny-gpt").layers[0]
    x = torch.randn(2, layer.seq_len, layer.hidden_size, requires_grad=True)
    full = saved_activation_bytes(Block(layer), x)
    half = saved_activation_bytes(Block(shard_spec(layer, 2)), x)
    params = sum(p.numel() * 4 for p in Block(layer).parameters())
    assert 0 < half < full
    # GPT block at batch 2: at least the block input and the MLP hidden (4h wide) are kept
    assert full >= 4 * 2 * layer.seq_len * (layer.hidden_size + layer.ffn_hidden_size)
    assert full < params + 40 * 2 * layer.seq_len * layer.hidden_size * 4


def test_a_tp_shard_of_a_moe_block_splits_every_expert():
    """tiny-moe: 8 experts of width 256; a tp-2 rank holds every expert at width 128 (the
    router and norms whole), as the executor's expert tensor parallelism splits them."""
    layer = specs.load_model("tiny-moe").layers[0]
    shard = shard_spec(layer, 2)
    assert shard.moe.expert_ffn_hidden_size == 128 and shard.moe.num_experts == 8
    router = layer.moe.router_params(layer.hidden_size)
    assert shard._ffn_params() - router == (layer._ffn_params() - router) // 2


def test_profile_file_round_trips_and_has_the_tables(tmp_path):
    out = tmp_path / "profile.json"
    assert profile_main(["--model", "tiny-gpt", "--batch-sizes", "1", "2", "--tp", "1", "2",
                         "--world-size", "2", "--repeats", "1", "--out", str(out)]) == 0
    from specs.profile_format import load_profile
    profile = load_profile(out)
    entry = profile.layer(specs.load_model("tiny-gpt").layers[0])
    assert set(entry.forward_ms) == {1, 2} and set(entry.activation_bytes_per_sample) == {"1", "2", "ckpt"}
    assert entry.parameter_bytes == 4 * specs.load_model("tiny-gpt").layers[0].param_count()  # fp32
    # the layer also timed as executed: tensor parallel at tp 2 (plain, and Megatron-SP with and
    # without selective recomputation), ZeRO-3 over both ranks
    assert set(entry.tp_forward_ms) == set(entry.zero3_forward_ms) == set(entry.zero3_backward_ms) == {2}
    assert set(entry.sp_forward_ms) == set(entry.sp_backward_ms) == set(entry.sp_selective_backward_ms) == {2}
    assert set(entry.sp_selective_backward_ms[2]) == {1, 2}
    assert set(entry.zero3_forward_ms[2]) == {1, 2} and all(ms > 0 for ms in entry.zero3_backward_ms[2].values())
    assert "2_consec" in profile.allreduce_gbytes_per_s and "2" in profile.p2p_gbytes_per_s
    # the collectives FSDP runs, timed with the job's backend (gloo here)
    assert {kind: set(t) for kind, t in profile.collective_gbytes_per_s.items()} == {
        "all_gather": {"2_consec"}, "reduce_scatter": {"2_consec"}}
    assert profile.overlap_coefficient >= 1.0
    assert profile.optimizer_ms_per_mparam > 0  # the slope between the two optimizer probes
    assert json.loads(out.read_text())["hardware"]["world_size"] == 2


@pytest.mark.slow  # the profile's tables, the profiled model and planner plans under --check each run by default
def test_profile_plan_run_loop(tmp_path):
    """Profile this machine, plan with the profiled cost model, run the plan with --check."""
    planners = pytest.importorskip("planners", reason="planners package not importable yet")
    import cost_models
    from specs.profile_format import save_profile
    model, cluster = specs.load_model("tiny-gpt"), specs.load_cluster("cpu-4")
    path = tmp_path / "cpu4.json"
    save_profile(build_profile(model, batch_sizes=[1, 2, 4], tps=[1, 2], repeats=1, world_size=4), path)
    cost_model = cost_models.get("profiled", cluster, profile_path=path)
    result = planners.plan("galvatron", model, cluster, planners.Budget(memory_gib=2.0, global_batch=8),
                           cost_model=cost_model)
    assert result.feasible
    assert_matches_reference(result.plan, model, cluster.world_size)


def test_validate_reports_predicted_and_measured_memory():
    pytest.importorskip("simulator", reason="simulator package not importable yet")
    model, cluster = specs.load_model("tiny-gpt"), specs.load_cluster("cpu-2")
    v = validate_plan(uniform_plan(4, dp=2, dp_type="zero3", global_batch=4, model="tiny-gpt"), model, cluster,
                      steps=2)
    assert [p.source for p in v.predictions] == ["cost model (analytical)", "simulator"]
    for p in v.predictions:
        assert len(p.peak_memory_bytes) == 2 and all(b > 0 for b in p.peak_memory_bytes)
        errors = v.memory_errors(p)
        assert all(abs(e) < 10 for e in errors)  # same order of magnitude: a unit slip would be 1e3+
    text = format_validation(v)
    assert "measured" in text and "simulator" in text and "%" in text


def test_noisy_profiles_are_refused_with_the_entries_named():
    from specs.profile_format import ProfileError
    from executor.profile import Timed, noisy_entries
    stats = {"layer0/4/fwd": Timed(10.0, 0.02, 5), "layer0/4/bwd": Timed(20.0, 0.4, 40)}
    assert noisy_entries(stats, 0.15) == ["layer0/4/bwd 0.40 (40 repeats)"]
    model = specs.load_model("tiny-gpt").scaled(num_layers=1)
    with pytest.raises(ProfileError, match=r"timings too noisy \(relative standard error of the median > 0.0 "
                                           r"after up to 4 repeats\): layer0/1/bwd [0-9.]+ \(4 repeats\)"):
        build_profile(model, batch_sizes=[1], tps=[1], repeats=3, warmup=0, max_error=0.0, max_repeats=4)


def test_median_error_is_robust_to_one_outlier():
    from executor.profile import median_error
    # median 3, absolute deviations 2 1 0 1 97: MAD 1
    assert median_error([1.0, 2.0, 3.0, 4.0, 100.0]) == pytest.approx(1.2533 * 1.4826 / 5 ** 0.5 / 3)
    assert median_error([2.0, 2.0, 2.0]) == 0.0


class _Scripted:
    """Timings whose quantities return scripted times in place of measured ones."""

    def __init__(self, script: dict):
        from executor.profile import Timings

        class Fake(Timings):
            def _once(self, fn):
                return fn()
        self.timings = Fake("cpu", repeats=3, warmup=0)
        for key, values in script.items():
            it = iter(values)
            self.timings.time(key, lambda it=it: next(it))


def test_timings_repeat_only_the_noisy_times_until_precise_or_at_the_limit():
    steady = [1.0] * 100
    noisy = [1.0, 2.0, 3.0] * 40  # never precise to 1%
    settles = [1.0, 1.5, 2.0] + [1.5] * 100  # precise once the 1.5s dominate
    t = _Scripted({"steady": steady, "noisy": noisy, "settles": settles}).timings
    stats = t.settle(max_error=0.01, max_repeats=10)
    assert stats["steady"].repeats == 3 and stats["steady"].error == 0.0
    assert stats["noisy"].repeats == 10 and stats["noisy"].error > 0.01  # stopped at the limit
    assert stats["settles"].repeats == 6 and stats["settles"].median_ms == 1.5 and stats["settles"].error == 0.0
    assert len(t.samples["noisy"]) == 10
    no_more = _Scripted({"noisy": noisy}).timings.settle(max_error=None)
    assert no_more["noisy"].repeats == 3


def test_profile_records_how_it_timed():
    model = specs.load_model("tiny-gpt").scaled(num_layers=1)
    profile = build_profile(model, batch_sizes=[1, 2], tps=[1], repeats=2, warmup=1, world_size=2, max_error=None)
    hw = profile.hardware
    assert hw["threads_per_rank"] == 1 and hw["repeats"] == 2 and hw["most_repeats"] == 2 and hw["world_size"] == 2
    assert hw["max_error"] >= hw["median_error"] >= 0


def test_validate_with_check_holds_the_run_to_the_cost_model():
    """analysis.validate --check --bf16: the executor's check, with the cost model's data-parallel
    collectives and peak memory passed in; a ZeRO-1 plan runs as charged and within memory."""
    model, cluster = specs.load_model("tiny-gpt"), specs.load_cluster("cpu-2")
    plan = uniform_plan(4, dp=2, dp_type="zero1", global_batch=8, micro_batches=2, model="tiny-gpt")
    v = validate_plan(plan, model, cluster, steps=2, bf16=True, check=True)
    c = v.measured.check
    assert c is not None and c.passed, (c.collective_errors, c.memory_errors, c.execution_errors)
    assert format_validation(v).splitlines()[1].startswith("  check PASSED")


def _tp2_moe_block_shapes(rank, world_size):
    """Local shapes of a tiny-moe block as the profiler times it at tp 2."""
    from executor.parallel.layout import GroupCache
    from executor.profile import profiled_block
    layer = specs.load_model("tiny-moe").layers[0]
    block, key = profiled_block(layer, 0, "cpu", torch.float32, tp=2, groups=GroupCache())
    experts = block.mlp.experts
    return key, [tuple(w.to_local().shape) for w in (experts.gate, experts.up, experts.down)]


def test_the_profiler_times_a_tp_moe_block_with_its_experts_split():
    """At tp 2 every rank computes every routed expert at half width, as a tp plan runs them
    (not the whole experts on both ranks, which timed twice the expert work)."""
    from executor.launch import launch
    layer = specs.load_model("tiny-moe").layers[0]
    h, f, e = layer.hidden_size, layer.moe.expert_ffn_hidden_size, layer.moe.num_experts
    for key, shapes in launch(_tp2_moe_block_shapes, 2, timeout_s=120):
        assert key == "layer0/tp2"
        assert shapes == [(e, h, f // 2), (e, h, f // 2), (e, f // 2, h)]


def test_the_profiler_times_the_vocabulary_with_the_loss_the_executor_runs():
    """Embedding, head and the cross-entropy: the loss's log-softmax and its backward are passes
    over every logit that each training step runs (uncharged before: the head's output was
    summed), in the timed forward and in the timed backward."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from executor.profile import Timings, time_vocab

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.__name__)
            return func(*args, **(kwargs or {}))

    timings = Timings("cpu", repeats=1, warmup=0)
    time_vocab(specs.load_model("tiny-gpt"), [2], timings, torch.float32)
    for key, wanted in (("vocab/2/fwd", "_log_softmax.default"), ("vocab/2/bwd", "_log_softmax_backward_data.default")):
        with Ops() as ops:
            timings.entries[key]()
        assert wanted in ops.names, (key, sorted(ops.names))
