"""Search wall time of the galvatron DP, the MILP (ilp) and CP-SAT on growing problems, and a head
to head with Galvatron's own search inputs (its LLaMA-2 7B profiles, read by the profiled model).

    python -m benchmarks.planner_speed                 # every part but scale
    python -m benchmarks.planner_speed --part scaling --max-gpus 64
    python -m benchmarks.planner_speed --part head-to-head
    python -m benchmarks.planner_speed --part targets --repeats 3   # the speed targets, full space
    python -m benchmarks.planner_speed --part scale --repeats 3     # today's scale: 1024-16,384 H100
"""
from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import statistics
import sys
import time
from dataclasses import dataclass

import cost_models
import planners
from planners import Budget, PlanResult, SearchSpace
from specs import load_cluster, load_galvatron_plan, load_model
from specs.datasets import DATA_ROOT, Dataset
from specs.errors import one_line_errors
from specs.processes import worker_pool
from specs.units import GIB

PROFILES = DATA_ROOT / Dataset.GALVATRON_LLAMA2_7B.value
"""Galvatron's own LLaMA-2 7B profiles and plan (data/galvatron_llama2_7b)."""
SIZES = ((8, 24), (16, 32), (64, 48), (256, 64), (1024, 128))
"""(GPUs, layers): GPT-7.5B-shaped layers on DGX-A100 nodes."""
SPACES = {"base": SearchSpace.preset("galvatron"),
          "+zero2+ckpt": SearchSpace.preset("galvatron").widened(zero2=True, checkpoint=True)}


def _row(cells, widths=(6, 7, 12, 10, 10, 12, 14, 60)) -> str:
    return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))


SCALE_WIDTHS = (6, 7, 14, 14, 8, 10, 11, 9, 22, 30)


def scaling(args) -> None:
    print(_row(["GPUs", "layers", "space", "planner", "search s", "samples/s", "status", "plan"]))
    for gpus, layers in SIZES:
        if gpus > args.max_gpus:
            continue
        model = load_model("gpt-7.5b").scaled(num_layers=layers, name=f"gpt-7.5b-{layers}L")
        cluster = load_cluster(f"dgx-a100-80g:{max(1, gpus // 8)}")
        cm = cost_models.get("analytical", cluster)
        budget = Budget(memory_gib=args.budget_gib, global_batch=max(64, gpus))
        for space_name, space in SPACES.items():
            for name in args.planners:
                if not name.startswith("galvatron") and gpus > args.max_exact_gpus:
                    continue
                opts = {"space": space}
                if not name.startswith("galvatron"):
                    opts["time_limit_s"] = args.time_limit_s
                start = time.perf_counter()
                res = planners.get(name).plan(model, cluster, budget, cm, opts)
                wall = time.perf_counter() - start
                thr = f"{res.throughput_samples_per_s:.2f}" if res.feasible else "OOM"
                summary = res.plan.summary()[:60] if res.feasible else res.message[:60]
                print(_row([gpus, layers, space_name, name, f"{wall:.2f}", thr, res.stats.solver_status, summary]),
                      flush=True)


TARGETS = (("gpt3-175b", "dgx-a100-80g:128", 80, 1536), ("t5-large-48", "titan-16", 12, 64),
           ("llama2-70b", "dgx-h100:8", 80, 512))
"""Issue 16's cases on the full space: (model, cluster, GiB, global batch); targets < 5 s, < 10 s, < 5 s
proven optimal or with gap <= 0.5%."""
GAP_TOLERANCES = (0.0, 1e-4)
"""galvatron's gap_tolerance: the default (search until proven) and the MIP solvers' usual 1e-4."""


