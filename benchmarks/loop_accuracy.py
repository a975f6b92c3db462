"""The profile -> predict -> run loop on this machine: ``python -m benchmarks.loop_accuracy``.

On cpu-2 (two gloo processes, one thread and one core each) with a GPT wide enough that compute
dominates communication (gpt-1.7b scaled to hidden 384, 6 heads, 4 layers, sequence 128,
vocabulary cut to 8192: ~1.8 GFLOP per layer forward at batch 4, against a 7 MiB fp32 gradient
all-reduce), and tiny-moe scaled the same way for the MoE plans: profile each model once, check
every plan (one step against the one-process reference, held to the cost model's charged
data-parallel collectives: the executor's --check), then for each of twenty plans print the
profiled cost model's and the simulator's predicted iteration time beside the measured time,
and predicted beside measured peak memory (runtime overhead excluded). Summary, over all plans,
2022's nine and today's eleven: time MAPE, Kendall's tau, median and worst memory error.
Targets (issue 11): MAPE <= 15 %, tau >= 0.8, memory within 10 % on every plan.

Measurement: each plan runs once per round, the rounds interleaved over the plans (--rounds,
default 3, of --steps 2 timed steps after --warmup 1 untimed), so a spell of load falls on one
run of many plans, not on every run of one. Every run is fresh processes, one rank a core: the
launcher pins rank r to the r-th core of the machine and sets one intra-op thread per rank
(executor.launch), as the profile's ranks run. A plan's time is the median of its timed steps
(each step's slowest rank) over all rounds, as the profile takes the median of its repeats, so
prediction and measurement are the same statistic; the fastest step is printed beside it, and
the spread of its rounds (the largest run median less the smallest, over the plan's time): a
plan whose rounds spread more than its distance to the next plan in the ranking is not ranked
by this run. The load average is printed at the start and the end. Peak memory is
measured in the first round (MemTracker; deterministic since the launcher's heartbeat stopped
keeping frames alive). --plans runs a subset; --profile-dir keeps the profiles for a rerun.

The plans of 2022's space: each kind a planner mixes, in a ladder of work whose steps are mostly larger than
the run-to-run noise (a plan's time moved 2-25 % between quiet runs of one day), since tau counts every
swapped pair; medians of the 9-plan run of 2026-12-02 08:49 (docs/executor.md):
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
Today's space, still on two ranks (one plan per axis the planners gained since):
  tp2 vocab-tp2 m2    vocabulary parallelism: the head's logits and loss split over the tp group.
  pp2 zb_h1 m4        zero-bubble H1: backward split into B and W, W deferred into the drain.
  ulysses2 m2         Ulysses: tokens split, all-to-alls around attention, weights whole.
  tp2 sp m2           Megatron sequence parallelism: all-gather/reduce-scatter for all-reduce.
  pp2 v2 interleaved m8  interleaved 1F1B, two chunks per rank: the smaller bubble, twice the sends.
  cp2 ring m4         context parallelism: the sequence split, K/V passed round a ring.
  tp2 sp selective m4 selective recomputation: only the attention core re-run in backward.
  pp2 dualpipev m8    DualPipeV's V placement (the head on stage 0), split backward. Not with
                      recomputation: under a split backward (zbv, dualpipev) the executor re-runs
                      a checkpointed forward for W as well as for B (dualpipev ckpt: 3 forwards a
                      micro-batch, zbv ckpt: 10; selective: torch refuses the second backward),
                      so --check fails it as not executed as planned (docs/results/executor.md).
  moe dp2 m2          MoE, data parallel: every expert on every rank.
  moe ep2 m2          MoE, expert parallel: four experts a rank, all-to-all dispatch and combine.
  moe tp2 m2          MoE, tensor parallel: every expert split over the tp group.
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
MOE_MODEL = "tiny-moe"
"""The MoE plans' model, scaled like the dense one (hidden 384, 4 layers, sequence 128,
vocabulary 8192): 8 heads of 48 (4 key/value heads), 8 experts of width 768, top-2, so a
token's expert FLOPs match the dense model's 1536-wide MLP."""
CLUSTER = "cpu-2"
BATCH = 8
SPACE_2022 = ("dp2", "dp2 zero2 m2", "pp2 m4 gpipe", "tp2+zero3 mixed m2", "tp2 ckpt m2", "dp2 zero3 m4",
              "tp2 ckpt m4", "pp2 ckpt m8", "dp2 zero3 ckpt m4")
"""The nine plans of the first loop (2022's space: dp, ZeRO, tp, pp GPipe/1F1B, full recomputation)."""


def plans() -> dict[str, Plan]:
    """Twenty plans: the nine of 2022's space, then today's (the module docstring says why each)."""
    def u(model: str = MODEL, **kw) -> Plan:
        return uniform_plan(4, global_batch=BATCH, model=model, cluster=CLUSTER, **kw)
    mixed = Plan(pp=1, stage_layers=(4,), layers=(L(tp=2), L(tp=2), L(dp=2, dp_type="zero3"), L(dp=2, dp_type="zero3")),
                 global_batch=BATCH, micro_batches=2, model=MODEL, cluster=CLUSTER)
    ep2 = u(MOE_MODEL, dp=2, micro_batches=2)
    ep2 = dataclasses.replace(ep2, layers=tuple(dataclasses.replace(s, ep=2) for s in ep2.layers))
    return {"dp2": u(dp=2), "dp2 zero2 m2": u(dp=2, dp_type="zero2", micro_batches=2),
            "pp2 m4 gpipe": u(pp=2, micro_batches=4, schedule="gpipe"), "tp2+zero3 mixed m2": mixed,
            "tp2 ckpt m2": u(tp=2, recompute="full", micro_batches=2),
            "dp2 zero3 m4": u(dp=2, dp_type="zero3", micro_batches=4),
            "tp2 ckpt m4": u(tp=2, recompute="full", micro_batches=4),
            "pp2 ckpt m8": u(pp=2, recompute="full", micro_batches=8),
            "dp2 zero3 ckpt m4": u(dp=2, dp_type="zero3", recompute="full", micro_batches=4),
            # today's space
            "tp2 vocab-tp2 m2": u(tp=2, vocab_tp=2, micro_batches=2),
            "pp2 zb_h1 m4": u(pp=2, schedule="zb_h1", micro_batches=4),
            "ulysses2 m2": u(sp="ulysses", ulysses=2, micro_batches=2),
            "tp2 sp m2": u(tp=2, sp="megatron", micro_batches=2),
            "pp2 v2 interleaved m8": u(pp=2, schedule="interleaved_1f1b", virtual_stages=2, micro_batches=8),
            "cp2 ring m4": u(cp=2, cp_comm="p2p", micro_batches=4),
            "tp2 sp selective m4": u(tp=2, sp="megatron", recompute="selective", micro_batches=4),
            "pp2 dualpipev m8": u(pp=2, schedule="dualpipev", virtual_stages=2, micro_batches=8),
            "moe dp2 m2": u(MOE_MODEL, dp=2, micro_batches=2), "moe ep2 m2": ep2,
            "moe tp2 m2": u(MOE_MODEL, tp=2, micro_batches=2)}


def _with_vocab(model):
    return dataclasses.replace(model, embedding=dataclasses.replace(model.embedding, vocab_size=VOCAB),
                               head=dataclasses.replace(model.head, output_size=VOCAB))


def _model():
    model = load_model(MODEL).scaled(**SCALE)
    layers = tuple(dataclasses.replace(l, num_heads=HEADS, head_dim=0) for l in model.layers)
    return _with_vocab(dataclasses.replace(model, layers=layers))


def _moe_model():
    return _with_vocab(load_model(MOE_MODEL).scaled(**SCALE))


def models() -> dict:
    """The scaled models by the name the plans carry (Plan.model)."""
    return {MODEL: _model(), MOE_MODEL: _moe_model()}


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
    """Kendall's tau-b of two rankings (scipy's; 1: the same order, -1: reversed)."""
    from scipy.stats import kendalltau
    return float(kendalltau(a, b).statistic)


def mape(predicted: list[float], measured: list[float]) -> float:
    """Mean absolute percentage error of ``predicted`` against ``measured`` (a fraction)."""
    return statistics.mean(abs(p - t) / t for p, t in zip(predicted, measured))


def memory_error(predicted: tuple[float, ...], measured: tuple[float, ...]) -> float:
    """Relative error of the predicted peak (the largest over stages/ranks) against the
    measured one (the largest over ranks)."""
    return abs(max(predicted) - max(measured)) / max(measured)


def selected(names: str | None) -> dict[str, Plan]:
    """plans(), or those named in a comma-separated list (an unknown name is refused)."""
    every = plans()
    if not names:
        return every
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in every]
    if unknown:
        raise RuntimeError(f"--plans: unknown {', '.join(map(repr, unknown))}; the plans: {', '.join(every)}")
    return {n: every[n] for n in every if n in wanted}


