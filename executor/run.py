"""Run a plan for real: python -m executor.run --plan PLAN.json [--world-size N] [--check].

On CPU it forks N local processes (gloo on 127.0.0.1); under torchrun (WORLD_SIZE set) every
process runs its own rank on its GPU (NCCL) and rank 0 prints the result.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, replace

from executor.checks import check_runnable
from executor.execution import CostPrediction, collective_errors, memory_errors
from executor.launch import LaunchError, launch
from executor.devices import resolve_device
from executor.reference import CHECK_ATOL, CHECK_ATOL_BF16, CheckResult, compare, reference_run
from executor.train import TrainConfig, median_step_time, worker
from specs import ModelSpec, Plan, SpecError
from specs.embedded import plan_model, read_plan
from specs.cli import ArgumentParser, count, number, output_file
from specs.errors import one_line_errors


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What one run of a plan measured."""

    model: str
    plan_summary: str
    world_size: int
    step_time_s: float
    """Median over the timed steps of the slowest rank's step time."""
    step_times_s: tuple[float, ...]
    peak_memory_bytes: tuple[int, ...]
    """Per rank: MemTracker peak (CPU) or torch.cuda.max_memory_allocated (GPU)."""
    reserved_memory_bytes: tuple[int, ...] = ()
    """Per rank: torch.cuda.memory_reserved after the measured step (GPU; 0 on CPU)."""
    loss: float
    """Loss of the last step (global mean over the batch)."""
    losses: tuple[float, ...]
    check: CheckResult | None = None
    notes: tuple[str, ...] = ()
    device: str = "cpu"

    def to_dict(self) -> dict:
        return asdict(self)


def scaled_model(model: ModelSpec, scale: str | None) -> ModelSpec:
    """Apply ``--scale hidden=64,layers=4,seq=32`` (any subset) to a model."""
    if not scale:
        return model
    keys = {"hidden": "hidden_size", "layers": "num_layers", "seq": "seq_len"}
    kwargs = {}
    for item in scale.split(","):
        key, _, value = item.partition("=")
        if key.strip() not in keys or not re.fullmatch(r"[0-9]{1,9}", value.strip()):  # ASCII digits only
            raise SpecError("--scale", f"expected hidden=H,layers=L,seq=S; got {item!r}")
        kwargs[keys[key.strip()]] = int(value)
    return model.scaled(**kwargs)


def run_plan(plan: Plan, model: ModelSpec, *, world_size: int | None = None, steps: int = 4,
             warmup: int = 1, check: bool = False, seed: int = 0, timeout_s: float = 300.0,
             track_memory: bool = True, bf16: bool = False, device: str = "cpu",
             check_atol: float | None = None, progress_path: str | None = None, rank_fn=worker,
             stacks_dir: str | None = None, prediction: CostPrediction | None = None) -> Measurement:
    """Run ``plan`` on ``world_size`` local processes (default: the plan's pp * stage width;
    device "cuda": rank r on GPU r, NCCL) and measure it; ``check`` also compares with a
    one-process CPU reference (tolerance ``check_atol``, default by precision). ``rank_fn``
    is what each rank runs (tests pass deliberately broken variants of ``worker``);
    ``progress_path``: each rank's finished steps, as they finish; ``stacks_dir``: where every
    rank's full stacks are kept when the run fails (none kept without it);
    ``prediction``: a cost model's peak memory and data-parallel collectives, which ``check``
    holds the run to (executor.execution)."""
    world_size = world_size or plan.pp * plan.layers[0].gpus
    check_runnable(model, plan, world_size)
    cfg = TrainConfig(steps=steps, warmup=0 if check else warmup, seed=seed, check=check,
                      track_memory=track_memory, bf16=bf16, device=device)
    per_rank = launch(rank_fn, world_size, model, plan, cfg, timeout_s=timeout_s, progress_path=progress_path,
                      backend="nccl" if device.startswith("cuda") else "gloo", stacks_dir=stacks_dir)
    return _measurement(model, plan, world_size, per_rank, cfg, check_atol, prediction)


def _measurement(model: ModelSpec, plan: Plan, world_size: int, per_rank: list[dict],
                 cfg: TrainConfig, check_atol: float | None = None,
                 prediction: CostPrediction | None = None) -> Measurement:
    losses = per_rank[0]["losses"]
    median, times = median_step_time(per_rank, cfg.warmup)
    result = None
    if cfg.check:
        ref = reference_run(model, plan, cfg.steps, cfg.seed, cfg.lr, cfg.adam_eps, cfg.bf16)
        atol = check_atol if check_atol is not None else (CHECK_ATOL_BF16 if cfg.bf16 else CHECK_ATOL)
        result = compare(per_rank, losses, ref, plan, model, atol=atol, bf16=cfg.bf16)
        if prediction is not None:
            result = _held_to(result, prediction, plan, per_rank, cfg.track_memory)
    return Measurement(model=model.name, plan_summary=plan.summary(), world_size=world_size,
                       step_time_s=median, step_times_s=tuple(times),
                       peak_memory_bytes=tuple(r.get("peak_memory_bytes", 0) for r in per_rank),
                       reserved_memory_bytes=tuple(r.get("reserved_memory_bytes", 0) for r in per_rank),
                       loss=losses[-1], losses=tuple(losses), check=result,
                       notes=tuple(per_rank[0]["notes"]), device=per_rank[0]["device"])


def _held_to(result: CheckResult, prediction: CostPrediction, plan: Plan, per_rank: list[dict],
             memory_tracked: bool) -> CheckResult:
    """``result`` with the run's memory and collectives compared with ``prediction``'s."""
    memory = []
    if prediction.peak_bytes is not None and memory_tracked:
        memory = memory_errors(plan, tuple(r["peak_memory_bytes"] for r in per_rank), prediction.peak_bytes)
    collectives = [] if prediction.collectives is None else collective_errors(plan, per_rank, prediction.collectives)
    return replace(result, memory_errors=tuple(memory), collective_errors=tuple(collectives),
                   passed=result.passed and not memory and not collectives)


