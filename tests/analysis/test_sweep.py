"""The results store and the sweep runner: atomic rows, skip done cells, resume after a kill,
one sweep per folder at a time, leftovers of a killed sweep cleaned."""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from analysis.results import ResultStore, RunRecord, StoreBusy, cell_key, plan_hash, run_id
from analysis.sweep import run_sweep

REPO = Path(__file__).resolve().parents[2]

CELLS = [{"model": m, "budget_gib": b, "planner": p}
         for m in ("a", "b") for b in (8, 16) for p in ("x", "y")]


def fake_experiment(model: str, budget_gib: int, planner: str) -> RunRecord:
    """Deterministic stand-in for a planner run."""
    throughput = budget_gib * (2 if planner == "y" else 1) + (0.5 if model == "b" else 0.0)
    return RunRecord(metrics={"throughput": throughput, "feasible": budget_gib > 8},
                     inputs={"model": {"name": model}}, files={"plan.json": json.dumps({"p": planner})})


SWEEP = textwrap.dedent("""
    import os, signal, sys, time
    from analysis.results import ResultStore
    from analysis.sweep import run_sweep
    from tests.analysis.test_sweep import CELLS, fake_experiment
    kill_at, delay = int(sys.argv[2]), float(sys.argv[3])
    calls = []
    def cell(**params):
        calls.append(1)
        if len(calls) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a real crash mid-sweep, no cleanup runs
        time.sleep(delay)
        return fake_experiment(**params)
    run_sweep(ResultStore(sys.argv[1]), "exp", CELLS, cell, progress=False)
""")


def _sweep_process(root, kill_at: int = 0, delay: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", SWEEP, str(root), str(kill_at), str(delay)], env=env,
                            cwd=REPO, stderr=subprocess.PIPE, text=True)


def stable(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=["finished_at"]).sort_values("key").reset_index(drop=True)


def test_resumed_sweep_gives_the_same_table_as_an_uninterrupted_one(tmp_path):
    whole = ResultStore(tmp_path / "whole")
    run_sweep(whole, "exp", CELLS, fake_experiment, progress=False)
    killed = _sweep_process(tmp_path / "broken", kill_at=4)
    assert killed.wait(timeout=120) == -signal.SIGKILL
    assert len(ResultStore(tmp_path / "broken").rows()) == 3
    report = run_sweep(ResultStore(tmp_path / "broken"), "exp", CELLS, fake_experiment, progress=False)
    assert (report.skipped, report.ran) == (3, len(CELLS) - 3)
    pd.testing.assert_frame_equal(stable(whole.table()), stable(ResultStore(tmp_path / "broken").table()))
    # Order of rows is the order of the cells, as in the uninterrupted run.
    assert list(whole.table()["key"]) == list(ResultStore(tmp_path / "broken").table()["key"])


def test_rerun_skips_everything_and_calls_nothing(tmp_path):
    store = ResultStore(tmp_path)
    run_sweep(store, "exp", CELLS, fake_experiment, progress=False)

    def must_not_run(**params):
        raise AssertionError(f"ran {params} again")

    report = run_sweep(ResultStore(tmp_path), "exp", CELLS, must_not_run, progress=False)
    assert (report.total, report.skipped, report.ran) == (len(CELLS), len(CELLS), 0)
    assert len(ResultStore(tmp_path).rows()) == len(CELLS)


def test_run_folder_holds_inputs_command_metrics_and_files(tmp_path):
    store = ResultStore(tmp_path)
    params = CELLS[3]
    run_sweep(store, "exp", [params], fake_experiment, command="python -m analysis.figures", progress=False)
    folder = store.run_dir("exp", params)
    assert json.loads((folder / "inputs.json").read_text())["params"] == params
    assert (folder / "command.txt").read_text().strip() == "python -m analysis.figures"
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["throughput"] == 32 and metrics["feasible"] is True
    assert json.loads(store.read_file("exp", params, "plan.json")) == {"p": "y"}
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_table_is_read_by_pandas_directly(tmp_path):
    store = ResultStore(tmp_path)
    run_sweep(store, "exp", CELLS, fake_experiment, progress=False)
    frame = pd.read_json(store.table_path, lines=True)
    assert len(frame) == len(CELLS)
    assert set(frame["planner"]) == {"x", "y"}
    assert frame.loc[(frame.model == "b") & (frame.budget_gib == 16) & (frame.planner == "y"),
                     "throughput"].item() == 32.5


