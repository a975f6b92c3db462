"""The single-process reference run (same seed, same data, plain SGD) and the --check
comparison of a parallel run against it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from executor.model import Transformer, per_sample_loss, synthetic_batch
from specs import ModelSpec, Plan

CHECK_ATOL = 1e-5
"""fp32 tolerance of --check (loss, first-step gradients, parameters after the last step)."""


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


def reference_run(model: ModelSpec, plan: Plan, steps: int, seed: int, lr: float) -> dict:
    """Loss per step, first-step gradients and final parameters of a one-process SGD run."""
    torch.manual_seed(seed)
    net = Transformer(model, seed)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    losses, grads = [], {}
    for step in range(steps):
        inputs, targets = synthetic_batch(model, plan.global_batch, seed + step)
        loss = per_sample_loss(net(inputs), targets).mean()
        loss.backward()
        losses.append(float(loss.detach()))
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad(set_to_none=True)
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    return {"loss": losses, "grads": grads, "params": params}


def _max_diff(got: dict, want: dict, rank: int, tag: str) -> tuple[float, str, int]:
    worst, where, n = 0.0, "", 0
    for name, tensor in got.items():
        if name not in want:
            raise KeyError(f"rank {rank}: {tag} {name!r} has no reference counterpart")
        if tensor.shape != want[name].shape:
            raise ValueError(f"rank {rank}: {tag} {name} shape {tuple(tensor.shape)} != {tuple(want[name].shape)}")
        diff = float((tensor - want[name]).abs().max()) if tensor.numel() else 0.0
        n += 1
        if diff >= worst:
            worst, where = diff, f"{tag} {name} on rank {rank}"
    return worst, where, n


def compare(per_rank: list[dict], losses: list[float], ref: dict, atol: float = CHECK_ATOL) -> CheckResult:
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
    passed = max(loss_diff, grad_diff, param_diff) <= atol
    return CheckResult(passed=passed, loss_max_abs_diff=loss_diff, grad_max_abs_diff=grad_diff,
                       param_max_abs_diff=param_diff, worst=worst, compared_tensors=count)
