"""A hash computed once per object, for the frozen dataclasses the cost models and planners key
their caches on (a layer's spec and strategy, its degrees): the generated one hashes every field
on every lookup, enums through Python-level calls."""
from __future__ import annotations

import dataclasses
from functools import cache


def cached_hash(self) -> int:
    """The dataclass's own hash (its compared fields' tuple), worked out on the first call. Set as
    ``__hash__ = cached_hash`` in the class body (dataclass keeps an explicit one), with
    ``__getstate__ = without_cached_hash``."""
    cached = self.__dict__.get("_hash")
    if cached is None:
        cached = hash(tuple(getattr(self, name) for name in _hashed_fields(type(self))))
        object.__setattr__(self, "_hash", cached)
    return cached


def without_cached_hash(self) -> dict:
    """The state to pickle: the cached hash is per process (str hashes are salted)."""
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@cache
def _hashed_fields(cls: type) -> tuple[str, ...]:
    """The fields the generated hash would take, in order."""
    return tuple(f.name for f in dataclasses.fields(cls) if (f.compare if f.hash is None else f.hash))
