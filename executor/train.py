"""What every rank runs: build its share of the model, train a few steps on synthetic data,
time them, measure peak memory, and (for --check) hand back full gradients and parameters."""
from __future__ import annotations

import gc
import re
import statistics
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from executor.execution import ExecutionRecorder, _chunks, _first, unit_traces
from executor.launch import progress
from executor.model import Block, is_tied, synthetic_batch
from executor.parallel.data import local
from executor.parallel.layout import Layout
from executor.parallel.pipeline import run_schedule
from executor.parallelize import ParallelModel, parallelize
from executor.trace import CollectiveTrace
from specs import ModelSpec, Plan
from specs.schedules import OpKind, schedule_entry


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How a run trains (the same on every rank)."""

    steps: int = 4
    """Timed iterations (after warm-up)."""
    warmup: int = 1
    """Iterations run before timing starts."""
    seed: int = 0
    check: bool = False
    """Return first-step gradients, final parameters and per-layer state bytes for --check."""
    lr: float = 1e-3
    """Adam learning rate."""
    adam_eps: float = 1e-4
    """Adam epsilon: large enough that a gradient which is zero up to rounding (a key bias)
    does not become a +-lr update whose sign depends on the reduction order."""
    device: str = "cpu"
    """"cpu", or "cuda" (each local rank takes GPU local_rank) or "cuda:<i>"."""
    track_memory: bool = True
    bf16: bool = False
    """bf16 parameters, activations and communication; fp32 master weights and Adam states."""


def rank_slice(full: torch.Tensor, plan: Plan, layout: Layout, local: int) -> torch.Tensor:
    """This rank's rows of every micro-batch, micro-batch after micro-batch."""
    mb = plan.global_batch // plan.micro_batches
    part = mb // layout.dp
    d = layout.dp_index(local)
    return torch.cat([full[k * mb + d * part:k * mb + (d + 1) * part] for k in range(plan.micro_batches)])


def train_step(pm: ParallelModel, plan: Plan, inputs: torch.Tensor, targets: torch.Tensor, loss_fn,
               recorder: ExecutionRecorder | None = None) -> torch.Tensor:
    """Forward and backward of every micro-batch, then the data-parallel reductions. Returns
    this rank's share of the loss as a tensor on the device (no host sync). ``recorder`` is
    told the loop's ops (the pipeline schedule's it records itself)."""
    if pm.schedule is not None:
        losses = run_schedule(pm.schedule, pm.stage, plan.head_stage, inputs, targets)
        total = torch.stack([l.detach().float() for l in losses]).sum() if losses else torch.zeros((), device=inputs.device)
    else:
        total = torch.zeros((), device=inputs.device)
        for k, (x, y) in enumerate(zip(inputs.chunk(plan.micro_batches), targets.chunk(plan.micro_batches))):
            if recorder is not None:
                recorder.op(OpKind.FORWARD, k, 0)
            loss = loss_fn(pm.module(x), y)
            if recorder is not None:
                recorder.op(OpKind.BACKWARD, k, 0)
            loss.backward()
            total = total + loss.detach().float()
    pm.data_parallel.sync()
    return total


def _canonical(name: str, tied: bool) -> str:
    name = re.sub(r"^chunk\d+\.", "", name)  # interleaved 1F1B: this rank's chunks
    name = name.replace(".inner.", ".").replace("_checkpoint_wrapped_module.", "")
    # the last stage's copy of a tied weight is the embedding's
    return "embed.tokens.weight" if tied and name == "head.out.weight" else name


