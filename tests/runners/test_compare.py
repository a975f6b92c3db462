"""``python -m planners.compare``: table, JSON records, files, errors."""
from __future__ import annotations

import json

import pytest

from runners import compare
from planners.registry import available

FAST = ["--model", "tiny-gpt", "--cluster", "cpu-4", "--global-batch", "8", "--no-progress"]


def test_json_records_have_the_agreed_fields(capsys):
    code = compare.main(FAST + ["--budget-gib", "0.05", "4", "--planners", "ddp,zero3", "galvatron", "--json"])
    assert code == 0
    records = json.loads(capsys.readouterr().out)
    assert len(records) == 6
    need = {"planner", "model", "cluster", "budget_gib", "feasible", "throughput_samples_per_s",
            "iteration_time_s", "peak_memory_gib", "search_time_s", "plan_summary"}
    for r in records:
        assert need <= set(r)
    tight = [r for r in records if r["budget_gib"] == 0.05]
    assert all(not r["feasible"] and r["plan_summary"].startswith("OOM (needs") for r in tight)
    roomy = {r["planner"]: r for r in records if r["budget_gib"] == 4}
    assert roomy["galvatron"]["feasible"]
    assert roomy["galvatron"]["throughput_samples_per_s"] >= max(r["throughput_samples_per_s"] for r in roomy.values())
    # cpu-4 has no calibration file: every record (and the table's head line) says so
    assert {r["calibration"] for r in records} == {"defaults: public-figure constants, uncalibrated on CPU"}
    assert compare.main(FAST + ["--budget-gib", "4", "--planners", "ddp"]) == 0
    assert capsys.readouterr().out.startswith("cost model constants: defaults: public-figure constants, uncalibrated")


def test_out_writes_plans_and_tables(tmp_path, capsys):
    code = compare.main(FAST + ["--budget-gib", "4", "--planners", "zero3", "galvatron", "--out", str(tmp_path)])
    assert code == 0
    assert "galvatron" in capsys.readouterr().out
    plans = sorted(p.name for p in (tmp_path / "plans").glob("*.json"))
    assert plans == ["galvatron_4gib.json", "zero3_4gib.json"]
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [r["planner"] for r in rows] == ["zero3", "galvatron"]
    assert (tmp_path / "results.csv").read_text().startswith("planner,model,cluster,budget_gib")
    from specs import Plan
    assert Plan.load(tmp_path / "plans" / "galvatron_4gib.json").summary() == rows[1]["plan_summary"]
    assert not list(tmp_path.rglob("*.tmp"))


def _without_batch(argv: list[str]) -> list[str]:
    i = argv.index("--global-batch")
    return argv[:i] + argv[i + 2:]


