"""Cost models by name: ``get("analytical", cluster)``.

Third-party cost models join through the ``hybridpar.cost_models`` entry-point group (docs/planners.md).
"""
from __future__ import annotations

from typing import Any

from cost_models.reserve import reserve_from_options
from specs import ClusterSpec
from specs.registry import Registry

COST_MODELS: Registry[type] = Registry("cost_model", ["cost_models.analytical", "cost_models.profiled",
                                        "cost_models.galvatron"],
                                       group="hybridpar.cost_models")
"""Built-in cost model modules, and where installed packages add theirs."""
register = COST_MODELS.register
available = COST_MODELS.available


def get(name: str, cluster: ClusterSpec, **options: Any):
    """An instance of the cost model ``name`` for ``cluster``; every model also takes the allocator
    reserve (cost_models.reserve.reserve_from_options: ``reserve_gib``, ``reserve_fraction``,
    ``reserve`` or ``allocator_reserve=False``)."""
    options = dict(options)
    reserve = reserve_from_options(options)
    model = COST_MODELS.get(name)(cluster, **options)
    if reserve is not None:  # a budget term every model has (CostModel.reserve)
        model.reserve = reserve
    return model
