"""Head to head with Galvatron's own search engine on its LLaMA-2 7B profiles (8 GPUs; batch 64 at
16/24/40 GB, batch 16 at 36 GB; every chunk count, pp and tp up to 8), in matched spaces.

    python -m benchmarks.galvatron_head_to_head                  # 3 alternating pairs per budget
    python -m benchmarks.galvatron_head_to_head --repeats 1 --budgets 24
    python -m benchmarks.galvatron_head_to_head --engine-results data/galvatron_llama2_7b/engine_results.json
                                               # Galvatron's side from a recorded run of its engine

Galvatron runs through tools/galvatron_engine.py when hetu-galvatron is installed (recipe in that
file and docs/cost_models.md); otherwise one line says so and only our side is printed. Ours is the
galvatron planner restricted to Galvatron's space (ZeRO-2 default / ZeRO-3 per layer, checkpointing,
both tp layouts, 1F1B, even stages, and the vocabulary's vsp / embed_sdp, which Galvatron's engine
loops over, as the plan's vocab_sp ulysses / vocab_zero3) planning under the `galvatron` cost model
(SEARCHES: two calls, the second for vsp with vocabulary tp 1). Each plan is scored under
both cost models: `galvatron` (Galvatron's formulas; memory as its engine prints it, allocator
reserve included) and `profiled` (ours, on the same files; its own reserve shown apart).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import cost_models
import planners
from cost_models.galvatron import gplan_from_config
from planners import Budget, SearchSpace
from specs import SequenceParallel, SpecError, load_cluster
from specs.datasets import Dataset, data_path
from specs.errors import one_line_errors
from specs.galvatron_io import plan_from_galvatron

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "tools" / "galvatron_engine.py"
STUBS = ROOT / "tools" / "galvatron_stubs"
BUDGETS = ((16, 64), (24, 64), (40, 64), (36, 16))
"""(GB per GPU, global batch) as the issue and Galvatron's shipped 36 GB plan set them."""
SPACE = SearchSpace(dp_types=("zero2", "zero3"), max_micro_batches=64, vocab_zero3=(False, True),
                    vocab_sp=(SequenceParallel.NONE, SequenceParallel.ULYSSES))
"""Galvatron's space in hybridpar's terms (plus partition='even'): its embed_sdp and vsp are the
plan's vocab_zero3 and vocab_sp ulysses."""
SEARCHES = ((False, SPACE), (True, replace(SPACE, vocab_tp=(1,), vocab_sp=(SequenceParallel.NONE,))))
"""(the galvatron model's vsp switch, space) of our two searches: every (vsp, embed_sdp) pair
Galvatron's engine loops over as the plan says it, then vsp with vocabulary tp 1, which its
engine also searches and a Plan cannot say (the switch turns it on)."""


def engine_missing() -> str:
    """Why Galvatron's engine cannot run here ('' when it can)."""
    for module in ("galvatron", "galvatron_dp_core"):
        if importlib.util.find_spec(module) is None:
            return f"Galvatron's engine is not installed ({module} not importable); printing only hybridpar's side"
    return ""


