"""Where the measured data sets the project ships live (``data/`` at the repository root).

One resolver: every reader asks here, so a clone of the repository alone finds everything.
"""
from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from specs.errors import SpecError

DATA_ROOT = Path(__file__).resolve().parents[1] / "data"
"""The repository's data folder (each data set has a PROVENANCE.md)."""


class Dataset(StrEnum):
    """The data sets in ``data/``; the value is the path under DATA_ROOT."""

    VTRAIN_SINGLE_NODE = "vtrain_a100/vtrain_a100_single_node.csv"
    """vTrain: 1,440 Megatron runs on one 8 x A100 node (iteration time, ms)."""
    VTRAIN_MULTI_NODE = "vtrain_a100/vtrain_a100_multi_node.csv"
    """vTrain: 109 Megatron runs on 64-512 A100s (validation only, never fitted)."""
    MEGATRON_PUBLISHED = "megatron_a100/megatron_a100_published.csv"
    """Megatron-LM's 8 published runs (22B-1T, 8-512 A100s; full recomputation vs sequence
    parallelism + selective recomputation): validation only, never fitted."""
    PUBLISHED_RUNS = "published_runs/published_runs.csv"
    """Published H100/H200/A100 training runs (torchtitan, Megatron-Bridge, NeMo AutoModel,
    Llama 3): the validation set of benchmarks.published_runs, never fitted."""
    H100_FP8_CALIBRATION = "h100_fp8_calibration"
    """NeMo 24.07 H100 FP8 runs (the H100 calibration's, cost_models.calibrate) and torchtitan
    BF16/FP8 pairs (not fitted); no row shared with PUBLISHED_RUNS."""
    NCCL_A100 = "nccl_a100"
    """nccl-tests all-reduce on 2..8 A100 SXM GPUs (folder of CSVs)."""
    GALVATRON_LLAMA2_7B = "galvatron_llama2_7b"
    """Galvatron's example profile folder for LLaMA-2 7B, bf16, 8-GPU nodes."""


def has_dataset(dataset: Dataset | str) -> bool:
    """Whether ``dataset`` is present (a trimmed checkout may leave data/ out)."""
    return (DATA_ROOT / Dataset(dataset).value).exists()


def data_path(dataset: Dataset | str) -> Path:
    """Path of ``dataset`` (a Dataset or its value); SpecError if it is not there."""
    path = DATA_ROOT / Dataset(dataset).value
    if not path.exists():
        raise SpecError("dataset", f"{Dataset(dataset).name} not found at {path}")
    return path
