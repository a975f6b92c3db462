"""Regenerate every figure and table: python -m analysis.figures [--quick] [--results DIR] [--out DIR].

Each figure first runs the experiments it needs (finished cells are skipped), then draws
from the results files only. PNG, PDF and the data drawn (CSV) per figure; tables as Markdown and CSV.
"""
from __future__ import annotations

import argparse
import io
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from analysis import plots
from analysis.experiments import EXACT_PLANNERS, finished, run_experiment
from analysis.results import ResultStore
from analysis.timeline import read_memory_csv, read_spans_csv


@dataclass(frozen=True, kw_only=True)
class FigureJob:
    """A group of figures/tables and the experiments they read."""

    name: str
    experiments: tuple[str, ...]
    draw: Callable[[Path, bool, Path], list[Path]]
    """(results dir, quick, out dir) -> files written."""


def save(fig, out: Path, name: str, data: pd.DataFrame | None = None) -> list[Path]:
    """``name``.png and ``name``.pdf under ``out``, and ``name``.csv: the numbers drawn."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for path in paths:
        # no creation date in the PDF: the same results give the same bytes
        fig.savefig(path, dpi=200 if path.suffix == ".png" else None, bbox_inches="tight",
                    metadata={"CreationDate": None} if path.suffix == ".pdf" else None)
    if data is not None:
        paths.append(out / f"{name}.csv")
        data.to_csv(paths[-1], index=False)
    return paths


def save_table(frame: pd.DataFrame, out: Path, name: str, title: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, csv = out / f"{name}.md", out / f"{name}.csv"
    flat = frame.reset_index() if frame.index.nlevels > 1 or frame.index.name else frame
    md.write_text(f"# {title}\n\n{flat.to_markdown(index=flat is frame)}\n")
    frame.to_csv(csv)
    return [md, csv]


def _need_rows(frame: pd.DataFrame, experiment: str) -> pd.DataFrame:
    if frame.empty:
        raise RuntimeError(f"no finished runs of {experiment!r} in this mode; run without --no-run")
    return frame


DETAIL_COLUMNS = ["cluster", "model", "budget_gib", "planner", "feasible", "planner_throughput",
                  "cost_model_throughput", "sim_throughput", "cost_model_peak_memory_gib", "sim_peak_memory_gib",
                  "sim_oom", "search_time_s", "plan_summary", "error"]


def draw_paper(results: Path, quick: bool, out: Path) -> list[Path]:
    frame = _need_rows(finished("paper_eval", results, quick), "paper_eval")
    paths = save(plots.throughput_vs_budget(frame), out, "paper_throughput_vs_budget",
                 plots.throughput_data(frame))
    paths += save(plots.throughput_vs_budget(frame, "cost_model_throughput",
                                             "cost-model throughput (samples/s)"),
                  out, "paper_throughput_vs_budget_cost_model", plots.throughput_data(frame, "cost_model_throughput"))
    paths += save_table(plots.paper_table(frame), out, "paper_table",
                        "Simulated throughput (samples/s) by planner; OOM = no feasible plan")
    details = frame[[c for c in DETAIL_COLUMNS if c in frame]].sort_values(["cluster", "model", "budget_gib"])
    paths += save_table(details.set_index(["cluster", "model", "budget_gib", "planner"]), out,
                        "paper_details", "Every planner's plan: predictions, memory, search time")
    return paths


def draw_search(results: Path, quick: bool, out: Path) -> list[Path]:
    frame = _need_rows(finished("search_scaling", results, quick), "search_scaling")
    drawn = frame[[c for c in ("planner", "layers", "gpus", "search_time_s", "solver_status") if c in frame]]
    return save(plots.search_time(frame), out, "search_time_scaling", drawn)


def draw_gap(results: Path, quick: bool, out: Path) -> list[Path]:
    frame = _need_rows(finished("optimality_gap", results, quick), "optimality_gap")
    gaps = plots.optimality_gaps(frame, EXACT_PLANNERS)
    if gaps.empty:
        raise RuntimeError(f"no exact planner ({', '.join(EXACT_PLANNERS)}) found a plan; no optimum to compare to")
    summary = gaps.groupby("planner").agg(problems=("gap_pct", "size"), feasible=("feasible", "sum"),
                                          mean_gap_pct=("gap_pct", "mean"), max_gap_pct=("gap_pct", "max"))
    return (save(plots.optimality_gap_figure(gaps), out, "optimality_gap", gaps)
            + save_table(summary, out, "optimality_gap_summary", "Gap to the exact optimum (cost-model throughput, %)"))


def draw_modern(results: Path, quick: bool, out: Path) -> list[Path]:
    frame = _need_rows(finished("modern_clusters", results, quick), "modern_clusters")
    table = plots.paper_table(frame, "cost_model_throughput")
    drawn = frame[[c for c in ("model", "cluster", "budget_gib", "planner", "feasible", "cost_model_throughput")
                   if c in frame]]
    return (save(plots.relative_throughput(frame), out, "modern_clusters", drawn)
            + save_table(table, out, "modern_clusters_table", "Cost-model throughput (samples/s) on modern clusters"))


def draw_validation(results: Path, quick: bool, out: Path) -> list[Path]:
    rows = _need_rows(finished("vtrain_validation", results, quick), "vtrain_validation")
    store = ResultStore(results)
    parts = []
    for cell in rows.to_dict("records"):
        text = store.read_run_file("vtrain_validation", cell["run_id"], "predictions.csv")
        parts.append(pd.read_csv(io.StringIO(text)).assign(dataset=cell["dataset"], predictor=cell["predictor"]))
    preds = pd.concat(parts, ignore_index=True)
    ok = preds[preds.predicted_s.notna()]
    ape = (ok.predicted_s - ok.measured_s).abs() / ok.measured_s * 100
    summary = ok.assign(ape=ape).groupby(["predictor", "dataset"]).agg(cases=("ape", "size"),
                                                                     mape_pct=("ape", "mean"))
    return (save(plots.predicted_vs_measured(preds), out, "validation_scatter", preds)
            + save_table(summary, out, "validation_mape", "Mean absolute percentage error vs vTrain measurements"))


def draw_picture(results: Path, quick: bool, out: Path) -> list[Path]:
    rows = _need_rows(finished("plan_picture", results, quick), "plan_picture")
    cell = rows.iloc[0]
    store = ResultStore(results)
    read = lambda name: store.read_run_file("plan_picture", cell.run_id, name)  # noqa: E731
    plan = plots.load_plan(read("plan.json"))
    intervals, memory = read_spans_csv(read("spans.csv")), read_memory_csv(read("memory.csv"))
    title = (f"{cell.planner} plan for {cell.model} on {cell.cluster} at {cell.budget_gib} GiB: "
             f"simulated {cell.sim_throughput:.1f} samples/s")
    figure = plots.plan_picture(plan, intervals, memory, title, float(cell.budget_gib))
    drawn = pd.concat([intervals.assign(table="timeline"), memory.assign(table="memory")], ignore_index=True)
    return save(figure, out, "plan_picture", drawn)


JOBS = [FigureJob(name="paper", experiments=("paper_eval",), draw=draw_paper),
        FigureJob(name="search", experiments=("search_scaling",), draw=draw_search),
        FigureJob(name="gap", experiments=("optimality_gap",), draw=draw_gap),
        FigureJob(name="modern", experiments=("modern_clusters",), draw=draw_modern),
        FigureJob(name="validation", experiments=("vtrain_validation",), draw=draw_validation),
        FigureJob(name="picture", experiments=("plan_picture",), draw=draw_picture)]


def run_job(job: FigureJob, args: argparse.Namespace) -> list[Path]:
    if not args.no_run:
        for name in job.experiments:
            start = time.perf_counter()
            report = run_experiment(name, args.results, quick=args.quick, progress=not args.no_progress,
                                    workers=args.workers, ray_address=args.ray)
            print(f"{name}: {report.ran} run, {report.skipped} already done "
                  f"({time.perf_counter() - start:.1f} s)", flush=True)
    for name in job.experiments:
        errors = error_rows(finished(name, args.results, args.quick))
        if len(errors):
            print(f"note: {name}: {len(errors)} run(s) recorded an error (retried next time), e.g. "
                  f"{errors.iloc[0].error}", file=sys.stderr)
    return job.draw(Path(args.results), args.quick, Path(args.out))


def error_rows(table: pd.DataFrame) -> pd.DataFrame:
    if table.empty or "error" not in table:
        return table.iloc[0:0]
    return table[table.error.fillna("").astype(str) != ""]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = ", ".join(j.name for j in JOBS)
    parser = argparse.ArgumentParser(prog="python -m analysis.figures", description="Run the experiments each figure needs (finished runs are "
                                     "skipped), then draw every figure and table from the result files.",
                                     epilog=f"Figure groups: {names}. Exit status 0, 1 if a group failed, "
                                            "2 for bad arguments.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sweeps (a few minutes)")
    parser.add_argument("--results", default="results", metavar="DIR", help="results folder the experiments write and figures read")
    parser.add_argument("--out", default="figures", metavar="DIR", help="folder for the figures (PNG, PDF, CSV) and tables (MD, CSV)")
    parser.add_argument("--only", nargs="+", metavar="NAME", default="all",
                        help=f"figure groups to draw, some of: {names} (default: %(default)s)")
    parser.add_argument("--no-run", action="store_true", help="draw from existing results only (run no experiment)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--workers", type=_positive, default=1, metavar="N",
                        help="experiment cells run at once in a local process pool (the result files are "
                             "the same as with 1); with --ray local, the CPUs of the Ray instance")
    parser.add_argument("--ray", metavar="ADDRESS", help="run the experiment cells as Ray tasks on this cluster "
                        "('auto', 'ray://host:10001'; 'local' starts one here); needs pip install -e '.[ray]'")
    return parser.parse_args(argv)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [j.name for j in JOBS]
    chosen = names if args.only == "all" else args.only
    unknown = [n for n in chosen if n not in names]
    if unknown:
        print(f"error: --only: unknown {', '.join(unknown)}; choose from {', '.join(names)}", file=sys.stderr)
        return 2
    failed = []
    for job in JOBS:
        if job.name not in chosen:
            continue
        try:
            for path in run_job(job, args):
                print(f"wrote {path}")
        except (ImportError, RuntimeError, ValueError, FileNotFoundError) as err:
            failed.append(job.name)
            print(f"error: figure {job.name!r}: {err}", file=sys.stderr)
    if failed:
        print(f"error: {len(failed)} figure group(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
