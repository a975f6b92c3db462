"""Measured training iterations the cost models are fitted on and checked against, as (model,
cluster, plan, measured time), read via specs.datasets:

- the vTrain A100 runs (data/vtrain_a100): Megatron-DeepSpeed, fp16, Adam, full recomputation,
  1F1B, no ZeRO, no sequence parallelism; sets 'single' (fitted) and 'multi' (never fitted);
- Megatron-LM's published runs (data/megatron_a100): set 'published' (never fitted), with the
  interleaving, recomputation and sequence parallelism each row gives;
- NeMo 24.07's FP8 DGX-H100 table (data/h100_fp8_calibration): the H100 calibration's runs
  (``nemo_h100_runs``), on zoo models or the NeMo GPT-3 shapes of NEMO_SHAPES.

Each vTrain/Megatron row becomes a uniform Plan on a GPT model of the row's shape (vocabulary 50257).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from specs import (ClusterSpec, DPType, ModelSpec, Plan, Recompute, Schedule, SequenceParallel, load_cluster,
                   load_model, model_from_dict, uniform_plan)
from specs.cluster import InterNodeLink
from specs.datasets import DATA_ROOT, Dataset, data_path
from specs.precision import Precision
from specs.stack import SoftwareStack

SETS = {"single": Dataset.VTRAIN_SINGLE_NODE, "multi": Dataset.VTRAIN_MULTI_NODE,
        "published": Dataset.MEGATRON_PUBLISHED}
"""Set name -> data set."""
VOCAB = 50257
NICS_PER_NODE = {"multi": 4}
"""InfiniBand NICs (200 Gb/s) per node where a set's nodes have fewer than dgx-a100-80g's 8:
the vTrain multi-node set has about 4 (data/vtrain_a100/PROVENANCE.md)."""
MEGATRON_VOCAB_MULTIPLE = 128
"""Megatron pads the vocabulary to a multiple of 128 * tp (make-vocab-size-divisible-by)."""
MEGATRON_SOFTWARE = {"dp_overlap_fraction": 0.0}
"""What the vTrain runs' software did, stated not fitted: Megatron-DeepSpeed all-reduced the
gradients after the last micro-batch's backward, without overlap."""


@dataclass(frozen=True)
class Run:
    """One measured training iteration."""

    model: ModelSpec
    """The model trained."""
    cluster: ClusterSpec
    """The GPUs it ran on."""
    plan: Plan
    """How it was split over them."""
    measured_s: float
    """Measured iteration time."""
    set_name: str = ""
    """The set ('single', 'multi' or 'published'; see SETS), empty for runs from elsewhere."""

    @property
    def model_key(self) -> str:
        """Groups runs of one model shape (for per-model error and Kendall's tau)."""
        return f"h{self.model.layers[0].hidden_size}-L{self.model.num_layers}"


def available() -> bool:
    """Whether both vTrain sets are in data/."""
    return all((DATA_ROOT / d.value).exists() for d in SETS.values())


def _model(hidden: int, heads: int, layers: int, seq: int) -> ModelSpec:
    return model_from_dict({"model_type": "gpt2", "n_embd": hidden, "n_head": heads, "n_layer": layers,
                            "n_positions": seq, "seq_length": seq, "vocab_size": VOCAB},
                           name=f"gpt-h{hidden}-L{layers}")


