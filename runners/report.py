"""The compare results as a text table, and as files: one Plan JSON per feasible cell plus
results.csv / results.json, each written atomically."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from planners.base import Budget, PlanResult
from runners.records import COLUMNS, MEMORY_NOTE
from specs.cli import dumps, finite
from specs.files import atomic_write_text
from specs.flops import FLOP_FORMULA


def table(records: list[dict[str, Any]], evaluator: str | None = None) -> str:
    """One row per cell; the plan summary last (it is long), the evaluator's throughput and peak
    memory beside the cost model's when ``evaluator`` re-scored the plans; the tie column only
    where the cost model's error band is known; notes under the table say what the figures count."""
    from tabulate import tabulate
    ties = any(r.get("tie") is not None for r in records)
    robust = any(r.get("regret_max") is not None for r in records)
    head = (["GiB", "planner", "batch", "samples/s"] + ([f"{evaluator} samples/s"] if evaluator else [])
            + ["seq", "tok/s/GPU", "TFLOP/s/GPU", "MFU", "iter ms", "peak GiB"]
            + ([f"{evaluator} peak GiB"] if evaluator else []) + ["search s"] + (["tie"] if ties else [])
            + (["regret", "worst ms"] if robust else []) + ["plan"])
    rows = []
    for r in records:
        rows.append(_row(r, evaluator, ties) if not robust else _row(r, evaluator, ties)[:-1] + _regret(r)
                    + [r["plan_summary"]])
        if robust and r.get("nominal_plan_summary"):  # the nominal objective's plan, beside the robust one
            rows.append(_nominal_row(r, len(head)))
    statuses = sorted({r["calibration"] for r in records if r.get("calibration")})
    stacks = sorted({r["stack"] for r in records if r.get("stack")})
    return "\n".join([f"cost model constants: {s}" for s in statuses] + [f"software stack: {s}" for s in stacks]
                     + [tabulate(rows, headers=head, tablefmt="simple"), *notes(records, evaluator, ties)])


def _regret(r: dict[str, Any]) -> list:
    if r.get("regret_max") is None:
        return ["", ""]
    worst = f" ({r['worst_scenario']})" if r.get("worst_scenario") else ""
    return [f"{r['regret_max']:.1%}{worst}", f"{r['robust_time_s'] * 1e3:.1f}"]


def _nominal_row(r: dict[str, Any], width: int) -> list:
    """The nominal plan under its robust record: samples/s, iteration time, regret, plan."""
    row = [""] * width
    batch = round(r["nominal_throughput_samples_per_s"] * r["nominal_iteration_time_s"])
    row[1], row[2] = f"{r['planner']} nominal", batch
    row[3] = f"{r['nominal_throughput_samples_per_s']:.2f}"
    row[-1], row[-3] = r["nominal_plan_summary"], f"{r['nominal_regret_max']:.1%}"
    return row


def notes(records: list[dict[str, Any]], evaluator: str | None, ties: bool) -> list[str]:
    """The lines under a table: the FLOP count, and what else a reader needs to compare rows."""
    lines = [f"FLOPs: {FLOP_FORMULA}"]
    if evaluator:
        lines.append("memory: " + MEMORY_NOTE.format(e=evaluator))
    if ties:
        lines.append("tie ~: within the cost model's 10th-90th percentile error of the budget's best")
    if any(r.get("regret_max") is not None for r in records):
        lines.append("regret: the plan's worst time per sample over the nominal model and its perturbation scenarios "
                     "(cost_models/scenarios.py) above the best plan this planner found for that scenario (its worst scenario in "
                     "brackets); worst ms: its iteration time there; a 'nominal' row: the nominal objective's plan")
    lines += [f"robust ({r['planner']}, {r['budget_gib']:g} GiB): the nominal plan runs {r['robust_reason']}"
              for r in records if r.get("robust_reason")]
    batches = {r["global_batch"] for r in records if r["feasible"]}
    if len(batches) > 1:
        lines.append(f"batch: planners chose global batches {min(batches)}..{max(batches)}; "
                     "--same-batch compares them at one")
    return lines


def _row(r: dict[str, Any], evaluator: str | None, ties: bool) -> list:
    ok = r["feasible"]
    extra, sim_peak = [], []
    if evaluator:
        value, peak = r[f"{evaluator}_throughput_samples_per_s"], r[f"{evaluator}_peak_memory_gib"]
        extra = [f"{value:.2f}" if value else ""]
        sim_peak = [(f"{peak:.2f}" + (" OOM" if r[f"{evaluator}_oom"] else "")) if peak is not None else ""]
    speed = ([f"{r['tokens_per_s_per_gpu']:.0f}", f"{r['tflops_per_gpu']:.1f}", f"{r['mfu']:.1%}"] if ok
             else ["", "", ""])
    return ([f"{r['budget_gib']:g}", r["planner"], r["global_batch"] or "",
             f"{r['throughput_samples_per_s']:.2f}" if ok else "OOM"] + extra + [r.get("seq_length", "")] + speed
            + [f"{r['iteration_time_s'] * 1e3:.1f}" if ok else "", f"{r['peak_memory_gib']:.2f}" if ok else ""]
            + sim_peak + [f"{r['search_time_s']:.2f}"] + (["~" if r.get("tie") else ""] if ties else [])
            + [r["plan_summary"]])


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
