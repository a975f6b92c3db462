"""What each dimension of the modern space buys: ``python -m benchmarks.space_ablation``.

The galvatron planner on the 2022 paper's space, then on that space with one dimension added
at a time (ZeRO-1/2 with full checkpointing, Megatron-SP, Ulysses, selective recomputation,
interleaving, the vocabulary's choices, the pp and micro-batch caps lifted), then on the
Galvatron-2 and full presets, beside Megatron-LM's and DeepSpeed's tuned grids; each row's
throughput under the analytical cost model as a ratio to the 2022 space (to the first space
with a plan that fits, when nothing fits in the 2022 space).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import Any

import cost_models
import planners
from planners import Budget, SearchSpace
from specs import MEGATRON_RECOMPUTE, SequenceParallel, load_cluster, load_model
from specs.errors import one_line_errors

CASES = {
    "gpt3-175b": ("gpt3-175b", "dgx-a100-80g:64", 80.0, 1536),
    "llama2-70b": ("llama2-70b", "dgx-h100:8", 80.0, 512),
    "bert-8": ("bert-huge-32", "titan-8", 8.0, 32),
}
"""name -> (model, cluster, budget GiB, global batch); bert-8 is the 8-layer quick case."""
BASELINES = ("megatron_3d", "deepspeed_3d", "megatron_sp_selective")


def spaces() -> dict[str, SearchSpace]:
    """The 2022 space, each dimension added to it alone, and the two presets."""
    paper = SearchSpace.preset("galvatron")
    classic = SearchSpace.preset("classic")
    full = SearchSpace.preset("full")
    return {
        "2022 (paper)": paper,
        "+ zero1/2, full ckpt": classic,
        "+ megatron-sp": replace(classic, sp=(SequenceParallel.NONE, SequenceParallel.MEGATRON)),
        "+ ulysses": replace(classic, sp=(SequenceParallel.NONE, SequenceParallel.ULYSSES)),
        "+ selective recompute": replace(classic, recompute=MEGATRON_RECOMPUTE),
        "+ interleaving v<=4": replace(classic, virtual_stages=full.virtual_stages),
        "+ vocabulary zero3/sp": replace(classic, vocab_zero3=full.vocab_zero3, vocab_sp=full.vocab_sp),
        "+ pp/micro-batch caps lifted": replace(classic, max_pp=full.max_pp, max_micro_batches=full.max_micro_batches),
        "galvatron2 preset": SearchSpace.preset("galvatron2"),
        "full preset": full,
    }


def _run(name: str, model, cluster, cm, budget: Budget, options: dict[str, Any]) -> tuple[float, float, str, str]:
    """(samples/s or 0, search wall s, status with the proven gap, plan summary or message)."""
    start = time.perf_counter()
    res = planners.get(name).plan(model, cluster, budget, cm, options)
    wall = time.perf_counter() - start
    gap = res.stats.gap
    status = res.stats.solver_status + (f" gap {gap:.1%}" if gap is not None and gap > 0 else "")
    if not res.feasible:
        return 0.0, wall, status, res.message
    return res.throughput_samples_per_s, wall, status, res.plan.summary()


def ablate(case: str, only: list[str] | None, time_limit_s: float) -> list[list]:
    model_name, cluster_name, gib, batch = CASES[case]
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    if case == "bert-8":
        model = model.scaled(num_layers=8)
    cm = cost_models.get("analytical", cluster)
    budget = Budget(memory_gib=gib, global_batch=batch)
    print(f"{model.name} on {cluster.name} ({cluster.world_size} GPUs), {gib:g} GiB, global batch {batch}, "
          "analytical cost model", flush=True)
    rows, ref = [], None
    limit = {"time_limit_s": time_limit_s} if time_limit_s else {}
    runs = [(label, "galvatron", {"space": space, **limit}) for label, space in spaces().items()]
    runs += [(name, name, {}) for name in BASELINES]
    for label, planner, options in runs:
        if only and label not in only and planner not in only:
            continue
        thr, wall, status, plan = _run(planner, model, cluster, cm, budget, options)
        if not ref:  # the first space with a plan that fits (2022, else the classic space)
            ref = thr
        ratio = f"{thr / ref:.3f}" if ref and thr else "-"
        rows.append([label, f"{thr:.2f}" if thr else "none fits", ratio, f"{wall:.1f}", status, plan[:90]])
        print("  " + " | ".join(rows[-1]), flush=True)
    return rows


@one_line_errors()
def main(argv: list[str] | None = None) -> int:
    from tabulate import tabulate
    p = argparse.ArgumentParser(prog="python -m benchmarks.space_ablation", description=__doc__)
    p.add_argument("--case", nargs="+", choices=tuple(CASES), default=["gpt3-175b", "llama2-70b"])
    p.add_argument("--only", nargs="+", default=None, help="row labels or planner names to run (default: all)")
    p.add_argument("--time-limit-s", type=float, default=0.0,
                   help="bound each galvatron call (0: none); a stopped search prints its proven gap")
    args = p.parse_args(argv)
    for case in args.case:
        rows = ablate(case, args.only, args.time_limit_s)
        print(tabulate(rows, headers=["space / planner", "samples/s", "vs first fitting", "search s", "status", "plan"],
                       tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