def _profiles(wanted: dict[str, Plan], the_models: dict, args, start: float) -> dict:
    """One profile per model the wanted plans use: read from --profile-dir when there, else
    measured (and written there when given)."""
    from executor.profile import build_profile
    from specs.profile_format import load_profile, save_profile
    out = {}
    for name in dict.fromkeys(p.model for p in wanted.values()):
        path = os.path.join(args.profile_dir, f"{name}.json") if args.profile_dir else None
        if path and os.path.exists(path):
            out[name] = load_profile(path)
            print(f"profile of {name}: read {path}")
            continue
        out[name] = build_profile(the_models[name], batch_sizes=[1, 2, 4], tps=[1, 2], world_size=2,
                                  repeats=args.repeats, max_error=args.max_error, timeout_s=1200)
        hw = out[name].hardware
        print(f"profile of {name}: {time.time() - start:.0f} s, relative standard error of the medians: median "
              f"{hw['median_error']:.3f}, max {hw['max_error']:.3f} (up to {hw['most_repeats']} repeats)", flush=True)
        if path:
            os.makedirs(args.profile_dir, exist_ok=True)
            save_profile(out[name], path)
    return out


def _check(wanted: dict[str, Plan], the_models: dict) -> list[str]:
    """Every plan's --check (one step against the one-process reference), held to the
    collectives the cost model charges, data- and model-parallel, as the executor runs them
    (``cost_models.expected_collectives``: its documented differences explicit); the plans that
    failed, with why."""
    import cost_models
    from executor.execution import CostPrediction
    from executor.run import check_lines, run_plan
    failed = []
    for name, plan in wanted.items():
        model = the_models[plan.model]
        prediction = CostPrediction(collectives=tuple(cost_models.expected_collectives(model, plan, 2)))
        m = run_plan(plan, model, world_size=2, steps=1, check=True, track_memory=False, timeout_s=600,
                     prediction=prediction)
        print(f"check {name:22s} {'PASSED' if m.check.passed else 'FAILED'}", flush=True)
        if not m.check.passed:
            failed.append(name + ": " + "; ".join(line.strip() for line in check_lines(m.check)))
    return failed


