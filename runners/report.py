"""The compare results as a text table, and as files: one Plan JSON per feasible cell plus
results.csv / results.json, each written atomically."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from planners.base import Budget, PlanResult
from runners.records import COLUMNS
from specs.cli import dumps, finite
from specs.files import atomic_write_text


def table(records: list[dict[str, Any]], evaluator: str | None = None) -> str:
    """One row per cell; the plan summary last (it is long), the evaluator's throughput beside
    the cost model's when ``evaluator`` re-scored the plans."""
    from tabulate import tabulate
    head = ["GiB", "planner", "batch", "samples/s"] + ([f"{evaluator} samples/s"] if evaluator else []) + \
        ["iter ms", "peak GiB", "search s", "tie", "plan"]
    text = tabulate([_row(r, evaluator) for r in records], headers=head, tablefmt="simple")
    statuses = sorted({r["calibration"] for r in records if r.get("calibration")})
    return "\n".join([f"cost model constants: {s}" for s in statuses] + [text])


def _row(r: dict[str, Any], evaluator: str | None) -> list:
    ok = r["feasible"]
    extra = []
    if evaluator:
        value = r[f"{evaluator}_throughput_samples_per_s"]
        extra = [f"{value:.2f}" if value else ""]
    return ([f"{r['budget_gib']:g}", r["planner"], r["global_batch"] or "",
             f"{r['throughput_samples_per_s']:.2f}" if ok else "OOM"] + extra
            + [f"{r['iteration_time_s'] * 1e3:.1f}" if ok else "", f"{r['peak_memory_gib']:.2f}" if ok else "",
               f"{r['search_time_s']:.2f}", "~" if r.get("tie") else "", r["plan_summary"]])


def save_plan(out: Path, name: str, budget: Budget, result: PlanResult) -> str:
    """``out/plans/<planner>_<GiB>gib.json``; its path relative to ``out``, for the record's
    plan_file (so that the results files do not depend on where ``out`` is)."""
    folder = out / "plans"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}_{budget.memory_gib:g}gib.json"
    result.plan.save(path)
    return str(path.relative_to(out))


def write_tables(out: Path, records: list[dict[str, Any]]) -> None:
    """``out/results.csv`` and ``out/results.json``."""
    out.mkdir(parents=True, exist_ok=True)
    columns = list(COLUMNS) + [k for k in (records[0] if records else {}) if k not in COLUMNS]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(finite(records))
    atomic_write_text(out / "results.csv", buf.getvalue())
    atomic_write_text(out / "results.json", dumps(records, indent=1) + "\n")
