"""The planners' plans for tiny-gpt and tiny-llama on the CPU "clusters" cpu-4 and cpu-8 run end
to end and match the one-process reference. Skipped with the reason while planners/ is not
importable."""
import subprocess
import sys
from pathlib import Path

import pytest

import cost_models
import specs
from executor.execution import CostPrediction
from executor.unsupported import refuse_unsupported
from specs import Plan

from executor.checks import check_runnable
from tests.executor.conftest import assert_matches_reference

planners = pytest.importorskip("planners", reason="planners package not importable yet")

REPO = Path(__file__).resolve().parents[2]


def _galvatron_plan(cluster: str, budget_gib: float, global_batch: int) -> Plan:
    model = specs.load_model("tiny-gpt")
    result = planners.plan("galvatron_classic", model, specs.load_cluster(cluster),
                           planners.Budget(memory_gib=budget_gib, global_batch=global_batch))
    assert result.feasible, f"galvatron found nothing for tiny-gpt on {cluster} at {budget_gib} GiB"
    return result.plan


@pytest.mark.parametrize("cluster,budget_gib,global_batch", [
    ("cpu-4", 1.005, 8),
    pytest.param("cpu-8", 1.005, 32, marks=pytest.mark.slow),
])
def test_galvatron_plans_run_and_match_the_reference(cluster, budget_gib, global_batch):
    """Tight budgets make galvatron (the classic space) mix ZeRO stages and checkpointing per layer."""
    plan = _galvatron_plan(cluster, budget_gib, global_batch)
    assert_matches_reference(plan, specs.load_model("tiny-gpt"), specs.load_cluster(cluster).world_size)


def _compare_plans(cluster: str, out: Path, extra: list[str]) -> list[Plan]:
    cmd = [sys.executable, "-m", "planners.compare", "--model", "tiny-gpt", "--cluster", cluster,
           "--out", str(out), "--no-progress", *extra]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    files = sorted((out / "plans").glob("*.json")) or sorted(out.glob("*.json"))
    plans = {}
    for f in files:
        try:
            plan = Plan.load(f)
        except specs.SpecError:
            continue  # results.json and other non-plan files
        plans.setdefault(plan.to_json(), plan)
    assert plans, f"planners.compare wrote no plan files under {out}"
    return list(plans.values())


FEW = ["--planners", "galvatron", "megatron_3d", "--budget-gib", "1.015"]
EVERY = ["--budget-gib", "1.015", "8"]


@pytest.mark.parametrize("cluster,extra", [
    ("cpu-4", FEW),
    pytest.param("cpu-4", EVERY, marks=pytest.mark.slow),
    pytest.param("cpu-8", EVERY, marks=pytest.mark.slow),
], ids=["cpu-4-few", "cpu-4-every", "cpu-8-every"])
def test_planners_compare_files_run_end_to_end(cluster, extra, tmp_path):
    """Every distinct plan file ``python -m planners.compare --out DIR`` writes runs with --check."""
    model = specs.load_model("tiny-gpt")
    world = specs.load_cluster(cluster).world_size
    for plan in _compare_plans(cluster, tmp_path, extra):
        try:
            refuse_unsupported(plan, model)
        except specs.SpecError as err:  # e.g. megatron_3d's interleaved plans: refused in one line
            assert "\n" not in str(err)
            continue
        assert_matches_reference(plan, model, world)


def _every_planners_plans(model_name: str, cluster: str) -> dict[str, Plan]:
    """Distinct plans of every registered planner (summary -> plan), at a budget tight enough
    that they differ (tiny models: 1.015 GiB is 15 MiB above the runtime overhead)."""
    model, spec = specs.load_model(model_name), specs.load_cluster(cluster)
    plans: dict[str, Plan] = {}
    for name in planners.available():
        result = planners.plan(name, model, spec, planners.Budget(memory_gib=1.015, global_batch=8))
        if result.feasible:
            plans.setdefault(result.plan.summary(), result.plan)
    return plans


def _executor_runs(model, plans: dict[str, Plan]) -> list[Plan]:
    """The plans the executor does not refuse for what it lacks (executor/unsupported.py: e.g.
    recomputation under a split backward); each refusal is one line."""
    kept = []
    for plan in plans.values():
        try:
            refuse_unsupported(plan, model)
        except specs.SpecError as err:
            assert "\n" not in str(err)
            continue
        kept.append(plan)
    return kept


@pytest.mark.parametrize("model_name", ["tiny-gpt", "tiny-llama"])
@pytest.mark.parametrize("cluster", ["cpu-4", "cpu-8"])
def test_every_planners_plan_is_runnable(model_name, cluster):
    """No planner produces a plan the executor cannot mean to run (tp splitting kv heads, MLP
    width...); what it lacks is refused in one line."""
    model = specs.load_model(model_name)
    plans = _every_planners_plans(model_name, cluster)
    assert len(plans) >= 4
    runs = _executor_runs(model, plans)
    assert len(runs) >= 3
    for plan in runs:
        check_runnable(model, plan, specs.load_cluster(cluster).world_size)


@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["tiny-gpt", "tiny-llama"])
def test_every_planners_plan_runs_with_check_on_cpu_4(model_name):
    """Each plan matches the reference, held to every collective the cost model charges."""
    model = specs.load_model(model_name)
    for plan in _executor_runs(model, _every_planners_plans(model_name, "cpu-4")):
        assert_matches_reference(plan, model, 4, prediction=_charged(model, plan, 4))


def _charged(model, plan, world_size: int) -> CostPrediction:
    """The cost model's collectives for ``plan`` as the executor runs them."""
    return CostPrediction(collectives=tuple(cost_models.expected_collectives(model, plan, world_size)))


def test_mixed_planner_plans_run_with_check_on_cpu_4():
    """The default run's share of the slow test above: the planners' per-layer mixes."""
    gpt = _every_planners_plans("tiny-gpt", "cpu-4")
    mixes = [p for p in gpt.values() if len({(s.tp, s.dp_type, s.checkpoint) for s in p.layers}) > 1]
    assert mixes
    model = specs.load_model("tiny-gpt")
    for plan in mixes:
        assert_matches_reference(plan, model, 4, prediction=_charged(model, plan, 4))
