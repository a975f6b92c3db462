"""Measure what the profiled cost model needs on this hardware and write a profile file
(docs/profile_format.md): python -m executor.profile --model tiny-gpt --out profile.json.

Per layer type: forward/backward ms per micro-batch size, parameter bytes, activation bytes
per sample per tp degree (and checkpointed). Embedding + head the same way. With
--world-size N >= 2 (CPU processes, or torchrun on GPUs): all-reduce bus bandwidth per group
size and layout, p2p bandwidth per pipeline degree, and the compute/communication overlap
slowdown.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
from typing import Callable, NamedTuple, Sequence

import torch
import torch.distributed as dist
from torch import nn

from executor.collectives_bench import collective_entries, collective_fields
from executor.devices import resolve_device
from executor.launch import LaunchError, launch
from executor.model import Block, Embedding, Head, per_sample_loss
from executor.parallel.layout import GroupCache
from executor.run import scaled_model
from executor.train import collected_first
from specs import LayerSpec, LayerStrategy, ModelSpec, Recompute, load_model
from specs.cli import ArgumentParser, count, number, output_file
from specs.errors import one_line_errors


MAX_ERROR = 0.1
"""Largest relative standard error a recorded (median) time may keep; a noisier one gets more
repeats, up to MAX_REPEATS, and a profile still noisier is refused, since the planner would be
fitted to the noise."""
MAX_REPEATS = 40
"""Most repeats of one timed quantity."""


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Timed(NamedTuple):
    """One timed quantity over its repeats (the slowest rank's time of each)."""

    median_ms: float
    error: float
    """Relative standard error of the median (median_error)."""
    repeats: int


def median_error(samples: Sequence[float]) -> float:
    """Relative standard error of the median of ``samples``: 1.2533 sigma / sqrt(n) / median,
    sigma estimated robustly as 1.4826 x the median absolute deviation (both factors exact
    for normal data), so that one spell of load does not count as spread."""
    med = statistics.median(samples)
    if med <= 0:
        return 0.0
    mad = statistics.median(abs(x - med) for x in samples)
    return 1.2533 * 1.4826 * mad / math.sqrt(len(samples)) / med


class Timings:
    """Every timed quantity's repeats (the slowest rank's time of each repeat, ms)."""

    def __init__(self, device: str, repeats: int, warmup: int) -> None:
        self.device, self.repeats, self.warmup = device, repeats, warmup
        self.entries: dict[str, Callable[[], float | None]] = {}
        self.samples: dict[str, list[float]] = {}

    def time(self, key: str, fn: Callable[[], float | None]) -> None:
        """Warm ``fn`` up now (allocations, kernel selection, caches) and time it in run();
        ``fn`` may return its own start time, to skip a setup part."""
        for _ in range(self.warmup):
            fn()
        self.entries[key] = fn

    def run(self, keys: Sequence[str] | None = None, rounds: int | None = None) -> None:
        """``rounds`` (default: repeats) rounds, each timing every quantity of ``keys`` (default:
        all) once, every rank together, as in a training step: a spell of load from other
        processes then falls on one repeat of many quantities, not on every repeat of one."""
        for _ in range(self.repeats if rounds is None else rounds):
            for key in self.entries if keys is None else keys:
                self.samples.setdefault(key, []).append(self._once(self.entries[key]))

    def settle(self, max_error: float | None = MAX_ERROR, max_repeats: int = MAX_REPEATS) -> dict[str, Timed]:
        """run(), then further rounds of ``repeats`` over the quantities whose median is still
        less precise than ``max_error``, until none is or each has ``max_repeats`` repeats
        (None: no further rounds). Every rank takes the same decisions: they follow from
        reduce(), which is the same on all."""
        self.run()
        stats = self.reduce()
        while max_error is not None:
            noisy = [k for k, t in stats.items() if t.error > max_error and t.repeats < max_repeats]
            if not noisy:
                return stats
            self.run(noisy, min(self.repeats, max_repeats - max(stats[k].repeats for k in noisy)))
            stats = self.reduce()
        return stats

    def _once(self, fn: Callable[[], float | None]) -> float:
        with collected_first():
            if dist.is_initialized():
                dist.barrier()
            _sync(self.device)
            start = time.perf_counter()
            begin = fn()
            _sync(self.device)
            return (time.perf_counter() - (begin or start)) * 1e3

    def reduce(self) -> dict[str, Timed]:
        """key -> Timed of the slowest rank per repeat (one collective);
        benchmarks.loop_accuracy measures steps the same way."""
        keys = list(self.samples)
        t = torch.tensor([x for k in keys for x in self.samples[k]], dtype=torch.float64, device=self.device)
        if dist.is_initialized():
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        rows = t.cpu().split([len(self.samples[k]) for k in keys])
        return {k: Timed(statistics.median(row.tolist()), median_error(row.tolist()), len(row))
                for k, row in zip(keys, rows)}


def time_module(module: nn.Module, make_input, timings: Timings, key: str, passes: tuple[str, ...] = ("fwd", "bwd")
                ) -> None:
    """Forward and backward (alone) of ``module``, as ``key``/fwd, ``key``/bwd (``passes``: which
    of the two). The backward is what ``module`` runs in backward: a checkpointed module's
    includes its recomputation."""
    device = timings.device

    def forward():
        with torch.no_grad():
            module(make_input())

    def backward():
        module.zero_grad(set_to_none=True)  # each backward makes its gradients, as a step's first
        loss = module(make_input()).float().sum()
        _sync(device)
        begin = time.perf_counter()  # time the backward pass only
        loss.backward()
        return begin

    for name, fn in (("fwd", forward), ("bwd", backward)):
        if name in passes:
            timings.time(f"{key}/{name}", fn)


def shard_spec(layer: LayerSpec, tp: int) -> LayerSpec:
    """What one tensor-parallel rank of ``layer`` computes: heads and MLP width / tp (for a
    MoE block every expert's and the shared experts' width / tp, as the executor splits them)."""
    moe = layer.moe and dataclasses.replace(
        layer.moe, expert_ffn_hidden_size=layer.moe.expert_ffn_hidden_size // tp,
        shared_expert_ffn_hidden_size=layer.moe.shared_expert_ffn_hidden_size // tp)
    return dataclasses.replace(layer, num_heads=layer.num_heads // tp,
                               num_kv_heads=layer.kv_heads // tp if layer.num_kv_heads else 0,
                               head_dim=layer.head_size, ffn_hidden_size=layer.ffn_hidden_size // tp, moe=moe)


def saved_activation_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd keeps for backward during one forward (parameters excluded, storages
    counted once)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


def layer_memory_entry(layer: LayerSpec, tps: list[int], batch: int, device: str, dtype: torch.dtype) -> dict:
    """Signature, parameter bytes and activation bytes per sample per tp of one layer type."""
    block = Block(layer).to(device=device, dtype=dtype)
    shape = (layer.seq_len, layer.hidden_size)
    acts: dict[str, float] = {}
    for tp in tps:
        if layer.num_heads % tp or layer.kv_heads % tp or layer.ffn_hidden_size % tp:
            continue
        shard = Block(shard_spec(layer, tp)).to(device=device, dtype=dtype)
        x = torch.randn(batch, *shape, device=device, dtype=dtype, requires_grad=True)
        acts[str(tp)] = saved_activation_bytes(shard, x) / batch
    acts["ckpt"] = layer.seq_len * layer.hidden_size * torch.finfo(dtype).bits / 8
    sig = {"kind": layer.kind, "hidden_size": layer.hidden_size, "num_heads": layer.num_heads,
           "num_kv_heads": layer.kv_heads, "ffn_hidden_size": layer.ffn_hidden_size, "seq_len": layer.seq_len}
    params = sum(p.numel() * p.element_size() for p in block.parameters())
    return {"signature": sig, "parameter_bytes": params, "activation_bytes_per_sample": acts}


def time_layer(layer: LayerSpec, index: int, batch_sizes: list[int], timings: Timings, dtype: torch.dtype,
               tp: int = 1, zero3: bool = False, *, sequence_parallel: bool = False, groups: GroupCache) -> None:
    """The layer's forward and backward per batch size, as ``layer{index}/{b}``, or as
    ``layer{index}/tp{tp}/{b}``, ``layer{index}/sp{tp}/{b}`` and ``layer{index}/zero3/{b}`` run
    as ``profiled_block`` builds it; under sequence parallelism on this rank's sequence chunk,
    and the backward again with selective recomputation as the executor applies it
    (executor.parallel.checkpoint.apply_ac), as ``layer{index}/sp{tp}/selective/{b}/bwd``."""
    block, key = profiled_block(layer, index, timings.device, dtype, tp, zero3, sequence_parallel=sequence_parallel,
                                groups=groups)
    timed = [(block, key, ("fwd", "bwd"))]
    if sequence_parallel:
        from executor.parallel.checkpoint import apply_ac
        again, _ = profiled_block(layer, index, timings.device, dtype, tp, sequence_parallel=True, groups=groups)
        timed.append((apply_ac(again, Recompute.SELECTIVE), f"{key}/selective", ("bwd",)))
    shape = (layer.seq_len // tp if sequence_parallel else layer.seq_len, layer.hidden_size)
    for b in batch_sizes:
        make = lambda b=b: torch.randn(b, *shape, device=timings.device, dtype=dtype, requires_grad=True)
        for module, name, passes in timed:
            time_module(module, make, timings, f"{name}/{b}", passes)


def profiled_block(layer: LayerSpec, index: int, device: str, dtype: torch.dtype, tp: int = 1,
                   zero3: bool = False, *, sequence_parallel: bool = False,
                   groups: GroupCache) -> tuple[nn.Module, str]:
    """The block to time and its key: at ``tp`` > 1 as the executor runs it tensor parallel
    (executor.parallel.tensor: DTensor column/row splits and their all-reduces; a MoE's routed
    experts split over the same group by executor.parallel.expert) on consecutive groups of tp
    ranks, every group at once; with ``sequence_parallel`` as Megatron-SP runs a block between
    two of the same split (its input and output this rank's sequence chunk, the norms on it,
    an all-gather before attention and the MLP, a reduce-scatter after each, and the DTensor
    layout copies around them); with ``zero3`` as the executor runs a ZeRO-3 layer over every
    rank (executor.parallel.data.apply_fsdp: FSDP2, gathered per pass, gradients
    reduce-scattered). Their meshes take their groups from ``groups``."""
    # a ZeRO-3 layer keeps fp32 shards and computes in the run's dtype (MixedPrecisionPolicy)
    block = Block(layer).to(device=device, dtype=torch.float32 if zero3 else dtype)
    key = f"layer{index}"
    kind = device.split(":")[0]
    world = dist.get_world_size() if dist.is_initialized() else 1
    if tp > 1:
        from executor.parallel.tensor import apply_tp
        mesh = groups.mesh(torch.arange(world).view(world // tp, tp), kind, ("dp", "tp"))["tp"]
        block = apply_tp(block, mesh, sequence_parallel, split_in=sequence_parallel, split_out=sequence_parallel)
        key = f"{key}/{'sp' if sequence_parallel else 'tp'}{tp}"
        if layer.moe is not None:
            _split_experts(block, layer, index, tp, world, groups, kind)
    elif zero3:
        from executor.parallel.data import DataParallel, apply_fsdp
        apply_fsdp(block, groups.mesh(torch.arange(world), kind, ("dp",)), DataParallel(1),
                   dtype == torch.bfloat16, set())
        key = f"{key}/zero3"
    return block, key


def _split_experts(block: nn.Module, layer: LayerSpec, index: int, tp: int, world: int, groups: GroupCache,
                   kind: str) -> None:
    """Split ``block``'s routed experts over its tp group as a tp-only plan runs them
    (executor.parallel.expert: each rank every expert's 1/tp, the outputs summed over the
    group); apply_tp splits only the attention and the shared experts."""
    from executor.parallel.expert import apply_ep, build_strategy_expert_groups
    strategy = LayerStrategy(tp=tp, dp=world // tp)
    build_strategy_expert_groups(strategy, 1, groups)
    apply_ep(block, layer, strategy, index, 0, dist.get_rank(), groups, kind)


def tp_degrees(tps: list[int], world_size: int, layer: LayerSpec) -> list[int]:
    """The tp degrees > 1 the launched world can run ``layer`` at (dividing the world, its heads
    and its key/value heads)."""
    return [tp for tp in sorted(set(tps)) if 1 < tp <= world_size and world_size % tp == 0
            and layer.num_heads % tp == 0 and layer.kv_heads % tp == 0]


def sp_degrees(tps: list[int], world_size: int, layer: LayerSpec) -> list[int]:
    """The tp degrees the layer is also timed at under Megatron-SP: tp_degrees that divide its
    sequence, for a dense block the executor runs sequence parallel (none with cross-attention
    or patch merging, executor.checks); a MoE block's SP run is not profiled: its SP layers
    take the tp tables."""
    if layer.moe is not None or layer.cross_attention_seq_len or layer.downsample_to:
        return []
    return [tp for tp in tp_degrees(tps, world_size, layer) if layer.seq_len % tp == 0]


class _Vocab(nn.Module):
    """Embedding, then head and loss, with no blocks in between."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        self.embed, self.head = Embedding(model.embedding, model.seq_len), Head(model.head)
        self.last_width = model.layers[-1].downsample_to or model.layers[-1].hidden_size
        self.bridge = model.embedding.hidden_size != self.last_width

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Each sample's loss, as the executor's loss takes it (executor.model.per_sample_loss:
        the cross-entropy's log-softmax over the logits and its backward are the head's largest
        passes after the projection)."""
        inputs, targets = batch
        x = self.embed(inputs)
        if self.bridge:  # a Swin model narrows and widens in between: keep shapes consistent
            x = x[..., :1].expand(*x.shape[:-1], self.last_width)
        return per_sample_loss(self.head(x), targets)


def time_vocab(model: ModelSpec, batch_sizes: list[int], timings: Timings, dtype: torch.dtype) -> int:
    """Times embedding + head + loss for each batch size; returns their parameter bytes."""
    from executor.model import synthetic_batch
    device = timings.device
    vocab = _Vocab(model).to(device=device, dtype=dtype)
    for b in batch_sizes:
        inputs, targets = synthetic_batch(model, b, 0)
        inputs = inputs.to(device) if inputs.dtype == torch.long else inputs.to(device=device, dtype=dtype)
        batch = (inputs, targets.to(device) if targets.dtype == torch.long else targets.to(device=device, dtype=dtype))
        time_module(vocab, lambda batch=batch: batch, timings, f"vocab/{b}")
    return sum(p.numel() * p.element_size() for p in vocab.parameters())


OPTIMIZER_PROBE_PARAMS = {"cpu": 1 << 20, "cuda": 1 << 24}
"""Parameters of the smaller of the two buffers the optimizer step is timed on, by device kind;
the larger holds OPTIMIZER_PROBE_RATIO times as many. The slope between the two is the step's
cost per parameter without its fixed cost (kernel launches, Adam's Python). On an H200 one
2M-parameter probe was launch-bound: scaled to a 333M-parameter model it charged 79 ms of
optimizer to a step measured at 21.8 ms (benchmarks.gpu_check, 2026-12-04)."""
OPTIMIZER_PROBE_RATIO = 4


def optimizer_probe_sizes(device: str) -> tuple[int, int]:
    """The two buffer sizes (parameters) the optimizer step is timed on."""
    small = OPTIMIZER_PROBE_PARAMS["cuda" if device.startswith("cuda") else "cpu"]
    return small, small * OPTIMIZER_PROBE_RATIO


def time_optimizer(timings: Timings, dtype: torch.dtype) -> None:
    """The executor's optimizer step (executor.parallel.data: Adam, foreach off, over a flat fp32
    master copy, then the copy back into the model's parameters), as ``optimizer/N`` for each
    probe size N."""
    device = timings.device
    for nparams in optimizer_probe_sizes(device):
        master = torch.zeros(nparams, device=device, requires_grad=True)
        master.grad = torch.randn(nparams, device=device)
        weights = torch.zeros(nparams, device=device, dtype=dtype)
        adam = torch.optim.Adam([master], lr=1e-3, foreach=False)

        def step(adam=adam, master=master, weights=weights):
            adam.step()
            weights.copy_(master.detach())

        timings.time(f"optimizer/{nparams}", step)


def optimizer_ms_per_mparam(stats: dict[str, Timed], device: str) -> float:
    """Slope of the optimizer step's median time over the two probe sizes, ms per million."""
    small, large = optimizer_probe_sizes(device)
    extra_ms = stats[f"optimizer/{large}"].median_ms - stats[f"optimizer/{small}"].median_ms
    return extra_ms / ((large - small) / 1e6)


def profile_rank(rank: int, world_size: int, model: ModelSpec, batch_sizes: list[int], tps: list[int],
                 device: str, dtype: torch.dtype, repeats: int, warmup: int, collective_bytes: int,
                 max_error: float | None = MAX_ERROR, max_repeats: int = MAX_REPEATS) -> dict:
    """What every launched rank runs: the collectives on the job's backend, then the compute
    timings in lockstep with the other ranks (their thread settings, their contention). Every
    group comes from one GroupCache, as in the executor: a process that keeps creating groups
    sees gloo's transfers stall (executor.collectives_bench, docs/executor.md)."""
    if device == "cuda":
        device = f"cuda:{rank}"
        torch.cuda.set_device(torch.device(device))
    groups = GroupCache()
    out: dict = {}
    if world_size > 1:
        comm = Timings(device, repeats, warmup)
        for key, fn in collective_entries(world_size, collective_bytes, groups, device).items():
            comm.time(key, fn)
        out["comm_stats"] = comm.settle(max_error, max_repeats)
        out["collectives"] = collective_fields({k: t.median_ms for k, t in out["comm_stats"].items()},
                                               world_size, collective_bytes)
    timings = Timings(device, repeats, warmup)
    kinds = model.layer_types()
    for i, layer in enumerate(kinds):
        for tp in [1, *tp_degrees(tps, world_size, layer)]:
            time_layer(layer, i, batch_sizes, timings, dtype, tp, groups=groups)
        for tp in sp_degrees(tps, world_size, layer):
            time_layer(layer, i, batch_sizes, timings, dtype, tp, sequence_parallel=True, groups=groups)
        if world_size > 1:
            time_layer(layer, i, batch_sizes, timings, dtype, zero3=True, groups=groups)
    vocab_bytes = time_vocab(model, batch_sizes, timings, dtype)
    time_optimizer(timings, dtype)
    return {**out, "stats": timings.settle(max_error, max_repeats), "vocab_bytes": vocab_bytes,
            "device_name": _device_name(device)}


def _tables(stats: dict, key: str, batch_sizes: list[int]) -> tuple[dict, dict]:
    return _table(stats, key, batch_sizes, "fwd"), _table(stats, key, batch_sizes, "bwd")


def _table(stats: dict, key: str, batch_sizes: list[int], name: str) -> dict:
    return {str(b): stats[f"{key}/{b}/{name}"].median_ms for b in batch_sizes}


def noisy_entries(stats: dict[str, Timed], max_error: float) -> list[str]:
    """Timed quantities whose median is less precise than ``max_error``."""
    return [f"{k} {t.error:.2f} ({t.repeats} repeats)" for k, t in sorted(stats.items()) if t.error > max_error]


def build_profile(model: ModelSpec, *, batch_sizes: list[int], tps: list[int], device: str = "cpu",
                  dtype: torch.dtype = torch.float32, repeats: int = 5, warmup: int = 2, world_size: int = 1,
                  collective_bytes: int = 1 << 22, timeout_s: float = 300.0, max_error: float | None = MAX_ERROR,
                  max_repeats: int = MAX_REPEATS):
    """The whole Profile object, measured inside ``world_size`` launched ranks (one thread
    each, as training runs): ``repeats`` of every time, more (up to ``max_repeats``) of those
    whose median is less precise than ``max_error`` (relative standard error); refused with the
    noisy entries named if any still is (None: no more repeats, accept anything)."""
    from specs.profile_format import Profile, ProfileError
    backend = "nccl" if device.startswith("cuda") else "gloo"
    result = launch(profile_rank, world_size, model, batch_sizes, tps, device, dtype, repeats, warmup,
                    collective_bytes, max_error, max(max_repeats, repeats), timeout_s=timeout_s, backend=backend)[0]
    stats = result["stats"]
    noisy = noisy_entries(stats, max_error) if max_error is not None else []
    if noisy:
        raise ProfileError("profile", f"timings too noisy (relative standard error of the median > {max_error} "
                           f"after up to {max(max_repeats, repeats)} repeats): {', '.join(noisy[:4])}"
                           f"{' ...' if len(noisy) > 4 else ''}; the machine is probably loaded: rerun, or raise "
                           "--max-error or --max-repeats")
    mem_device = "cpu" if device.startswith("cuda") else device  # activation bytes: same on any device
    layers = []
    for i, layer in enumerate(model.layer_types()):
        entry = layer_memory_entry(layer, tps, max(batch_sizes), mem_device, dtype)
        entry["forward_ms"], entry["backward_ms"] = _tables(stats, f"layer{i}", batch_sizes)
        sharded = {tp: _tables(stats, f"layer{i}/tp{tp}", batch_sizes) for tp in tp_degrees(tps, world_size, layer)}
        if sharded:
            entry["tp_forward_ms"] = {str(tp): f for tp, (f, _) in sharded.items()}
            entry["tp_backward_ms"] = {str(tp): b for tp, (_, b) in sharded.items()}
        split = {tp: _tables(stats, f"layer{i}/sp{tp}", batch_sizes) for tp in sp_degrees(tps, world_size, layer)}
        if split:
            entry["sp_forward_ms"] = {str(tp): f for tp, (f, _) in split.items()}
            entry["sp_backward_ms"] = {str(tp): b for tp, (_, b) in split.items()}
            entry["sp_selective_backward_ms"] = {
                str(tp): _table(stats, f"layer{i}/sp{tp}/selective", batch_sizes, "bwd") for tp in split}
        if world_size > 1:
            fwd, bwd = _tables(stats, f"layer{i}/zero3", batch_sizes)
            entry["zero3_forward_ms"], entry["zero3_backward_ms"] = {str(world_size): fwd}, {str(world_size): bwd}
        layers.append(entry)
    fwd, bwd = _tables(stats, "vocab", batch_sizes)
    errors = [t.error for t in stats.values()]
    raw = {"format": "hybridpar-profile", "version": 1,
           "hardware": {"device": result["device_name"], "world_size": world_size,
                        "dtype": str(dtype).replace("torch.", ""), "torch": torch.__version__,
                        "model": model.name, "threads_per_rank": 1, "statistic": "median of the slowest rank",
                        "repeats": repeats, "most_repeats": max(t.repeats for t in stats.values()),
                        "warmup": warmup, "max_error": round(max(errors), 4),
                        "median_error": round(statistics.median(errors), 4)},
           "layers": layers, "vocab": {"forward_ms": fwd, "backward_ms": bwd, "parameter_bytes": result["vocab_bytes"]}}
    raw.update(result.get("collectives", {}))
    if "comm_stats" in result:  # settled like the compute times, but never refused: gloo's
        # transfers on loopback come in two modes (ms, or ~40 ms stalls), spread that is no load
        raw["hardware"]["collective_max_error"] = round(max(t.error for t in result["comm_stats"].values()), 4)
    raw["optimizer_ms_per_mparam"] = optimizer_ms_per_mparam(stats, device)
    return Profile.from_dict(raw)


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu-process"


@one_line_errors(LaunchError)
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m executor.profile", description=__doc__)
    parser.add_argument("--model", required=True, help="zoo model name")
    parser.add_argument("--scale", help="shrink the model: hidden=H,layers=L,seq=S")
    parser.add_argument("--batch-sizes", type=count(4096), nargs="+", default=[1, 2, 4], help="micro-batch sizes to time")
    parser.add_argument("--tp", type=count(64), nargs="+", default=[1, 2, 4, 8], help="tensor-parallel degrees for the activation tables")
    parser.add_argument("--world-size", type=count(1024), default=1,
                        help="ranks to profile in (all time compute together; collectives need >= 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when a CUDA GPU is visible, else cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default=None,
                        help="default: bf16 on GPU, fp32 on CPU")
    parser.add_argument("--repeats", type=count(10_000), default=5, help="timed repeats per measurement (at least)")
    parser.add_argument("--warmup", type=count(10_000, minimum=0), default=2, help="untimed runs before each measurement")
    parser.add_argument("--max-error", type=number(0.0, 100.0), default=MAX_ERROR,
                        help="repeat a time until the relative standard error of its median is below this; "
                             "refuse the profile if one is not after --max-repeats")
    parser.add_argument("--max-repeats", type=count(10_000), default=MAX_REPEATS,
                        help="most repeats of one time")
    parser.add_argument("--out", required=True, help="profile file to write")
    args = parser.parse_args(argv)
    output_file(args.out, "--out")  # before the timing runs, not after them
    device, why = resolve_device(args.device)
    print(why, file=sys.stderr)
    dtype_name = args.dtype or ("bf16" if device == "cuda" else "fp32")
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    from specs.profile_format import save_profile
    model = scaled_model(load_model(args.model), args.scale)
    profile = build_profile(model, batch_sizes=args.batch_sizes, tps=args.tp, device=device, dtype=dtype,
                            repeats=args.repeats, warmup=args.warmup, world_size=args.world_size,
                            max_error=args.max_error, max_repeats=args.max_repeats)
    save_profile(profile, args.out)
    print(f"wrote {args.out}: {len(profile.layers)} layer types, "
          f"all-reduce {profile.allreduce_gbytes_per_s or '-'}, overlap {profile.overlap_coefficient:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
