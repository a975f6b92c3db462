"""Every notebook runs top to bottom (quick settings) in CI; the quick start is stored with its
outputs (a reader sees them on the repository's page), the others without."""
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
WITH_OUTPUTS = {"quickstart"}
"""Notebooks stored executed (fast enough to re-run whenever they change)."""
TIMEOUT_S = 600
"""Per cell; a hung kernel fails the test instead of stalling CI."""


def test_there_are_notebooks():
    names = {p.stem for p in NOTEBOOKS}
    assert {"quickstart", "galvatron_eval", "validation"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_as_agreed(path):
    book = nbformat.read(path, as_version=4)
    nbformat.validate(book)
    for i, cell in enumerate(book.cells):
        if cell.cell_type != "code":
            continue
        if path.stem in WITH_OUTPUTS:  # executed in order, without errors
            assert cell.execution_count is not None, f"{path.name} cell {i} was not executed"
            assert all(o.output_type != "error" for o in cell.outputs), f"{path.name} cell {i} stored an error"
        else:
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} cell {i} has outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_with_quick_settings(path, tmp_path, monkeypatch, request):
    from nbclient import NotebookClient
    pytest.importorskip("ipykernel", reason="ipykernel provides the python3 kernel")
    if path.stem == "validation":
        request.getfixturevalue("vtrain_data")  # skips, naming the path, only if data/ lacks it
    monkeypatch.setenv("HYBRIDPAR_QUICK", "1")
    monkeypatch.setenv("HYBRIDPAR_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    book = nbformat.read(path, as_version=4)
    client = NotebookClient(book, timeout=TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
