"""Predicted against measured: python -m analysis.validate --plan PLAN.json.

Joins three packages (so it sits above them): runs the plan (CPU processes, or torchrun on
GPUs), asks the cost model and the simulator for the same plan, and prints time and per-rank
memory side by side with the relative error. Memory is compared without the cost model's fixed
runtime overhead (CUDA context, allocator slack), which neither MemTracker nor
max_memory_allocated sees.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass

import cost_models
import simulator
from executor.devices import resolve_device
from executor.launch import LaunchError
from cost_models.charged import expected_collectives
from executor.execution import CostPrediction
from executor.run import Measurement, TrainConfig, add_common_args, check_lines, load_inputs, run_plan, run_torchrun
from specs import ClusterSpec, ModelSpec, Plan, SpecError, load_cluster
from specs.cli import ArgumentParser
from specs.errors import one_line_errors


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """What one predictor says about a plan."""

    source: str
    """'cost model (<name>)' or 'simulator'."""
    time_s: float
    """Iteration time."""
    peak_memory_bytes: tuple[float, ...]
    """Per rank, without the runtime overhead."""


@dataclass(frozen=True, kw_only=True)
class Validation:
    """A measurement next to the predictions for the same plan."""

    measured: Measurement
    predictions: tuple[Prediction, ...]
    cluster: str

    def time_error(self, p: Prediction) -> float:
        """(predicted - measured) / measured."""
        return (p.time_s - self.measured.step_time_s) / self.measured.step_time_s

    def memory_errors(self, p: Prediction) -> tuple[float, ...]:
        return tuple((pred - got) / got for pred, got in zip(p.peak_memory_bytes, self.measured.peak_memory_bytes))

    def to_dict(self) -> dict:
        out = {"cluster": self.cluster, "measured": self.measured.to_dict(), "predictions": []}
        for p in self.predictions:
            out["predictions"].append({**asdict(p), "time_error": self.time_error(p),
                                       "memory_errors": list(self.memory_errors(p))})
        return out


def predict(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost_model: str = "analytical",
            **cost_options) -> list[Prediction]:
    """Cost-model and simulator predictions, per rank, runtime overhead removed."""
    cm = cost_models.get(cost_model, cluster, **cost_options)
    cost = cm.plan_cost(model, plan)
    overhead = cm.runtime_overhead_bytes
    per_stage = cluster.world_size // plan.pp
    cost_mem = tuple(cost.stage_peak_bytes[r // per_stage] - overhead for r in range(cluster.world_size))
    sim = simulator.simulate(model, cluster, plan, cm)
    sim_mem = tuple(b - overhead for b in sim.peak_memory_bytes)
    if len(sim_mem) < cluster.world_size:  # symmetric shortcut: one GPU per stage
        sim_mem = tuple(sim_mem[r // per_stage] for r in range(cluster.world_size))
    return [Prediction(source=f"cost model ({cost_model})", time_s=cost.iteration_time_s, peak_memory_bytes=cost_mem),
            Prediction(source="simulator", time_s=sim.iteration_time_s, peak_memory_bytes=sim_mem)]


def validate_plan(plan: Plan, model: ModelSpec, cluster: ClusterSpec, *, steps: int = 4,
                  cost_model: str = "analytical", timeout_s: float = 300.0, device: str = "cpu",
                  bf16: bool = False, check: bool = False, **cost_options) -> Validation:
    """Run ``plan`` on ``cluster.world_size`` local processes (CPU, or one GPU each) and
    compare with the predictions; ``check`` also runs the executor's --check, held to every
    collective the cost model charges, data- and model-parallel, as the executor runs them
    (``expected_collectives``) and, in bf16 (the bytes the cost model charges), to its peak
    memory per rank."""
    predictions = predict(model, cluster, plan, cost_model, **cost_options)
    prediction = CostPrediction(peak_bytes=predictions[0].peak_memory_bytes if bf16 else None,
                                collectives=tuple(expected_collectives(model, plan, cluster.world_size))) \
        if check else None
    measured = run_plan(plan, model, world_size=cluster.world_size, steps=steps, timeout_s=timeout_s,
                        device=device, bf16=bf16, check=check, prediction=prediction)
    return Validation(measured=measured, predictions=tuple(predictions), cluster=cluster.name)


def format_validation(v: Validation) -> str:
    m = v.measured
    checked = check_lines(m.check) if m.check is not None else []
    lines = [f"{m.model} on {v.cluster} ({m.world_size} ranks): {m.plan_summary}", *checked,
             f"{'':22s}{'time (ms)':>12s}{'error':>9s}   peak memory per rank (MiB) [error]",
             f"{'measured':22s}{m.step_time_s * 1e3:12.1f}{'':9s}   "
             + " ".join(f"{b / 2**20:.1f}" for b in m.peak_memory_bytes)]
    for p in v.predictions:
        mem = " ".join(f"{b / 2**20:.1f}[{e:+.0%}]" for b, e in zip(p.peak_memory_bytes, v.memory_errors(p)))
        lines.append(f"{p.source:22s}{p.time_s * 1e3:12.1f}{v.time_error(p):+9.0%}   {mem}")
    return "\n".join(lines)


def _cluster_for(args: argparse.Namespace, plan: Plan, world_size: int) -> ClusterSpec:
    name = args.cluster or plan.cluster or f"cpu-{world_size}"
    cluster = load_cluster(name)
    if cluster.world_size != world_size:
        raise SpecError("--cluster", f"{cluster.name} has {cluster.world_size} GPUs but the run uses {world_size}")
    return cluster


@one_line_errors(LaunchError)
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m analysis.validate", description=__doc__)
    add_common_args(parser)
    parser.add_argument("--cluster", help="zoo cluster the predictions are for (default: the plan's, "
                        "else cpu-<world size>)")
    parser.add_argument("--cost-model", default="analytical", choices=cost_models.available(),
                        help="the cost model whose prediction is shown beside the simulator's")
    parser.add_argument("--profile", default=None, help="profile file for --cost-model profiled")
    parser.add_argument("--json", action="store_true", help="print one JSON record instead of the table")
    parser.add_argument("--check", action="store_true",
                        help="also compare with a one-process reference and hold the run to the cost model's "
                             "data-parallel collectives (and, with --bf16, its peak memory per rank)")
    args = parser.parse_args(argv)
    options = {"profile_path": args.profile} if args.profile else {}
    plan, model = load_inputs(args)
    torchrun = "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if torchrun else (args.world_size or plan.pp * plan.layers[0].gpus)
    cluster = _cluster_for(args, plan, world)
    device, why = resolve_device(args.device)
    if torchrun:
        predictions = predict(model, cluster, plan, args.cost_model, **options)
        measured = run_torchrun(plan, model, TrainConfig(steps=args.steps, bf16=args.bf16, device=device),
                                timeout_s=args.timeout)
        if measured is None:
            return 0
        v = Validation(measured=measured, predictions=tuple(predictions), cluster=cluster.name)
    else:
        print(why, file=sys.stderr)
        v = validate_plan(plan, model, cluster, steps=args.steps, cost_model=args.cost_model,
                          timeout_s=args.timeout, device=device, bf16=args.bf16, check=args.check, **options)
    print(json.dumps(v.to_dict(), indent=1) if args.json else format_validation(v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
