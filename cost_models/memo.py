"""The per-instance cache of the cost models' hot per-layer queries, and a hash-once key for
values too costly to hash per lookup."""
from __future__ import annotations

import weakref
from functools import cache

Memo = cache
"""A bound method's answers by its positional arguments' values: functools.cache, in C. The
frozen dataclasses those arguments hold (LayerSpec, LayerStrategy, Degrees) and RankGroups hash
once per object (specs.hashing), so a lookup costs a tuple hash; a level keyed by the
arguments' identities before it, in Python, cost more per call than the hashing it saved."""


class HashOnce:
    """A value (a ModelSpec: ~0.1 ms to hash field by field at 96 layers) as a cache key: its
    hash computed once, equality by identity first, then by value."""

    __slots__ = ("_hash", "value", "__weakref__")

    def __init__(self, value) -> None:
        self.value, self._hash = value, hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, HashOnce) and (other.value is self.value or other.value == self.value)


_KEYS: "weakref.WeakValueDictionary[int, HashOnce]" = weakref.WeakValueDictionary()
"""The HashOnce of each value in use, by identity; an entry lives as long as some cache holds
its key, which holds the value (so its id is its own)."""


def hash_once(value) -> HashOnce:
    """``value``'s HashOnce, the same object for the same value object while a cache keeps it."""
    key = _KEYS.get(id(value))
    if key is None or key.value is not value:
        key = _KEYS[id(value)] = HashOnce(value)
    return key