def full_tensors(module: torch.nn.Module, grads: bool, tied: bool = False,
                 rows: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """Unsharded fp32 copies of every parameter (or gradient), the vocabulary padding cut off
    (``rows``: name -> real rows); collective over each mesh."""
    out, rows = {}, rows or {}
    for name, p in module.named_parameters():
        t = p.grad if grads else p
        if t is None:
            continue
        t = t.full_tensor() if isinstance(t, DTensor) else t
        name = _canonical(name, tied)
        t = t[:rows[name]] if name in rows else t
        out[name] = t.detach().float().cpu().clone()
    return out


def _global_loss(pm: ParallelModel, plan: Plan, local_loss: torch.Tensor) -> float:
    """Sum of one copy per DP replica of the last stage's loss shares."""
    own = pm.stage == plan.head_stage and pm.owns_loss
    t = (local_loss if own else torch.zeros_like(local_loss)).double().reshape(1)
    dist.all_reduce(t)
    return float(t)


class StepTimer:
    """Wall time of one step: CUDA events on GPU (read after the step), perf_counter on CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def start(self) -> None:
        if self.cuda:
            self.begin, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self.end.record()
        else:
            self.t1 = time.perf_counter()

    def seconds(self) -> float:
        if self.cuda:
            self.end.synchronize()
            return self.begin.elapsed_time(self.end) / 1e3
        return self.t1 - self.t0


@contextmanager
def collected_first():
    """Collect Python's garbage now and not inside the block: a collection's pause (the
    autograd graph of a step is thousands of objects) would otherwise land in whichever timed
    step crosses the allocation threshold."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def rank_device(cfg: TrainConfig, local_rank: int) -> str:
    """The device of this rank: "cuda" means GPU ``local_rank`` (one GPU per local process)."""
    return f"cuda:{local_rank}" if cfg.device == "cuda" else cfg.device


def worker(rank: int, world_size: int, model: ModelSpec, plan: Plan, cfg: TrainConfig,
           local_rank: int | None = None) -> dict:
    """One rank's whole run; returns plain data (pickled back to the launcher)."""
    cfg = replace(cfg, device=rank_device(cfg, rank if local_rank is None else local_rank))
    if cfg.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(cfg.device))
    torch.manual_seed(cfg.seed)
    pm = parallelize(model, plan, rank, world_size, seed=cfg.seed, device=cfg.device, bf16=cfg.bf16)
    pm.data_parallel.build_optimizer(cfg.lr, cfg.adam_eps)
    opt = pm.data_parallel
    loss_fn = pm.loss_fn
    result: dict = {"rank": rank, "stage": pm.stage, "losses": [], "step_times_s": [], "notes": pm.notes,
                    "device": cfg.device, "process_groups": len(pm.groups.groups)}
    recorder = ExecutionRecorder(pm.module, pm.schedule) if cfg.check else None
    trace = collective_trace(pm, plan) if cfg.check else None
    total_steps = cfg.steps if cfg.check else cfg.warmup + cfg.steps
    timer, losses = StepTimer(cfg.device), []
    for step in range(total_steps):
        inputs, targets = _rank_batch(model, plan, pm, cfg, step)
        with collected_first():
            dist.barrier()
            _sync(cfg.device)
            timer.start()
            if recorder is not None:
                recorder.active = step == 0
            traced = cfg.check and step == total_steps - 1  # a pipeline's first step also runs torch's shape inference
            with trace if traced else nullcontext():
                local = train_step(pm, plan, inputs, targets, loss_fn, recorder)
            held = state_bytes(pm) if cfg.check and step == 0 else None  # gradients as backward left them
            opt.step()
            if traced:
                result["collectives"] = unit_traces(pm.units)
                result["model_parallel"] = trace.record()
            if held is not None:
                result["state_bytes"] = _merge_grads(state_bytes(pm), held)
                _check_state(result, pm, model)
            opt.zero_grad()
            timer.stop()
        result["step_times_s"].append(timer.seconds())
        losses.append(local)  # on the device: reading it here would sync the host every step
        progress({"step": step, "step_time_s": result["step_times_s"][-1]})
    result["losses"] = [_global_loss(pm, plan, l) for l in losses]
    if cfg.check:
        recorder.active = False
        result["executed"] = recorder.record()
        result["params"] = full_tensors(pm.module, grads=False, tied=is_tied(model), rows=pm.padded_rows)
    if cfg.track_memory:
        result.update(_peak_memory(pm, plan, opt, loss_fn, model, cfg))
    return result


def collective_trace(pm: ParallelModel, plan: Plan) -> CollectiveTrace:
    """A model-parallel trace (executor.trace) watching this rank's embedding, blocks, relayouts,
    head and loss and, under a pipeline of one chunk per rank, its stage's boundaries."""
    trace = CollectiveTrace([u.trace for u in pm.units if u.trace is not None])
    for chunk in _chunks(pm.module):
        ids = sorted(int(key) for key in chunk.layers)
        if chunk.embed is not None:
            trace.watch_embedding(chunk.embed)
        for key, wrapped in chunk.layers.items():
            trace.watch_block(int(key), _first(wrapped, Block))
        # a relayout into layer i (the head: len(plan.layers)), named by its place in the chunk; a
        # chunk of no layer relays nothing out (the embedding's hands on layer 0's layout)
        into = {"in": 0, "head": len(plan.layers), **({"out": ids[-1] + 1} if ids else {})}
        for key, relayout in chunk.relayouts.items():
            trace.watch_module(relayout, f"relayout {into[key] if key in into else int(key)}")
        if chunk.head is not None:
            trace.watch_module(chunk.head, "head")
            if hasattr(chunk.head, "loss"):
                trace.watch_module(chunk.head.loss, "loss")
    chunks = plan.stage_chunks(pm.stage)
    if plan.pp > 1 and len(chunks) == 1:
        layers = plan.chunk_ranges()[chunks[0]]
        trace.watch_stage(chunks[0], plan.pp, layers[0], layers[-1])
    return trace


