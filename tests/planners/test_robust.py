"""The robust objective: regret worked by hand, the choice when the nominal winner loses under a
scenario, the scenarios' perturbations, and the objective through Planner.plan and compare."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

import cost_models
from cost_models.scenarios import SCENARIOS, Scenario, perturbed
from planners import Budget
from planners.registry import get
from planners.robust import choose, regrets, robust_index, robust_plans
from runners import compare
from specs import SpecError, load_cluster, load_model, uniform_plan
from specs.units import MIB

A = uniform_plan(4, dp=4, global_batch=8, micro_batches=2, model="tiny-gpt", cluster="cpu-4")
B = uniform_plan(4, tp=2, dp=2, global_batch=8, micro_batches=2, model="tiny-gpt", cluster="cpu-4")
C = uniform_plan(4, tp=4, global_batch=16, micro_batches=2, model="tiny-gpt", cluster="cpu-4")


class Times:
    """A stand-in cost model: plan -> iteration time, nothing else."""

    def __init__(self, times):
        self.times = times

    def plan_cost(self, model, plan):
        return type("Cost", (), {"iteration_time_s": self.times[plan]})()


def test_regret_worked_by_hand():
    # two scenarios; per-sample times: p0 (1.0, 2.0), p1 (1.1, 1.5), p2 (1.2, 1.6)
    r = regrets([[1.0, 2.0], [1.1, 1.5], [1.2, 1.6]])
    assert r[0] == pytest.approx([0.0, 2.0 / 1.5 - 1])
    assert r[1] == pytest.approx([0.1, 0.0])
    assert r[2] == pytest.approx([0.2, 1.6 / 1.5 - 1])
    assert robust_index(r) == 1  # worst regrets 1/3, 0.1, 0.2
    assert robust_index([[0.0, 0.1], [0.05, 0.1]]) == 0  # equal worst: the lower nominal regret
    assert robust_index([[0.0, 0.1005], [0.002, 0.1]]) == 0  # 0.05% less worst regret: inside CHOICE_TOL


def test_nominal_winner_that_loses_under_a_scenario_is_not_chosen():
    # A wins nominally by 5% but loses 30% when the network is slow; B is 5% behind, then best.
    nominal = Times({A: 1.00, B: 1.05})
    slow_net = Times({A: 1.50, B: 1.15})
    choice = choose(None, [A, B], [nominal, slow_net], ("nominal", "net-eff-0.6"))
    assert choice.differs and choice.chosen.plan == B and choice.nominal.plan == A
    assert choice.nominal.regret == pytest.approx((0.0, 1.50 / 1.15 - 1))
    assert choice.chosen.regret == pytest.approx((0.05, 0.0))
    assert choice.chosen.regret_max == pytest.approx(0.05) and choice.chosen.worst_time_s == 1.15
    # regret is per sample: C runs twice the batch in 1.5x the best time, so it is the best everywhere
    with_c = [Times({**m.times, C: 1.5 * min(m.times.values())}) for m in (nominal, slow_net)]
    choice = choose(None, [A, B, A, C], with_c, ("nominal", "net-eff-0.6"))
    assert choice.candidates == 3 and choice.chosen.plan == C


def test_scenarios_perturb_the_named_constants_only():
    cm = cost_models.get("analytical", load_cluster("dgx-a100-80g:2"))
    c = cm.constants
    bw = perturbed(cm, SCENARIOS["bw-20%"]).constants
    assert bw.bus_efficiency == pytest.approx(0.8 * c.bus_efficiency)
    assert bw.network_efficiency == pytest.approx(0.8 * c.network_efficiency)
    assert bw.gemm_efficiency_max == c.gemm_efficiency_max
    assert perturbed(cm, SCENARIOS["net-eff-0.6"]).constants.network_efficiency == min(0.6, c.network_efficiency)
    assert perturbed(cm, SCENARIOS["gemm-10%"]).constants.gemm_efficiency_max == pytest.approx(0.9 * c.gemm_efficiency_max)
    assert Scenario("x", "cap above", cap=(("network_efficiency", 2.0),)).apply(c) == c  # a cap never raises
    slow = perturbed(cm, SCENARIOS["at-scale"])
    assert slow.reserve == cm.reserve and slow.calibration_status() == cm.calibration_status()
    with pytest.raises(SpecError, match="galvatron cost model has none"):
        perturbed(cost_models.get("galvatron", load_cluster("dgx-a100-80g:1")), SCENARIOS["bw-20%"])


def test_at_scale_penalty_only_for_groups_above_the_covered_size():
    cluster = load_cluster("dgx-h100:32")  # 256 GPUs
    cm = cost_models.get("analytical", cluster)
    slow = perturbed(cm, SCENARIOS["at-scale"])
    covered = int(cm.constants.at_scale_ranks)
    small, large = [tuple(range(covered))], [tuple(range(2 * covered))]
    assert slow.collective_time("all_gather", 256 * MIB, small) == cm.collective_time("all_gather", 256 * MIB, small)
    ratio = slow.collective_time("all_gather", 256 * MIB, large) / cm.collective_time("all_gather", 256 * MIB, large)
    assert 1.05 < ratio <= 1 / 0.7  # the bandwidth term at 0.7, the latency terms as they were


def test_robust_plans_adds_each_scenarios_own_best():
    model, cm = load_model("tiny-gpt"), cost_models.get("analytical", load_cluster("cpu-4"))
    seen = []
    choice = robust_plans(lambda m: seen.append(m) or (B,), model, cm, (A,), "bw-20%,gemm-10%")
    assert len(seen) == 2 and choice.scenarios == ("nominal", "bw-20%", "gemm-10%") and choice.candidates == 2
    with pytest.raises(SpecError, match="unknown 'nope'"):
        robust_plans(lambda m: (), model, cm, (A,), "nope")


def test_planner_robust_objective_is_consistent():
    model, cluster = load_model("tiny-gpt"), load_cluster("cpu-4")
    cm = cost_models.get("analytical", cluster)
    budget = Budget(memory_gib=4, global_batch=8)
    nominal = get("galvatron").plan(model, cluster, budget, cm)
    robust = get("galvatron").plan(model, cluster, budget, cm, {"objective": "robust"})
    choice = robust.robust
    assert nominal.robust is None and choice.nominal.plan == nominal.plan
    assert robust.plan == choice.chosen.plan and robust.stats.solver_status == "robust"
    assert robust.iteration_time_s == pytest.approx(cm.plan_cost(model, robust.plan).iteration_time_s)
    assert choice.chosen.regret_max <= choice.nominal.regret_max
    assert len(choice.scenarios) == 1 + len(SCENARIOS)
    with pytest.raises(SpecError, match="objective"):
        get("galvatron").plan(model, cluster, budget, cm, {"objective": "p90"})
    with pytest.raises(SpecError, match="scenarios are for objective=robust"):
        get("galvatron").plan(model, cluster, budget, cm, {"scenarios": "bw-20%"})


def test_compare_robust_records_and_table(capsys):
    args = ["--model", "tiny-gpt", "--cluster", "cpu-4", "--global-batch", "8", "--no-progress", "--budget-gib", "4",
            "--planners", "galvatron,zero3", "--robust"]
    assert compare.main(args + ["--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    for r in records:
        assert r["regret_max"] is not None and r["robust_time_s"] >= r["iteration_time_s"] * (1 - 1e-9)
    assert compare.main(args) == 0
    out = capsys.readouterr().out
    assert "regret" in out and "worst ms" in out and "nominal model and its perturbation scenarios" in out
    assert compare.main(args[:-1] + ["--json"]) == 0
    assert all(r["regret_max"] is None for r in json.loads(capsys.readouterr().out))


def test_table_shows_the_nominal_plan_under_a_robust_one_that_differs():
    from runners.report import table
    rec = {"budget_gib": 80, "planner": "galvatron", "global_batch": 8, "feasible": True,
           "throughput_samples_per_s": 10.0, "seq_length": 128, "tokens_per_s_per_gpu": 1.0, "tflops_per_gpu": 1.0,
           "mfu": 0.5, "iteration_time_s": 0.8, "peak_memory_gib": 3.0, "search_time_s": 1.0, "plan_summary": "ROBUST",
           "calibration": "", "regret_max": 0.05, "robust_time_s": 1.0, "worst_scenario": "net-eff-0.6",
           "nominal_throughput_samples_per_s": 11.0, "nominal_iteration_time_s": 8 / 11, "nominal_regret_max": 0.3,
           "nominal_plan_summary": "NOMINAL"}
    lines = table([rec]).splitlines()
    robust = next(line for line in lines if line.rstrip().endswith("ROBUST"))
    nominal = next(line for line in lines if line.rstrip().endswith("NOMINAL"))
    assert "5.0% (net-eff-0.6)" in robust and "1000" in robust
    assert "galvatron nominal" in nominal and "30.0%" in nominal and " 11" in nominal


def test_coverage_names_what_no_measured_run_reaches():
    from cost_models.coverage import measured_zero3_ranks, uncovered
    from specs import uniform_plan
    reach = measured_zero3_ranks()
    assert reach >= 8  # data/published_runs has torchtitan's FSDP runs
    zero3 = uniform_plan(4, dp=2 * reach, dp_type="zero3", global_batch=4 * reach, micro_batches=2)
    assert uncovered(zero3, 2 * reach) == (f"ZeRO-3 over {2 * reach} ranks (published ZeRO-3 runs in data/ "
                                           f"reach {reach})",)
    assert uncovered(replace(zero3, layers=tuple(replace(s, dp=reach, tp=2) for s in zero3.layers)), reach) == ()
    ddp = uniform_plan(4, dp=256, global_batch=512, micro_batches=2)
    assert uncovered(ddp, 128) == ("a gradient sync over 256 ranks (measured runs in data/ reach 128)",)
    assert uncovered(ddp, 256) == ()


def test_auto_objective_is_robust_only_beyond_the_measured_regime():
    from cost_models.coverage import measured_zero3_ranks
    gpus = 2 * measured_zero3_ranks()  # twice the largest published ZeRO-3 group
    model, budget = load_model("tiny-gpt"), Budget(memory_gib=80, global_batch=gpus)
    big = load_cluster(f"dgx-a100-80g:{gpus // 8}")  # the zero3 baseline shards over all of them
    res = get("zero3").plan(model, big, budget, cost_models.get("analytical", big), {"objective": "auto"})
    assert res.stats.solver_status == "robust" and res.robust is not None
    assert f"robust objective: the nominal plan runs ZeRO-3 over {gpus} ranks" in res.message
    small = load_cluster("dgx-a100-80g:8")
    res = get("zero3").plan(model, small, budget, cost_models.get("analytical", small), {"objective": "auto"})
    assert res.robust is None and res.stats.solver_status == "exhaustive" and "robust" not in res.message
