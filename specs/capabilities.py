"""What a consumer of plans (a cost model, the simulator, the executor) can run, declared once per
consumer as a Capabilities record; ``check_supported`` refuses the rest in one line."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Callable

from specs.errors import SpecError
from specs.axes import CPComm, CPLoadBalance, EPDispatcher
from specs.plan import DPType, LayerStrategy, Plan, Recompute, Schedule, SequenceParallel
from specs.precision import Precision
from specs.stack import SoftwareStack

if TYPE_CHECKING:
    from specs.model import LayerSpec, ModelSpec

OFF = "off"
"""The ``expert_parallel`` value of a layer without an expert split; ``tp_comm_overlap`` off."""
ON = "on"
"""``tp_comm_overlap`` on."""
NO_TP_OVERLAP = frozenset({OFF})
"""The ``tp_comm_overlap`` of a consumer that does not run TP communication overlap."""
ALL_TO_ALL_ONLY = frozenset({EPDispatcher.ALL_TO_ALL})
"""The ``ep_dispatcher`` of a consumer that runs (or prices) the plain all-to-all only, not DeepEP."""


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """Per axis, the values a consumer supports; None: every value. An axis is read from the plan
    by the reader of the same name (LAYER_AXES, PLAN_AXES), as text, or None when not in use."""

    dp_type: frozenset[str] | None = None
    """How a layer with dp > 1 holds its states (DPType values)."""
    sp: frozenset[str] | None = None
    """A layer's sequence parallelism (SequenceParallel values)."""
    recompute: frozenset[str] | None = None
    """A layer's activation recomputation (Recompute values)."""
    expert_parallel: frozenset[str] | None = None
    """A layer's expert split: ``off``, or ``ep<e>/etp<t>`` (any split when None)."""
    expert_dp_type: frozenset[str] | None = None
    """How a MoE layer's expert data-parallel group of more than one rank holds the experts."""
    precision: frozenset[str] | None = None
    """A layer's arithmetic (specs.precision.Precision values: bf16 or an FP8 recipe)."""
    schedule: frozenset[str] | None = None
    """The pipeline schedule (Schedule values)."""
    vocab_sp: frozenset[str] | None = None
    """The embedding/head's sequence parallelism (SequenceParallel values)."""
    cp_comm: frozenset[str] | None = None
    """How a layer with cp > 1 exchanges keys and values (CPComm values)."""
    cp_load_balance: frozenset[str] | None = None
    """The token order of a plan with a cp > 1 layer (CPLoadBalance values)."""
    stack: frozenset[str] | None = None
    """The software stack a plan states (SoftwareStack values; a plan that states none passes)."""
    tp_comm_overlap: frozenset[str] | None = None
    """TP communication overlap (Plan.tp_comm_overlap): ``on`` or ``off``."""
    ep_dispatcher: frozenset[str] | None = None
    """How a plan with an ep > 1 layer dispatches tokens to experts (Plan.ep_dispatcher, EPDispatcher values)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                object.__setattr__(self, f.name, frozenset(str(v) for v in value))

    def supports(self, axis: str, value: object) -> bool:
        """Whether ``value`` of ``axis`` (None: the axis is not in use) can be run."""
        allowed = getattr(self, axis)
        return value is None or allowed is None or str(value) in allowed

    def without(self, *axes: str) -> Capabilities:
        """The same record with ``axes`` supported in full (a check that leaves them to others)."""
        return replace(self, **{a: None for a in axes})


EVERYTHING = Capabilities()
"""A consumer that runs every value of every axis."""
BF16_ONLY = frozenset({Precision.BF16})
"""The ``precision`` of a consumer without FP8 (its kernels, tables or profiles are BF16)."""


def _expert_split(spec: LayerSpec, s: LayerStrategy) -> str:
    return f"ep{s.ep}/etp{s.etp}" if s.has_expert_split else OFF


LAYER_AXES: dict[str, Callable[[LayerSpec, LayerStrategy], object]] = {
    "dp_type": lambda spec, s: s.dp_type if s.dp > 1 else None,  # as SearchSpace.dp_types reads it
    "sp": lambda spec, s: s.sp,
    "recompute": lambda spec, s: s.recompute,
    "expert_parallel": _expert_split,
    "expert_dp_type": lambda spec, s: s.expert_dp_kind if spec.moe is not None and s.expert_dp > 1 else None,
    "cp_comm": lambda spec, s: s.cp_comm if s.cp > 1 else None,
    "precision": lambda spec, s: s.precision,
}
"""How each per-layer axis reads its value from a layer and its strategy."""
PLAN_AXES: dict[str, Callable[[Plan], object]] = {
    "schedule": lambda plan: plan.schedule,
    "vocab_sp": lambda plan: plan.vocab_sp,
    "cp_load_balance": lambda plan: plan.cp_load_balance if any(s.cp > 1 for s in plan.layers) else None,
    "stack": lambda plan: plan.stack,
    "tp_comm_overlap": lambda plan: ON if plan.tp_comm_overlap else OFF,
    "ep_dispatcher": lambda plan: plan.ep_dispatcher if any(s.ep > 1 for s in plan.layers) else None,
}
"""How each whole-plan axis reads its value."""


def refusal(who: str, where: str, axis: str, value: object, capabilities: Capabilities) -> SpecError:
    """The one-line refusal every consumer gives: ``<who> cannot run <where>: <axis> <value>
    (supported: ...)``, e.g. ``galvatron cost model cannot run layer 3: sp ulysses (supported:
    none, megatron)``."""
    allowed = ", ".join(sorted(getattr(capabilities, axis) or (), key=_in_enum_order)) or "nothing"
    return SpecError(f"{who} cannot run {where}", f"{axis} {value} (supported: {allowed})")


_ENUM_ORDER = [str(v) for enum in (DPType, SequenceParallel, Recompute, Schedule, CPComm, CPLoadBalance, Precision,
                                          SoftwareStack, EPDispatcher)
               for v in enum]


def _in_enum_order(value: str) -> tuple[int, str]:
    return (_ENUM_ORDER.index(value) if value in _ENUM_ORDER else len(_ENUM_ORDER), value)


def check_supported(plan: Plan, model: ModelSpec, capabilities: Capabilities, who: str) -> None:
    """SpecError (``refusal``) for the first axis value of ``plan`` on ``model`` that
    ``capabilities`` lacks: whole-plan axes first, then layer by layer."""
    for axis, read in PLAN_AXES.items():
        value = read(plan)
        if not capabilities.supports(axis, value):
            raise refusal(who, "the plan", axis, value, capabilities)
    passed = set()  # (layer spec, strategy) objects checked: a repeat passes as well
    for i, (spec, s) in enumerate(zip(model.layers, plan.layers)):
        if (id(spec), id(s)) in passed:
            continue
        passed.add((id(spec), id(s)))
        for axis, read in LAYER_AXES.items():
            value = read(spec, s)
            if not capabilities.supports(axis, value):
                raise refusal(who, f"layer {i}", axis, value, capabilities)


def layer_supported(spec: LayerSpec, s: LayerStrategy, capabilities: Capabilities) -> bool:
    """Whether every per-layer axis of ``s`` on ``spec`` is supported (for planners' choices)."""
    return all(capabilities.supports(axis, read(spec, s)) for axis, read in LAYER_AXES.items())


__all__ = ["BF16_ONLY", "Capabilities", "EVERYTHING", "NO_TP_OVERLAP", "OFF", "ON", "LAYER_AXES", "PLAN_AXES",
           "check_supported", "layer_supported", "refusal"]
