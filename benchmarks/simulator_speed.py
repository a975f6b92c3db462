"""How fast the simulator plays one iteration, from 8 to 512 GPUs.

``python -m benchmarks.simulator_speed``: for growing plans (a single node, then the vTrain
multi-node shapes up to the 175B tp4 dp4 pp32 run on 512 GPUs) prints events, wall time
per simulated iteration and events per second, for the symmetry shortcut with coalesced
ring steps, with every ring step, and (up to --full-max GPUs) the full per-rank simulation.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from specs import ClusterSpec, ModelSpec, Plan, load_cluster, load_model, uniform_plan


@dataclass(frozen=True)
class SpeedCase:
    label: str
    model: ModelSpec
    cluster: ClusterSpec
    plan: Plan


def cases() -> list[SpeedCase]:
    """Growing plans; the multi-node ones are vTrain measured runs when the data is there."""
    gpt = load_model("gpt-1.7b")
    out = [SpeedCase("gpt-1.7b tp2 pp2 dp2 m8", gpt, load_cluster("dgx-a100-80g"),
                     uniform_plan(gpt.num_layers, tp=2, pp=2, dp=2, global_batch=32, micro_batches=8,
                                  recompute="full"))]
    from cost_models import measured_runs
    if not measured_runs.available():
        return out
    wanted = [(64, 1, 64, 1), (256, 8, 32, 1), (512, 2, 32, 8), (512, 4, 4, 32)]
    multi = measured_runs.load_cases("multi")
    for gpus, tp, dp, pp in wanted:
        for c in multi:
            s = c.plan.layers[0]
            if (c.cluster.world_size, s.tp, s.dp, c.plan.pp) == (gpus, tp, dp, pp):
                model, plan = measured_runs.as_megatron(c.model, c.plan)
                label = f"{c.model_key} tp{tp} dp{dp} pp{pp} m{plan.micro_batches}"
                out.append(SpeedCase(label, model, c.cluster, plan))
                break
    return out


def time_one(case: SpeedCase, **options) -> tuple[float, float, int, float]:
    """(wall seconds, CPU seconds, events, simulated iteration seconds) of one simulation; CPU
    time is the steadier figure on a shared machine."""
    import cost_models
    from simulator import simulate
    cm = cost_models.get("analytical", case.cluster)
    start, cpu = time.perf_counter(), time.process_time()
    result = simulate(case.model, case.cluster, case.plan, cm, record_memory=False, **options)
    return time.perf_counter() - start, time.process_time() - cpu, result.events, result.iteration_time_s


def main(argv: list[str] | None = None) -> int:
    from tabulate import tabulate
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulator_speed", description=__doc__)
    parser.add_argument("--full-max", type=int, default=64, help="largest world size to also run in full")
    parser.add_argument("--steps-max", type=int, default=512, help="largest world size to run step by step")
    args = parser.parse_args(argv)
    rows = []
    for case in cases():
        gpus = case.cluster.world_size
        modes = [("symmetric, coalesced", dict(coalesce_steps=True))]
        if gpus <= args.steps_max:
            modes.append(("symmetric, ring steps", dict(coalesce_steps=False)))
        if gpus <= args.full_max:
            modes.append(("full, ring steps", dict(full=True)))
        for mode, options in modes:
            wall, cpu, events, iteration = time_one(case, **options)
            rows.append([case.label, gpus, mode, events, wall, cpu, events / cpu, iteration])
            print(f"  {case.label} [{mode}]: {wall:.2f} s", file=sys.stderr, flush=True)
    print(tabulate(rows, headers=["plan", "GPUs", "mode", "events", "wall s / iteration", "CPU s / iteration",
                                  "events / CPU s", "simulated iteration s"],
                   floatfmt=(".0f", ".0f", "", ".0f", ".2f", ".2f", ".0f", ".3f")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