@pytest.mark.parametrize("argv, text", [
    (["--planners", "nope"], "planners: unknown 'nope'"),
    (["--model", "no-such-model"], "model:"),
    (["--budget-gib", "-3"], "--budget-gib: must be in (0, 1e+06], got -3"),
    (["--budget-gib", "nan"], "--budget-gib: expected a finite decimal number"),
    (["--planners", ","], "planners: no planner named"),
    (["--global-batch", "8", "--global-batch-range", "8", "16"], "not allowed with argument --global-batch"),
    (["--global-batch", "٣"], "--global-batch: expected an integer in ASCII digits"),
    (["--global-batch-range", "64", "8"], "global-batch-range: LO(64) > HI(8)"),
    (["--out", "/dev/null/x"], "--out: cannot create folder /dev/null/x"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, text):
    fast = FAST if "--global-batch-range" not in argv else _without_batch(FAST)
    assert compare.main(fast + argv) == 2
    err = capsys.readouterr().err.strip()
    assert text in err and "\n" not in err and "Traceback" not in err


def test_every_registered_planner_runs_on_a_tiny_case():
    import planners
    from specs import load_cluster, load_model
    model, cluster = load_model("tiny-gpt"), load_cluster("cpu-4")
    budget = planners.Budget(memory_gib=4, global_batch=8)
    for name in available():
        res = planners.plan(name, model, cluster, budget, time_limit_s=20) if name in ("ilp", "cpsat") \
            else planners.plan(name, model, cluster, budget)
        assert res.planner == name
        assert res.feasible, name
        res.plan.validate(model, cluster)
        assert res.peak_memory_gib <= 4


def test_evaluate_sim_fills_the_sim_columns(capsys):
    pytest.importorskip("simulator")
    code = compare.main(FAST + ["--budget-gib", "4", "--planners", "galvatron", "--json", "--evaluate", "sim"])
    assert code == 0
    rec = json.loads(capsys.readouterr().out)[0]
    assert rec["sim_iteration_time_s"] > 0 and rec["sim_throughput_samples_per_s"] > 0


def test_json_stdout_stays_parseable_when_highs_runs():
    """HiGHS prints a banner on fd 1; compare --json must still print only JSON there."""
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "planners.compare", *FAST, "--budget-gib", "4", "--planners", "ilp", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    records = json.loads(done.stdout)
    assert records[0]["planner"] == "ilp" and records[0]["feasible"]


def test_profiled_cost_model_on_galvatrons_files(capsys, galvatron_dir):
    """--cost-model profiled --galvatron-dir: plans on exactly Galvatron's search inputs."""
    folder = galvatron_dir
    code = compare.main(["--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--cost-model", "profiled",
                         "--galvatron-dir", str(folder), "--budget-gib", "40", "--global-batch", "64",
                         "--planners", "megatron_3d", "--json", "--no-progress"])
    assert code == 0
    (rec,) = json.loads(capsys.readouterr().out)
    assert rec["feasible"] and rec["peak_memory_gib"] <= 40


def test_profile_options_need_the_profiled_cost_model(capsys):
    assert compare.main(FAST + ["--profile", "p.json"]) == 2
    assert "--profile/--galvatron-dir need --cost-model profiled" in capsys.readouterr().err


def test_plans_within_the_model_error_of_the_best_are_marked_ties():
    from runners.records import mark_ties
    rows = [{"feasible": True, "budget_gib": 16, "throughput_samples_per_s": t} for t in (100.0, 96.0, 80.0)]
    rows.append({"feasible": False, "budget_gib": 16, "throughput_samples_per_s": 0.0})
    rows.append({"feasible": True, "budget_gib": 32, "throughput_samples_per_s": 50.0})
    mark_ties(rows, (-0.04, 0.02))  # 6% wide: 96 is 4% behind 100, 80 is 20% behind
    assert [r["tie"] for r in rows] == [False, True, False, False, False]
    mark_ties(rows, (0.0, 0.0))  # no error band known: nothing is a tie
    assert not any(r["tie"] for r in rows)


@pytest.mark.parametrize("name", ["megatron_3d", "gpipe", "zero2"])
def test_a_baseline_answers_each_budget_as_a_fresh_cost_model_does(name):
    """The grid a baseline scores is kept per cost model and shared by budgets: after a tight
    budget, a loose one (and back) gives what a fresh cost model gives, top plans included."""
    import cost_models
    import planners
    from specs import load_cluster, load_model
    model, cluster = load_model("bert-huge-32"), load_cluster("titan-8")
    shared = cost_models.get("analytical", cluster)
    for gib in (8, 20, 12):
        budget = planners.Budget(memory_gib=gib, global_batch_range=(8, 64))
        again = planners.get(name).plan(model, cluster, budget, shared)
        fresh = planners.get(name).plan(model, cluster, budget, cost_models.get("analytical", cluster))
        assert again.feasible == fresh.feasible and again.min_memory_gib == fresh.min_memory_gib, gib
        assert [r.plan for r in again.top_k] == [r.plan for r in fresh.top_k], gib
        assert again.stats.candidates == fresh.stats.candidates


def test_from_a_framework_config_predicts_it_beside_the_best_plan_of_that_framework(tmp_path, capsys):
    """`compare --from torchtitan FILE`: the config a user runs today, then the best torchtitan
    plan at its global batch; that search space holds the imported plan, so it is no slower."""
    import frameworks
    from specs import load_cluster, load_model, uniform_plan
    from dataclasses import replace
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    plan = uniform_plan(model.num_layers, tp=8, dp=1, global_batch=8, micro_batches=4, sp="megatron",
                        recompute="full", model=model.name, cluster=cluster.name)
    plan = replace(plan, vocab_tp=8, vocab_sp="megatron")
    frameworks.get("torchtitan").export(plan, model, cluster).write(tmp_path)
    assert compare.main(["--from", "torchtitan", str(tmp_path / "torchtitan.toml"), "--model", "llama3-8b",
                         "--cluster", "dgx-h100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    imported = next(line for line in lines if line.startswith("imported"))
    best = next(line for line in lines if line.startswith("best torchtitan"))
    assert "L0-31 tp8/dp1 ckpt sp" in imported
    assert float(best.split()[2]) >= float(imported.split()[1])
    assert lines[-1].startswith("speed-up ")


def test_from_needs_a_cluster(capsys):
    assert compare.main(["--from", "torchtitan", "x.toml", "--model", "llama3-8b"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --from: needs --cluster (and --model): the files name "
                                               "neither exactly")


def test_a_search_the_time_limit_stopped_before_any_plan_is_not_called_out_of_memory():
    """Its row says why there is no plan (the planner's one line), not "OOM"."""
    from planners.base import Budget, SearchStats, infeasible_result
    from runners.records import record
    from specs import load_cluster, load_model
    stopped = infeasible_result("galvatron", None, SearchStats(solver_status="time_limit"),
                                "time limit of 1 s reached while building cost tables (0 of 3 groups built)")
    row = record(stopped, "tiny-gpt", "cpu-2", Budget(memory_gib=8), load_model("tiny-gpt"), load_cluster("cpu-2"))
    assert row["plan_summary"] == "no plan: time limit of 1 s reached while building cost tables (0 of 3 groups built)"
