"""What context parallelism buys at long sequences: ``python -m benchmarks.long_context``.

Llama-3-8B on 64 H100 and Llama-3-70B on 256 H100 (``dgx-h100:N``) at 8k, 32k and 128k tokens,
one fixed token budget per iteration; for each, galvatron on the full space with cp and with cp
removed, beside Megatron's long-context recipe (megatron_cp): throughput, peak memory and plan
under the analytical cost model, the simulator's iteration time beside each, and the search time.
Prints only; nothing here is timed by a test.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import cost_models
import planners
from planners import Budget, SearchSpace
from simulator import simulate
from specs import load_cluster, load_model
from specs.errors import one_line_errors

CASES = {"llama3-8b": "dgx-h100:8", "llama3-70b": "dgx-h100:32"}
"""model -> cluster (64 and 256 H100)."""
SEQUENCES = (8192, 32768, 131072)
TOKENS_PER_ITERATION = 1 << 21
"""2 M tokens an iteration at every sequence length (global batch = tokens / seq)."""
BUDGET_GIB = 80.0


def rows(model_name: str, cluster_name: str, seq: int) -> list[list]:
    """One row per search: with cp, without cp, Megatron's cp recipe."""
    model, cluster = load_model(model_name).with_seq_len(seq), load_cluster(cluster_name)
    cm = cost_models.get("analytical", cluster)
    budget = Budget(memory_gib=BUDGET_GIB, global_batch=TOKENS_PER_ITERATION // seq)
    full = SearchSpace.preset("full")
    searches = [("galvatron", "galvatron", {"space": full}),
                ("galvatron, cp off", "galvatron", {"space": replace(full, cp=(1,))}),
                ("megatron_cp", "megatron_cp", None)]
    out = []
    for label, name, options in searches:
        start = time.perf_counter()
        res = planners.get(name).plan(model, cluster, budget, cm, options)
        search_s = time.perf_counter() - start
        if not res.feasible:
            out.append([model_name, seq, label, "OOM", "", "", f"{search_s:.1f}", res.message[:60]])
            continue
        sim = simulate(model, cluster, res.plan, cm, record_memory=False)
        out.append([model_name, seq, label, f"{res.throughput_samples_per_s * seq / cluster.world_size:.0f}",
                    f"{res.peak_memory_gib:.1f}", f"{sim.iteration_time_s * 1e3:.0f} / {res.iteration_time_s * 1e3:.0f}",
                    f"{search_s:.1f}", res.plan.summary()])
    return out


@one_line_errors()
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.long_context", description=__doc__)
    p.add_argument("--models", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--seq", nargs="+", type=int, default=list(SEQUENCES))
    args = p.parse_args(argv)
    head = ["model", "seq", "search", "tok/s/GPU", "peak GiB", "sim / model ms", "search s", "plan"]
    print(" | ".join(head))
    for model_name in args.models:
        for seq in args.seq:
            for row in rows(model_name, CASES[model_name], seq):
                print(" | ".join(str(x) for x in row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
