"""Experiments on real planners, cost models and the simulator (tiny problems), and the CLI."""
import dataclasses
import json

import pandas as pd
import pytest

from analysis import experiments, figures
from analysis.results import ResultStore, plan_hash
from specs import Plan, load_cluster, load_model

TINY = {"model": "bert-huge-32", "cluster": "titan-8", "layers": 4, "global_batch": 16}


def test_plan_cell_predictions_agree_with_the_plan_it_writes():
    record = experiments.plan_cell(budget_gib=8, planner="galvatron", **TINY)
    m = record.metrics
    assert m["feasible"] and m["error"] == ""
    # The planner scores its plan with the same analytical cost model the cell re-evaluates.
    assert m["planner_throughput"] == pytest.approx(m["cost_model_throughput"], rel=1e-9)
    assert m["cost_model_peak_memory_gib"] <= 8 and m["sim_throughput"] > 0
    plan_dict = json.loads(record.files["plan.json"])
    assert plan_hash(plan_dict) == m["plan_hash"] and m["global_batch"] == 16
    model = load_model("bert-huge-32").scaled(num_layers=4)
    Plan.from_dict(plan_dict).validate(model, load_cluster("titan-8"))
    assert record.inputs["model"]["name"] == "bert-huge-32-L4"


def test_plan_cell_records_an_infeasible_budget_without_a_plan():
    record = experiments.plan_cell(budget_gib=0.5, planner="ddp", **TINY)
    m = record.metrics
    assert m["feasible"] is False and "plan.json" not in record.files
    assert m["plan_hash"] == "" and m["min_memory_gib"] > 0.5


@pytest.mark.parametrize("name", list(experiments.EXPERIMENTS))
def test_cells_of_every_experiment_are_valid_and_quick_is_smaller(name, request):
    from analysis.sweep import check_cells
    if name == "vtrain_validation":
        request.getfixturevalue("vtrain_data")  # its cells are slices of the measured runs
    exp = experiments.EXPERIMENTS[name]
    quick, full = exp.cells(True), exp.cells(False)
    check_cells(name, quick)
    check_cells(name, full)
    assert 0 < len(quick) <= len(full), name


def test_cli_runs_the_sweep_then_draws_and_a_rerun_only_draws(tmp_path, monkeypatch, capsys):
    cells = [{"planner": p, "budget_gib": b, **TINY} for p in ("ddp", "galvatron") for b in (0.5, 8)]
    exp = experiments.EXPERIMENTS["paper_eval"]
    monkeypatch.setitem(experiments.EXPERIMENTS, "paper_eval", dataclasses.replace(exp, cells=lambda quick: cells))
    args = ["--quick", "--only", "paper", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "f"),
            "--no-progress"]
    assert figures.main(args) == 0
    out = capsys.readouterr().out
    assert "paper_eval: 4 run, 0 already done" in out
    for name in ("paper_throughput_vs_budget.png", "paper_throughput_vs_budget.pdf", "paper_table.md"):
        assert (tmp_path / "f" / name).stat().st_size > 0
    drawn = pd.read_csv(tmp_path / "f" / "paper_throughput_vs_budget.csv")  # the figure's numbers beside it
    assert len(drawn) == 4 and drawn.sim_throughput.isna().sum() == 2  # 0.5 GiB: no plan, no point
    table = (tmp_path / "f" / "paper_table.md").read_text()
    assert "OOM" in table  # 0.5 GiB fits nothing
    assert len(ResultStore(tmp_path / "r").table("paper_eval")) == 4
    assert figures.main(args) == 0
    assert "paper_eval: 0 run, 4 already done" in capsys.readouterr().out


def test_cli_rejects_an_unknown_figure_in_one_line(capsys):
    assert figures.main(["--only", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --only: unknown nope") and "\n" not in err


def test_cli_ray_without_ray_installed_is_one_line(tmp_path, monkeypatch, capsys):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert figures.main(["--quick", "--only", "picture", "--results", str(tmp_path), "--no-progress",
                         "--ray", "local"]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert first == "error: figure 'picture': ray: --ray local: Ray is not installed (pip install -e '.[ray]')"


def test_vtrain_cell_keeps_every_case_and_its_mape_matches_the_predictions(vtrain_data):
    import io

    from analysis.vtrain_validation import vtrain_cell
    record = vtrain_cell(dataset="single", predictor="analytical", stride=240, chunk=0)
    frame = pd.read_csv(io.StringIO(record.files["predictions.csv"]))
    m = record.metrics
    assert len(frame) == m["cases"] == 6 and m["predicted"] + m["rejected"] == 6
    ok = frame[frame.predicted_s.notna()]
    assert m["mape"] == pytest.approx(100 * ((ok.predicted_s - ok.measured_s).abs() / ok.measured_s).mean())
    assert (ok.measured_s > 0).all() and m["error"] == ""
