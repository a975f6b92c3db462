"""The profile -> predict -> run loop on this machine: ``python -m benchmarks.loop_accuracy``.

On cpu-2 (two gloo processes, one thread and one core each) with a GPT wide enough that compute
dominates communication (gpt-1.7b scaled to hidden 384, 6 heads, 4 layers, sequence 128,
vocabulary cut to 8192: ~1.8 GFLOP per layer forward at batch 4, against a 7 MiB fp32 gradient
all-reduce): profile once, then for each of nine plans print the profiled cost model's and the
simulator's predicted iteration time beside the measured time, and predicted beside measured
peak memory (runtime overhead excluded). Summary: time MAPE, Kendall's tau, worst memory error.
Targets (issue 11): MAPE <= 15 %, tau >= 0.8, memory within 10 % on every plan.

Measurement: each plan runs once per round, the rounds interleaved over the plans (--rounds,
default 5, of --steps 2 timed steps after one warm-up), so a spell of load falls on one run
of many plans, not on every run of one. A plan's time is the median of its timed steps (each
step's slowest rank) over all rounds, as the profile takes the median of its repeats, so
prediction and measurement are the same statistic; the fastest step is printed beside it. Peak memory is
measured in the first round (MemTracker; deterministic since the launcher's heartbeat stopped
keeping frames alive).

The plans: each kind a planner mixes, in a ladder of work whose steps are mostly larger than
the run-to-run noise (a plan's time moved 2-25 % between quiet runs of one day), since tau counts every
swapped pair; medians of the run of 2026-12-02 08:49 (docs/executor.md):
  dp2                 DDP, one micro-batch: the least work, the all-reduce under backward (619 ms).
  dp2 zero2 m2        ZeRO-2: a reduce-scatter per micro-batch, the step on a shard (687 ms).
  pp2 m4 gpipe        GPipe: (m + pp - 1) / m = 1.25 of a stage's work, p2p sends (795 ms).
  tp2+zero3 mixed m2  per-layer mix: two tensor-parallel layers, two ZeRO-3 layers, the
                      relayouts between them (894 ms).
  pp2 ckpt m8         1F1B with recomputation on micro-batches of one sample: 9/8 bubble, the
                      per-micro-batch fixed costs eight times, one more forward (989 ms).
  tp2 ckpt m2         tensor parallel (DTensor dispatch, all-reduces) with full recomputation:
                      one more forward per layer (1164 ms).
  dp2 zero3 m4        ZeRO-3: FSDP2 gathers and bookkeeping on every pass of four micro-batches
                      (1289 ms).
  tp2 ckpt m4         the tp2 ckpt plan with twice the per-micro-batch fixed costs and
                      collectives (1424 ms).
  dp2 zero3 ckpt m4   ZeRO-3 with full recomputation: one more forward per layer, with its
                      gathers (1449 ms); its peak is the tied lookup's backward, not the
                      activations (docs/executor.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

from specs import LayerStrategy as L
from specs import Plan, load_cluster, load_model, uniform_plan
from specs.errors import one_line_errors

MODEL, SCALE = "gpt-1.7b", dict(hidden_size=384, num_layers=4, seq_len=128)
HEADS = 6
"""64-wide heads (the scaled model would keep gpt-1.7b's head width and have too few to split)."""
VOCAB = 8192
"""A 50k vocabulary would make the head, not the blocks, the bulk of the work."""
CLUSTER = "cpu-2"
BATCH = 8


def plans() -> dict[str, Plan]:
    """Nine plans over the dimensions a planner mixes (the module docstring says why each)."""
    def u(**kw) -> Plan:
        return uniform_plan(4, global_batch=BATCH, model=MODEL, cluster=CLUSTER, **kw)
    mixed = Plan(pp=1, stage_layers=(4,), layers=(L(tp=2), L(tp=2), L(dp=2, dp_type="zero3"), L(dp=2, dp_type="zero3")),
                 global_batch=BATCH, micro_batches=2, model=MODEL, cluster=CLUSTER)
    return {"dp2": u(dp=2), "dp2 zero2 m2": u(dp=2, dp_type="zero2", micro_batches=2),
            "pp2 m4 gpipe": u(pp=2, micro_batches=4, schedule="gpipe"), "tp2+zero3 mixed m2": mixed,
            "tp2 ckpt m2": u(tp=2, recompute="full", micro_batches=2),
            "dp2 zero3 m4": u(dp=2, dp_type="zero3", micro_batches=4),
            "tp2 ckpt m4": u(tp=2, recompute="full", micro_batches=4),
            "pp2 ckpt m8": u(pp=2, recompute="full", micro_batches=8),
            "dp2 zero3 ckpt m4": u(dp=2, dp_type="zero3", recompute="full", micro_batches=4)}


def _model():
    model = load_model(MODEL).scaled(**SCALE)
    layers = tuple(dataclasses.replace(l, num_heads=HEADS, head_dim=0) for l in model.layers)
    return dataclasses.replace(model, layers=layers, embedding=dataclasses.replace(model.embedding, vocab_size=VOCAB),
                               head=dataclasses.replace(model.head, output_size=VOCAB))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Predicted:
    """One predictor's iteration time and per-stage peak memory (runtime overhead excluded)."""

    time_s: float
    peak_memory_bytes: tuple[float, ...]


def predict_plan(model, cluster, plan, **cost_options) -> tuple[Predicted, Predicted]:
    """The profiled cost model's and the simulator's prediction (benchmarks may not import
    analysis.validate, which does the same per rank)."""
    import cost_models
    import simulator
    cm = cost_models.get("profiled", cluster, **cost_options)
    cost = cm.plan_cost(model, plan)
    sim = simulator.simulate(model, cluster, plan, cm)
    overhead = cm.runtime_overhead_bytes
    return (Predicted(time_s=cost.iteration_time_s, peak_memory_bytes=tuple(b - overhead for b in cost.stage_peak_bytes)),
            Predicted(time_s=sim.iteration_time_s, peak_memory_bytes=tuple(b - overhead for b in sim.peak_memory_bytes)))


def kendall_tau(a: list[float], b: list[float]) -> float:
    from scipy.stats import kendalltau
    return float(kendalltau(a, b).statistic)


@one_line_errors(RuntimeError)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loop_accuracy", description=__doc__)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per plan and round (after one warm-up)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="passes over the plans, one run of each per pass: a plan's time is the median "
                             "of its timed steps over all its runs, so a spell of load spreads over every plan")
    parser.add_argument("--repeats", type=int, default=5, help="profiler repeats (rounds over every timed quantity)")
    parser.add_argument("--max-error", type=float, default=None,
                        help="repeat the profile's noisy times until the relative standard error of their "
                             "medians is below this, and refuse it if one is not after 40 repeats "
                             "(default: accept, print its spread)")
    args = parser.parse_args(argv)
    from executor.profile import build_profile
    from executor.run import run_plan
    model, cluster = _model(), load_cluster(CLUSTER)
    start = time.time()
    print(f"load average at the start: {os.getloadavg()[0]:.2f} (the times mean something only near 0)")
    profile = build_profile(model, batch_sizes=[1, 2, 4], tps=[1, 2], world_size=2, repeats=args.repeats,
                            max_error=args.max_error, timeout_s=1200)
    hw = profile.hardware
    print(f"profile: {time.time() - start:.0f} s, relative standard error of the medians: median "
          f"{hw['median_error']:.3f}, max {hw['max_error']:.3f} (up to {hw['most_repeats']} repeats)")
    runs: dict[str, list] = {name: [] for name in plans()}
    for r in range(args.rounds):
        for name, plan in plans().items():  # memory is deterministic: measured in the first round
            runs[name].append(run_plan(plan, model, world_size=2, steps=args.steps, warmup=1, timeout_s=600,
                                       track_memory=r == 0))
        print(f"round {r + 1}/{args.rounds} done ({time.time() - start:.0f} s)", flush=True)
    rows = []
    for name, plan in plans().items():
        cost, sim = predict_plan(model, cluster, plan, profile=profile)
        m = _combined(runs[name])
        rows.append((name, m, cost, sim))
        _print_row(name, m, cost, sim)
    _summary(rows)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


