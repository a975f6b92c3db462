"""One registry of named implementations (planners, cost models, evaluators): classes declare
their ``name`` once; built-in modules load on first use; other installed packages add theirs
through a package entry-point group (``importlib.metadata``), documented in docs/planners.md.
"""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Generic, Sequence, TypeVar

from specs.errors import SpecError

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Name -> class, for one kind of implementation.

    ``builtin`` are the modules of this project whose classes ``register`` themselves;
    ``group`` is the entry-point group where an installed package names a module (its
    classes register themselves on import) or a class (registered here).
    """

    def __init__(self, kind: str, builtin: Sequence[str], group: str) -> None:
        self.kind = kind
        self.builtin = tuple(builtin)
        self.group = group
        self._classes: dict[str, T] = {}
        self._loaded = False

    def register(self, cls: T) -> T:
        """Class decorator: make ``cls`` available under its ``name`` ClassVar."""
        name = getattr(cls, "name", "")
        if not isinstance(name, str) or not name:
            raise SpecError(self.kind, f"{cls.__qualname__} declares no name (a non-empty ClassVar str)")
        known = self._classes.get(name)
        if known is not None and known is not cls:
            raise SpecError(self.kind, f"{name!r} is registered twice: {_where(known)} and {_where(cls)}")
        self._classes[name] = cls
        return cls

    def _load(self) -> None:
        # On first use only: importing every planner at import time would pull in the solvers.
        if self._loaded:
            return
        self._loaded = True
        for module in self.builtin:
            importlib.import_module(module)
        for point in entry_points(group=self.group):
            try:
                loaded = point.load()
            except Exception as err:  # a broken third-party package must not hide the others
                raise SpecError(self.group, f"entry point {point.name!r} = {point.value!r} "
                                f"failed to load: {type(err).__name__}: {err}") from None
            if isinstance(loaded, type):
                self.register(loaded)

    def available(self) -> list[str]:
        """Every registered name, built-in first, in registration order."""
        self._load()
        return list(self._classes)

    def get(self, name: str) -> T:
        """The class registered under ``name``; a one-line error lists the choices."""
        self._load()
        if name not in self._classes:
            raise SpecError(self.kind, f"unknown {name!r}; choose from {', '.join(self._classes)}")
        return self._classes[name]


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
