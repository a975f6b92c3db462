"""The single-process reference run (same seed, same data, Adam) and the --check comparison of a
parallel run against it: numerics, and each layer's per-rank state bytes against the plan's."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from executor.execution import execution_errors, part_key
from executor.model import Transformer, per_sample_loss, synthetic_batch
from specs import ModelSpec, Plan

CHECK_ATOL = 1e-5
"""fp32 tolerance of --check (loss, first-step gradients, parameters after the last step)."""
CHECK_ATOL_BF16 = 2e-2
"""bf16 tolerance: bf16 rounds to 8 bits of mantissa (relative 4e-3), and the order of the
summations differs between the parallel run and the reference (docs/executor.md)."""

GRAD_RTOL = 1e-4
"""fp32 tolerance of each first-step gradient tensor's error relative to its norm."""
GRAD_RTOL_BF16 = 1e-1
"""bf16 tolerance of the same: a gradient sync that is dropped or scaled by 1/dp moves a tensor
by half its norm or more at dp 2, far above bf16's rounding of a sum (docs/executor.md)."""
GRAD_NORM_FLOOR = 1e-3
"""Share of the largest reference gradient norm added to each tensor's norm: a gradient that is
zero up to rounding (a key bias) is compared absolutely."""

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
    grad_norm_rel_diff: float = 0.0
    """Largest ||g - g_ref|| / (||g_ref|| + floor) of a first-step gradient tensor, in fp32 after
    the data-parallel reductions (floor: GRAD_NORM_FLOOR of the largest reference tensor norm)."""
    grad_norm_worst: str = ""
    """Gradient (and rank) with the largest ``grad_norm_rel_diff``."""
    grad_rtol: float = 0.0
    """Tolerance of ``grad_norm_rel_diff``."""
    execution_errors: tuple[str, ...] = ()
    """What the ranks ran that the plan does not say (executor.execution): schedule order per
    stage, forward passes and sequence split per layer."""
    memory_errors: tuple[str, ...] = ()
    """Ranks whose measured peak exceeds the predicted one beyond the tolerance (when a
    prediction was given)."""
    collective_errors: tuple[str, ...] = ()
    """Layer parts whose data-parallel collectives differ from those the cost model charges
    (when a prediction was given)."""


def expected_state_bytes(dp_type: str, dp: int, numel: int, bf16: bool) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state one rank holds for ``numel`` elements
    run under ``dp_type`` over ``dp`` ranks (STATE_BYTES_PER_ELEMENT)."""
    out = {}
    for key, (per, shard) in zip(("params", "grads", "optimizer"), STATE_BYTES_PER_ELEMENT[dp_type]):
        nbytes = per if per is not None else (2 if bf16 else 4)
        out[key] = numel * nbytes / (dp if shard == "dp" else 1)
    return out


TP_COLUMNS = re.compile(r"\.(attn|cross)\.(q|k|v)\.|\.mlp\.(shared\.)?(fc1|gate|up)\.")
TP_ROWS = re.compile(r"\.(attn|cross)\.o\.weight$|\.mlp\.(shared\.)?(fc2|down)\.weight$")
"""Megatron's split of a block: column-parallel projections (weights and biases) and the weights
of row-parallel ones are 1/tp per rank; norms, routers and row-parallel biases are whole."""


def layer_unit_plan(plan: Plan, shapes: dict[str, tuple[int, ...]], name: str) -> tuple[str, int, int] | None:
    """(dp type, dp degree, elements per rank before data parallelism) the plan gives unit ``name``
    ("layer i" or "layer i experts"), from the full model's parameter ``shapes``; None for the
    other units (embedding, head, tied weight: their elements are taken as built)."""
    key = part_key(name)
    if key is None:
        return None
    i, part = key
    s = plan.layers[i]
    numels = {n: math.prod(shape) for n, shape in shapes.items() if n.startswith(f"layers.{i}.")}
    if part == "experts":
        numel = sum(v for n, v in numels.items() if ".mlp.experts." in n) // (s.ep * s.etp)
        return (s.expert_dp_kind if s.expert_dp > 1 else "ddp"), s.expert_dp, numel
    numel = sum(v // s.tp if TP_COLUMNS.search(n) or TP_ROWS.search(n) else v
                for n, v in numels.items() if ".mlp.experts." not in n)
    dp = s.degrees.grad_sync
    return (s.dp_type if dp > 1 else "ddp"), dp, numel


def state_bytes_errors(per_rank: list[dict], bf16: bool, plan: Plan, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """Every (rank, unit, category) whose bytes are not the plan's, up to shard padding (one
    element per rank of the group and per tensor row). A layer's dp type, degree and elements
    come from the plan and the full model (not from what the rank built or says it built)."""
    errors = []
    for rank, result in enumerate(per_rank):
        for name, got in result.get("state_bytes", {}).items():
            dp_type, dp, numel = layer_unit_plan(plan, shapes, name) or (got["dp_type"], got["dp"], got["numel"])
            want = expected_state_bytes(dp_type, dp, numel, bf16)
            if any(abs(got[key] - value) > 0.01 * value + 64 * dp for key, value in want.items()):
                held = " / ".join(str(got[key]) for key in want)
                means = " / ".join(f"{value:.0f}" for value in want.values())
                errors.append(f"{name} (rank {rank}): holds {held} B of params / grads / optimizer; the plan means "
                              f"{means} B ({numel} elements per rank after tensor parallelism, {dp_type} dp{dp})")
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


def grad_norm_diff(per_rank: list[dict], ref_grads: dict) -> tuple[float, str]:
    """Largest error of a gradient tensor relative to its norm, over every rank's copy, and where."""
    floor = GRAD_NORM_FLOOR * max(float(g.norm()) for g in ref_grads.values())
    worst, where = 0.0, ""
    for rank, result in enumerate(per_rank):
        for name, g in result["grads"].items():
            ref = ref_grads[name]
            diff = float((g - ref).norm()) / (float(ref.norm()) + floor)
            if diff >= worst:
                worst, where = diff, f"grad {name} on rank {rank}"
    return worst, where


def compare(per_rank: list[dict], losses: list[float], ref: dict, plan: Plan, model: ModelSpec,
            atol: float = CHECK_ATOL, bf16: bool = False, grad_rtol: float | None = None) -> CheckResult:
    """Every rank's gradients and parameters (full tensors) against the reference's, its state
    bytes against the plan's, and what it ran against the plan (executor.execution)."""
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
    shapes = {name: tuple(t.shape) for name, t in ref["params"].items()}
    bytes_errors = state_bytes_errors(per_rank, bf16, plan, shapes)
    ran_errors = execution_errors(plan, model, per_rank)
    grad_rtol = grad_rtol if grad_rtol is not None else (GRAD_RTOL_BF16 if bf16 else GRAD_RTOL)
    norm_diff, norm_where = grad_norm_diff(per_rank, ref["grads"])
    passed = (max(loss_diff, grad_diff, param_diff) <= atol and norm_diff <= grad_rtol
              and not bytes_errors and not ran_errors)
    return CheckResult(passed=passed, loss_max_abs_diff=loss_diff, grad_max_abs_diff=grad_diff,
                       param_max_abs_diff=param_diff, worst=worst, compared_tensors=count, atol=atol,
                       state_bytes_errors=tuple(bytes_errors), grad_norm_rel_diff=norm_diff, grad_norm_worst=norm_where,
                       grad_rtol=grad_rtol,
                       execution_errors=tuple(ran_errors))
