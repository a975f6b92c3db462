"""Simulated iteration times against measured A100 runs (data/vtrain_a100, data/megatron_a100)."""
import numpy as np
import pytest

from benchmarks.simulator_accuracy import REQUIRED_MAPE, run_set


def _mape(set_name: str, limit: int | None) -> float:
    _, predicted, measured, _, _ = run_set(set_name, limit, coalesce=True)
    return float(np.mean(np.abs(predicted - measured) / measured) * 100)


def test_single_node_sample_within_the_required_error():
    assert _mape("single", 48) <= REQUIRED_MAPE["single"]


@pytest.mark.slow
@pytest.mark.parametrize("set_name", ["single", "multi", "published"])
def test_whole_set_within_the_required_error(set_name):
    assert _mape(set_name, None) <= REQUIRED_MAPE[set_name]