def test_a_cell_whose_folder_exists_but_row_does_not_is_rerun(tmp_path):
    """A crash between writing the folder and appending the row: the cell runs again."""
    store = ResultStore(tmp_path)
    params = CELLS[0]
    store._write_folder(store.run_dir("exp", params), params, fake_experiment(**params), "", {})
    report = run_sweep(ResultStore(tmp_path), "exp", [params], fake_experiment, progress=False)
    assert report.ran == 1 and len(ResultStore(tmp_path).rows()) == 1


def test_bad_cells_and_records_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match=r"params\['budget_gib'\]"):
        cell_key("exp", {"budget_gib": [8]})
    with pytest.raises(ValueError, match=r"metrics\['plan'\]"):
        RunRecord(metrics={"plan": {"pp": 2}})
    with pytest.raises(ValueError, match="duplicate cell"):
        run_sweep(ResultStore("/nonexistent"), "exp", [CELLS[0], dict(CELLS[0])], fake_experiment)


def test_run_ids_and_plan_hashes_are_stable_and_distinct():
    assert run_id("exp", {"a": 1, "b": "x"}).split("_")[-1] == run_id("exp", {"b": "x", "a": 1}).split("_")[-1]
    assert run_id("exp", {"model": "bert", "budget_gib": 8}).startswith("bert-8_")
    assert run_id("exp", {"a": 1}) != run_id("exp", {"a": 2})
    assert plan_hash({"pp": 1, "layers": [1]}) == plan_hash({"layers": [1], "pp": 1})
    assert plan_hash({"pp": 1}) != plan_hash({"pp": 2}) and plan_hash(None) == ""


def test_a_run_that_recorded_an_error_is_retried_and_its_new_row_wins(tmp_path):
    calls = []

    def flaky(model, budget_gib, planner):
        calls.append(model)
        error = "" if len(calls) > 1 else "SpecError: calibration missing"
        return RunRecord(metrics={"throughput": float(len(calls)), "error": error})

    cell = [CELLS[0]]
    run_sweep(ResultStore(tmp_path), "exp", cell, flaky, progress=False)
    report = run_sweep(ResultStore(tmp_path), "exp", cell, flaky, progress=False)
    assert report.ran == 1
    table = ResultStore(tmp_path).table()
    assert len(table) == 1 and table.throughput.item() == 2.0 and table.error.item() == ""
    assert run_sweep(ResultStore(tmp_path), "exp", cell, flaky, progress=False).ran == 0


def test_two_simultaneous_sweeps_on_one_folder_run_each_cell_once(tmp_path):
    with ResultStore(tmp_path).lock():  # hold the folder until both sweeps are waiting for it
        sweeps = [_sweep_process(tmp_path, delay=0.05) for _ in range(2)]
        for proc in sweeps:
            assert "waiting for the sweep of pid" in proc.stderr.readline()
    assert [proc.wait(timeout=120) for proc in sweeps] == [0, 0]
    keys = [r["key"] for r in ResultStore(tmp_path).rows()]
    assert sorted(keys) == sorted(cell_key("exp", c) for c in CELLS)  # each cell once


def test_a_busy_folder_is_refused_in_one_line_when_told_not_to_wait(tmp_path):
    with ResultStore(tmp_path).lock():
        with pytest.raises(StoreBusy, match=f"in use by another sweep \\(pid {os.getpid()}\\)"):
            with ResultStore(tmp_path).lock(wait=False):
                pass


