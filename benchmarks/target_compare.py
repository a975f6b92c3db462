"""The best plan each framework can launch beside the unrestricted best (planners.targets), with
the exported files; and, with --from, an imported framework config predicted beside the better
plan hybridpar finds for the same framework, memory and global batch.

python -m benchmarks.target_compare --model llama3-70b --cluster dgx-h100:8 --out OUT
python -m benchmarks.target_compare --from torchtitan data/torchtitan_llama3_70b/llama3_70b.toml \
    --model llama3-70b --cluster dgx-a100-80g:8
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

import cost_models
import frameworks
from planners.base import Budget
from planners.targets import TARGETS, plan_for_target
from runners.compare_views import imported_vs_best
from specs import load_cluster, load_model
from specs.cli import ArgumentParser, count
from specs.errors import one_line_errors


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.target_compare", description=__doc__)
    p.add_argument("--model", default="llama3-70b")
    p.add_argument("--cluster", default="dgx-h100:8")
    p.add_argument("--budget-gib", type=float, help="memory per GPU (default: the cluster's GPU memory)")
    p.add_argument("--global-batch-range", type=count(1 << 20), nargs=2, default=(8, 512))
    p.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    p.add_argument("--from", dest="source", nargs=2, metavar=("TARGET", "FILE"),
                   help="an existing config of framework TARGET: predict it and search that framework at its batch")
    p.add_argument("--out", type=Path, help="folder for each target's exported files")
    return p


def _row(label: str, thr: float, time_s: float, peak_gib: float, summary: str, ref: float | None) -> str:
    rel = f"{thr / ref:6.1%}" if ref else "     -"
    return f"{label:<12} {thr:9.3f} {time_s:10.2f} {peak_gib:8.1f} {rel}  {summary}"


HEADER = f"{'target':<12} {'samples/s':>9} {'iter s':>10} {'peak GiB':>8} {'vs none':>6}  plan"


def compare_targets(args: Any) -> list[str]:
    model, cluster = load_model(args.model), load_cluster(args.cluster)
    cm = cost_models.get("analytical", cluster)
    budget = Budget(memory_gib=args.budget_gib or cluster.gpu.memory_gib,
                    global_batch_range=tuple(args.global_batch_range))
    results = {t: plan_for_target(t, model, cluster, budget, cm) for t in args.targets}
    ref = results["none"].throughput_samples_per_s if "none" in results else None
    lines = [f"{model.name} on {cluster.name} ({cluster.world_size} GPUs), {budget.memory_gib:g} GiB", HEADER]
    for t, r in results.items():
        if not r.feasible:
            lines.append(f"{t:<12} OOM ({r.message})")
            continue
        lines.append(_row(t, r.throughput_samples_per_s, r.iteration_time_s, r.peak_memory_gib, r.plan.summary(), ref))
        if args.out and t != "none":
            frameworks.get(t).export(r.plan, model, cluster).write(
                args.out / f"{cluster.name.partition(':')[0]}-{cluster.world_size}" / t)
    return lines


def compare_imported(args: Any) -> list[str]:
    target, path = args.source
    return imported_vs_best(target, Path(path), args.model, args.cluster, args.budget_gib, args.out)


@one_line_errors()
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    print("\n".join(compare_imported(args) if args.source else compare_targets(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
