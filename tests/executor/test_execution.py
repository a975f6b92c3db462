"""--check proves the plan was executed: each fault a user could inject through run_plan(rank_fn=...)
and that leaves the numbers right (or right up to bf16's tolerance) must fail it, with a line
naming what was not executed; the unmutated plans pass."""
import pytest

import cost_models
from executor.execution import CostPrediction, collective_errors, execution_errors, expected_ops, expected_tokens
from executor.reference import layer_unit_plan
from executor.run import run_plan
from specs import LayerStrategy as L
from specs import Plan, load_cluster, uniform_plan
from specs.schedules import Op, OpKind

from tests.executor import broken_workers

F, B = OpKind.FORWARD, OpKind.BACKWARD
TP_SP = Plan(pp=1, stage_layers=(4,), layers=(L(tp=2, sp="megatron"),) * 4, global_batch=4, micro_batches=1,
             model="tiny-gpt")
RECOMPUTE = Plan(pp=1, stage_layers=(4,), layers=(L(dp=2, recompute="full"), L(dp=2, recompute="selective")) * 2,
                 global_batch=4, micro_batches=1, model="tiny-gpt")
MUTATIONS = {
    # fault: (plan, bf16, what the failure line says), on 2 ranks of tiny-gpt
    "tp_not_applied": (uniform_plan(4, model="tiny-gpt", global_batch=4, tp=2), False,
                       "layer 0 (rank 0): holds 793088 / 793088 / 2379264 B of params / grads / optimizer; the plan "
                       "means 398080 / 398080 / 1194240 B (99520 elements per rank after tensor parallelism, ddp dp1)"),
    "megatron_sp_dropped": (TP_SP, False, "layer 0 (rank 0): norm1 saw 64 tokens per sequence; tp2/dp1 sp splits the "
                                          "sequence to 32"),
    "recompute_dropped": (RECOMPUTE, False, "layer 1 (rank 0): block ran forward 1x, attention 1x in a step of 1 "
                                            "micro-batches; recompute selective means 1x and 2x"),
    "one_micro_batch": (uniform_plan(4, model="tiny-gpt", global_batch=4, dp=2, micro_batches=2), False,
                        "stage 0 (rank 0): ran F0 B0; gradient accumulation with 2 micro-batches is F0 B0 F1 B1"),
    "gpipe_for_1f1b": (uniform_plan(4, model="tiny-gpt", global_batch=8, pp=2, micro_batches=4), False,
                       "stage 1 (rank 1): ran F0 F1 F2 F3 B0 B1 B2 B3; 1f1b with 4 micro-batches is "
                       "F0 B0 F1 B1 F2 B2 F3 B3"),
    "zero1_run_as_ddp": (uniform_plan(4, model="tiny-gpt", global_batch=4, dp=2, dp_type="zero1"), False,
                         "layer 3 (rank 1): holds 793088 / 793088 / 2379264 B of params / grads / optimizer; the plan "
                         "means 793088 / 793088 / 1189632 B (198272 elements per rank after tensor parallelism, "
                         "zero1 dp2)"),
    "one_layer_all_reduce_skipped": (uniform_plan(4, model="tiny-gpt", global_batch=4, dp=2), True, "grad layers.1."),
    "zero3_averaged": (uniform_plan(4, model="tiny-gpt", global_batch=4, dp=2, dp_type="zero3"), True, "grad layers."),
}
FAST = {"one_layer_all_reduce_skipped"}
"""Mutations in the default run (the rest: -m slow)."""


@pytest.mark.parametrize("fault", [f if f in FAST else pytest.param(f, marks=pytest.mark.slow) for f in MUTATIONS])
def test_check_fails_on_a_plan_not_executed(tiny_gpt, fault):
    plan, bf16, line = MUTATIONS[fault]
    m = run_plan(plan, tiny_gpt, world_size=2, steps=2, check=True, track_memory=False, timeout_s=180, bf16=bf16,
                 rank_fn=getattr(broken_workers, fault))
    c = m.check
    # the numbers are within the element-wise tolerance: what fails is the proof (or, in bf16,
    # the gradients against their norm)
    assert not c.passed and max(c.loss_max_abs_diff, c.grad_max_abs_diff, c.param_max_abs_diff) <= c.atol
    if bf16:
        assert c.grad_norm_rel_diff > 3 * c.grad_rtol and c.grad_norm_worst.startswith(line), c.grad_norm_worst
    else:
        assert line in c.state_bytes_errors + c.execution_errors, c.state_bytes_errors + c.execution_errors


