"""Each pipeline schedule at its best plan, on three of today's training setups: throughput by the
analytical cost model and in the simulator, their ratio, peak memory and search time.

    python -m benchmarks.schedules                          # the three cases
    python -m benchmarks.schedules --case gpt3-175b --time-limit-s 60
    python -m benchmarks.schedules --part memory            # each schedule run on CPU: peak memory

GPipe and 1F1B rows are the galvatron search (per-layer strategies, searched stage split) with
only that schedule; the others are their best uniform plan (one strategy for every layer, in
Megatron's chunk layout: how frameworks run them), found with the search's own tables and
bound (the seeds and the uniform phase of ``planners.outer``) over the full space (a MoE
model: the ``moe`` space galvatron_moe searches, Megatron-Core's MoE dimensions; the full space's
expert choices at 2048 GPUs make thousands of strategies per stage, whose relayout tables do not
fit this machine's memory) restricted to the schedule; "1f1b uniform" is 1F1B's, the like-for-like reference. Each plan is then
simulated (one iteration, the simulator's symmetric shortcut). Budgets lose the cost model's
allocator reserve, as in every planner.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import Iterator, NamedTuple

import cost_models
import planners
from planners import Budget, SearchSpace
from planners.base import PlanResult
from planners.outer import OuterState, finish, run_outer
from specs import Schedule, load_cluster, load_model
from specs.errors import one_line_errors
from specs.units import GIB


class Case(NamedTuple):
    model: str
    cluster: str
    memory_gib: float
    global_batch: int
    source: str
    """Where the setup comes from."""


CASES = {
    "gpt3-175b": Case("gpt3-175b", "dgx-a100-80g:128", 80.0, 1536, "Megatron-LM's 175B run (1024 A100, batch 1536)"),
    "llama3.1-405b": Case("llama3.1-405b", "dgx-h100:1024", 80.0, 2048,
                          "Llama 3 405B's 8192-GPU stage (126 layers, 2048 x 8192 tokens)"),
    "deepseek-v3": Case("deepseek-v3", "dgx-h100:256", 80.0, 15360, "DeepSeek-V3 (2048 H800 there; batch 15360)"),
}
UNIFORM_1F1B = "1f1b uniform"
"""The row of 1F1B's best uniform plan (even stages), the like-for-like reference of the others."""
ROWS = ((Schedule.GPIPE, 1), (Schedule.ONE_F_ONE_B, 1), (UNIFORM_1F1B, 1), (Schedule.INTERLEAVED_1F1B, 2),
        (Schedule.INTERLEAVED_1F1B, 4), (Schedule.ZB_H1, 1), (Schedule.ZBV, 2), (Schedule.DUALPIPE_V, 2),
        (Schedule.LOOPED_BFS, 2))
"""(schedule, model chunks per rank) of each row."""


def flat_space(space: SearchSpace, schedule: str) -> SearchSpace:
    """``space`` searching only ``schedule`` of one chunk per rank and a whole backward."""
    return replace(space, schedule=schedule, virtual_stages=(1,), uniform_schedules=())


def best_of_schedule(model, cluster, budget: Budget, cm, space: SearchSpace, schedule: str, v: int,
                     time_limit_s: float) -> PlanResult:
    """The best plan of ``schedule`` with ``v`` chunks per rank (see the module doc)."""
    if schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B):
        return planners.get("galvatron").plan(model, cluster, budget, cm,
                                              {"space": flat_space(space, schedule), "time_limit_s": time_limit_s})
    uniform = flat_space(space, Schedule.ONE_F_ONE_B)
    if schedule == Schedule.INTERLEAVED_1F1B:
        uniform = replace(uniform, virtual_stages=(1, v))
    elif schedule != UNIFORM_1F1B:
        uniform = replace(uniform, uniform_schedules=(schedule,))
    usable_bytes = budget.memory_bytes - cm.allocator_reserve_bytes(budget.memory_bytes)  # as Planner.plan
    deadline = time.monotonic() + time_limit_s
    state, tables = run_outer("uniform", model, cm, usable_bytes, uniform, budget.global_batches(),
                              lambda tables, incumbent_s: [], 1, {"model": model.name, "cluster": cluster.name},
                              OuterState(limit_s=time_limit_s), deadline, seed=schedule == UNIFORM_1F1B)
    result = finish("uniform", model, cm, state, tables, usable_bytes, 1,
                    "time_limit" if state.timed_out else "optimal", None)
    if result.feasible or schedule == UNIFORM_1F1B or state.timed_out:
        return result
    # the tables' smallest memory is 1F1B's: a schedule played by plan_cost alone states none
    return replace(result, min_memory_gib=None,
                   message=f"no uniform plan fits {usable_bytes / GIB:.1f} GiB by plan_cost")