def _check_state(result: dict, pm: ParallelModel, model: ModelSpec) -> None:
    """First-step gradients, summed and unsharded (a check-only gather)."""
    for bucket in pm.data_parallel.buckets:
        bucket.materialize_grads()
    result["grads"] = full_tensors(pm.module, grads=True, tied=is_tied(model), rows=pm.padded_rows)


def _merge_grads(after_step: dict, before_step: dict) -> dict:
    return {name: {**units, "grads": before_step[name]["grads"]} for name, units in after_step.items()}


def state_bytes(pm: ParallelModel) -> dict[str, dict[str, int]]:
    """Per unit: bytes of parameters, gradients and optimizer state this rank holds (after a
    step, before the gradients are freed)."""
    adam = pm.data_parallel.adam

    def opt_bytes(tensors) -> int:
        return sum(local(v).numel() * v.element_size() for t in tensors for k, v in adam.state.get(t, {}).items()
                   if k != "step" and torch.is_tensor(v))

    def nbytes(tensors) -> int:
        return sum(local(t).numel() * local(t).element_size() for t in tensors)

    out = {}
    for unit in pm.units:
        if unit.bucket is not None:
            s = unit.bucket.state_tensors()
            out[unit.name] = {"params": nbytes(s["params"]), "grads": nbytes(s["grads"]),
                              "optimizer": nbytes(s["master"]) + opt_bytes(s["master"])}
        else:
            params = [p for p in unit.module.parameters() if p not in unit.ignored]
            out[unit.name] = {"params": nbytes(params), "grads": nbytes([p.grad for p in params if p.grad is not None]),
                              "optimizer": opt_bytes(params)}
        out[unit.name].update(numel=unit.numel, dp_type=unit.dp_type, dp=unit.dp)
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _rank_batch(model: ModelSpec, plan: Plan, pm: ParallelModel, cfg: TrainConfig, step: int):
    inputs, targets = synthetic_batch(model, plan.global_batch, cfg.seed + step)
    inputs = rank_slice(inputs, plan, pm.first_layout, pm.local_rank).to(cfg.device)
    targets = rank_slice(targets, plan, pm.last_layout, pm.local_rank).to(cfg.device)
    if cfg.bf16 and inputs.is_floating_point():
        inputs = inputs.to(torch.bfloat16)
    return inputs, targets


def _peak_memory(pm: ParallelModel, plan: Plan, opt, loss_fn, model: ModelSpec, cfg: TrainConfig) -> dict:
    """Peak bytes of one more training step: CUDA allocator peak (and reserved) on GPU,
    MemTracker on CPU."""
    inputs, targets = _rank_batch(model, plan, pm, cfg, 0)
    if cfg.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        train_step(pm, plan, inputs, targets, loss_fn)
        opt.step()
        opt.zero_grad()
        return {"peak_memory_bytes": int(torch.cuda.max_memory_allocated()),
                "reserved_memory_bytes": int(torch.cuda.memory_reserved())}
    if schedule_entry(plan.schedule).splits_backward:  # MemTracker's hooks cannot follow it (live_memory.py)
        return {"peak_memory_bytes": _live_peak_bytes(pm, plan, opt, loss_fn, inputs, targets), "reserved_memory_bytes": 0}
    tracker = _micro_batch_tracker()
    tracker.track_external(pm.module, opt.adam, *[b.master for b in opt.buckets])
    with tracker, warnings.catch_warnings():
        # the gradient buckets take the gradients in a post-accumulate hook (p.grad = None)
        # before MemTracker's own hook reads them, which then warns once per parameter
        warnings.filterwarnings("ignore", "Expected a tensor or a traceable wrapper-subclass", UserWarning)
        train_step(pm, plan, inputs, targets, loss_fn)
        opt.step()
        opt.zero_grad()
    peak = tracker.get_tracker_snapshot("peak")
    return {"peak_memory_bytes": int(sum(v.get("Total", 0) for v in peak.values())), "reserved_memory_bytes": 0}


def _live_peak_bytes(pm: ParallelModel, plan: Plan, opt, loss_fn, inputs, targets) -> int:
    """One more step's peak of live storages (executor.live_memory), the model's parameters,
    buffers and gradients, the optimizer's states and the buckets' master copies counted from
    the start."""
    from executor.live_memory import LiveStorageBytes
    tracker = LiveStorageBytes()
    params = list(pm.module.parameters())
    tracker.track([params, [p.grad for p in params if p.grad is not None], list(pm.module.buffers()),
                   list(opt.adam.state.values()), [b.master for b in opt.buckets]])
    with tracker:
        train_step(pm, plan, inputs, targets, loss_fn)
        opt.step()
        opt.zero_grad()
    return tracker.peak_bytes


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