def run_torchrun(plan: Plan, model: ModelSpec, cfg: TrainConfig, timeout_s: float = 300.0,
                 check_atol: float | None = None) -> Measurement | None:
    """Under torchrun: this process's rank (cfg.device "cuda": GPU LOCAL_RANK and NCCL, else
    gloo), collectives timing out after ``timeout_s``; rank 0 gets the Measurement."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", 0))
    check_runnable(model, plan, world)
    timeout = timedelta(seconds=timeout_s)
    if cfg.device.startswith("cuda"):  # this process is a rank: it may initialise CUDA
        device = torch.device(f"cuda:{local}")
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", timeout=timeout)
    mine = worker(rank, world, model, plan, cfg, local_rank=local)
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    dist.destroy_process_group()
    return _measurement(model, plan, world, gathered, cfg, check_atol) if rank == 0 else None


def format_measurement(m: Measurement) -> str:
    mib = [f"{b / 2**20:.1f}" for b in m.peak_memory_bytes]
    lines = [f"{m.model} on {m.world_size} ranks ({m.device}): {m.plan_summary}",
             f"  step time (median) {m.step_time_s * 1e3:.1f} ms over {len(m.step_times_s)} steps; loss {m.loss:.6f}",
             f"  peak memory per rank (MiB): {' '.join(mib) if any(m.peak_memory_bytes) else 'not measured'}"]
    if m.check is not None:
        lines += check_lines(m.check)
    if any(m.reserved_memory_bytes):
        lines.append("  reserved memory per rank (MiB): "
                     + " ".join(f"{b / 2**20:.1f}" for b in m.reserved_memory_bytes))
    lines += [f"  note: {n}" for n in m.notes]
    return "\n".join(lines)


def check_lines(c: CheckResult) -> list[str]:
    """What --check found (``Measurement.check``), one indented line each."""
    lines = [f"  check {'PASSED' if c.passed else 'FAILED'}: loss {c.loss_max_abs_diff:.2e} "
             f"grad {c.grad_max_abs_diff:.2e} param {c.param_max_abs_diff:.2e} (atol {c.atol:.0e}; worst: {c.worst})",
             f"  gradient error relative to its norm {c.grad_norm_rel_diff:.2e} (tolerance {c.grad_rtol:.0e}; "
             f"worst: {c.grad_norm_worst})"]
    lines += [f"  state bytes not the plan's: {e}" for e in c.state_bytes_errors]
    lines += [f"  not executed as planned: {e}" for e in c.execution_errors]
    lines += [f"  memory above the prediction: {e}" for e in c.memory_errors]
    return lines + [f"  collectives not the cost model's: {e}" for e in c.collective_errors]


def load_inputs(args: argparse.Namespace) -> tuple[Plan, ModelSpec]:
    """The plan, and the model (``--model`` or the plan's) with any ``--scale`` applied."""
    plan = read_plan(args.plan, args.world_size)
    model = scaled_model(plan_model(plan, args.model), args.scale)
    return plan, model


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, help="plan JSON file")
    parser.add_argument("--model", help="zoo model name (default: the plan's)")
    parser.add_argument("--scale", help="shrink the model: hidden=H,layers=L,seq=S (any subset)")
    parser.add_argument("--world-size", type=count(1024), help="local CPU processes (default: from the plan)")
    parser.add_argument("--steps", type=count(10**6), default=4, help="training steps to time")
    parser.add_argument("--timeout", type=number(0.0, 7 * 86400.0), default=300.0,
                        help="seconds before a hung run is ended")
    parser.add_argument("--bf16", action="store_true",
                        help="bf16 parameters, activations and communication; fp32 master weights and Adam")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when a CUDA GPU is visible, else cpu (said in one line)")


@one_line_errors(LaunchError)
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m executor.run", description=__doc__)
    add_common_args(parser)
    parser.add_argument("--check", action="store_true", help="compare with a one-process reference")
    parser.add_argument("--check-atol", type=number(0.0, 1e6), default=None,
                        help=f"--check tolerance (default {CHECK_ATOL:g} fp32, {CHECK_ATOL_BF16:g} bf16)")
    parser.add_argument("--json", action="store_true", help="print the Measurement as JSON")
    parser.add_argument("--progress", metavar="FILE", help="append each rank's finished steps here (JSON lines)")
    parser.add_argument("--stacks", metavar="DIR", help="when a run fails, keep every rank's full stacks in this "
                        "folder (without it no file is left behind)")
    args = parser.parse_args(argv)
    output_file(args.progress, "--progress")
    plan, model = load_inputs(args)
    device, why = resolve_device(args.device)
    if "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ:
        cfg = TrainConfig(steps=args.steps, check=args.check, bf16=args.bf16, warmup=0 if args.check else 1,
                          device=device)
        m = run_torchrun(plan, model, cfg, timeout_s=args.timeout, check_atol=args.check_atol)
        if m is None:
            return 0
    else:
        m = run_plan(plan, model, world_size=args.world_size, steps=args.steps, check=args.check,
                     timeout_s=args.timeout, bf16=args.bf16, device=device, check_atol=args.check_atol,
                     progress_path=args.progress, stacks_dir=args.stacks)
        print(why, file=sys.stderr)  # after the run: a refused plan stays a one-line error
    print(json.dumps(m.to_dict(), indent=1) if args.json else format_measurement(m))
    return 0 if m.check is None or m.check.passed else 1


if __name__ == "__main__":
    sys.exit(main())
