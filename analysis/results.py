"""Result files: one folder per run (inputs, command, metrics) and one results table per root.

The table is JSON lines (``results.jsonl``, one row per finished run, read by pandas); a run
is done when its row is in the table without an ``error`` (failed runs are retried, and the
newest row of a run is the one that counts). Every write goes through a temporary file and
``os.replace``, so a crash leaves either the old file or the new one, never half of one.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from specs.files import atomic_write_text

TABLE_NAME = "results.jsonl"
RUNS_DIR = "runs"
LOCK_NAME = ".lock"


class StoreBusy(RuntimeError):
    """Another process holds the results folder's lock (and we were told not to wait)."""
SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """What one run of an experiment produced."""

    metrics: Mapping[str, Any]
    """Scalar results (numbers, strings, booleans, None): the table row and metrics.json."""
    inputs: Mapping[str, Any] = field(default_factory=dict)
    """Resolved inputs (model, cluster, plan, settings) as JSON-able data: inputs.json."""
    files: Mapping[str, str] = field(default_factory=dict)
    """Extra text files for the run folder by name (plan.json, timeline.csv, ...)."""

    def __post_init__(self) -> None:
        for name, value in self.metrics.items():
            if not isinstance(value, SCALARS):
                raise ValueError(f"metrics[{name!r}]: must be a number, string, bool or None, "
                                 f"got {type(value).__name__}")
        for name in self.files:
            if "/" in name or name in ("inputs.json", "metrics.json", "command.txt") or not name:
                raise ValueError(f"files: name {name!r} is reserved or not a plain file name")


def check_params(params: Mapping[str, Any]) -> None:
    """Cell parameters must be JSON scalars (they are the run's key and table columns)."""
    if not params:
        raise ValueError("params: a cell needs at least one parameter")
    for name, value in params.items():
        if not isinstance(value, SCALARS) or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"params[{name!r}]: must be a finite JSON scalar, got {value!r}")


