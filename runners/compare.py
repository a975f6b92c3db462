"""hybridpar plan (or python -m planners.compare): planners x memory budgets on one model and
cluster, printed as a table, as JSON records (--json) or written as files (--out DIR: one Plan
JSON per feasible cell plus results.csv and results.json). --config FILE reads these flags from
a TOML file (flags given here win). --list shows what the names below can be."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

import cost_models
import frameworks
from cost_models.listing import cluster_lines
from cost_models.reserve import DEFAULT_RESERVE
from planners.base import Budget
from runners.cells import DEFAULT_BATCH_RANGE, DEFAULT_BUDGETS, DEFAULT_PLANNERS, Grid, default_budget, run
from runners.compare_views import (budget_line, check_precision, gpu_budget_gib, imported_vs_best, model_lines,
                                   same_batch, option_for_all, write_report)
from runners.evaluators import EVALUATORS
from planners.registry import CLUSTER_PLANNERS, available
from planners.robust import OBJECTIVES
from runners.report import table
from specs import SpecError
from specs.cli import ArgumentParser, count, dumps, number, output_dir, output_file, parse_with_config
from specs.model import ATTENTION_KINDS
from specs.stack import STACKS
from specs.errors import one_line_errors
from specs.processes import WorkerDied
from specs.limits import MAX_GLOBAL_BATCH

__all__ = ["DEFAULT_BUDGETS", "DEFAULT_PLANNERS", "default_budget", "main", "parse_options"]
LISTINGS = {"models": model_lines, "clusters": cluster_lines, "planners": available,
            "cost-models": cost_models.available, "evaluators": EVALUATORS.available,
            "frameworks": frameworks.available}
"""What --list can print."""


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m planners.compare", description=__doc__)
    p.add_argument("--config", type=Path, metavar="FILE", help="a TOML file of these flags: keys are the flags' "
                   "names (budget_gib = [80], [option] galvatron.time_limit_s = 60); flags given here win")
    p.add_argument("--list", choices=sorted(LISTINGS), help="print the zoo's models or clusters, or the "
                   "registered planners, cost models, evaluators or frameworks, one a line, and exit")
    p.add_argument("--model", default="bert-huge-32", help="zoo model name or a config.json path")
    p.add_argument("--cluster", help="zoo cluster name (name:nodes) or a cluster file (default: titan-8, "
                   "the paper's comparison)")
    p.add_argument("--budget-gib", type=number(0.0, 1e6), nargs="+",
                   help="memory budgets per GPU, GiB (default: the GPU's memory with --cluster, the paper's "
                   f"{' '.join(f'{b:g}' for b in DEFAULT_BUDGETS)} without; the allocator reserve is kept out: "
                   "--reserve-gib)")
    p.add_argument("--seq-length", type=count(1 << 24), help="train at this sequence length (default: the model's)")
    p.add_argument("--attention", choices=ATTENTION_KINDS, help="how attention is computed (default: the config's "
                   "attn_implementation, else flash for the families that ship it, eager for the rest)")
    p.add_argument("--precision", help="every layer of every plan in this precision (bf16, fp8-delayed, fp8-current, "
                   "mxfp8; fp8: the GPU's recipe), or search: the planners try bf16 and the GPU's FP8 recipe (galvatron: "
                   "one search per precision, the best plan kept; baselines: their grid in each; default: bf16)")
    p.add_argument("--same-batch", action="store_true", help="re-plan every planner of a budget at the global "
                   "batch of its best plan, so rows compare like for like")
    p.add_argument("--from", dest="source", nargs=2, metavar=("TARGET", "FILE"),
                   help="a framework config you run today (TARGET: megatron, torchtitan, deepspeed, galvatron; "
                   "needs --model and --cluster): its prediction beside the best plan that framework can launch "
                   "at the same global batch and memory; --out writes that plan's files")
    p.add_argument("--report", type=Path, help="write a self-contained HTML page of the best plan and every cell")
    p.add_argument("--planners", nargs="+", help="registered planner names, comma or space separated (see --list "
                   f"planners; default: with --cluster, {' '.join(CLUSTER_PLANNERS)}; without, the paper's "
                   f"comparison: {' '.join(DEFAULT_PLANNERS)})")
    p.add_argument("--option", action="append", default=[], metavar="PLANNER.KEY=VALUE",
                   help="a planner option, e.g. galvatron.mode=exact (repeatable; VALUE is read as "
                   "int, float, true/false, else text)")
    goal = p.add_mutually_exclusive_group()
    goal.add_argument("--objective", choices=OBJECTIVES, default="auto", help="every planner's objective: nominal "
                      "(the least predicted time), robust (the plan of least worst regret over perturbation scenarios "
                      "of the cost model's constants: bandwidths, network and GEMM efficiency, collectives at scale; "
                      "its regret beside the nominal plan's; choose scenarios with --option "
                      "PLANNER.scenarios=bw-20%%,net-eff-0.6), or auto: robust where the nominal plan runs ZeRO-3 or a "
                      "gradient sync over more ranks than the measured runs in data/ reach, else nominal "
                      "(default: %(default)s)")
    goal.add_argument("--robust", dest="objective", action="store_const", const="robust",
                      help="the same as --objective robust")
    batch = p.add_mutually_exclusive_group()  # one silently overriding the other was a trap
    batch.add_argument("--global-batch", type=count(MAX_GLOBAL_BATCH), help="fix the global batch (else it "
                       f"is searched: powers of two in {DEFAULT_BATCH_RANGE[0]}..{DEFAULT_BATCH_RANGE[1]})")
    batch.add_argument("--global-batch-range", type=count(MAX_GLOBAL_BATCH), nargs=2, metavar=("LO", "HI"),
                       help="search the global batch over the powers of two in [LO, HI]")
    p.add_argument("--cost-model", default="analytical", choices=cost_models.available(),
                   help="the cost model the planners minimise")
    p.add_argument("--stack", choices=STACKS, help="for --cost-model analytical: the software whose kernels it "
                   "times and every plan states: megatron-te (Megatron-Core with Transformer Engine, fused), eager "
                   "(PyTorch as torchtitan runs without compile) or compile (torch.compile) (default: megatron-te)")
    reserve = p.add_mutually_exclusive_group()
    reserve.add_argument("--reserve-gib", type=number(0.0, 1e6, low_open=False),
                         help="allocator reserve: keep this many GiB of every budget free (0: none); default "
                         f"{DEFAULT_RESERVE.describe().replace('%', '%%')} (caching allocator and NCCL buffers; the 1 GiB CUDA "
                         "context is counted apart)")
    reserve.add_argument("--reserve-fraction", type=number(0.0, 0.99, low_open=False),
                         help="allocator reserve: keep this share of every budget free instead")
    p.add_argument("--profile", help="for --cost-model profiled: a hybridpar profile file "
                   "(python -m executor.profile)")
    p.add_argument("--galvatron-dir", help="for --cost-model profiled: a folder of Galvatron's own "
                   "profile files; the model is then the zoo model at the files' sequence length")
    p.add_argument("--evaluate", choices=("cost", *EVALUATORS.available()), default="cost",
                   help="cost: the cost model's figures only; "
                   + "; ".join(f"{n}: {EVALUATORS.get(n).help}" for n in EVALUATORS.available()))
    p.add_argument("--out", type=Path, help="folder for the plan JSONs and results.csv/results.json")
    p.add_argument("--json", action="store_true", help="print a JSON list of records instead of the table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--workers", type=int, default=1, help="cells run at once in a local process pool "
                   "(the table is the same as with 1); with --ray local, the CPUs of the Ray instance")
    p.add_argument("--ray", metavar="ADDRESS", help="run the cells as Ray tasks on this cluster ('auto', "
                   "'ray://host:10001'; 'local' starts one here); needs pip install -e '.[ray]'")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return parse_with_config(build_parser(), argv)


def _planner_names(raw: list[str]) -> tuple[str, ...]:
    names = tuple(n for item in raw for n in item.split(",") if n)
    if not names:
        raise SpecError("planners", f"no planner named in {' '.join(raw)!r}; choose from {', '.join(available())}")
    for n in names:
        if n not in available():
            raise SpecError("planners", f"unknown {n!r}; choose from {', '.join(available())}")
    return names


def _typed(text: str) -> Any:
    """An option value: int, float, bool (true/false), else the text itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_options(items: Sequence[str], planners: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``["galvatron.mode=exact", ...]`` -> ``{"galvatron": {"mode": "exact"}}``."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        head, eq, value = item.partition("=")
        name, dot, key = head.partition(".")
        if not (eq and dot and name and key):
            raise SpecError("--option", f"{item!r} is not PLANNER.KEY=VALUE")
        if name not in available():
            raise SpecError("--option", f"unknown planner {name!r} in {item!r}; choose from {', '.join(available())}")
        if name not in planners:
            raise SpecError("--option", f"{item!r} is for {name}, which --planners does not run")
        out.setdefault(name, {})[key] = _typed(value)
    return out


def _planner_options(args: argparse.Namespace, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """--option per planner, then --precision and --objective for every planner."""
    options = option_for_all(parse_options(args.option, names), names, "precision", args.precision)
    return option_for_all(options, names, "objective", args.objective)


def _cost_model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The allocator reserve when given, the analytical model's software stack, and where the
    profiled model reads its numbers from."""
    reserve = {k: v for k, v in (("reserve_gib", args.reserve_gib), ("reserve_fraction", args.reserve_fraction))
               if v is not None}
    if args.stack is not None and args.cost_model != "analytical":
        raise SpecError("--stack", f"the software stack is the analytical model's (--cost-model {args.cost_model} "
                        "times what its profile ran)")
    if args.cost_model != "profiled":
        if args.profile or args.galvatron_dir:
            raise SpecError("--profile", "--profile/--galvatron-dir need --cost-model profiled")
        return {**reserve, "stack": args.stack} if args.stack else reserve
    if args.galvatron_dir:
        return {"galvatron_dir": args.galvatron_dir, "model": args.model, **reserve}
    return {"profile_path": args.profile, **reserve} if args.profile else reserve


def _reserve_given(args: argparse.Namespace) -> bool:
    return args.reserve_gib is not None or args.reserve_fraction is not None


def _budget(gib: float, args: argparse.Namespace) -> Budget:
    if args.global_batch is not None:
        return Budget(memory_gib=gib, global_batch=args.global_batch)
    return default_budget(gib, tuple(args.global_batch_range or DEFAULT_BATCH_RANGE))


def grid_from_args(args: argparse.Namespace) -> Grid:
    names = _planner_names(args.planners or list(CLUSTER_PLANNERS if args.cluster else DEFAULT_PLANNERS))
    check_precision(args.precision)
    output_file(args.report, "--report")
    cluster = args.cluster or "titan-8"
    budgets = args.budget_gib or ([gpu_budget_gib(cluster)] if args.cluster else list(DEFAULT_BUDGETS))
    lo, hi = args.global_batch_range or DEFAULT_BATCH_RANGE
    if lo > hi:
        raise SpecError("global-batch-range", f"LO({lo}) > HI({hi})")
    output_dir(args.out, "--out")  # before the work, so a bad folder never costs a search
    return Grid(model=args.model, cluster=cluster, budgets=tuple(_budget(b, args) for b in budgets),
                seq_length=args.seq_length, attention=args.attention, keep_plans=args.report is not None,
                planners=names, options=_planner_options(args, names),
                cost_model=args.cost_model,
                cost_model_options=_cost_model_options(args),
                evaluator=None if args.evaluate == "cost" else args.evaluate, out=args.out,
                progress=not args.no_progress, workers=args.workers, ray_address=args.ray)


@one_line_errors(WorkerDied)
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print("\n".join(LISTINGS[args.list]()))
        return 0
    if args.source:
        if args.cluster is None:
            raise SpecError("--from", "needs --cluster (and --model): the files name neither exactly")
        budget = args.budget_gib[0] if args.budget_gib else None
        print("\n".join(imported_vs_best(args.source[0], Path(args.source[1]), args.model, args.cluster, budget,
                                         args.out)))
        return 0
    grid = grid_from_args(args)
    records = run(grid)
    if args.same_batch:
        records = same_batch(grid, records)
    if args.report:
        print(write_report(args.report, grid, records), file=sys.stderr)
    records = [{k: v for k, v in r.items() if k != "plan"} for r in records]
    print(dumps(records, indent=1) if args.json else table(records, grid.evaluator)
          + ("" if grid.budgets == tuple(default_budget(b) for b in DEFAULT_BUDGETS) and not _reserve_given(args)
             else "\n" + budget_line(grid)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
