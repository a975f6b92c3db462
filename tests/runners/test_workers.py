"""compare --workers N: the cells run in a local process pool and give the serial run's records."""
from __future__ import annotations

import json

import pytest

from runners import compare
from runners.cells import Grid
from specs import SpecError

GRID = ["--model", "tiny-gpt", "--cluster", "cpu-4", "--global-batch", "8", "--no-progress", "--json",
        "--budget-gib", "1", "2", "4", "--planners", "ddp", "zero3", "megatron_3d", "galvatron"]


def _records(capsys, workers: int, extra: tuple[str, ...] = ()) -> list[dict]:
    assert compare.main(GRID + ["--workers", str(workers), *extra]) == 0
    out = json.loads(capsys.readouterr().out)
    for r in out:  # wall time and work done may differ (a process reuses the tables and bounds
        r.pop("search_time_s")  # of the cells it ran before); plans, figures, status and gap may not
        r.pop("states_explored")
    return out


def test_two_workers_give_the_serial_table(capsys, tmp_path):
    serial = _records(capsys, 1)
    assert len(serial) == 12 and any(r["feasible"] for r in serial)
    assert _records(capsys, 2) == serial
    assert compare.main(GRID + ["--workers", "2", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "plans").iterdir())  # plans written by the workers


@pytest.mark.parametrize("bad", [0, -2, True])
def test_bad_worker_counts_are_refused(bad):
    with pytest.raises(SpecError, match="workers"):
        Grid(budgets=(), workers=bad)


def test_ray_tasks_give_the_serial_table(capsys):
    """--ray local: a Ray instance started by the test runs every cell; same records as serial."""
    ray = pytest.importorskip("ray")
    serial = _records(capsys, 1)
    try:
        assert _records(capsys, 2, ("--ray", "local")) == serial
    finally:
        ray.shutdown()


def test_ray_without_ray_installed_is_one_line(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(SpecError, match=r"ray: --ray auto: Ray is not installed"):
        Grid(budgets=(), ray_address="auto")


def test_a_cells_work_does_not_depend_on_the_cells_run_before_it():
    """states_explored differed with --workers 2: the bounds one search computed were kept for
    the next search in the same process (their work then went uncounted)."""
    from runners.cells import Grid, default_budget, forget_contexts, run_cell
    budgets = (default_budget(2, (8, 8)), default_budget(4, (8, 8)))
    grid = Grid(model="tiny-gpt", cluster="cpu-4", budgets=budgets, planners=("galvatron_dp_tp",), progress=False)
    forget_contexts()
    alone = run_cell(grid, budgets[1], "galvatron_dp_tp")["states_explored"]
    forget_contexts()
    run_cell(grid, budgets[0], "galvatron_dp_tp")
    assert run_cell(grid, budgets[1], "galvatron_dp_tp")["states_explored"] == alone
