"""The vTrain measured runs (../shared/validation) as (model, cluster, plan, measured time) cases.

Megatron-DeepSpeed, fp16, Adam, full recomputation, 1F1B, no ZeRO, no sequence parallelism:
each row becomes a uniform Plan on a GPT model of the row's shape (vocabulary 50257).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specs import ClusterSpec, ModelSpec, Plan, load_cluster, model_from_dict, uniform_plan
from specs.cluster import InterNodeLink
from dataclasses import replace

SHARED = Path(__file__).resolve().parents[2] / "shared"
VALIDATION = SHARED / "validation"
SETS = {"single": "vtrain_a100_single_node.csv", "multi": "vtrain_a100_multi_node.csv"}
VOCAB = 50257
MULTI_NODE_NICS = 4
"""The multi-node set's nodes have about 4 x 200 Gb/s InfiniBand (validation README)."""


@dataclass(frozen=True)
class Case:
    """One measured run."""

    set_name: str
    model: ModelSpec
    cluster: ClusterSpec
    plan: Plan
    measured_s: float

    @property
    def model_key(self) -> str:
        """Groups runs of one model shape (for per-model error and Kendall's tau)."""
        layer = self.model.layers[0]
        return f"h{layer.hidden_size}-L{self.model.num_layers}"


def available() -> bool:
    return all((VALIDATION / f).exists() for f in SETS.values())


def _model(hidden: int, heads: int, layers: int, seq: int) -> ModelSpec:
    return model_from_dict({"model_type": "gpt2", "n_embd": hidden, "n_head": heads, "n_layer": layers,
                            "n_positions": seq, "seq_length": seq, "vocab_size": VOCAB},
                           name=f"gpt-h{hidden}-L{layers}")


def _cluster(gpus: int) -> ClusterSpec:
    base = load_cluster("dgx-a100-80g")
    if gpus <= base.gpus_per_node:
        return replace(base, gpus_per_node=gpus, name=f"dgx-a100-{gpus}gpu")
    nodes = gpus // base.gpus_per_node
    inter = InterNodeLink(nics_per_node=MULTI_NODE_NICS, nic_bandwidth_gbytes_per_s=25.0,
                          latency_us=base.inter_node.latency_us)
    return replace(base.with_nodes(nodes), inter_node=inter)


def load_cases(set_name: str) -> list[Case]:
    """Every run of one set ('single' or 'multi') as a Case."""
    frame = pd.read_csv(VALIDATION / SETS[set_name])
    cases = []
    for row in frame.to_dict("records"):
        tp, dp, pp = int(row["tensor parallelism"]), int(row["data parallelism"]), int(row["pipeline parallelism"])
        mbs, gbs = int(row["micro batch"]), int(row["global batch"])
        model = _model(int(row["hidden size"]), int(row["attention heads"]), int(row["# layers"]),
                       int(row["sequence length"]))
        plan = uniform_plan(model.num_layers, tp=tp, dp=dp, pp=pp, global_batch=gbs,
                            micro_batches=gbs // (mbs * dp), recompute="full", schedule="1f1b",
                            model=model.name)
        cases.append(Case(set_name, model, _cluster(int(row["# GPUs"])), plan,
                          float(row["iteration time (ms)"]) / 1e3))
    return cases