def _combined(measurements: list):
    """One measurement from a plan's runs: the median of its timed steps, every timed step, and
    the first run's peak memory."""
    steps = tuple(t for m in measurements for t in m.step_times_s)
    return dataclasses.replace(measurements[0], step_time_s=statistics.median(steps), step_times_s=steps)


def _print_row(name, m, cost, sim) -> None:
    mem_meas = max(m.peak_memory_bytes) / 2**20
    mem_pred = max(cost.peak_memory_bytes) / 2**20
    mem_sim = max(sim.peak_memory_bytes) / 2**20
    fastest = min(m.step_times_s) * 1e3
    print(f"{name:20s} measured {m.step_time_s * 1e3:8.1f} ms (fastest {fastest:7.1f})  cost {cost.time_s * 1e3:8.1f} "
          f"({(cost.time_s - m.step_time_s) / m.step_time_s:+5.0%})  sim {sim.time_s * 1e3:8.1f} "
          f"({(sim.time_s - m.step_time_s) / m.step_time_s:+5.0%})  | peak MiB measured {mem_meas:6.1f} "
          f"cost {mem_pred:6.1f} ({(mem_pred - mem_meas) / mem_meas:+4.0%}) sim {mem_sim:6.1f}", flush=True)


def _summary(rows) -> None:
    measured = [m.step_time_s for _, m, _, _ in rows]
    for label, idx in (("cost model (profiled)", 2), ("simulator", 3)):
        pred = [r[idx].time_s for r in rows]
        mape = statistics.mean(abs(p - t) / t for p, t in zip(pred, measured))
        mem = [abs(max(r[idx].peak_memory_bytes) - max(r[1].peak_memory_bytes)) / max(r[1].peak_memory_bytes)
               for r in rows]
        print(f"{label:22s} time MAPE {mape:.1%}  Kendall tau {kendall_tau(pred, measured):+.2f}  "
              f"memory error median {statistics.median(mem):.1%} worst {max(mem):.1%}")


if __name__ == "__main__":
    sys.exit(main())
