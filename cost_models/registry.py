"""Cost models by name: ``get("analytical", cluster)``."""
from __future__ import annotations

import importlib
from typing import Any

from specs import ClusterSpec, SpecError

_MODULES = {"analytical": "cost_models.analytical", "profiled": "cost_models.profiled",
            "galvatron": "cost_models.galvatron"}
"""Name -> module that defines and registers it (imported on first use)."""
_REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


def available() -> list[str]:
    return sorted(_MODULES)


def get(name: str, cluster: ClusterSpec, **options: Any):
    """An instance of the cost model ``name`` for ``cluster``."""
    if name not in _MODULES:
        raise SpecError("cost_model", f"unknown {name!r}; choose from {', '.join(available())}")
    importlib.import_module(_MODULES[name])
    reserve = options.pop("allocator_reserve", None)
    model = _REGISTRY[name](cluster, **options)
    if reserve is not None:  # a budget term every model has (CostModel.allocator_reserve)
        model.allocator_reserve = bool(reserve)
    return model
