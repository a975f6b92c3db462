"""Cost models by name: ``get("analytical", cluster)``.

Third-party cost models join through the ``hybridpar.cost_models`` entry-point group (docs/planners.md).
"""
from __future__ import annotations

from typing import Any

from specs import ClusterSpec
from specs.registry import Registry

COST_MODELS: Registry[type] = Registry("cost_model", ["cost_models.analytical", "cost_models.profiled",
                                        "cost_models.galvatron"],
                                       group="hybridpar.cost_models")
"""Built-in cost model modules, and where installed packages add theirs."""
register = COST_MODELS.register
available = COST_MODELS.available


def get(name: str, cluster: ClusterSpec, **options: Any):
    """An instance of the cost model ``name`` for ``cluster``."""
    reserve = options.pop("allocator_reserve", None)
    model = COST_MODELS.get(name)(cluster, **options)
    if reserve is not None:  # a budget term every model has (CostModel.allocator_reserve)
        model.allocator_reserve = bool(reserve)
    return model