@one_line_errors(RuntimeError)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loop_accuracy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per plan and round (after --warmup)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them (each run is fresh processes)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="passes over the plans, one run of each per pass: a plan's time is the median "
                             "of its timed steps over all its runs, so a spell of load spreads over every plan")
    parser.add_argument("--repeats", type=int, default=5, help="profiler repeats (rounds over every timed quantity)")
    parser.add_argument("--max-error", type=float, default=None,
                        help="repeat the profile's noisy times until the relative standard error of their "
                             "medians is below this, and refuse it if one is not after 40 repeats "
                             "(default: accept, print its spread)")
    parser.add_argument("--plans", default=None, help="comma-separated plan names (default: all)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the --check pass (one step of every plan against the reference)")
    parser.add_argument("--profile-dir", default=None,
                        help="read each model's profile from DIR/MODEL.json when there, else measure it and "
                             "write it there (default: measure, keep nothing)")
    args = parser.parse_args(argv)
    from executor.run import run_plan
    wanted, the_models, cluster = selected(args.plans), models(), load_cluster(CLUSTER)
    start = time.time()
    print(f"load average at the start: {os.getloadavg()[0]:.2f} (the times mean something only near 0)")
    profiles = _profiles(wanted, the_models, args, start)
    failed = [] if args.no_check else _check(wanted, the_models)
    if not args.no_check:
        print(f"check: {len(wanted) - len(failed)}/{len(wanted)} passed ({time.time() - start:.0f} s)", flush=True)
    runs: dict[str, list] = {name: [] for name in wanted}
    for r in range(args.rounds):
        for name, plan in wanted.items():  # memory is deterministic: measured in the first round
            runs[name].append(run_plan(plan, the_models[plan.model], world_size=2, steps=args.steps, warmup=args.warmup,
                                       timeout_s=600, track_memory=r == 0))
        print(f"round {r + 1}/{args.rounds} done ({time.time() - start:.0f} s)", flush=True)
    rows = []
    for name, plan in wanted.items():
        cost, sim = predict_plan(the_models[plan.model], cluster, plan, profile=profiles[plan.model])
        m = _combined(runs[name])
        rows.append((name, m, cost, sim))
        _print_row(name, m, cost, sim, round_spread([r.step_time_s for r in runs[name]], m.step_time_s))
    groups = [("all plans", rows)]
    old = [r for r in rows if r[0] in SPACE_2022]
    if old and len(old) < len(rows):
        groups += [("2022's space", old), ("today's additions", [r for r in rows if r[0] not in SPACE_2022])]
    for label, group in groups:
        print(f"{label} ({len(group)}):")
        _summary(group)
    for line in failed:
        print(f"check FAILED: {line}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}; {time.time() - start:.0f} s in all")
    return 1 if failed else 0


