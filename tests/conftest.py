"""Shared test fixtures: the measured data sets in data/ (resolved by specs.datasets).

A fixture skips its test, naming the missing path, only when a trimmed checkout lacks the data.
"""
from pathlib import Path

import pytest

from specs.datasets import DATA_ROOT, Dataset, data_path, has_dataset


def _dataset(dataset: Dataset) -> Path:
    if not has_dataset(dataset):
        pytest.skip(f"data set {dataset.name} not in this checkout ({DATA_ROOT / dataset.value})")
    return data_path(dataset)


@pytest.fixture
def galvatron_dir() -> Path:
    """Galvatron's LLaMA-2 7B profile folder (data/galvatron_llama2_7b)."""
    return _dataset(Dataset.GALVATRON_LLAMA2_7B)


@pytest.fixture
def nccl_dir() -> Path:
    """The nccl-tests A100 all-reduce CSVs (data/nccl_a100)."""
    return _dataset(Dataset.NCCL_A100)


@pytest.fixture
def vtrain_data() -> tuple[Path, Path]:
    """The vTrain single- and multi-node CSVs (data/vtrain_a100)."""
    return _dataset(Dataset.VTRAIN_SINGLE_NODE), _dataset(Dataset.VTRAIN_MULTI_NODE)
