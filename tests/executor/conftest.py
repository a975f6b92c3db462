"""Helpers for the executor tests: plans on the tiny models, and one assertion for --check."""
import pytest

import specs
from executor.run import run_plan


@pytest.fixture(scope="session")
def tiny_gpt():
    return specs.load_model("tiny-gpt")


def assert_matches_reference(plan, model, world_size, **kwargs):
    """Run ``plan`` with --check and fail with the differences if it strays from the reference."""
    m = run_plan(plan, model, world_size=world_size, steps=2, check=True, track_memory=False,
                 timeout_s=180, **kwargs)
    c = m.check
    assert c is not None and c.compared_tensors > 0
    assert c.passed, (f"{plan.summary()}: loss {c.loss_max_abs_diff:.2e} grad {c.grad_max_abs_diff:.2e} "
                      f"param {c.param_max_abs_diff:.2e} worst {c.worst}; {c.state_bytes_errors[:3]}; {c.collective_errors[:3]}")
    return m