def prediction(plan, model, world):
    """The analytical cost model's per-rank peak on cpu-<world>, its runtime overhead removed
    (what analysis.validate compares), and its charged data-parallel collectives."""
    cm = cost_models.get("analytical", load_cluster(f"cpu-{world}"))
    cost = cm.plan_cost(model, plan)
    peak = tuple(cost.stage_peak_bytes[r // (world // plan.pp)] - cm.runtime_overhead_bytes for r in range(world))
    return CostPrediction(peak_bytes=peak, collectives=tuple(cost_models.charged_dp_collectives(model, plan, world)))


def test_the_unmutated_plans_pass_every_proof(tiny_gpt):
    """The plans of the mutations above, all at once on 4 ranks in bf16 (the cost model's
    precision): tp with Megatron-SP, full and selective recomputation, ZeRO-1, ZeRO-2, DDP, 2
    micro-batches under 1F1B; peak memory within the tolerance of the cost model's and every
    bucket's collectives those it charges."""
    plan = Plan(pp=2, stage_layers=(2, 2), layers=(L(tp=2, sp="megatron"), L(dp=2, dp_type="zero1", recompute="full"),
                                                   L(tp=2, recompute="selective"), L(dp=2, dp_type="zero2")),
                global_batch=8, micro_batches=2, model="tiny-gpt")
    m = run_plan(plan, tiny_gpt, world_size=4, steps=2, check=True, timeout_s=180, bf16=True,
                 prediction=prediction(plan, tiny_gpt, 4))
    c = m.check
    assert c.passed, (c.execution_errors, c.state_bytes_errors, c.memory_errors, c.collective_errors,
                      c.grad_norm_rel_diff, c.worst)
    assert c.grad_norm_rel_diff < c.grad_rtol / 3 and min(m.peak_memory_bytes) > 0


@pytest.mark.parametrize("fault", ["tp_not_applied", pytest.param("zero1_run_as_ddp", marks=pytest.mark.slow)])
def test_memory_above_the_cost_model_s_fails_when_a_saving_is_not_applied(tiny_gpt, fault):
    plan = MUTATIONS[fault][0]
    m = run_plan(plan, tiny_gpt, world_size=2, steps=2, check=True, timeout_s=180, bf16=True,
                 prediction=prediction(plan, tiny_gpt, 2), rank_fn=getattr(broken_workers, fault))
    c = m.check
    assert not c.passed and c.state_bytes_errors and len(c.memory_errors) == 2
    assert c.memory_errors[0].startswith(f"rank 0 (stage 0: {plan.layers[0].short()}): peak ")
    assert c.memory_errors[0].endswith(", tolerance +35%): a memory-saving choice of the stage was not applied")


def test_expected_ops_are_the_registry_s_or_the_accumulation_loop():
    pp1 = uniform_plan(4, model="tiny-gpt", global_batch=4, micro_batches=2)
    assert expected_ops(pp1, 0) == [Op(F, 0, 0), Op(B, 0, 0), Op(F, 1, 0), Op(B, 1, 0)]
    one_f_one_b = uniform_plan(4, model="tiny-gpt", global_batch=8, pp=2, micro_batches=4)
    assert expected_ops(one_f_one_b, 0)[:4] == [Op(F, 0, 0), Op(F, 1, 0), Op(B, 0, 0), Op(F, 2, 0)]


def _record(ops, forwards, tokens=64):
    return {"ops": ops, "block_forwards": dict.fromkeys(range(4), forwards),
            "attention_forwards": dict.fromkeys(range(4), forwards), "norm_tokens": dict.fromkeys(range(4), tokens)}


def test_execution_errors_by_hand(tiny_gpt):
    plan = uniform_plan(4, model="tiny-gpt", global_batch=4, micro_batches=2, recompute="full")
    ran = [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0)]
    assert execution_errors(plan, tiny_gpt, [{"stage": 0, "executed": _record(ran, 4)}]) == []
    errors = execution_errors(plan, tiny_gpt, [{"stage": 0, "executed": _record(ran[:2], 1, tokens=32)}])
    assert errors[0] == "stage 0 (rank 0): ran F0 B0; gradient accumulation with 2 micro-batches is F0 B0 F1 B1"
    assert errors[1] == ("layer 0 (rank 0): block ran forward 1x, attention 1x in a step of 2 micro-batches; "
                         "recompute full means 4x and 4x")
    assert errors[2] == "layer 0 (rank 0): norm1 saw 32 tokens per sequence; tp1/dp1 ckpt splits the sequence to 64"
    assert execution_errors(plan, tiny_gpt, [{"stage": 0, "executed": {**_record(ran, 4), "block_forwards": {}}}]) \
        == ["layers [0, 1, 2, 3] ran on no rank"]


def test_a_layer_s_elements_per_rank_follow_megatron_s_split(tiny_gpt):
    shapes = {"layers.0.attn.q.weight": (8, 4), "layers.0.attn.q.bias": (8,), "layers.0.attn.o.weight": (4, 8),
              "layers.0.attn.o.bias": (4,), "layers.0.norm1.weight": (4,), "layers.1.attn.q.weight": (8, 4)}
    plan = Plan(pp=1, stage_layers=(4,), layers=(L(tp=2, dp=2, dp_type="zero1"),) + (L(tp=4),) * 3, global_batch=4,
                micro_batches=1, model="tiny-gpt")
    assert layer_unit_plan(plan, shapes, "layer 0") == ("zero1", 2, 16 + 4 + 16 + 4 + 4)
    assert layer_unit_plan(plan, shapes, "layer 1") == ("ddp", 1, 8)
    assert layer_unit_plan(plan, shapes, "embedding") is None
    assert expected_tokens(TP_SP, tiny_gpt, 0) == tiny_gpt.layers[0].seq_len // 2


@pytest.mark.parametrize("fault, line", [
    ("zero1_run_as_ddp", "layer 0 (rank 0): ran all_reduce x1 of 198272 elements over 2 ranks; the cost model charges "
                         "all_gather x1 of 198272 elements over 2 ranks, reduce_scatter x1 of 198272 elements over 2 "
                         "ranks"),
    pytest.param("one_layer_all_reduce_skipped", "layer 1 (rank 0): ran none; the cost model charges all_reduce x1 of "
                 "198272 elements over 2 ranks", marks=pytest.mark.slow)])
def test_collectives_not_the_cost_model_s_fail(tiny_gpt, fault, line):
    plan = MUTATIONS[fault][0]
    m = run_plan(plan, tiny_gpt, world_size=2, steps=2, check=True, track_memory=False, timeout_s=180,
                 prediction=prediction(plan, tiny_gpt, 2), rank_fn=getattr(broken_workers, fault))
    assert not m.check.passed and line in m.check.collective_errors, m.check.collective_errors


def test_collective_errors_by_hand(tiny_gpt):
    plan = uniform_plan(4, model="tiny-gpt", global_batch=4, micro_batches=2, dp=2, dp_type="zero2")
    charged = cost_models.charged_dp_collectives(tiny_gpt, plan, 2)
    assert [(c.layer, c.op, c.calls, c.group_axes) for c in charged[:2]] == [
        (0, "reduce_scatter", 2, ("dp",)), (0, "all_gather", 1, ("dp",))]
    n = int(charged[0].elements)
    ran = {"layer 0": [("reduce_scatter", n, 2), ("reduce_scatter", n, 2), ("all_gather", n + 1, 2)], "head": []}
    assert collective_errors(plan, [{"collectives": ran}], tuple(charged[:2])) == []
    ran["layer 0"] = ran["layer 0"][1:]
    assert collective_errors(plan, [{"collectives": ran}], tuple(charged[:2])) == [
        f"layer 0 (rank 0): ran all_gather x1 of {n + 1} elements over 2 ranks, reduce_scatter x1 of {n} elements "
        f"over 2 ranks; the cost model charges all_gather x1 of {n} elements over 2 ranks, reduce_scatter x2 of "
        f"{n} elements over 2 ranks"]


@pytest.mark.slow
def test_zero3_collectives_are_those_charged_without_a_pipeline(tiny_gpt):
    """FSDP2's all-gathers (forward and backward of each micro-batch) and reduce-scatters, traced
    through its custom-collective hooks, with and without recomputation."""
    plan = Plan(pp=1, stage_layers=(4,), layers=(L(dp=2, dp_type="zero3"), L(dp=2, dp_type="zero3", recompute="full"),
                                                 L(dp=2, dp_type="zero3", recompute="selective"), L(dp=2)),
                global_batch=4, micro_batches=2, model="tiny-gpt")
    m = run_plan(plan, tiny_gpt, world_size=2, steps=2, check=True, track_memory=False, timeout_s=180,
                 prediction=CostPrediction(collectives=tuple(cost_models.charged_dp_collectives(tiny_gpt, plan, 2))))
    assert m.check.passed, m.check.collective_errors


@pytest.mark.parametrize("schedule,micro_batches", [("1f1b", 2), ("1f1b", 4), ("gpipe", 2)])
def test_zero3_collectives_are_those_charged_under_a_pipeline(tiny_gpt, schedule, micro_batches):
    """Each stage's ZeRO-3 modules gather twice per micro-batch, the last one included (FSDP2's
    implicit backward prefetch, which follows forward order across micro-batches, is off)."""
    plan = Plan(pp=2, stage_layers=(2, 2), layers=(L(dp=2, dp_type="zero3"),) * 4, global_batch=2 * micro_batches,
                micro_batches=micro_batches, schedule=schedule, model="tiny-gpt")
    m = run_plan(plan, tiny_gpt, world_size=4, steps=2, check=True, track_memory=False, timeout_s=180,
                 prediction=CostPrediction(collectives=tuple(cost_models.charged_dp_collectives(tiny_gpt, plan, 4))))
    assert m.check.passed, m.check.collective_errors
