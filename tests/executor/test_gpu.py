"""GPU path (NCCL, CUDA memory): run with ``pytest -m gpu tests/executor/test_gpu.py`` on a
machine with at least one GPU. Untested in the session that wrote it (no GPU there)."""
import pytest
import torch

import specs
from executor.run import run_plan
from specs import uniform_plan

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_single_gpu_run_matches_the_cpu_reference():
    model = specs.load_model("tiny-gpt")
    plan = uniform_plan(4, global_batch=4, micro_batches=2, recompute="full")
    m = run_plan(plan, model, world_size=1, steps=2, check=True, device="cuda", check_atol=1e-4, timeout_s=300)
    assert m.check.passed, m.check
    assert m.peak_memory_bytes[0] > 4 * model.param_count()  # at least the fp32 parameters


def test_checkpointing_lowers_measured_gpu_memory():
    model = specs.load_model("gpt-1.7b").scaled(hidden_size=512, num_layers=4, seq_len=512)
    plain = run_plan(uniform_plan(4, global_batch=8), model, world_size=1, steps=2, device="cuda", bf16=True)
    ckpt = run_plan(uniform_plan(4, global_batch=8, recompute="full"), model, world_size=1, steps=2,
                    device="cuda", bf16=True)
    assert ckpt.peak_memory_bytes[0] < plain.peak_memory_bytes[0]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpu_mixed_plan_matches_the_reference():
    from specs import LayerStrategy as L, Plan
    plan = Plan(pp=1, stage_layers=(4,), layers=(L(tp=2), L(dp=2, dp_type="zero3"), L(dp=2), L(tp=2)),
                global_batch=4, micro_batches=2)
    m = run_plan(plan, specs.load_model("tiny-gpt"), world_size=2, steps=2, check=True, device="cuda",
                 check_atol=1e-4)
    assert m.check.passed, m.check
