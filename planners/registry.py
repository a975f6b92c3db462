"""Planners by name: ``available()``, ``get(name)``, and ``plan(name, model, cluster, budget, ...)``.

Third-party planners join through the ``hybridpar.planners`` entry-point group (docs/planners.md).
"""
from __future__ import annotations

from typing import Any

from planners.base import Budget, Planner, PlanResult
from specs import ClusterSpec, ModelSpec
from specs.registry import Registry

PLANNERS: Registry[type[Planner]] = Registry(
    "planner", ["planners.baselines", "planners.galvatron", "planners.ilp", "planners.cpsat",
                "planners.targets"],
    group="hybridpar.planners")
"""Built-in planner modules, and where installed packages add theirs."""
register = PLANNERS.register
available = PLANNERS.available

DEFAULT_PLANNERS = ("ddp", "zero2", "zero3", "megatron_tp", "gpipe", "megatron_3d", "deepspeed_3d",
                    "megatron_sp_selective", "galvatron_dp_tp", "galvatron_dp_pp", "galvatron_paper",
                    "galvatron_classic")
"""The default comparison (the paper's, on titan-8): the paper's planners plus today's baselines,
with Galvatron in the classic space. The exact solvers (ilp, cpsat) and galvatron / galvatron2
(today's spaces, several times larger) search longer, so they are opt-in here."""
CLUSTER_PLANNERS = ("megatron_3d", "deepspeed_3d", "megatron_sp_selective", "galvatron")
"""The default when a cluster is named: the recipes Megatron-LM and DeepSpeed users tune by hand,
and galvatron in today's space."""


def get(name: str) -> Planner:
    """A planner instance by name."""
    return PLANNERS.get(name)()


def plan(name: str, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: Any = None,
         **options: Any) -> PlanResult:
    """Run planner ``name``; the cost model defaults to the analytical one for ``cluster``."""
    if cost_model is None:
        import cost_models
        cost_model = cost_models.get("analytical", cluster)
    return get(name).plan(model, cluster, budget, cost_model, options)
