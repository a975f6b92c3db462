"""What every rank runs: build its share of the model, train a few steps on synthetic data,
time them, measure peak memory, and (for --check) hand back full gradients and parameters."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from executor.launch import progress
from executor.model import synthetic_batch
from executor.parallel.layout import Layout
from executor.parallel.pipeline import run_schedule
from executor.parallelize import ParallelModel, make_loss_fn, parallelize
from specs import ModelSpec, Plan


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How a run trains (the same on every rank)."""

    steps: int = 4
    """Timed iterations (after warm-up)."""
    warmup: int = 1
    """Iterations run before timing starts."""
    seed: int = 0
    check: bool = False
    """Plain SGD, and return first-step gradients and final parameters for the reference check."""
    lr: float = 0.05
    device: str = "cpu"
    track_memory: bool = True
    bf16: bool = False
    """Autocast forward (and so the saved activations) to bfloat16; parameters stay fp32."""


def rank_slice(full: torch.Tensor, plan: Plan, layout: Layout, local: int) -> torch.Tensor:
    """This rank's rows of every micro-batch, micro-batch after micro-batch."""
    mb = plan.global_batch // plan.micro_batches
    part = mb // layout.dp
    d = layout.dp_index(local)
    return torch.cat([full[k * mb + d * part:k * mb + (d + 1) * part] for k in range(plan.micro_batches)])


def train_step(pm: ParallelModel, plan: Plan, inputs: torch.Tensor, targets: torch.Tensor, loss_fn) -> float:
    """Forward and backward of every micro-batch, then the DDP gradient sum. Returns this
    rank's share of the loss."""
    if pm.schedule is not None:
        losses = run_schedule(pm.schedule, pm.stage, plan.pp, inputs, targets)
        total = sum(float(l.detach()) for l in losses)
    else:
        total = 0.0
        for x, y in zip(inputs.chunk(plan.micro_batches), targets.chunk(plan.micro_batches)):
            loss = loss_fn(pm.module(x), y)
            loss.backward()
            total += float(loss.detach())
    pm.grad_sync.sync()
    return total


def _canonical(name: str) -> str:
    return name.replace(".inner.", ".").replace("_checkpoint_wrapped_module.", "")


def full_tensors(module: torch.nn.Module, grads: bool) -> dict[str, torch.Tensor]:
    """Unsharded copies of every parameter (or gradient); collective over each mesh."""
    out = {}
    for name, p in module.named_parameters():
        t = p.grad if grads else p
        if t is None:
            continue
        t = t.full_tensor() if isinstance(t, DTensor) else t
        out[_canonical(name)] = t.detach().cpu().clone()
    return out


def _global_loss(pm: ParallelModel, plan: Plan, local_loss: float, device: str) -> float:
    """Sum of one copy per DP replica of the last stage's loss shares."""
    own = pm.stage == plan.pp - 1 and pm.last_layout.tp_index(pm.local_rank) == 0
    t = torch.tensor([local_loss if own else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t)


def _autocast(cfg: TrainConfig):
    return torch.autocast(device_type=cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=cfg.bf16)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def worker(rank: int, world_size: int, model: ModelSpec, plan: Plan, cfg: TrainConfig) -> dict:
    """One rank's whole run; returns plain data (pickled back to the launcher)."""
    if cfg.device == "cuda":  # one GPU per local process
        cfg = replace(cfg, device=f"cuda:{rank % torch.cuda.device_count()}")
    torch.manual_seed(cfg.seed)
    pm = parallelize(model, plan, rank, world_size, seed=cfg.seed, device=cfg.device)
    params = list(pm.module.parameters())
    opt = (torch.optim.SGD(params, lr=cfg.lr, foreach=False) if cfg.check
           else torch.optim.Adam(params, lr=1e-4, foreach=False))
    loss_fn = make_loss_fn(plan.global_batch)
    result: dict = {"rank": rank, "stage": pm.stage, "losses": [], "step_times_s": [], "notes": pm.notes}
    total_steps = cfg.steps if cfg.check else cfg.warmup + cfg.steps
    for step in range(total_steps):
        inputs, targets = _rank_batch(model, plan, pm, cfg, step)
        dist.barrier()
        _sync(cfg.device)
        start = time.perf_counter()
        with _autocast(cfg):
            local = train_step(pm, plan, inputs, targets, loss_fn)
        if cfg.check and step == 0:
            result["grads"] = full_tensors(pm.module, grads=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(cfg.device)
        result["step_times_s"].append(time.perf_counter() - start)
        result["losses"].append(_global_loss(pm, plan, local, cfg.device))
        progress({"step": step, "loss": result["losses"][-1], "step_time_s": result["step_times_s"][-1]})
    if cfg.check:
        result["params"] = full_tensors(pm.module, grads=False)
    result["peak_memory_bytes"] = _peak_memory(pm, plan, opt, loss_fn, model, cfg) if cfg.track_memory else 0
    return result


def _rank_batch(model: ModelSpec, plan: Plan, pm: ParallelModel, cfg: TrainConfig, step: int):
    inputs, targets = synthetic_batch(model, plan.global_batch, cfg.seed + step)
    inputs = rank_slice(inputs, plan, pm.first_layout, pm.local_rank).to(cfg.device)
    targets = rank_slice(targets, plan, pm.last_layout, pm.local_rank).to(cfg.device)
    return inputs, targets


def _peak_memory(pm: ParallelModel, plan: Plan, opt, loss_fn, model: ModelSpec, cfg: TrainConfig) -> int:
    """Peak bytes of one more training step: CUDA allocator peak on GPU, MemTracker on CPU."""
    inputs, targets = _rank_batch(model, plan, pm, cfg, 0)
    if cfg.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        with _autocast(cfg):
            train_step(pm, plan, inputs, targets, loss_fn)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return int(torch.cuda.max_memory_allocated())
    tracker = _micro_batch_tracker()
    tracker.track_external(pm.module, opt)
    with tracker, _autocast(cfg):
        train_step(pm, plan, inputs, targets, loss_fn)
        opt.step()
        opt.zero_grad(set_to_none=True)
    peak = tracker.get_tracker_snapshot("peak")
    return int(sum(v.get("Total", 0) for v in peak.values()))


def _micro_batch_tracker():
    """A MemTracker that accepts the stage module being called once per micro-batch (the
    stock one takes a second top-level call for a new iteration and refuses it); the
    global peak, which is all we read, is unaffected."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class MicroBatchMemTracker(MemTracker):
        def _pre_fw_hook(self, module, inputs):
            parents = set(self._mod_tracker.parents) - {self._mod_tracker.get_known_fqn(module)}
            if module in self.memory_tracking and not self._mod_tracker.is_bw and parents == {"Global"}:
                del self.memory_tracking[module]
            super()._pre_fw_hook(module, inputs)

    return MicroBatchMemTracker()


def median_step_time(per_rank: list[dict], warmup: int) -> tuple[float, list[float]]:
    """Slowest rank's time of each timed step, and their median."""
    steps = list(zip(*[r["step_times_s"] for r in per_rank]))[warmup:]
    times = [max(s) for s in steps]
    return (statistics.median(times) if times else 0.0), times
