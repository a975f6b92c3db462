"""Sweep runner: run an experiment function over its cells, skipping finished ones.

A crash mid-sweep loses at most the cell that was running: every finished cell already
has its folder and its row, so running the same sweep again resumes after it.
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from tqdm.auto import tqdm

from analysis.results import ResultStore, RunRecord, cell_key
from runners.cells import check_ray, ray_map
from specs.processes import completed, worker_pool


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    """What one call of run_sweep did."""

    experiment: str
    total: int
    """Cells in the sweep."""
    skipped: int
    """Cells already done before this call."""
    ran: int
    """Cells run by this call."""


def default_command() -> str:
    """The command line of this process, for the run folders' command.txt."""
    return " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])


def check_cells(experiment: str, cells: Sequence[Mapping[str, Any]]) -> None:
    """Every cell valid and no two cells the same run."""
    seen: set[str] = set()
    for i, params in enumerate(cells):
        key = cell_key(experiment, params)
        if key in seen:
            raise ValueError(f"cells[{i}]: duplicate cell {dict(params)} in experiment {experiment!r}")
        seen.add(key)


def run_sweep(store: ResultStore, experiment: str, cells: Sequence[Mapping[str, Any]],
              fn: Callable[..., RunRecord], *, command: str | None = None,
              progress: bool = True, wait: bool = True, workers: int = 1,
              ray_address: str | None = None) -> SweepReport:
    """Call ``fn(**params)`` for every cell not yet in ``store`` and record each result.

    One sweep per results folder at a time: a second one waits for the lock (or, with
    wait=False, raises StoreBusy), then skips what the first finished. What a killed sweep
    left half-written is removed first. ``workers`` > 1 runs the cells in a local process pool
    (``fn`` must pickle: a module-level function; the workers die with this process); this
    process writes the records in the cells' order (a record waits for those before it), so the
    store holds the same rows in the same order as after a serial run, and a failing cell stops
    the sweep with every record before it kept. ``ray_address`` runs each cell as a Ray task on that
    cluster instead ('auto', 'ray://host:10001', ...; 'local' starts a Ray instance here with
    ``workers`` CPUs), recorded the same way; it needs the optional extra ``.[ray]`` and
    hybridpar (and ``fn``'s module) importable on every node."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: must be a positive integer, got {workers!r}")
    check_ray(ray_address)
    check_cells(experiment, cells)
    with store.lock(wait=wait):
        store.clean()
        return _run_locked(store, experiment, cells, fn, command, progress, workers, ray_address)


def _run_locked(store: ResultStore, experiment: str, cells: Sequence[Mapping[str, Any]],
                fn: Callable[..., RunRecord], command: str | None, progress: bool, workers: int,
                ray_address: str | None) -> SweepReport:
    todo = [c for c in cells if not store.is_done(experiment, c)]
    command = default_command() if command is None else command
    skipped = len(cells) - len(todo)
    with tqdm(total=len(cells), initial=skipped, desc=experiment, unit="run",
              disable=not progress, leave=False) as bar:
        def record(params: Mapping[str, Any], result: Any) -> None:
            if not isinstance(result, RunRecord):
                raise TypeError(f"experiment {experiment!r} returned {type(result).__name__}, not a RunRecord")
            store.write_run(experiment, params, result, command)
            bar.set_postfix_str(_short(params), refresh=False)
            bar.update(1)

        finished = _in_order(lambda i, result: record(todo[i], result))
        if ray_address is not None:
            ray_map(fn, todo, ray_address, workers, finished)
        elif workers == 1:
            for params in todo:
                record(params, fn(**params))
        else:
            with worker_pool(workers) as pool:
                futures = {pool.submit(fn, **params): i for i, params in enumerate(todo)}
                try:
                    for i, result in completed(futures):
                        finished(i, result)
                except BaseException:
                    pool.shutdown(cancel_futures=True)
                    raise
    return SweepReport(experiment=experiment, total=len(cells), skipped=skipped, ran=len(todo))


def _in_order(record: Callable[[int, Any], None]) -> Callable[[int, Any], None]:
    """``record`` called in index order whatever order the results come in: result i waits
    for results 0..i-1, so the store's rows come in the cells' order, as after a serial run."""
    ready: dict[int, Any] = {}
    next_index = [0]

    def finished(i: int, result: Any) -> None:
        ready[i] = result
        while next_index[0] in ready:
            record(next_index[0], ready.pop(next_index[0]))
            next_index[0] += 1
    return finished


def _short(params: Mapping[str, Any]) -> str:
    return " ".join(str(v) for v in params.values())[:60]
