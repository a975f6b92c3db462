"""Import the packages analysis builds on, failing with one clear line if one is missing."""
from __future__ import annotations

import importlib
from types import ModuleType


class MissingPackageError(RuntimeError):
    """A package analysis needs (planners, simulator, ...) is absent or lacks an entry point."""


def need(module: str, *attributes: str, purpose: str = "") -> ModuleType:
    """``module`` imported, checked to have ``attributes``; else MissingPackageError."""
    why = f" (needed for {purpose})" if purpose else ""
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        raise MissingPackageError(f"package {module!r} cannot be imported{why}: {err}") from None
    missing = [a for a in attributes if not hasattr(mod, a)]
    if missing:
        raise MissingPackageError(f"package {module!r} has no {', '.join(missing)}{why}; "
                                  "is it fully installed?")
    return mod


def planners() -> ModuleType:
    return need("planners", "available", "plan", "Budget", purpose="planning")


def simulator() -> ModuleType:
    return need("simulator", "simulate", purpose="simulating plans")


def cost_models() -> ModuleType:
    return need("cost_models", "get", "available", purpose="predicting plan cost")


def cost_model(name: str, cluster):
    """The cost model ``name`` for ``cluster``; MissingPackageError if its module is absent."""
    try:
        return cost_models().get(name, cluster)
    except ImportError as err:
        raise MissingPackageError(f"cost model {name!r} cannot be imported: {err}") from None


def vtrain() -> ModuleType:
    mod = need("benchmarks.vtrain", "load_cases", "available", purpose="the vTrain measured cases")
    if not mod.available():
        raise MissingPackageError(f"vTrain measurements not found under {mod.VALIDATION}")
    return mod
