"""The GPU path's CPU-checkable parts: the device is chosen without any CUDA call in the parent,
said in one line, and each distinct set of ranks gets one process group."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specs
from executor import devices
from executor.launch import launch
from executor.train import TrainConfig, rank_device, worker
from specs import LayerStrategy as L
from specs import Plan, SpecError, uniform_plan

REPO = Path(__file__).resolve().parents[2]


def test_default_device_is_cpu_without_a_gpu_and_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(devices, "visible_gpus", lambda: 0)
    assert devices.resolve_device(None) == ("cpu", "device: cpu (default: no CUDA GPU visible)")
    with pytest.raises(SpecError, match="--device: cuda asked for but no CUDA GPU is visible"):
        devices.resolve_device("cuda")


def test_default_device_is_cuda_when_gpus_are_visible(monkeypatch):
    monkeypatch.setattr(devices, "visible_gpus", lambda: 2)
    assert devices.resolve_device(None) == ("cuda", "device: cuda (default: 2 CUDA GPU(s) visible)")
    assert devices.resolve_device("cpu")[0] == "cpu"


def test_each_local_rank_takes_its_own_gpu():
    assert [rank_device(TrainConfig(device="cuda"), r) for r in range(3)] == ["cuda:0", "cuda:1", "cuda:2"]
    assert rank_device(TrainConfig(device="cpu"), 5) == "cpu"


PARENT_SCRIPT = """
import os, sys, torch
from executor import devices
from executor.run import main
parent = os.getpid()
def guard(real):
    def call(*args, **kwargs):  # a forked rank may call them: it is not the parent
        if os.getpid() == parent:
            raise AssertionError("CUDA touched in the parent process")
        return real(*args, **kwargs)
    return call
for name in ("is_available", "device_count", "init", "_lazy_init", "set_device", "synchronize",
             "get_device_name", "current_device"):
    setattr(torch.cuda, name, guard(getattr(torch.cuda, name)))
devices.cuda_build = lambda: True  # pretend a CUDA build: the probe must use a subprocess
sys.exit(main(["--plan", sys.argv[1], "--steps", "1"]))
"""


def test_the_parent_makes_no_cuda_call(tmp_path):
    """``python -m executor.run`` with the default device: any CUDA call in the parent raises."""
    path = tmp_path / "plan.json"
    uniform_plan(4, global_batch=2, model="tiny-gpt").save(path)
    done = subprocess.run([sys.executable, "-c", PARENT_SCRIPT, str(path)], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "device: cpu (default: no CUDA GPU visible)" in done.stderr


def test_one_process_group_per_distinct_set_of_ranks():
    """Two layouts on 4 ranks: singletons (4), tp2 x dp2 groups (2 + 2), the whole stage (1,
    shared by the dp4 layout, the stage mesh and the tied weight)."""
    plan = Plan(pp=1, stage_layers=(2,), layers=(L(tp=2, dp=2), L(dp=4)), global_batch=4, micro_batches=1)
    model = specs.load_model("tiny-gpt").scaled(num_layers=2)
    per_rank = launch(worker, 4, model, plan, TrainConfig(steps=1, warmup=0, track_memory=False), timeout_s=120)
    assert [r["process_groups"] for r in per_rank] == [9] * 4
