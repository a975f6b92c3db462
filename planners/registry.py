"""Planners by name: ``available()``, ``get(name)``, and ``plan(name, model, cluster, budget, ...)``."""
from __future__ import annotations

import importlib
from typing import Any

from planners.base import Budget, Planner, PlanResult
from specs import ClusterSpec, ModelSpec, SpecError

_MODULES = {
    "galvatron": "planners.galvatron", "galvatron_dp_tp": "planners.galvatron",
    "galvatron_dp_pp": "planners.galvatron", "galvatron_paper": "planners.galvatron",
    "galvatron_bins": "planners.galvatron", "galvatron2": "planners.galvatron",
    "ilp": "planners.ilp", "cpsat": "planners.cpsat",
    "ddp": "planners.baselines", "zero2": "planners.baselines", "zero3": "planners.baselines",
    "megatron_tp": "planners.baselines", "gpipe": "planners.baselines",
    "megatron_3d": "planners.baselines", "deepspeed_3d": "planners.baselines",
    "megatron_sp_selective": "planners.baselines",
}
"""Name -> module that defines and registers it (imported on first use)."""
_REGISTRY: dict[str, type[Planner]] = {}


def register(cls: type[Planner]) -> type[Planner]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


def available() -> list[str]:
    return list(_MODULES)


def get(name: str) -> Planner:
    """A planner instance by name."""
    if name not in _MODULES:
        raise SpecError("planner", f"unknown {name!r}; choose from {', '.join(available())}")
    importlib.import_module(_MODULES[name])
    return _REGISTRY[name]()


def plan(name: str, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: Any = None,
         **options: Any) -> PlanResult:
    """Run planner ``name``; the cost model defaults to the analytical one for ``cluster``."""
    if cost_model is None:
        import cost_models
        cost_model = cost_models.get("analytical", cluster)
    return get(name).plan(model, cluster, budget, cost_model, options)
