"""The single-process reference run (same seed, same data, Adam) and the --check comparison of a
parallel run against it: numerics, and each layer's per-rank state bytes against the plan's."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from executor.model import Transformer, per_sample_loss, synthetic_batch
from specs import ModelSpec, Plan

CHECK_ATOL = 1e-5
"""fp32 tolerance of --check (loss, first-step gradients, parameters after the last step)."""
CHECK_ATOL_BF16 = 2e-2
"""bf16 tolerance: bf16 rounds to 8 bits of mantissa (relative 4e-3), and the order of the
summations differs between the parallel run and the reference (docs/executor.md)."""

STATE_BYTES_PER_ELEMENT = {
    # (parameters, gradients, optimizer) bytes per element and the dp_type's sharding of each;
    # buckets keep an fp32 master + Adam m and v (12 B), ZeRO-3 shards are the fp32 master
    "ddp": ((None, 1), (None, 1), (12, 1)),
    "zero1": ((None, 1), (None, 1), (12, "dp")),
    "zero2": ((None, 1), (None, "dp"), (12, "dp")),
    "zero3": ((4, "dp"), (4, "dp"), (8, "dp")),
}
"""None: the working dtype (4 B fp32, 2 B bf16); "dp": divided by the layer's dp degree."""


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """How far a parallel run is from the single-process reference."""

    passed: bool
    loss_max_abs_diff: float
    """Largest |loss - reference loss| over the steps."""
    grad_max_abs_diff: float
    """Largest element difference of the first step's gradients, over every rank's copy."""
    param_max_abs_diff: float
    """Largest element difference of the parameters after the last step."""
    worst: str
    """Parameter (and rank) with the largest difference."""
    compared_tensors: int
    """Gradient and parameter tensors compared (over all ranks)."""
    atol: float = CHECK_ATOL
    """Tolerance the differences were held to."""
    state_bytes_errors: tuple[str, ...] = ()
    """Layers whose per-rank parameter/gradient/optimizer bytes differ from the plan's."""


def expected_state_bytes(dp_type: str, dp: int, numel: int, bf16: bool) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state one rank holds for ``numel`` elements
    run under ``dp_type`` over ``dp`` ranks (STATE_BYTES_PER_ELEMENT)."""
    out = {}
    for key, (per, shard) in zip(("params", "grads", "optimizer"), STATE_BYTES_PER_ELEMENT[dp_type]):
        nbytes = per if per is not None else (2 if bf16 else 4)
        out[key] = numel * nbytes / (dp if shard == "dp" else 1)
    return out


def state_bytes_errors(per_rank: list[dict], bf16: bool) -> list[str]:
    """Every (rank, layer, category) whose bytes are not the plan's, up to shard padding (one
    element per rank of the group and per tensor row)."""
    errors = []
    for rank, result in enumerate(per_rank):
        for name, got in result.get("state_bytes", {}).items():
            want = expected_state_bytes(got["dp_type"], got["dp"], got["numel"], bf16)
            for key, value in want.items():
                slack = 0.01 * value + 64 * got["dp"]
                if abs(got[key] - value) > slack:
                    errors.append(f"rank {rank} {name} ({got['dp_type']} dp{got['dp']}): {key} {got[key]} B, "
                                  f"plan {value:.0f} B")
    return errors


class _MixedAdam:
    """Adam on fp32 masters of a bf16 (or fp32) network: the reference's mixed precision."""

    def __init__(self, net: torch.nn.Module, lr: float, eps: float, dtype: torch.dtype) -> None:
        self.params = list(net.parameters())
        self.masters = [p.detach().float().clone() for p in self.params]
        net.to(dtype)
        self.adam = torch.optim.Adam(self.masters, lr=lr, eps=eps, foreach=False)

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad = p.grad.float() if p.grad is not None else torch.zeros_like(m)
        self.adam.step()
        for p, m in zip(self.params, self.masters):
            p.copy_(m)
            p.grad = None


def reference_run(model: ModelSpec, plan: Plan, steps: int, seed: int, lr: float, eps: float = 1e-4,
                  bf16: bool = False) -> dict:
    """Loss per step, first-step gradients and final parameters of a one-process Adam run
    (bf16: bf16 network, fp32 masters and states, as the parallel run)."""
    torch.manual_seed(seed)
    net = Transformer(model, seed)
    opt = _MixedAdam(net, lr, eps, torch.bfloat16 if bf16 else torch.float32)
    losses, grads = [], {}
    for step in range(steps):
        inputs, targets = synthetic_batch(model, plan.global_batch, seed + step)
        if bf16 and inputs.is_floating_point():
            inputs = inputs.to(torch.bfloat16)
        loss = per_sample_loss(net(inputs), targets).mean()
        loss.backward()
        losses.append(float(loss.detach()))
        if step == 0:
            grads = {n: p.grad.detach().float().clone() for n, p in net.named_parameters() if p.grad is not None}
        opt.step()
    params = {n: p.detach().float().clone() for n, p in net.named_parameters()}
    return {"loss": losses, "grads": grads, "params": params}


def _max_diff(got: dict, want: dict, rank: int, tag: str) -> tuple[float, str, int]:
    worst, where, n = 0.0, "", 0
    for name, tensor in got.items():
        if name not in want:
            raise KeyError(f"rank {rank}: {tag} {name!r} has no reference counterpart")
        if tensor.shape != want[name].shape:
            raise ValueError(f"rank {rank}: {tag} {name} shape {tuple(tensor.shape)} != {tuple(want[name].shape)}")
        ref = want[name]
        # absolute near zero, relative for large entries (a bf16 step is relative)
        diff = float(((tensor - ref).abs() / (1 + ref.abs())).max()) if tensor.numel() else 0.0
        n += 1
        if diff >= worst:
            worst, where = diff, f"{tag} {name} on rank {rank}"
    return worst, where, n


def compare(per_rank: list[dict], losses: list[float], ref: dict, atol: float = CHECK_ATOL,
            bf16: bool = False) -> CheckResult:
    """Every rank's gradients and parameters (full tensors) against the reference's."""
    loss_diff = max(abs(a - b) for a, b in zip(losses, ref["loss"]))
    grad_diff = param_diff = 0.0
    worst, worst_val, count = "loss", loss_diff, 0
    covered: set[str] = set()
    for rank, result in enumerate(per_rank):
        g, g_where, n1 = _max_diff(result["grads"], ref["grads"], rank, "grad")
        p, p_where, n2 = _max_diff(result["params"], ref["params"], rank, "param")
        covered.update(result["params"])
        count += n1 + n2
        grad_diff, param_diff = max(grad_diff, g), max(param_diff, p)
        for val, where in ((g, g_where), (p, p_where)):
            if val > worst_val:
                worst, worst_val = where, val
    missing = set(ref["params"]) - covered
    if missing:
        raise ValueError(f"no rank holds {len(missing)} parameters, e.g. {sorted(missing)[0]}")
    bytes_errors = state_bytes_errors(per_rank, bf16)
    passed = max(loss_diff, grad_diff, param_diff) <= atol and not bytes_errors
    return CheckResult(passed=passed, loss_max_abs_diff=loss_diff, grad_max_abs_diff=grad_diff,
                       param_max_abs_diff=param_diff, worst=worst, compared_tensors=count, atol=atol,
                       state_bytes_errors=tuple(bytes_errors))