def test_leftovers_of_a_killed_sweep_are_removed_on_start(tmp_path):
    store = ResultStore(tmp_path)
    run_sweep(store, "exp", CELLS[:1], fake_experiment, progress=False)
    (tmp_path / ".results.jsonl.999.tmp").write_text("half a table")
    half = store.run_dir("exp", CELLS[1])
    (half.parent / f".{half.name}.999.tmp").mkdir(parents=True)
    half.mkdir()  # renamed into place, but the sweep died before appending its row
    kept = store.run_dir("exp", CELLS[0])
    report = run_sweep(ResultStore(tmp_path), "exp", CELLS[:1], fake_experiment, progress=False)
    assert report.ran == 0 and kept.is_dir() and not half.exists()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_non_finite_metrics_are_written_as_null_and_named(tmp_path):
    store = ResultStore(tmp_path)
    store.write_run("exp", CELLS[0], RunRecord(metrics={"throughput": float("inf"), "gap": float("nan")}))
    text = store.table_path.read_text()
    assert "Infinity" not in text and "NaN" not in text
    row = store.rows()[0]
    assert row["throughput"] is None and row["non_finite"] == {"throughput": "inf", "gap": "nan"}


def test_a_sweep_on_two_workers_gives_the_serial_table(tmp_path):
    serial, pooled = ResultStore(tmp_path / "serial"), ResultStore(tmp_path / "pooled")
    run_sweep(serial, "exp", CELLS, fake_experiment, progress=False)
    report = run_sweep(pooled, "exp", CELLS, fake_experiment, progress=False, workers=2)
    assert (report.ran, report.skipped) == (len(CELLS), 0)
    pd.testing.assert_frame_equal(stable(serial.table()), stable(pooled.table()))
    with pytest.raises(ValueError, match="workers"):
        run_sweep(pooled, "exp", CELLS, fake_experiment, workers=0)


def failing_on_b(model: str, budget_gib: int, planner: str) -> RunRecord:
    if model == "b":
        raise RuntimeError("cell b failed")
    return fake_experiment(model, budget_gib, planner)


def test_a_failing_cell_in_the_pool_keeps_what_finished(tmp_path):
    store = ResultStore(tmp_path)
    with pytest.raises(RuntimeError, match="cell b failed"):
        run_sweep(store, "exp", CELLS, failing_on_b, progress=False, workers=2)
    done = {row["key"] for row in store.rows()}
    assert done and done <= {cell_key("exp", c) for c in CELLS if c["model"] == "a"}
    report = run_sweep(store, "exp", CELLS, fake_experiment, progress=False)
    assert report.skipped == len(done) and report.ran == len(CELLS) - len(done)


@pytest.fixture(scope="module")
def ray_local():
    """Ray, shut down after the module's tests (the first sweep with ray_address='local' starts it)."""
    ray = pytest.importorskip("ray")
    yield ray
    ray.shutdown()


def test_a_sweep_of_ray_tasks_gives_the_serial_table_and_resumes(tmp_path, ray_local):
    serial, on_ray = ResultStore(tmp_path / "serial"), ResultStore(tmp_path / "ray")
    run_sweep(serial, "exp", CELLS, fake_experiment, progress=False)
    run_sweep(on_ray, "exp", CELLS[:3], fake_experiment, progress=False, workers=2, ray_address="local")
    assert ray_local.is_initialized()  # the cells ran as tasks of the local instance
    report = run_sweep(on_ray, "exp", CELLS, fake_experiment, progress=False, workers=2, ray_address="local")
    assert (report.skipped, report.ran) == (3, len(CELLS) - 3)
    pd.testing.assert_frame_equal(stable(serial.table()), stable(on_ray.table()))


def test_a_failing_ray_task_keeps_what_finished(tmp_path, ray_local):
    store = ResultStore(tmp_path)
    with pytest.raises(RuntimeError, match="cell b failed"):
        run_sweep(store, "exp", CELLS, failing_on_b, progress=False, workers=2, ray_address="local")
    done = {row["key"] for row in store.rows()}
    assert done <= {cell_key("exp", c) for c in CELLS if c["model"] == "a"}
    report = run_sweep(store, "exp", CELLS, fake_experiment, progress=False)
    assert report.skipped == len(done) and report.ran == len(CELLS) - len(done)


def test_ray_without_ray_installed_is_one_line(tmp_path, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ValueError, match=r"^ray: --ray local: Ray is not installed \(pip install -e '\.\[ray\]'\)$"):
        run_sweep(ResultStore(tmp_path), "exp", CELLS, fake_experiment, ray_address="local")
    assert not ResultStore(tmp_path).rows()
