"""The shared vocabulary: ModelSpec (what), ClusterSpec (on what), Plan (how), and the zoo."""
from specs.axes import (DENSE_AXES, EXPERT_AXES, GRAD_SYNC_AXES, SPLIT_AXES, CPComm, CPLoadBalance, Degrees,
                        EPDispatcher)
from specs.cluster import ClusterSpec, GPUSpec, GroupLink, InterNodeLink, IntraNodeLink
from specs.errors import SpecError
from specs.galvatron_io import load_galvatron_plan, plan_from_galvatron, plan_to_galvatron, save_galvatron_plan
from specs.grid import RankGrid, RankGroups, layer_grid, stage_grid
from specs.hf_config import from_hf_config, model_from_dict
from specs.layer_parts import MLASpec, MoESpec
from specs.model import EmbeddingSpec, HeadSpec, LayerSpec, ModelSpec
from specs.chunks import chunk_layout, stage_sums
from specs.plan import (DP_TYPES, PLAN_VERSION, SCHEDULES, MEGATRON_RECOMPUTE, DPType, LayerStrategy, Plan, Recompute,
                        Schedule, SequenceParallel, even_stage_layers, padded_vocab, uniform_plan)
from specs.sequence_split import keeps_sequence_split, split_ends
from specs.zoo import cluster_names, load_cluster, load_model, model_names

ModelSpec.from_hf_config = staticmethod(from_hf_config)  # type: ignore[attr-defined]

__all__ = [
    "ClusterSpec", "GPUSpec", "GroupLink", "InterNodeLink", "IntraNodeLink", "DENSE_AXES", "EXPERT_AXES",
    "GRAD_SYNC_AXES", "SPLIT_AXES", "CPComm", "CPLoadBalance", "Degrees", "EPDispatcher", "RankGrid", "RankGroups", "layer_grid", "stage_grid",
    "SpecError", "load_galvatron_plan", "plan_from_galvatron", "plan_to_galvatron",
    "save_galvatron_plan", "from_hf_config", "model_from_dict", "EmbeddingSpec", "HeadSpec",
    "LayerSpec", "ModelSpec", "DP_TYPES", "PLAN_VERSION", "SCHEDULES", "DPType", "LayerStrategy", "Plan", "Recompute", "MEGATRON_RECOMPUTE",
    "Schedule", "SequenceParallel", "chunk_layout", "stage_sums", "keeps_sequence_split", "split_ends", "even_stage_layers",
    "padded_vocab", "uniform_plan",
    "cluster_names", "load_cluster", "load_model", "model_names", "MLASpec", "MoESpec",
]
