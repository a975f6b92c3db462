"""The prepared GPU check: ``python -m benchmarks.gpu_check OUT_DIR`` (or ``bash executor/gpu_check.sh``).

On a machine with G >= 1 visible GPUs, within about 10 minutes: (1) the GPU tests, (2) a bf16
profile of a small LLaMA (llama2-7b scaled to hidden 2048, 4 layers, sequence 1024) inside G
ranks, (3) plans for the local GPUs from several planners with that profile, (4) each plan run
(bf16, NCCL), then again with --check, and (5) one table of predicted (profiled cost model,
simulator) against measured time and peak memory, with each plan's check, written to
OUT_DIR/table.md row by row (a timeout keeps what was written). The plans are for a node of the
zoo's kind for the GPU found, with the memory it reports. ``--cpu`` runs the same steps on 2 CPU
processes with a tiny model (how CI tests this script; no GPU numbers).
"""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

from specs import load_cluster, load_model
from specs.errors import one_line_errors
from specs.files import atomic_write_text

GPU_MODEL, GPU_SCALE = "llama2-7b", dict(hidden_size=2048, num_layers=4, seq_len=1024)
CPU_MODEL, CPU_SCALE = "tiny-llama", dict(num_layers=2, seq_len=32)
PLANNERS = ("galvatron_classic", "ddp", "zero3", "megatron_tp", "gpipe")


ZOO_NODES = (("B200", "dgx-b200"), ("H200", "dgx-h200"), ("H100", "dgx-h100"), ("MI300X", "mi300x-8"))
"""A GPU name's part -> the zoo node whose links and peak figures the local plans assume."""


def local_cluster(gpus: int, cpu: bool, identity: tuple[str, int] = ("", 0)):
    """The cluster the plans are for: this machine's G GPUs as one node of the zoo's kind for the
    GPU found (by its name; an A100 by its memory; anything else as an H200), with the memory the
    GPU reports (or cpu-2)."""
    if cpu:
        return load_cluster("cpu-2")
    name, memory_bytes = identity
    zoo = next((node for part, node in ZOO_NODES if part in name.upper()), None)
    if zoo is None:
        zoo = ("dgx-a100-80g" if memory_bytes > 60 * 2**30 else "dgx-a100-40g") if "A100" in name.upper() else "h200-1"
    base = load_cluster(zoo)
    gpu = dataclasses.replace(base.gpu, memory_gib=memory_bytes / 2**30) if memory_bytes else base.gpu
    return dataclasses.replace(base, nodes=1, gpus_per_node=gpus, gpu=gpu, name=f"{zoo}-local{gpus}")


def run_gpu_tests(out: Path, cpu: bool) -> str:
    if cpu:
        return "GPU tests: skipped (--cpu)"
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "tests/executor/test_gpu.py", "-q",
                           "-p", "no:cacheprovider"], capture_output=True, text=True, timeout=240)
    atomic_write_text(out / "pytest.txt", done.stdout + done.stderr)
    return f"GPU tests: exit {done.returncode}: {done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ''}"


def plan_all(model, cluster, profile, batch: int) -> dict:
    import cost_models
    import planners
    cm = cost_models.get("profiled", cluster, profile=profile)
    out = {}
    for name in PLANNERS:
        result = planners.plan(name, model, cluster, planners.Budget(memory_gib=cluster.gpu.memory_gib,
                                                                     global_batch=batch), cost_model=cm)
        if result.feasible:
            out.setdefault(result.plan.summary(), (name, result.plan))
    return out


@one_line_errors()
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__)
    parser.add_argument("out", type=Path, help="folder for the table, the profile and the logs")
    parser.add_argument("--cpu", action="store_true", help="the same steps on 2 CPU processes, tiny model")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per plan")
    args = parser.parse_args(argv)
    from benchmarks.loop_accuracy import predict_plan
    from executor.devices import gpu_identity, visible_gpus
    from executor.profile import build_profile
    from executor.run import run_plan
    args.out.mkdir(parents=True, exist_ok=True)
    gpus = 2 if args.cpu else visible_gpus()
    if gpus == 0:
        raise SystemExit("error: no CUDA GPU visible (use --cpu for the CPU rehearsal)")
    device, dtype = ("cpu", "fp32") if args.cpu else ("cuda", "bf16")
    name, scale = (CPU_MODEL, CPU_SCALE) if args.cpu else (GPU_MODEL, GPU_SCALE)
    identity = ("", 0) if args.cpu else gpu_identity()
    model, cluster = load_model(name).scaled(**scale), local_cluster(gpus, args.cpu, identity)
    lines: list[str] = []

    def emit(*new: str) -> None:  # the table as far as it goes, so a timeout loses nothing written
        lines.extend(new)
        atomic_write_text(args.out / "table.md", "\n".join(lines) + "\n")
        print("\n".join(new), flush=True)

    emit(f"# gpu_check {time.strftime('%Y-%m-%d %H:%M')} on {cluster.name} ({gpus} x {device}"
         + (f": {identity[0]}, {identity[1] / 2**30:.1f} GiB" if identity[0] else "") + ")")
    emit(run_gpu_tests(args.out, args.cpu))
    import torch
    start = time.time()
    profile = build_profile(model, batch_sizes=[1, 2, 4], tps=[t for t in (1, 2, 4, 8) if t <= max(gpus, 1)],
                            device=device, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32,
                            world_size=gpus, repeats=5, max_error=None)
    from specs.profile_format import save_profile
    save_profile(profile, args.out / "profile.json")
    emit(f"profile: {time.time() - start:.0f} s on {profile.hardware['device']}, "
         f"largest relative standard error of a median {profile.hardware['max_error']:.3f}")
    emit("", "| planner | plan | measured ms | cost ms | sim ms | measured peak MiB | reserved MiB | cost MiB | check |",
         "|---|---|---|---|---|---|---|---|---|")
    for summary, (planner, plan) in plan_all(model, cluster, profile, batch=4 * gpus).items():
        cost, sim = predict_plan(model, cluster, plan, profile=profile)
        try:
            m = run_plan(plan, model, world_size=gpus, steps=args.steps, device=device, bf16=dtype == "bf16",
                         timeout_s=240)
            checked = run_plan(plan, model, world_size=gpus, steps=2, device=device, bf16=dtype == "bf16",
                               timeout_s=240, check=True, track_memory=False).check
        except Exception as err:  # one failing plan must not hide the others' rows
            emit(f"| {planner} | {summary.replace(' | ', '; ')} | failed: {str(err)[:120]} | | | | | | |")
            continue
        verdict = "passed" if checked.passed else f"FAILED ({checked.worst})"
        emit(f"| {planner} | {summary.replace(' | ', '; ')} | {m.step_time_s * 1e3:.1f} | {cost.time_s * 1e3:.1f} | "
             f"{sim.time_s * 1e3:.1f} | {max(m.peak_memory_bytes) / 2**20:.0f} | "
             f"{max(m.reserved_memory_bytes or (0,)) / 2**20:.0f} | {max(cost.peak_memory_bytes) / 2**20:.0f} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