def _cluster(gpus: int, set_name: str) -> ClusterSpec:
    base = load_cluster("dgx-a100-80g")
    if gpus <= base.gpus_per_node:
        return replace(base, gpus_per_node=gpus, name=f"dgx-a100-{gpus}gpu")
    cluster = base.with_nodes(gpus // base.gpus_per_node)
    if set_name not in NICS_PER_NODE:
        return cluster
    inter = InterNodeLink(nics_per_node=NICS_PER_NODE[set_name], nic_bandwidth_gbytes_per_s=25.0,
                          latency_us=base.inter_node.latency_us)
    return replace(cluster, inter_node=inter)


def load_cases(set_name: str) -> list[Run]:
    """Every run of one set (a key of SETS) as the CSV describes it. The columns `virtual
    stages`, `recompute` and `sequence parallelism` are optional (vTrain's files have none:
    1, full, none)."""
    import pandas as pd
    frame = pd.read_csv(data_path(SETS[set_name]))
    cases = []
    for row in frame.to_dict("records"):
        tp, dp, pp = int(row["tensor parallelism"]), int(row["data parallelism"]), int(row["pipeline parallelism"])
        mbs, gbs = int(row["micro batch"]), int(row["global batch"])
        model = _model(int(row["hidden size"]), int(row["attention heads"]), int(row["# layers"]),
                       int(row["sequence length"]))
        plan = uniform_plan(model.num_layers, tp=tp, dp=dp, pp=pp, global_batch=gbs,
                            micro_batches=gbs // (mbs * dp), recompute=Recompute(row.get("recompute", "full")),
                            sp=SequenceParallel(row.get("sequence parallelism", "none")),
                            schedule=Schedule.ONE_F_ONE_B, model=model.name)
        v = int(row.get("virtual stages", 1))
        if v > 1:
            plan = replace(plan, schedule=Schedule.INTERLEAVED_1F1B, virtual_stages=v)
        cases.append(Run(model, _cluster(int(row["# GPUs"]), set_name), plan,
                         float(row["iteration time (ms)"]) / 1e3, set_name))
    return cases


def _padded_vocab(vocab: int, tp: int) -> int:
    multiple = MEGATRON_VOCAB_MULTIPLE * tp
    return -(-vocab // multiple) * multiple


def as_megatron(model: ModelSpec, plan: Plan) -> tuple[ModelSpec, Plan]:
    """The run as Megatron executed it: vocabulary padded and split over the layers' tp; a
    1F1B run with fewer micro-batches than stages is all-forward-then-all-backward (GPipe)."""
    tp = plan.layers[0].tp
    vocab = _padded_vocab(model.embedding.vocab_size, tp)
    model = replace(model, embedding=replace(model.embedding, vocab_size=vocab),
                    head=replace(model.head, output_size=vocab))
    plan = replace(plan, vocab_tp=tp)
    if plan.schedule == Schedule.ONE_F_ONE_B and plan.micro_batches < plan.pp:
        plan = replace(plan, schedule=Schedule.GPIPE)
    return model, plan


def megatron_runs(set_name: str) -> list[Run]:
    """The vTrain runs of one set, as Megatron ran them (see as_megatron)."""
    runs = []
    for case in load_cases(set_name):
        model, plan = as_megatron(case.model, case.plan)
        runs.append(replace(case, model=model, plan=plan))
    return runs


NEMO_TABLE = "nemo_24.07_h100_fp8.csv"
"""The NeMo 24.07 FP8 DGX-H100 performance table in Dataset.H100_FP8_CALIBRATION."""
NEMO_SHAPES = {
    "GPT3-5B": {"n_embd": 4096, "n_layer": 24, "n_head": 32, "n_inner": 16384},
    "GPT3-20B": {"n_embd": 6144, "n_layer": 44, "n_head": 48, "n_inner": 24576},
}
"""NeMo rows without a zoo model whose shape is stated: GPTConfig5B / GPTConfig20B of
nemo/collections/llm/gpt/model/base.py in github.com/NVIDIA/NeMo (hidden, layers, heads, FFN;
GPT-2 vocabulary 50257, learned positions). The Nemotron rows (8B, 22B, 340B) are left out:
squared-ReLU MLPs and shapes no file read here states."""
NEMO_SOFTWARE = {"precision": Precision.FP8_DELAYED, "dp_type": DPType.ZERO1, "recompute": Recompute.NONE,
                 "stack": SoftwareStack.MEGATRON_TE}
"""What NeMo 24.07's performance recipes ran, stated not fitted: Megatron-Core with Transformer
Engine, FP8 with delayed scaling (the release's default recipe), Megatron's distributed optimizer
(ZeRO-1), no activation recomputation, Megatron-SP wherever tp > 1, and TP communication overlap
where the row's ``tp_comm_overlap`` says (the launcher's training config of that model)."""


def _nemo_model(row: dict) -> ModelSpec | None:
    """The row's model at its sequence length: the zoo model it names, a NEMO_SHAPES shape, or
    None (not stated)."""
    seq = int(row["seq_len"])
    if isinstance(row.get("zoo_model"), str) and row["zoo_model"]:
        return load_model(row["zoo_model"]).with_seq_len(seq).with_attention("flash")
    shape = NEMO_SHAPES.get(row["source_model"])
    if shape is None:
        return None
    return model_from_dict({"model_type": "gpt2", **shape, "n_positions": seq, "seq_length": seq, "vocab_size": VOCAB},
                           name=row["source_model"].lower()).with_attention("flash")


def _nemo_plan(model: ModelSpec, row: dict) -> Plan:
    """The row's degrees, batch, interleaving and TP communication overlap under NEMO_SOFTWARE
    (Megatron-SP where tp > 1)."""
    gpus, tp, pp, cp = (int(row[k]) for k in ("gpus", "tp", "pp", "cp"))
    dp, v = gpus // (tp * pp * cp), int(row["virtual_stages"])
    mbs, gbs = int(row["micro_batch"]), int(row["global_batch"])
    return uniform_plan(model.num_layers, tp=tp, dp=dp, pp=pp, cp=cp, global_batch=gbs, micro_batches=gbs // (mbs * dp),
                        sp=SequenceParallel.MEGATRON if tp > 1 else SequenceParallel.NONE,
                        schedule=Schedule.INTERLEAVED_1F1B if v > 1 else Schedule.ONE_F_ONE_B,
                        virtual_stages=v, model=model.name,
                        tp_comm_overlap=str(row["tp_comm_overlap"]).lower() == "true", **NEMO_SOFTWARE)


def nemo_h100_runs() -> list[Run]:
    """The NeMo 24.07 FP8 rows whose model is stated (NEMO_SHAPES), as Megatron-Core ran them
    (_nemo_plan, as_megatron) on whole dgx-h100 nodes; measured time = tokens per iteration over
    the cluster's tokens per second."""
    import pandas as pd
    frame = pd.read_csv(data_path(Dataset.H100_FP8_CALIBRATION) / NEMO_TABLE, keep_default_na=False)
    base = load_cluster("dgx-h100")
    runs = []
    for row in frame.to_dict("records"):
        model = _nemo_model(row)
        if model is None:
            continue
        model, plan = as_megatron(model, _nemo_plan(model, row))
        gpus = int(row["gpus"])
        measured_s = int(row["global_batch"]) * int(row["seq_len"]) / (float(row["tokens_per_s_per_gpu"]) * gpus)
        runs.append(Run(model, base.with_nodes(gpus // base.gpus_per_node), plan, measured_s,
                        f"nemo:{row['source_model']}"))
    return runs