def _combined(measurements: list):
    """One measurement from a plan's runs: the median of its timed steps, every timed step, and
    the first run's peak memory."""
    steps = tuple(t for m in measurements for t in m.step_times_s)
    return dataclasses.replace(measurements[0], step_time_s=statistics.median(steps), step_times_s=steps)


def round_spread(run_medians: list[float], time_s: float) -> float:
    """The spread of a plan's rounds: the largest run median less the smallest, over the plan's
    time (0 with one round)."""
    return (max(run_medians) - min(run_medians)) / time_s


def _print_row(name, m, cost, sim, spread: float) -> None:
    mem_meas = max(m.peak_memory_bytes) / 2**20
    mem_pred = max(cost.peak_memory_bytes) / 2**20
    mem_sim = max(sim.peak_memory_bytes) / 2**20
    fastest = min(m.step_times_s) * 1e3
    print(f"{name:22s} measured {m.step_time_s * 1e3:8.1f} ms (fastest {fastest:7.1f}, rounds {spread:4.0%})  "
          f"cost {cost.time_s * 1e3:8.1f} "
          f"({(cost.time_s - m.step_time_s) / m.step_time_s:+5.0%})  sim {sim.time_s * 1e3:8.1f} "
          f"({(sim.time_s - m.step_time_s) / m.step_time_s:+5.0%})  | peak MiB measured {mem_meas:6.1f} "
          f"cost {mem_pred:6.1f} ({(mem_pred - mem_meas) / mem_meas:+4.0%}) sim {mem_sim:6.1f} "
          f"({(mem_sim - mem_meas) / mem_meas:+4.0%})", flush=True)


def _summary(rows) -> None:
    measured = [m.step_time_s for _, m, _, _ in rows]
    for label, idx in (("cost model (profiled)", 2), ("simulator", 3)):
        pred = [r[idx].time_s for r in rows]
        mem = [memory_error(r[idx].peak_memory_bytes, r[1].peak_memory_bytes) for r in rows]
        tau = kendall_tau(pred, measured) if len(rows) > 1 else float("nan")
        print(f"  {label:22s} time MAPE {mape(pred, measured):.1%}  Kendall tau {tau:+.2f}  "
              f"memory error median {statistics.median(mem):.1%} worst {max(mem):.1%}")


if __name__ == "__main__":
    sys.exit(main())