def run_engine(folder: Path, gb: int, batch: int, keep: Path | None = None) -> tuple[float, dict | None]:
    """One search by Galvatron's engine: its own search wall time and its chosen plan (the run's
    JSON, every task's plan included, copied to ``keep`` when given)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "engine.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STUBS), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, str(ENGINE), "search", "--folder", str(folder), "--memory-gb", str(gb),
               "--batch", str(batch), "--log-dir", str(Path(tmp) / "logs"), "--out", str(out)]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.write_text(out.read_text())
        run = json.loads(out.read_text())[0]
    return run["search_wall_s"], run["chosen"]


def run_ours(models: dict, cluster, gb: int, batch: int):
    """Our search in the matched space (SEARCHES; ``models``: vsp switch -> galvatron model);
    (wall s, best result, its cost model)."""
    start, best = time.perf_counter(), (None, None)
    for vsp, space in SEARCHES:
        cm = models[vsp]
        res = planners.get("galvatron").plan(cm.model_spec, cluster, Budget(memory_gib=gb, global_batch=batch), cm,
                                             {"space": space, "partition": "even"})
        if res.feasible and (best[0] is None or res.throughput_samples_per_s > best[0].throughput_samples_per_s):
            best = (res, cm)
    return time.perf_counter() - start, best


def _galvatron_line(score, gb: int) -> str:
    fits = "fits" if max(score.stage_memory_mb) <= gb * 1024 else "OOM"
    return (f"{score.time_s:.4f} s/iter, memory {max(score.stage_memory_mb) / 1024:.2f} GB of {gb} "
            f"(reserve {score.reserve_mb / 1024:.2f} GB incl.) {fits}")


def _profiled_line(profiled, plan, gb: int) -> str:
    if plan is None:
        return "not expressible in hybridpar's Plan (Ulysses layers)"
    cost = profiled.plan_cost(profiled.model_spec, plan)
    reserve = profiled.allocator_reserve_bytes(gb * 2**30)
    fits = "fits" if cost.peak_memory_bytes + reserve <= gb * 2**30 else "OOM"
    return (f"{cost.iteration_time_s:.4f} s/iter, peak {cost.peak_memory_bytes / 2**30:.2f} GiB "
            f"+ reserve {reserve / 2**30:.2f} GiB of {gb} {fits}")


def report(gb, batch, ours, theirs, models, profiled, cluster) -> None:
    (res, cm), chosen = ours, theirs
    g = cm.gplan(res.plan) if res else None
    print(f"  hybridpar plan: {res.plan.summary() if res else 'none fits'}"
          + (f" (vsp {int(g.vsp)}, embed_sdp {int(g.embed_sdp)})" if res else ""))
    if res:
        print(f"    under galvatron: {_galvatron_line(cm.score(res.plan, gb * 2**30), gb)}")
        print(f"    under profiled:  {_profiled_line(profiled, res.plan, gb)}")
    if chosen is None:
        return
    config = chosen["config"]
    g = gplan_from_config(config, cluster.world_size, chosen["context"])
    variant = models[False]  # a GPlan carries its vsp and embed_sdp
    try:
        plan = plan_from_galvatron(config, cluster.world_size)
    except SpecError:
        plan = None
    label = plan.summary() if plan else f"{config['tp_sizes_enc']} (use_sp {config['use_sp']})"
    print(f"  Galvatron plan: {label} (vsp {config['vsp']}, embed_sdp {config['embed_sdp']}); "
          f"its engine printed {chosen['time_s']:.4f} s, {max(chosen['stage_memory_mb']) / 1024:.2f} GB")
    print(f"    under galvatron: {_galvatron_line(variant.score(g, gb * 2**30), gb)}")
    print(f"    under profiled:  {_profiled_line(profiled, plan, gb)}")


def _recorded(path: Path) -> dict:
    runs = json.loads(path.read_text())
    runs = runs["runs"] if isinstance(runs, dict) else runs
    best: dict = {}
    for r in runs:  # a complete run wins over interrupted ones; among those the one that got furthest
        key = (r["memory_gb"], r["global_batch"])
        rank = (r.get("complete", True), len(r.get("chunks_started", ())), len(r["tasks"]))
        if key not in best or rank > best[key][0]:
            best[key] = (rank, r)
    return {k: v for k, (_, v) in best.items()}


@one_line_errors()
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.galvatron_head_to_head", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="alternating (Galvatron, ours) pairs per budget")
    p.add_argument("--budgets", type=int, nargs="+", default=[b for b, _ in BUDGETS], help="GB per GPU")
    p.add_argument("--no-engine", action="store_true", help="print only hybridpar's side")
    p.add_argument("--engine-results", type=Path, help="take Galvatron's side (search time, chosen plan) "
                   "from this file written by tools/galvatron_engine.py instead of running the engine")
    p.add_argument("--engine-out", type=Path, help="keep each engine run's JSON in this folder "
                   "(engine_<GB>GB_bsz<batch>_<pair>.json; merge with tools/galvatron_engine.py collect)")
    args = p.parse_args(argv)
    recorded = _recorded(args.engine_results) if args.engine_results else {}
    folder, cluster = data_path(Dataset.GALVATRON_LLAMA2_7B), load_cluster("dgx-a100-80g")
    models = {vsp: cost_models.get("galvatron", cluster, vocab_sp=vsp) for vsp, _ in SEARCHES}
    profiled = cost_models.get("profiled", cluster, galvatron_dir=folder, model="llama2-7b")
    missing = "Galvatron's engine skipped (--no-engine); printing only hybridpar's side" if args.no_engine \
        else engine_missing()
    if recorded:
        missing = f"Galvatron's side recorded in {args.engine_results} (one engine run per budget)"
    if missing:
        print(missing)
    print(f"llama2-7b on {cluster.world_size} GPUs, Galvatron's profiles; median of {args.repeats} "
          f"alternating pair(s) per budget")
    for gb, batch in BUDGETS:
        if gb not in args.budgets:
            continue
        ours_s, theirs_s, ours, theirs = [], [], None, None
        for pair in range(args.repeats):
            if not missing:
                keep = args.engine_out / f"engine_{gb}GB_bsz{batch}_{pair}.json" if args.engine_out else None
                wall, theirs = run_engine(folder, gb, batch, keep)
                theirs_s.append(wall)
            wall, ours = run_ours(models, cluster, gb, batch)
            ours_s.append(wall)
        run = recorded.get((gb, batch))
        head = f"{gb} GB, batch {batch}: hybridpar search {statistics.median(ours_s):.1f} s"
        if run and not run.get("complete", True):
            theirs, wall = run["chosen"], run["elapsed_s_at_interruption"]
            head += (f", Galvatron's engine > {wall:.0f} s (interrupted; chunks {run['chunks_started']} started; "
                     f"> {wall / statistics.median(ours_s):.1f}x); its plan below is the best of the tasks it finished")
        elif run or theirs_s:
            if run:
                theirs_s, theirs = [run["search_wall_s"]], run["chosen"]
            ratio = statistics.median(theirs_s) / statistics.median(ours_s)
            head += f", Galvatron's engine {statistics.median(theirs_s):.1f} s ({ratio:.1f}x)"
            if len(theirs_s) > 1:
                head += " [pairs (engine, ours): " + ", ".join(f"({a:.1f}, {b:.1f})" for a, b in zip(theirs_s, ours_s)) + "]"
        print(head, flush=True)
        report(gb, batch, ours, theirs, models, profiled, cluster)
    _shipped(folder, models, profiled, cluster)
    return 0


def _shipped(folder: Path, models: dict, profiled, cluster) -> None:
    """The plan Galvatron ships for 36 GB (batch 16), scored under both models."""
    path = next(iter(sorted(folder.glob("galvatron_config_*36GB*.json"))), None)
    if path is None:
        return
    config = json.loads(path.read_text())
    g = gplan_from_config(config, cluster.world_size)
    plan = plan_from_galvatron(config, cluster.world_size)
    variant = models[False]  # a GPlan carries its vsp and embed_sdp
    print(f"Galvatron's shipped 36 GB plan ({path.name}): {plan.summary()} (vsp {config['vsp']}, "
          f"embed_sdp {config['embed_sdp']})")
    print(f"    under galvatron: {_galvatron_line(variant.score(g, 36 * 2**30), 36)}")
    print(f"    under profiled:  {_profiled_line(profiled, plan, 36)}")


if __name__ == "__main__":
    sys.exit(main())