def case_rows(case: Case, time_limit_s: float, rows=ROWS) -> Iterator[str]:
    from simulator import simulate
    model, cluster = load_model(case.model), load_cluster(case.cluster)
    cm = cost_models.get("analytical", cluster)
    budget = Budget(memory_gib=case.memory_gib, global_batch=case.global_batch)
    space = SearchSpace.preset("moe" if any(l.moe is not None for l in model.layers) else "full")
    yield (f"{case.model} on {cluster.name} ({cluster.world_size} GPUs), {case.memory_gib:g} GiB, batch "
           f"{case.global_batch}: {case.source}")
    yield HEADER
    for schedule, v in rows:
        start = time.perf_counter()
        res = best_of_schedule(model, cluster, budget, cm, space, schedule, v, time_limit_s)
        search_s = time.perf_counter() - start
        label = f"{schedule}" + (f" v{v}" if v > 1 else "")
        if not res.feasible:
            yield f"{label:<20} no plan ({res.stats.solver_status}; {res.message[:80]})  search {search_s:.1f} s"
            continue
        start = time.perf_counter()
        sim = simulate(model, cluster, res.plan, cm)
        sim_s = time.perf_counter() - start
        ratio = res.throughput_samples_per_s / sim.throughput_samples_per_s
        yield (f"{label:<20} {res.throughput_samples_per_s:9.3f} {sim.throughput_samples_per_s:9.3f} {ratio:7.3f} "
               f"{res.bubble_fraction:7.1%} {res.peak_memory_gib:8.1f} {search_s:8.1f} {sim_s:6.1f} "
               f"{res.stats.solver_status:<10}  {_shape(res)}")


HEADER = (f"{'schedule':<20} {'model/s':>9} {'sim/s':>9} {'mod/sim':>7} {'bubble':>7} {'peak GiB':>8} "
          f"{'search s':>8} {'sim s':>6} {'status':<10}  plan (samples/s by the cost model and the simulator)")


def _shape(res: PlanResult) -> str:
    p = res.plan
    first = p.layers[0]
    return (f"pp {p.pp} m {p.micro_batches} | layer 0 {first.short()} | stages {list(p.stage_layers)}"[:110])


MEMORY_MODEL = dict(hidden_size=256, num_layers=8, seq_len=128)
"""gpt-1.7b cut down for the CPU runs (8 layers: 2 per chunk at pp 4 x v 2), vocabulary MEMORY_VOCAB."""
MEMORY_VOCAB = 4096
MEMORY_MICRO_BATCHES = 8
"""One sample each: DualPipeV needs 2 pp at pp 4."""


def memory_model():
    model = load_model("gpt-1.7b").scaled(**MEMORY_MODEL)
    layers = tuple(replace(layer, num_heads=4, head_dim=0) for layer in model.layers)
    return replace(model, layers=layers, embedding=replace(model.embedding, vocab_size=MEMORY_VOCAB),
                   head=replace(model.head, output_size=MEMORY_VOCAB))


def memory_rows(pps=(2, 4)) -> Iterator[str]:
    """Each schedule run by the executor on CPU (gloo, pp ranks, dp 1): measured peak memory per
    stage (MemTracker; executor.live_memory under a split backward) beside the profiled cost
    model's on this machine's profile of the model (fp32, the executor's Adam), runtime overhead
    excluded, as the loop benchmark compares them."""
    from executor.profile import build_profile
    from executor.run import run_plan
    from specs import uniform_plan
    model = memory_model()
    profile = build_profile(model, batch_sizes=[1], tps=[1], world_size=2, repeats=1, max_error=None)
    yield f"{'schedule':<20} {'pp':>2}  measured / predicted MiB per stage (error)"
    for pp in pps:
        cluster = load_cluster(f"cpu-{pp}")
        cm = cost_models.get("profiled", cluster, profile=profile)
        for schedule, v in ROWS:
            if schedule == UNIFORM_1F1B or model.num_layers < pp * v:
                continue
            plan = uniform_plan(model.num_layers, pp=pp, global_batch=MEMORY_MICRO_BATCHES,
                                micro_batches=MEMORY_MICRO_BATCHES, schedule=schedule,
                                **({"virtual_stages": v} if v > 1 else {}))
            predicted = [b - cm.runtime_overhead_bytes for b in cm.plan_cost(model, plan).stage_peak_bytes]
            measured = run_plan(plan, model, steps=1, warmup=1, timeout_s=900).peak_memory_bytes
            cells = [f"{m / 2**20:6.1f}/{p / 2**20:6.1f} ({m / p - 1:+5.1%})" for m, p in zip(measured, predicted)]
            label = f"{schedule}" + (f" v{v}" if v > 1 else "")
            yield f"{label:<20} {pp:>2}  " + "  ".join(cells)


@one_line_errors()
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.schedules", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", nargs="+", choices=tuple(CASES), default=list(CASES))
    p.add_argument("--time-limit-s", type=float, default=120.0, help="per schedule's search")
    p.add_argument("--part", choices=("plans", "memory", "all"), default="plans",
                   help="plans: the three cases; memory: each schedule run on CPU, peak memory per stage")
    args = p.parse_args(argv)
    if args.part in ("memory", "all"):
        for line in memory_rows():
            print(line, flush=True)
        print()
    if args.part == "memory":
        return 0
    for name in args.case:
        for line in case_rows(CASES[name], args.time_limit_s):
            print(line, flush=True)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
