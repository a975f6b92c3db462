"""The regret table: per case, the nominal objective's plan and the robust objective's plan, their
iteration time and regret under the nominal model and each perturbation scenario.

    python -m benchmarks.robustness                     # the four cases
    python -m benchmarks.robustness --cases gpt3-175b --time-limit-s 120
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import cost_models
import planners
from cost_models.scenarios import SCENARIOS
from planners import Budget
from specs import load_cluster, load_model
from specs.errors import one_line_errors


@dataclass(frozen=True)
class Case:
    """One planning problem of the table."""

    name: str
    model: str
    cluster: str
    budget_gib: float
    global_batch: int
    planner: str = "galvatron"


CASES = (Case("gpt3-175b", "gpt3-175b", "dgx-a100-80g:128", 80, 1536),
         Case("llama3.1-405b", "llama3.1-405b", "dgx-h100:1024", 80, 2048),
         Case("llama3-70b", "llama3-70b", "dgx-h100:32", 80, 512),
         Case("mixtral-8x7b", "mixtral-8x7b", "dgx-h100:8", 80, 256, planner="galvatron_moe"))
"""gpt3-175b on 1024 A100, the 405B model on 8192 H100 (16M tokens a batch at 8k), llama3-70b on 256
H100 and Mixtral on 64 H100, all at 80 GiB."""


def regret_table(case: Case, time_limit_s: float | None) -> tuple[list[str], float]:
    """The case's lines (markdown) and the seconds its searches took."""
    model, cluster = load_model(case.model), load_cluster(case.cluster)
    cm = cost_models.get("analytical", cluster)
    options = {"objective": "robust"} | ({"time_limit_s": time_limit_s} if time_limit_s else {})
    start = time.perf_counter()
    res = planners.get(case.planner).plan(model, cluster, Budget(memory_gib=case.budget_gib,
                                                                 global_batch=case.global_batch), cm, options)
    wall = time.perf_counter() - start
    head = (f"### {case.model} on {cluster.world_size} {cluster.gpu.name} ({case.cluster}), {case.budget_gib:g} GiB, "
            f"batch {case.global_batch}, {case.planner}")
    if not res.feasible:
        return [head, "", f"no plan: {res.message}"], wall
    choice = res.robust
    nominal, chosen = choice.nominal, choice.chosen
    lines = [head, "", f"- nominal plan: `{nominal.plan.summary()}`",
             f"- robust plan: " + ("the same" if not choice.differs else f"`{chosen.plan.summary()}`"),
             f"- {choice.candidates} distinct plans compared (the nominal search's top plans and each scenario's "
             "own best)", "",
             "| scenario | nominal plan s/iter | nominal regret | robust plan s/iter | robust regret |",
             "|---|---:|---:|---:|---:|"]
    for s, name in enumerate(choice.scenarios):
        lines.append(f"| {name} | {nominal.iteration_time_s[s]:.2f} | {nominal.regret[s]:.1%} | "
                     f"{chosen.iteration_time_s[s]:.2f} | {chosen.regret[s]:.1%} |")
    lines.append(f"| **worst** | {nominal.worst_time_s:.2f} | **{nominal.regret_max:.1%}** | "
                 f"{chosen.worst_time_s:.2f} | **{chosen.regret_max:.1%}** |")
    return lines, wall


@one_line_errors()
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.robustness", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", choices=[c.name for c in CASES], default=[c.name for c in CASES])
    p.add_argument("--time-limit-s", type=float, help="galvatron's time_limit_s for each of a case's searches")
    args = p.parse_args(argv)
    print("scenarios: " + "; ".join(f"{s.name}: {s.description}" for s in SCENARIOS.values()) + "\n")
    for case in (c for c in CASES if c.name in args.cases):
        lines, wall = regret_table(case, args.time_limit_s)
        print("\n".join(lines))
        print(f"\n(searches: {wall:.1f} s)\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
