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
import statistics
import sys
import time

import torch
from torch import nn

from executor.collectives_bench import measure_collectives
from executor.launch import LaunchError, launch
from executor.model import Block, Embedding, Head
from executor.run import scaled_model
from specs import LayerSpec, ModelSpec, load_model
from specs.cli import ArgumentParser, count, output_file
from specs.errors import one_line_errors


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _median_ms(fn, device: str, repeats: int, warmup: int = 2) -> float:
    """Wall time of ``fn`` (which may return its own start time, to skip a setup part)."""
    for _ in range(warmup):  # allocations, kernel selection
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        begin = fn()
        _sync(device)
        times.append((time.perf_counter() - (begin or start)) * 1e3)
    # shared CPU cores: interference only ever adds time, so the fastest run is the estimate
    return min(times) if device == "cpu" else statistics.median(times)


def time_module(module: nn.Module, make_input, device: str, repeats: int) -> tuple[float, float]:
    """Forward ms and backward ms (backward alone, no recomputation) of ``module``."""
    def forward():
        with torch.no_grad():
            module(make_input())

    def backward():
        loss = module(make_input()).float().sum()
        _sync(device)
        begin = time.perf_counter()  # time the backward pass only
        loss.backward()
        return begin

    fwd = _median_ms(forward, device, repeats)
    bwd = _median_ms(backward, device, repeats)
    module.zero_grad(set_to_none=True)
    return fwd, bwd


def shard_spec(layer: LayerSpec, tp: int) -> LayerSpec:
    """What one tensor-parallel rank of ``layer`` computes: heads and MLP width / tp."""
    return dataclasses.replace(layer, num_heads=layer.num_heads // tp,
                               num_kv_heads=layer.kv_heads // tp if layer.num_kv_heads else 0,
                               head_dim=layer.head_size, ffn_hidden_size=layer.ffn_hidden_size // tp)


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


def profile_layer(layer: LayerSpec, batch_sizes: list[int], tps: list[int], device: str,
                  dtype: torch.dtype, repeats: int) -> dict:
    """One ``layers[*]`` entry of the profile file."""
    block = Block(layer).to(device=device, dtype=dtype)
    shape = (layer.seq_len, layer.hidden_size)
    fwd, bwd = {}, {}
    for b in batch_sizes:
        make = lambda b=b: torch.randn(b, *shape, device=device, dtype=dtype, requires_grad=True)
        fwd[str(b)], bwd[str(b)] = time_module(block, make, device, repeats)
    b = max(batch_sizes)
    acts: dict[str, float] = {}
    for tp in tps:
        if layer.num_heads % tp or layer.kv_heads % tp or layer.ffn_hidden_size % tp:
            continue
        shard = Block(shard_spec(layer, tp)).to(device=device, dtype=dtype)
        x = torch.randn(b, *shape, device=device, dtype=dtype, requires_grad=True)
        acts[str(tp)] = saved_activation_bytes(shard, x) / b
    acts["ckpt"] = layer.seq_len * layer.hidden_size * torch.finfo(dtype).bits / 8
    sig = {"kind": layer.kind, "hidden_size": layer.hidden_size, "num_heads": layer.num_heads,
           "num_kv_heads": layer.kv_heads, "ffn_hidden_size": layer.ffn_hidden_size, "seq_len": layer.seq_len}
    params = sum(p.numel() * p.element_size() for p in block.parameters())
    return {"signature": sig, "forward_ms": fwd, "backward_ms": bwd, "parameter_bytes": params,
            "activation_bytes_per_sample": acts}


class _Vocab(nn.Module):
    """Embedding, then head and loss, with no blocks in between."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        self.embed, self.head = Embedding(model.embedding, model.seq_len), Head(model.head)
        self.last_width = model.layers[-1].downsample_to or model.layers[-1].hidden_size
        self.bridge = model.embedding.hidden_size != self.last_width

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.embed(inputs)
        if self.bridge:  # a Swin model narrows and widens in between: keep shapes consistent
            x = x[..., :1].expand(*x.shape[:-1], self.last_width)
        return self.head(x)


def profile_vocab(model: ModelSpec, batch_sizes: list[int], device: str, dtype: torch.dtype, repeats: int) -> dict:
    from executor.model import synthetic_batch
    vocab = _Vocab(model).to(device=device, dtype=dtype)
    fwd, bwd = {}, {}
    for b in batch_sizes:
        inputs, _ = synthetic_batch(model, b, 0)
        inputs = inputs.to(device) if inputs.dtype == torch.long else inputs.to(device=device, dtype=dtype)
        fwd[str(b)], bwd[str(b)] = time_module(vocab, lambda: inputs, device, repeats)
    params = sum(p.numel() * p.element_size() for p in vocab.parameters())
    return {"forward_ms": fwd, "backward_ms": bwd, "parameter_bytes": params}


def build_profile(model: ModelSpec, *, batch_sizes: list[int], tps: list[int], device: str = "cpu",
                  dtype: torch.dtype = torch.float32, repeats: int = 3, world_size: int = 1,
                  collective_bytes: int = 1 << 22, timeout_s: float = 300.0):
    """The whole Profile object (compute on this process, collectives on world_size processes)."""
    from specs.profile_format import Profile
    layers = [profile_layer(l, batch_sizes, tps, device, dtype, repeats) for l in model.layer_types()]
    raw = {"format": "hybridpar-profile", "version": 1,
           "hardware": {"device": _device_name(device), "world_size": world_size,
                        "dtype": str(dtype).replace("torch.", ""), "torch": torch.__version__,
                        "model": model.name},
           "layers": layers, "vocab": profile_vocab(model, batch_sizes, device, dtype, repeats)}
    if world_size > 1:
        per_rank = launch(measure_collectives, world_size, collective_bytes, repeats, timeout_s=timeout_s)
        raw.update(per_rank[0])
    return Profile.from_dict(raw)


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else "cpu-process"


@one_line_errors(LaunchError)
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m executor.profile", description=__doc__)
    parser.add_argument("--model", required=True, help="zoo model name")
    parser.add_argument("--scale", help="shrink the model: hidden=H,layers=L,seq=S")
    parser.add_argument("--batch-sizes", type=count(4096), nargs="+", default=[1, 2, 4], help="micro-batch sizes to time")
    parser.add_argument("--tp", type=count(64), nargs="+", default=[1, 2, 4, 8], help="tensor-parallel degrees for the activation tables")
    parser.add_argument("--world-size", type=count(1024), default=1, help="CPU processes for the collective tables")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where to time the layers")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default=None,
                        help="default: bf16 on GPU, fp32 on CPU")
    parser.add_argument("--repeats", type=count(10_000), default=5, help="timed repeats per measurement")
    parser.add_argument("--out", required=True, help="profile file to write")
    args = parser.parse_args(argv)
    output_file(args.out, "--out")  # before the timing runs, not after them
    dtype_name = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    from specs.profile_format import save_profile
    model = scaled_model(load_model(args.model), args.scale)
    profile = build_profile(model, batch_sizes=args.batch_sizes, tps=args.tp, device=args.device,
                            dtype=dtype, repeats=args.repeats, world_size=args.world_size)
    save_profile(profile, args.out)
    print(f"wrote {args.out}: {len(profile.layers)} layer types, "
          f"all-reduce {profile.allreduce_gbytes_per_s or '-'}, overlap {profile.overlap_coefficient:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