def targets(args) -> None:
    """Wall time (median of --repeats), its split (tables / group DP, of which the proof of open
    groups / outer loops), status and gap."""
    print(_row(["GPUs", "layers", "model", "gap tolerance", "wall s", "samples/s", "status",
                "gap | tables s, DP s (proof s), outer s"]))
    for (name, cluster_name, gib, batch), tolerance in itertools.product(TARGETS, GAP_TOLERANCES):
        model, cluster = load_model(name), load_cluster(cluster_name)
        runs = []
        for _ in range(args.repeats):
            cm = cost_models.get("analytical", cluster)  # fresh: tables are not shared between repeats
            opts = {"space": "full", "time_limit_s": args.galvatron_limit_s, "gap_tolerance": tolerance}
            runs.append(planners.get("galvatron").plan(model, cluster, Budget(memory_gib=gib, global_batch=batch),
                                                        cm, opts))
        res = sorted(runs, key=lambda r: r.stats.wall_time_s)[len(runs) // 2]
        st = res.stats
        gap = "none" if st.gap is None else f"{st.gap * 100:.2f}%"
        split = (f"{st.tables_s:.1f}, {st.groups_s:.1f} ({st.proof_s:.1f}), "
                 f"{st.wall_time_s - st.tables_s - st.groups_s:.1f}")
        thr = f"{res.throughput_samples_per_s:.2f}" if res.feasible else "OOM"
        print(_row([cluster.world_size, model.num_layers, name, f"{tolerance:g}", f"{st.wall_time_s:.2f}", thr,
                    st.solver_status,
                    f"{gap} | {split}"]), flush=True)
    from runners import cells, compare
    walls = []
    for _ in range(args.repeats):
        cells.forget_contexts()  # each run builds its own cost model and tables, as a fresh process does
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            compare.main(["--no-progress"])
        walls.append(time.perf_counter() - start)
    print(f"default compare (python -m planners.compare): median {statistics.median(walls):.2f} s "
          f"of {len(walls)} run(s)", flush=True)


@dataclass(frozen=True, kw_only=True)
class ScaleCase:
    """One search at today's scale: a zoo model on H100 nodes (8 GPUs each), 80 GiB, one global batch."""

    model: str
    """Zoo name."""
    nodes: int
    """dgx-h100 nodes (8 GPUs each)."""
    global_batch: int
    """Samples per iteration."""
    planner: str
    target_s: float | None
    """Wall-time target; None: the search must finish within the time limit (the baselines)."""
    gap_suffices: bool = False
    """The target holds with a proven gap (else only proven optimal, or a finished baseline)."""
    gib: float = 80.0

    @property
    def cluster(self) -> str:
        return f"dgx-h100:{self.nodes}"

    def met(self, res: PlanResult) -> bool:
        """Whether ``res`` meets this case's target."""
        st = res.stats
        if self.target_s is None:
            return st.solver_status == "exhaustive"
        proven = st.solver_status == "optimal" or (self.gap_suffices and res.feasible and st.gap is not None)
        return proven and st.wall_time_s <= self.target_s


SCALE = (ScaleCase(model="deepseek-v3", nodes=256, global_batch=4096, planner="galvatron_moe", target_s=15.0,
                   gap_suffices=True),
         ScaleCase(model="deepseek-v3", nodes=256, global_batch=4096, planner="megatron_moe", target_s=None),
         ScaleCase(model="deepseek-v3", nodes=256, global_batch=4096, planner="deepspeed_moe", target_s=None),
         ScaleCase(model="llama3.1-405b", nodes=2048, global_batch=2048, planner="galvatron", target_s=10.0),
         ScaleCase(model="llama3-70b", nodes=128, global_batch=2048, planner="galvatron", target_s=5.0))
"""DeepSeek-V3 on 2048 H100 at 4096 sequences (16M tokens at its 4k context), its MoE baselines on
the same; the 126-layer 405B model on 16,384 H100 and llama3-70b on 1024 H100 at 2048 sequences
(16M tokens at 8k: Llama 3's batch at 16K GPUs). galvatron on the full space, galvatron_moe on
its own MoE space; targets: proven optimal or with a proven gap within the time (the 405B and
70B searches: optimal), the baselines finishing."""


def _scale_run(case: ScaleCase, limit_s: float) -> PlanResult:
    """One search of ``case`` under ``limit_s``."""
    model, cluster = load_model(case.model), load_cluster(case.cluster)
    budget = Budget(memory_gib=case.gib, global_batch=case.global_batch)
    return planners.get(case.planner).plan(model, cluster, budget, cost_models.get("analytical", cluster),
                                           {"time_limit_s": limit_s})


def scale(args) -> None:
    """Medians of --repeats, every search under --scale-limit-s, each in a process of its own
    forked from this one, which searches nothing: the cost model's topology answers are cached
    per process, so a repeat in the same process would find them and time what a second call
    costs, not the first."""
    print(_row(["GPUs", "layers", "model", "planner", "wall s", "samples/s", "status", "gap",
                "tables / DP / outer s", "target"], SCALE_WIDTHS))
    for case in SCALE:
        runs = []
        for _ in range(args.repeats):
            with worker_pool(1) as pool:
                runs.append(pool.submit(_scale_run, case, args.scale_limit_s).result())
        res = sorted(runs, key=lambda r: r.stats.wall_time_s)[len(runs) // 2]
        model, cluster = load_model(case.model), load_cluster(case.cluster)
        st = res.stats
        gap = "none" if st.gap is None else f"{st.gap * 100:.2f}%"
        split = f"{st.tables_s:.1f} / {st.groups_s:.1f} / {st.wall_time_s - st.tables_s - st.groups_s:.1f}"
        thr = f"{res.throughput_samples_per_s:.2f}" if res.feasible else "none"
        target = "finishes" if case.target_s is None else f"<= {case.target_s:g} s" + (
            ", gap" if case.gap_suffices else ", optimal")
        target += ": met" if case.met(res) else ": missed"
        print(_row([cluster.world_size, model.num_layers, case.model, case.planner, f"{st.wall_time_s:.2f}", thr,
                    st.solver_status, gap, split, target], SCALE_WIDTHS), flush=True)
        if not res.feasible:
            print(f"  {res.message}", flush=True)


def head_to_head(args) -> None:
    if not PROFILES.exists():
        print(f"skipped: Galvatron's profiles not found at {PROFILES}")
        return
    cluster = load_cluster("dgx-a100-80g")
    cm = cost_models.get("profiled", cluster, galvatron_dir=PROFILES, model="llama2-7b")
    model = cm.model_spec
    print(f"{model.name}: {model.num_layers} layers, seq {model.seq_len}, {cluster.world_size} GPUs, profiled cost "
          "model on Galvatron's own files; global batch 64, every micro-batch count, pp and tp <= 8")
    for gib in (16, 24, 40):
        _one(model, cluster, cm, Budget(memory_gib=gib, global_batch=64), args)
    shipped = sorted(PROFILES.glob("galvatron_config_*36GB*.json"))
    if shipped:
        plan = load_galvatron_plan(shipped[0], cluster.world_size)
        cost = cm.plan_cost(model, plan)
        print(f"Galvatron's shipped 36 GB plan (global batch {plan.global_batch}): {cost.iteration_time_s:.3f} s, "
              f"{cost.throughput_samples_per_s:.2f} samples/s, peak {cost.peak_memory_bytes / GIB:.2f} GiB | "
              f"{plan.summary()}")
        _one(model, cluster, cm, Budget(memory_gib=36, global_batch=plan.global_batch), args)


def public_loss(args) -> None:
    """What Galvatron's public search gives up: whole-MiB memory bins and even stage splits."""
    cases = [("bert-huge-32 on titan-8, analytical, batch 32", *_bert_case(), 32, (8, 12, 16, 20))]
    if PROFILES.exists():
        cluster = load_cluster("dgx-a100-80g")
        cm = cost_models.get("profiled", cluster, galvatron_dir=PROFILES, model="llama2-7b")
        cases.append(("llama2-7b on 8 A100, Galvatron's profiles, batch 64", cm.model_spec, cluster, cm, 64,
                      (16, 20, 24, 40)))
    variants = {"exact": {}, "MiB bins": {"memory_granularity_mib": 1.0},
                "even split": {"partition": "even"},
                "bins + even": {"memory_granularity_mib": 1.0, "partition": "even"}}
    for title, model, cluster, cm, batch, budgets in cases:
        print(title)
        for space_name in ("galvatron", "full"):
            for gib in budgets:
                budget = Budget(memory_gib=gib, global_batch=batch)
                out = {}
                for label, opts in variants.items():
                    res = planners.get("galvatron").plan(model, cluster, budget, cm, {"space": space_name, **opts})
                    out[label] = res.throughput_samples_per_s if res.feasible else 0.0
                ref = out["exact"]
                cells = ", ".join(f"{k} {v:.2f} ({(v / ref - 1) * 100:+.2f}%)" for k, v in out.items()) if ref \
                    else "nothing fits"
                print(f"  space {space_name}, {gib} GiB: {cells}", flush=True)


def _bert_case():
    cluster = load_cluster("titan-8")
    return load_model("bert-huge-32"), cluster, cost_models.get("analytical", cluster)


def _one(model, cluster, cm, budget, args) -> None:
    for name in args.h2h_planners:
        opts = {} if name.startswith("galvatron") else {"time_limit_s": args.time_limit_s}
        start = time.perf_counter()
        res = planners.get(name).plan(model, cluster, budget, cm, opts)
        wall = time.perf_counter() - start
        head = f"  {name} @ {budget.memory_gib:g} GiB, batch {budget.global_batches()[0]}: search {wall:.2f} s"
        if res.feasible:
            print(f"{head}, predicted {res.iteration_time_s:.3f} s/iter, {res.throughput_samples_per_s:.2f} samples/s, "
                  f"peak {res.peak_memory_gib:.2f} GiB, {res.stats.solver_status} | {res.plan.summary()}", flush=True)
        else:
            print(f"{head}: {res.message}", flush=True)


@one_line_errors()
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.planner_speed", description=__doc__)
    p.add_argument("--part", choices=("all", "scaling", "head-to-head", "public-loss", "targets", "scale"),
                   default="all")
    p.add_argument("--repeats", type=int, default=1, help="targets, scale: runs per case (the median is printed)")
    p.add_argument("--scale-limit-s", type=float, default=120.0, help="scale: every search's time_limit_s")
    p.add_argument("--galvatron-limit-s", type=float, default=120.0, help="targets: galvatron's time_limit_s")
    p.add_argument("--planners", nargs="+", default=["galvatron", "ilp", "cpsat"])
    p.add_argument("--h2h-planners", nargs="+", default=["galvatron_classic"])
    p.add_argument("--max-gpus", type=int, default=1024)
    p.add_argument("--max-exact-gpus", type=int, default=16, help="largest size given to ilp/cpsat")
    p.add_argument("--time-limit-s", type=float, default=60.0, help="per group, for ilp/cpsat")
    p.add_argument("--budget-gib", type=float, default=40.0)
    args = p.parse_args(argv)
    if args.part in ("all", "scaling"):
        scaling(args)
    if args.part in ("all", "head-to-head"):
        head_to_head(args)
    if args.part in ("all", "public-loss"):
        public_loss(args)
    if args.part in ("all", "targets"):
        targets(args)
    if args.part == "scale":  # minutes per repeat: not part of all
        scale(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
