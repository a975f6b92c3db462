"""How close the analytical model (and, for small runs, the simulator) comes to published
training runs it never saw: H100, H200 and A100; torchtitan, Megatron-Bridge, Llama 3.

``python -m benchmarks.published_runs`` predicts every row of data/published_runs (never
fitted; each cluster's own calibration status is printed) and reports, by GPU, precision and
framework and for all BF16 and all FP8 runs, MAPE, worst error and Kendall's tau, and the runs
the model cannot state and why; the FP8/BF16 speedup of each pair of runs that differ only in
precision, among these rows and in torchtitan's pairs of data/h100_fp8_calibration (not fitted).
``--sim`` also plays the runs of at most ``--sim-max-gpus`` GPUs in the simulator.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass, replace
from typing import Sequence

from specs import (ClusterSpec, CPComm, DPType, EPDispatcher, LayerStrategy, ModelSpec, Plan, Recompute, Schedule,
                   SequenceParallel, chunk_layout, even_stage_layers, load_cluster, load_model, stage_sums,
                   uniform_plan)
from specs.layer_parts import LEARNED, ROUTINGS
from specs.datasets import Dataset, data_path
from specs.errors import SpecError, one_line_errors
from specs.stack import STACKS, SoftwareStack
from specs.precision import Precision

RUN_PRECISIONS = {"bf16": Precision.BF16, "fp8-tensorwise": Precision.FP8_CURRENT,
                  "fp8-current": Precision.FP8_CURRENT, "fp8-delayed": Precision.FP8_DELAYED, "mxfp8": Precision.MXFP8}
"""The rows' precision column as a plan's (torchao's tensorwise Float8 is per-tensor current
scaling, as Transformer Engine's FP8-CS); others (rowwise) cannot be stated."""


@dataclass(frozen=True)
class PublishedRun:
    """One row of data/published_runs/published_runs.csv (its PROVENANCE.md names the columns)."""

    id: str
    cluster: str
    gpus: int
    model: str
    framework: str
    software: str
    precision: str
    tp: int
    pp: int
    dp: int
    cp: int
    dp_type: str
    virtual_stages: int
    micro_batch: int
    global_batch: int
    seq_len: int
    recompute: str
    attention: str
    """eager or flash (specs.model.ATTENTION_KINDS): every framework here runs a fused kernel."""
    measured_metric: str
    measured_value: float
    memory_gib: float | None
    source: str
    ep: int = 1
    """Expert-parallel degree of the model's MoE layers (1: dense, or unstated), carved out of
    the data-parallel ranks as Megatron-Core and FSDP2 with expert parallelism do."""
    tp_comm_overlap: bool = False
    """The TP collectives overlap their GEMMs as the source's configuration states (Transformer
    Engine userbuffers, torchtitan's async TP; Plan.tp_comm_overlap, with Megatron-SP, which both need)."""
    sequence_parallel: bool = False
    """The layers run Megatron-SP (norms and residuals on s / tp tokens between an all-gather and a
    reduce-scatter) as the source's code or recipe states: torchtitan's TP plan always does,
    Megatron-Bridge's recipes set it; required by tp_comm_overlap."""
    ep_dispatcher: str = EPDispatcher.ALL_TO_ALL
    """How the source's MoE layers dispatch tokens to experts (Plan.ep_dispatcher; empty: all_to_all)."""
    routing: str = LEARNED
    """Which experts the source's router sends a token to (MoESpec.routing; empty: the model's own,
    learned): a benchmark gate such as AutoModel's fake balanced one is the run's routing, not the model's."""
    cp_comm: str = CPComm.P2P
    """How the context-parallel layers exchange K and V (LayerStrategy.cp_comm; empty: p2p, the
    ring Megatron-Core and torchtitan run by default): all_gather where the source says so."""

    @property
    def gpu(self) -> str:
        """The GPU family, from the cluster name's node type (h100-500w -> h100-500w)."""
        return self.cluster.split(":")[0].removeprefix("dgx-")

    def measured_iteration_s(self, model: ModelSpec) -> float:
        """Seconds per iteration from the published throughput: tokens per iteration over the
        cluster's tokens per second (TFLOPS/GPU through 6 N + 12 L h s FLOPs per token)."""
        tokens = self.global_batch * self.seq_len
        per_gpu = self.measured_value
        if self.measured_metric == "tflops_per_gpu":
            per_gpu = self.measured_value * 1e12 / flops_per_token(model, self.seq_len)
        elif self.measured_metric != "tokens_per_s_per_gpu":
            raise SpecError("measured_metric", f"{self.id}: unknown {self.measured_metric!r}")
        return tokens / (per_gpu * self.gpus)


INT_FIELDS = ("gpus", "tp", "pp", "dp", "cp", "virtual_stages", "micro_batch", "global_batch", "seq_len")
OPTIONAL_INT_FIELDS = {"ep": 1}
"""Integer columns a row may leave empty, with the value an empty one means."""
BOOLS = {"true": True, "false": False}
BOOL_FIELDS = ("tp_comm_overlap", "sequence_parallel")
"""Columns of ``BOOLS`` values."""
CHOICE_FIELDS = {"ep_dispatcher": tuple(str(d) for d in EPDispatcher), "routing": ROUTINGS,
                 "cp_comm": tuple(str(c) for c in CPComm)}
"""Columns of named choices a row may leave empty (the first choice)."""


def load_runs() -> list[PublishedRun]:
    """Every row, typed; a malformed row is one SpecError naming its id and field."""
    out = []
    with open(data_path(Dataset.PUBLISHED_RUNS), newline="") as f:
        for row in csv.DictReader(f):
            try:
                typed = {k: int(row[k]) for k in INT_FIELDS}
                typed |= {k: int(row.get(k) or default) for k, default in OPTIONAL_INT_FIELDS.items()}
                typed |= {k: _bool(row, k) for k in BOOL_FIELDS}
                if typed["tp_comm_overlap"] and not typed["sequence_parallel"]:
                    raise ValueError("tp_comm_overlap true needs sequence_parallel true (the overlap splits "
                                     "Megatron-SP's all-gathers and reduce-scatters)")
                typed |= {k: _choice(row, k, choices) for k, choices in CHOICE_FIELDS.items()}
                _check_recompute(row["recompute"])
                if typed["cp"] == 1 and typed["cp_comm"] != CPComm.P2P:
                    raise ValueError(f"cp_comm {typed['cp_comm']} needs cp > 1 (cp is 1: no K/V to exchange)")
                mem = float(row["memory_gib"]) if row["memory_gib"] else None
                out.append(PublishedRun(**{k: row[k] for k in ("id", "cluster", "model", "framework", "software",
                                                               "precision", "dp_type", "recompute",
                                                               "attention", "measured_metric", "source")},
                                        **typed, measured_value=float(row["measured_value"]), memory_gib=mem))
            except (KeyError, ValueError) as err:
                raise SpecError(f"published_runs[{row.get('id', '?')}]", str(err)) from None
    return out


ASYNC_TP_SUFFIX = "+asynctp"
"""A pairs-file software with torchtitan's async TP (compile + Plan.tp_comm_overlap)."""


def load_pair_runs() -> list[tuple[str, PublishedRun]]:
    """torchtitan's BF16/FP8 pairs on the 500 W H100s (data/h100_fp8_calibration, not fitted: that
    folder's fit reads NeMo's table only) as (pair, run): torchtitan's TP plan with Megatron-SP, its
    async TP where the software says so; a malformed row is one SpecError naming its pair."""
    out = []
    with open(data_path(Dataset.H100_FP8_CALIBRATION) / "torchtitan_h100_bf16_fp8_pairs.csv", newline="") as f:
        for row in csv.DictReader(f):
            try:
                degrees = {k: int(row[k]) for k in ("gpus", "tp", "dp", "global_batch", "seq_len")}
                software = row["software"].removesuffix(ASYNC_TP_SUFFIX)
                run = PublishedRun(
                    id=f"{row['pair']}-{row['precision']}", cluster="h100-500w", model=row["model"],
                    framework="torchtitan", software=software, precision=row["precision"], pp=1, cp=1,
                    dp_type=row["dp_type"], virtual_stages=1, micro_batch=int(row["local_batch"]),
                    recompute=row["recompute"], attention="flash", measured_metric="tokens_per_s_per_gpu",
                    measured_value=float(row["tokens_per_s_per_gpu"]), source=row["source"],
                    memory_gib=float(row["memory_gib"]) if row["memory_gib"] else None,
                    tp_comm_overlap=software != row["software"], sequence_parallel=degrees["tp"] > 1, **degrees)
            except (KeyError, ValueError) as err:
                raise SpecError(f"torchtitan_h100_bf16_fp8_pairs[{row.get('pair', '?')}]", str(err)) from None
            out.append((row["pair"], run))
    return out


def _check_recompute(value: str) -> None:
    """A recompute column: a Recompute value, a per-layer pattern, or BLOCK_PREFIX + a positive count."""
    count = value.removeprefix(BLOCK_PREFIX)
    if value in (*Recompute, *LAYER_PATTERNS) or value.startswith(BLOCK_PREFIX) and count.isdigit() and int(count) > 0:
        return
    raise ValueError(f"recompute {value!r} is not one of {', '.join((*Recompute, *LAYER_PATTERNS))} or "
                     f"{BLOCK_PREFIX}N (N > 0)")


def _bool(row: dict, key: str) -> bool:
    """The row's ``key``: true or false."""
    if row[key] not in BOOLS:
        raise ValueError(f"{key} {row[key]!r} is not true or false")
    return BOOLS[row[key]]


def _choice(row: dict, key: str, choices: tuple[str, ...]) -> str:
    """The row's ``key``, one of ``choices`` (empty: the first)."""
    value = row.get(key) or choices[0]
    if value not in choices:
        raise ValueError(f"{key} {value!r} is not one of {', '.join(choices)}")
    return value


def flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """6 N + 12 L h s: torchtitan's model FLOPs per token (N all parameters), the count that
    reproduces its published MFU figures."""
    h = model.layers[0].hidden_size
    return 6 * model.param_count() + 12 * model.num_layers * h * seq_len


def cannot_state(run: PublishedRun) -> str:
    """Why the model cannot express ``run`` today ('' when it can)."""
    reasons = []
    if run.precision not in RUN_PRECISIONS:
        reasons.append(f"precision {run.precision} not modelled yet")
    if run.tp * run.pp * run.dp * run.cp != run.gpus:
        reasons.append(f"tp*pp*dp*cp = {run.tp * run.pp * run.dp * run.cp} != {run.gpus} GPUs")
    return "; ".join(reasons)


def cluster_for(run: PublishedRun) -> ClusterSpec:
    """The row's node type, as many nodes as the run used (fewer GPUs than a node: a part of one)."""
    base = load_cluster(run.cluster)
    if run.gpus < base.gpus_per_node:
        return replace(base, gpus_per_node=run.gpus, nodes=1, name=f"{base.name}-{run.gpus}gpu")
    if run.gpus % base.gpus_per_node:
        raise SpecError("gpus", f"{run.id}: {run.gpus} GPUs is not whole {base.name} nodes")
    return base.with_nodes(run.gpus // base.gpus_per_node)


def stack_for(run: PublishedRun) -> SoftwareStack:
    """The kernels the row's software runs (specs.stack): torchtitan's eager and compile rows as
    such; Megatron-Core, NeMo AutoModel's Transformer Engine layers and unstated software as
    megatron-te (fused)."""
    return SoftwareStack(run.software) if run.software in STACKS else SoftwareStack.MEGATRON_TE


def model_for(run: PublishedRun) -> ModelSpec:
    """The row's zoo model at its sequence length and attention kernel, its MoE layers routing as the run did."""
    model = load_model(run.model).with_seq_len(run.seq_len).with_attention(run.attention)
    if run.routing == LEARNED:
        return model
    return replace(model, layers=tuple(replace(spec, moe=replace(spec.moe, routing=run.routing)) if spec.moe else spec
                                       for spec in model.layers))


def plan_for(run: PublishedRun, model: ModelSpec) -> Plan:
    """Uniform layers as the row states them, every layer in the row's precision (none of the
    sources keeps layers in BF16); the vocabulary split like the layers (Megatron and torchtitan
    shard the output layer over tp, and FSDP shards the embedding); MoE layers' experts over the
    row's ep and its expert dispatcher; the row's software stack, Megatron-SP and TP communication
    overlap; a pipeline's stages and chunks as its framework lays them out (``pipeline_layout``)."""
    per_layer = run.recompute not in tuple(Recompute)  # a per-layer pattern (load_runs checked it)
    schedule = Schedule.INTERLEAVED_1F1B if run.virtual_stages > 1 else Schedule.ONE_F_ONE_B
    plan = uniform_plan(model.num_layers, tp=run.tp, dp=run.dp, pp=run.pp, cp=run.cp, cp_comm=run.cp_comm,
                        global_batch=run.global_batch, micro_batches=run.global_batch // (run.dp * run.micro_batch),
                        dp_type=run.dp_type, recompute=Recompute.NONE if per_layer else run.recompute,
                        sp=SequenceParallel.MEGATRON if run.sequence_parallel else SequenceParallel.NONE)
    stage_layers, chunk_layers = pipeline_layout(run, model.num_layers, schedule) if run.pp > 1 else (plan.stage_layers, ())
    layers = plan.layers
    if per_layer:
        layers = tuple(replace(s, recompute=r) for s, r in zip(layers, layer_recompute(run.recompute,
                                                                                       chunk_layers or stage_layers)))
    layers = tuple(replace(s, precision=RUN_PRECISIONS[run.precision]) for s in layers)
    if run.ep > 1:  # the routed experts split over ep groups of the data-parallel ranks
        layers = tuple(_expert_parallel(s, run.ep) if spec.moe is not None else s
                       for s, spec in zip(layers, model.layers))
    return replace(plan, layers=layers, schedule=schedule, virtual_stages=run.virtual_stages, stage_layers=stage_layers,
                   chunk_layers=chunk_layers, vocab_tp=run.tp,
                   vocab_zero3=run.dp_type == "zero3", stack=stack_for(run), tp_comm_overlap=run.tp_comm_overlap,
                   ep_dispatcher=run.ep_dispatcher)


LAYER_PATTERNS = ("full-every-2nd",)
"""Recompute columns that vary by layer: torchtitan's "selective layer" AC (every other block in
full), and BLOCK_PREFIX + N."""
BLOCK_PREFIX = "full-block-"
"""Megatron's --recompute-method block: the first N layers of every model chunk in full."""


def layer_recompute(recompute: str, chunk_layers: Sequence[int]) -> list[Recompute]:
    """Each layer's recomputation under a per-layer ``recompute`` column, the model's layers in
    chunks of ``chunk_layers``."""
    if recompute == "full-every-2nd":
        return [Recompute.FULL if i % 2 == 0 else Recompute.NONE for i in range(sum(chunk_layers))]
    first = int(recompute.removeprefix(BLOCK_PREFIX))
    return [Recompute.FULL if i < first else Recompute.NONE for n in chunk_layers for i in range(n)]


def pipeline_layout(run: PublishedRun, num_layers: int, schedule: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(stage_layers, chunk_layers) as the row's framework splits its layers: NeMo AutoModel's
    AutoPipeline gives the first num_layers % chunks chunks one layer more (its
    generate_hf_model_fqn_per_model_part, read at 89e3a9f: 61 layers on 32 chunks are 2 x 29 +
    1 x 3); the others ``chunk_layout``, Megatron's split with the embedding and the loss counted
    as layers (torchtitan's generate_split_points at 9dec370 gives the same for its rows)."""
    if run.framework != "nemo-automodel":
        return chunk_layout(num_layers, run.pp, run.virtual_stages, schedule)
    counts = even_stage_layers(num_layers, run.pp * run.virtual_stages)
    return stage_sums(counts, run.pp, run.virtual_stages, schedule), counts


def _expert_parallel(strategy: LayerStrategy, ep: int) -> LayerStrategy:
    """A MoE layer's strategy with its experts over ``ep`` ranks; where that leaves each expert on
    one rank (ep * expert tp = the stage's GPUs), nothing is left to shard or sync: plain DDP."""
    out = replace(strategy, ep=ep)
    return replace(out, expert_dp_type=DPType.DDP) if out.expert_dp == 1 else out


@dataclass(frozen=True)
class Prediction:
    run: PublishedRun
    reason: str = ""
    """Why the run cannot be stated ('' when predicted)."""
    measured_s: float = math.nan
    predicted_s: float = math.nan
    predicted_gib: float = math.nan
    gpu_gib: float = math.nan
    """Memory of the run's GPU: a prediction above it says the assumed plan is not the run's."""
    sim_s: float = math.nan
    calibration: str = ""

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def predict(run: PublishedRun, sim_max_gpus: int = 0) -> Prediction:
    """The analytical model's (and the simulator's, up to ``sim_max_gpus``) iteration time."""
    from cost_models.analytical import AnalyticalModel
    reason = cannot_state(run)
    if reason:
        return Prediction(run, reason=reason)
    model = model_for(run)
    cluster = cluster_for(run)
    cm = AnalyticalModel(cluster, stack=stack_for(run))
    try:
        plan = plan_for(run, model)
        cost = cm.plan_cost(model, plan)
    except SpecError as err:  # the row's configuration as read is not a plan (a stated field missing)
        return Prediction(run, reason=f"the row's plan: {err}")
    sim = math.nan
    if sim_max_gpus and run.gpus <= sim_max_gpus:
        from simulator.engine import simulate
        sim = simulate(model, cluster, plan, cm, record_memory=False).iteration_time_s
    return Prediction(run, measured_s=run.measured_iteration_s(model), predicted_s=cost.iteration_time_s,
                      predicted_gib=cost.peak_memory_bytes / 2**30, gpu_gib=cluster.gpu.memory_gib, sim_s=sim,
                      calibration=cm.calibration_status())


def precision_kind(run: PublishedRun) -> str:
    """bf16 or fp8 (every FP8 recipe), the split of the summary rows."""
    return "bf16" if run.precision == "bf16" else "fp8"


def group_rows(predictions: Sequence[Prediction]) -> list[list]:
    """By GPU, precision and framework, then all BF16 runs, all FP8 runs and all runs: runs,
    stated, MAPE, worst, tau."""
    from scipy.stats import kendalltau
    keys = sorted({(p.run.gpu, p.run.precision, p.run.framework) for p in predictions})
    summaries = [("all", "bf16", ""), ("all", "fp8", ""), ("all", "", "")]
    rows = []
    for key in [*keys, *summaries]:
        if key[0] == "all":
            group = [p for p in predictions if key[1] in ("", precision_kind(p.run))]
        else:
            group = [p for p in predictions if (p.run.gpu, p.run.precision, p.run.framework) == key]
        stated = [p for p in group if not p.reason]
        errs = [abs(p.error) * 100 for p in stated]
        tau = (kendalltau([p.predicted_s for p in stated], [p.measured_s for p in stated]).statistic
               if len(stated) > 2 else math.nan)
        worst = max(stated, key=lambda p: abs(p.error), default=None)
        rows.append([*key, len(group), len(stated), sum(errs) / len(errs) if errs else math.nan,
                     worst.error * 100 if worst else math.nan, tau])
    return rows


ZERO3_BANDS = ((1, 8), (9, 128), (129, 1 << 20))
"""ZeRO-3 (FSDP) group sizes, dp x cp, reported apart: one node, up to 128 ranks (where the
dense FSDP runs here stop), and beyond: the regime the planners lean on at scale, which
cost_models/coverage.py counts as covered up to the largest ZeRO-3 group in the set."""


def regime_rows(predictions: Sequence[Prediction]) -> list[list]:
    """The ZeRO-3 regime on its own: per band of ZeRO-3 group size, then every other run: runs,
    stated, MAPE, worst."""
    def band(r: PublishedRun) -> str:
        if r.dp_type != "zero3":
            return "not ZeRO-3"
        lo, hi = next(b for b in ZERO3_BANDS if b[0] <= r.dp * r.cp <= b[1])
        return f"ZeRO-3 over {lo}-{hi} ranks" if hi < ZERO3_BANDS[-1][1] else f"ZeRO-3 over more than {lo - 1} ranks"
    names = [band(r) for r in (p.run for p in predictions)]
    rows = []
    for name in [*(f"ZeRO-3 over {lo}-{hi} ranks" for lo, hi in ZERO3_BANDS[:-1]),
                 f"ZeRO-3 over more than {ZERO3_BANDS[-1][0] - 1} ranks", "not ZeRO-3"]:
        group = [p for p, n in zip(predictions, names) if n == name]
        stated = [p for p in group if not p.reason]
        errs = [abs(p.error) * 100 for p in stated]
        worst = max(stated, key=lambda p: abs(p.error), default=None)
        rows.append([name, len(group), len(stated), sum(errs) / len(errs) if errs else math.nan,
                     worst.error * 100 if worst else math.nan])
    return rows


def speedup_rows(predictions: Sequence[Prediction]) -> list[list]:
    """FP8/BF16 speedup of each FP8 run whose configuration (model, GPUs, degrees, batch, software)
    also ran in BF16: measured and predicted (target: within 5% of each other)."""
    def config(r: PublishedRun) -> tuple:
        return (r.model, r.cluster, r.gpus, r.tp, r.pp, r.dp, r.cp, r.global_batch, r.seq_len, r.software)
    bf16 = {config(p.run): p for p in predictions if p.run.precision == "bf16" and not p.reason}
    rows = []
    for p in predictions:
        base = bf16.get(config(p.run))
        if p.run.precision != "bf16" and base is not None and not p.reason:
            measured, predicted = base.measured_s / p.measured_s, base.predicted_s / p.predicted_s
            rows.append([p.run.id, base.run.id, measured, predicted, (predicted / measured - 1) * 100])
    return rows


def pair_rows(pairs: Sequence[tuple[str, Prediction]]) -> list[list]:
    """FP8/BF16 speedup (tokens/s over tokens/s) of each non-BF16 run of a named pair against the
    pair's BF16 run: measured, and predicted or why it cannot be stated."""
    bf16 = {name: p for name, p in pairs if p.run.precision == "bf16"}
    rows = []
    for name, p in pairs:
        base = bf16.get(name)
        if p.run.precision == "bf16" or base is None:
            continue
        measured = p.run.measured_value / base.run.measured_value  # tokens/s of both
        if p.reason or base.reason:
            rows.append([name, p.run.precision, measured, f"cannot state: {p.reason or base.reason}", ""])
            continue
        predicted = base.predicted_s / p.predicted_s
        rows.append([name, p.run.precision, measured, f"{predicted:.2f}", f"{(predicted / measured - 1) * 100:+.2f}"])
    return rows


def run_rows(predictions: Sequence[Prediction], with_sim: bool) -> list[list]:
    """One line per run: what ran, measured and predicted seconds and error, or why not stated."""
    rows = []
    for p in predictions:
        r = p.run
        what = [r.id, r.gpus, f"{r.tp} {r.pp} {r.dp} {r.cp} {r.ep}", r.precision]
        if p.reason:
            rows.append(what + [f"cannot state: {p.reason}"] + [""] * (4 + with_sim))
            continue
        sim = [f"{(p.sim_s / p.measured_s - 1) * 100:+.1f}" if not math.isnan(p.sim_s) else ""] if with_sim else []
        mem = f"{p.predicted_gib:.1f} / {r.memory_gib:g}" if r.memory_gib else f"{p.predicted_gib:.1f} / -"
        mem += " (over the GPU's)" if p.predicted_gib > p.gpu_gib else ""
        rows.append(what + [p.calibration, f"{p.measured_s:.2f}", f"{p.predicted_s:.2f}",
                            f"{p.error * 100:+.1f}"] + sim + [mem])
    return rows


@one_line_errors()
def main(argv: list[str] | None = None) -> int:
    from tabulate import tabulate
    parser = argparse.ArgumentParser(prog="python -m benchmarks.published_runs", description=__doc__)
    parser.add_argument("--sim", action="store_true", help="also play the small runs in the simulator")
    parser.add_argument("--sim-max-gpus", type=int, default=64, help="largest run the simulator plays")
    args = parser.parse_args(argv)
    predictions = [predict(r, args.sim_max_gpus if args.sim else 0) for r in load_runs()]
    print("Published runs (data/published_runs, never fitted): analytical model, each cluster's own constants\n")
    print(tabulate(group_rows(predictions), headers=["GPU", "precision", "framework", "runs", "stated", "MAPE %",
                                                      "worst %", "Kendall tau"], floatfmt=".2f"))
    print()
    print(tabulate(regime_rows(predictions), headers=["ZeRO-3 regime (dp x cp)", "runs", "stated", "MAPE %",
                                                       "worst %"], floatfmt=".2f"))
    print()
    pairs = speedup_rows(predictions)
    if pairs:
        print(tabulate(pairs, headers=["FP8 run", "BF16 run", "measured FP8/BF16", "predicted", "error %"],
                       floatfmt=".2f"))
        print()
    twins = [(name, predict(run)) for name, run in load_pair_runs()]
    print("torchtitan's FP8/BF16 pairs on the 500 W H100s (data/h100_fp8_calibration, not fitted)\n")
    print(tabulate(pair_rows(twins), headers=["pair", "FP8 recipe", "measured FP8/BF16", "predicted", "error %"],
                   floatfmt=".2f"))
    print()
    print(tabulate(run_rows(predictions, args.sim),
                   headers=["run", "GPUs", "tp pp dp cp ep", "precision", "constants", "measured s", "predicted s",
                            "error %"] + (["sim error %"] if args.sim else []) + ["GiB pred / meas"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