def _explicit(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics for a row: a NaN or infinite one (JSON has none) becomes null, and the row
    says so in ``non_finite`` ({name: "inf" | "-inf" | "nan"}): never a silent null."""
    bad = {k: str(v) for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
    out = {k: (None if k in bad else v) for k, v in metrics.items()}
    return {**out, "non_finite": bad} if bad else out


def cell_key(experiment: str, params: Mapping[str, Any]) -> str:
    """Canonical identity of a run: the experiment and its sorted parameters."""
    check_params(params)
    return json.dumps({"experiment": experiment, **params}, sort_keys=True)


def run_id(experiment: str, params: Mapping[str, Any]) -> str:
    """Folder name: the parameter values in the cell's order plus a short hash of the key (unique)."""
    digest = hashlib.sha1(cell_key(experiment, params).encode()).hexdigest()[:10]
    readable = "_".join(str(v) for v in params.values())
    readable = re.sub(r"[^A-Za-z0-9.+-]+", "-", readable).strip("-")[:80]
    return f"{readable}_{digest}" if readable else digest


def plan_hash(plan_dict: Mapping[str, Any] | None) -> str:
    """Short content hash of a plan's JSON (same plan, same hash); '' for no plan."""
    if plan_dict is None:
        return ""
    text = json.dumps(plan_dict, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


class ResultStore:
    """A results root: ``runs/<experiment>/<run id>/`` folders and ``results.jsonl``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.table_path = self.root / TABLE_NAME
        self._done: set[str] | None = None

    # -- reading ------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """Every row of the table, in the order written."""
        if not self.table_path.exists():
            return []
        lines = self.table_path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def latest_rows(self) -> list[dict[str, Any]]:
        """One row per run: the last one written (a retried run replaces its failed row)."""
        latest = {r["key"]: r for r in self.rows()}
        return list(latest.values())

    def table(self, experiment: str | None = None) -> pd.DataFrame:
        """The results table, one row per run (optionally one experiment's), as a DataFrame."""
        rows = [r for r in self.latest_rows() if experiment is None or r["experiment"] == experiment]
        return pd.DataFrame.from_records(rows)

    def done_keys(self) -> set[str]:
        """Keys of finished runs; a run whose row carries an ``error`` is not done (retried)."""
        if self._done is None:
            self._done = {r["key"] for r in self.latest_rows() if not r.get("error")}
        return self._done

    def is_done(self, experiment: str, params: Mapping[str, Any]) -> bool:
        return cell_key(experiment, params) in self.done_keys()

    def run_dir(self, experiment: str, params: Mapping[str, Any]) -> Path:
        return self.root / RUNS_DIR / experiment / run_id(experiment, params)

    def read_file(self, experiment: str, params: Mapping[str, Any], name: str) -> str:
        """A file of a finished run's folder, the run given by its parameters."""
        key = cell_key(experiment, params)
        rows = [r for r in self.latest_rows() if r["key"] == key]
        return self.read_run_file(experiment, rows[0]["run_id"] if rows else run_id(experiment, params), name)

    def read_run_file(self, experiment: str, run: str, name: str) -> str:
        """A file of a finished run's folder, the run given by its id (the table's run_id)."""
        path = self.root / RUNS_DIR / experiment / run / name
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such result file (run the experiment {experiment!r} first)")
        return path.read_text(encoding="utf-8")

    # -- one writer at a time ------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, wait: bool = True):
        """Hold the folder's lock (flock on ``.lock``): a second sweep waits, or with
        wait=False raises StoreBusy. The kernel drops the lock if the holder dies."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LOCK_NAME, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = (self.root / LOCK_NAME).read_text().strip() or "?"
                if not wait:
                    raise StoreBusy(f"{self.root}: in use by another sweep (pid {holder})") from None
                print(f"{self.root}: waiting for the sweep of pid {holder} to finish", file=sys.stderr)
                fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
            self._done = None  # another process may have finished cells meanwhile
            try:
                yield self
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def clean(self) -> list[Path]:
        """Remove what a killed writer left (call while holding the lock): temporary files and
        folders, and run folders that no row of the table names. Returns what was removed."""
        removed = [p for p in self.root.rglob(".*.tmp")]
        named = {(r.get("experiment"), r.get("run_id")) for r in self.rows()}
        runs = self.root / RUNS_DIR
        if runs.is_dir():
            removed += [d for exp in runs.iterdir() if exp.is_dir() for d in exp.iterdir()
                        if d.is_dir() and not d.name.startswith(".") and (exp.name, d.name) not in named]
        for path in removed:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        return removed

    # -- writing ------------------------------------------------------------------------
    def write_run(self, experiment: str, params: Mapping[str, Any], record: RunRecord,
                  command: str = "") -> dict[str, Any]:
        """Write the run folder, then append its row; returns the row."""
        key = cell_key(experiment, params)
        row = {"experiment": experiment, **params, **_explicit(record.metrics),
               "run_id": run_id(experiment, params), "key": key,
               "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        self._write_folder(self.run_dir(experiment, params), params, record, command, row)
        self._append_row(row)
        if not row.get("error"):
            self.done_keys().add(key)
        return row

    def _write_folder(self, final: Path, params: Mapping[str, Any], record: RunRecord,
                      command: str, row: Mapping[str, Any]) -> None:
        # Build the folder under a temporary name and rename it: a directory rename is atomic.
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        inputs = {"params": dict(params), **record.inputs}
        (tmp / "inputs.json").write_text(json.dumps(inputs, indent=1, sort_keys=True, default=str))
        (tmp / "command.txt").write_text(command + "\n")
        (tmp / "metrics.json").write_text(json.dumps(dict(row), indent=1, sort_keys=True, allow_nan=False))
        for name, text in record.files.items():
            (tmp / name).write_text(text)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)

    def _append_row(self, row: Mapping[str, Any]) -> None:
        old = self.table_path.read_text(encoding="utf-8") if self.table_path.exists() else ""
        if old and not old.endswith("\n"):
            old += "\n"
        self.table_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.table_path, old + json.dumps(dict(row), sort_keys=True, allow_nan=False) + "\n")
