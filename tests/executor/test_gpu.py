"""GPU path (NCCL, CUDA memory): ``pytest -m gpu tests/executor/test_gpu.py`` on a machine with at
least one GPU. Never run so far (no GPU in the sessions that wrote it). The GPU count comes
from executor.devices (a subprocess), so this pytest process never initialises CUDA before
the ranks start."""
import pytest

import specs
from executor.devices import visible_gpus
from executor.run import run_plan
from specs import LayerStrategy as L
from specs import Plan, uniform_plan

GPUS = visible_gpus()
NEEDS_GPU = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")


@pytest.mark.gpu
@NEEDS_GPU
def test_single_gpu_run_matches_the_cpu_reference():
    model = specs.load_model("tiny-gpt")
    plan = uniform_plan(4, global_batch=4, micro_batches=2, recompute="full")
    m = run_plan(plan, model, world_size=1, steps=2, check=True, device="cuda", check_atol=1e-4, timeout_s=300)
    assert m.check.passed, m.check
    assert m.device == "cuda:0"
    assert m.peak_memory_bytes[0] > 4 * model.param_count()  # at least the fp32 parameters
    assert m.reserved_memory_bytes[0] >= m.peak_memory_bytes[0]


@pytest.mark.gpu
@NEEDS_GPU
def test_bf16_single_gpu_run_matches_the_bf16_reference():
    plan = uniform_plan(4, global_batch=4, micro_batches=2)
    m = run_plan(plan, specs.load_model("tiny-gpt"), world_size=1, steps=2, check=True, device="cuda", bf16=True)
    assert m.check.passed, m.check


@pytest.mark.gpu
@NEEDS_GPU
def test_checkpointing_lowers_measured_gpu_memory():
    model = specs.load_model("gpt-1.7b").scaled(hidden_size=512, num_layers=4, seq_len=512)
    plain = run_plan(uniform_plan(4, global_batch=8), model, world_size=1, steps=2, device="cuda", bf16=True)
    ckpt = run_plan(uniform_plan(4, global_batch=8, recompute="full"), model, world_size=1, steps=2,
                    device="cuda", bf16=True)
    assert ckpt.peak_memory_bytes[0] < plain.peak_memory_bytes[0]


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
def test_two_gpu_mixed_plan_matches_the_reference():
    plan = Plan(pp=1, stage_layers=(4,), layers=(L(tp=2), L(dp=2, dp_type="zero3"), L(dp=2, dp_type="zero2"), L(tp=2)),
                global_batch=4, micro_batches=2)
    m = run_plan(plan, specs.load_model("tiny-gpt"), world_size=2, steps=2, check=True, device="cuda",
                 check_atol=1e-4)
    assert m.check.passed, m.check
    assert m.device == "cuda:0"


@pytest.mark.slow
def test_gpu_check_rehearses_every_step_on_cpu(tmp_path):
    """The prepared GPU script in --cpu mode: profile, plans, runs, one table (no GPU needed)."""
    from benchmarks.gpu_check import main
    assert main([str(tmp_path), "--cpu", "--steps", "1"]) == 0
    table = (tmp_path / "table.md").read_text()
    assert "| planner | plan | measured ms" in table and "failed" not in table and "FAILED" not in table
    assert table.count("| passed |") >= 2  # each plan's --check
    assert table.count("\n| ") >= 3  # header and at least two plans
    assert (tmp_path / "profile.json").exists()


@pytest.mark.parametrize("name, memory_gib, zoo", [
    ("NVIDIA H100 80GB HBM3", 79.6, "dgx-h100"), ("NVIDIA H200", 139.8, "dgx-h200"), ("NVIDIA B200", 179.0, "dgx-b200"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "dgx-a100-40g"), ("NVIDIA A100-SXM4-80GB", 79.2, "dgx-a100-80g"),
    ("Some Future GPU", 96.0, "h200-1"),
])
def test_the_gpu_check_plans_for_the_gpu_it_finds(name, memory_gib, zoo):
    """The local cluster is a node of the zoo's kind for the GPU's name, with the memory it reports."""
    from benchmarks.gpu_check import local_cluster
    cluster = local_cluster(1, False, (name, int(memory_gib * 2**30)))
    assert cluster.name == f"{zoo}-local1" and cluster.world_size == 1
    assert cluster.gpu.memory_gib == pytest.approx(memory_gib, rel=1e-6)
