"""RankGrid: the one rank layout of a layer on its stage, with process groups by axis name and the
expert view over the same ranks (Megatron-Core's HyperCommGrid, torchtitan's ParallelDims)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

import numpy as np

from specs.axes import DENSE_AXES, EXPERT_AXES, Degrees
from specs.errors import SpecError


class RankGroups(tuple):
    """Concurrent groups of ranks as a tuple of rank tuples whose hash is computed once: the
    cost models' caches are keyed on groups the planners ask about thousands of times."""

    def __hash__(self) -> int:
        cached = self.__dict__.get("hash")
        if cached is None:
            cached = self.__dict__["hash"] = tuple.__hash__(self)
        return cached

    def largest(self) -> int:
        """Ranks in the largest group (1 when there is none), computed once."""
        cached = self.__dict__.get("_largest")
        if cached is None:
            cached = self.__dict__["_largest"] = max(map(len, self), default=1)
        return cached


@dataclass(frozen=True)
class RankGrid:
    """Ranks ``first_rank .. first_rank + size - 1`` laid out over named axes.

    ``axes`` lists (name, size) in the documented order of the axis names (specs.axes); ``order``
    lists the names by placement, the fastest-varying first: rank = first_rank + sum(index[a] *
    stride[a]). ``views`` are other grids over the same ranks (the experts' etp/ep/edp)."""

    first_rank: int
    axes: tuple[tuple[str, int], ...]
    order: tuple[str, ...]
    views: tuple["RankGrid", ...] = field(default=(), compare=False)

    @property
    def size(self) -> int:
        n = 1
        for _, k in self.axes:
            n *= k
        return n

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    def degree(self, name: str) -> int:
        """The size of axis ``name`` (this grid's or a view's)."""
        return dict(self._owner((name,)).axes)[name]

    def _owner(self, names: tuple[str, ...]) -> "RankGrid":
        """This grid or the view that has every axis in ``names``."""
        for grid in (self, *self.views):
            if all(n in grid.names for n in names):
                return grid
        known = sorted({n for g in (self, *self.views) for n in g.names})
        raise SpecError("axis", f"no grid or view has axes {', '.join(names)}; known: {', '.join(known)}")

    def groups(self, names: str | Iterable[str]) -> RankGroups:
        """Concurrent groups over the axes ``names`` (a name or several, e.g. ("ulysses", "dp")):
        each group's ranks ascending; groups ordered by the other axes' indices, the first axis
        of the documented order fastest."""
        cache = self.__dict__.get("_cache")
        if cache is None:  # per grid: layer_grid hands out one grid per layout
            cache = {}
            object.__setattr__(self, "_cache", cache)
        found = cache.get(names)
        if found is None:
            key = (names,) if isinstance(names, str) else tuple(names)
            owner = self._owner(key)
            found = cache[names] = _groups(owner.first_rank, owner.axes, owner.order, frozenset(key))
        return found

    def group_of(self, names: str | Iterable[str], rank: int) -> tuple[int, ...]:
        """The group over ``names`` that holds ``rank``."""
        return next(g for g in self.groups(names) if rank in g)

    def strides(self) -> dict[str, int]:
        sizes, out, s = dict(self.axes), {}, 1
        for n in self.order:
            out[n] = s
            s *= sizes[n]
        return out

    def rank(self, **index: int) -> int:
        """The rank at these axis indices (axes left out are 0); names may be a view's."""
        owner = self._owner(tuple(index))
        stride = owner.strides()
        return owner.first_rank + sum(i * stride[n] for n, i in index.items())

    def coords(self, rank: int, view: str | None = None) -> dict[str, int]:
        """The axis indices of ``rank`` (of the view having axis ``view`` when given)."""
        owner = self._owner((view,)) if view else self
        sizes, local = dict(owner.axes), rank - owner.first_rank
        return {n: local // s % sizes[n] for n, s in owner.strides().items()}


@lru_cache(maxsize=65536)
def _groups(first_rank: int, axes: tuple[tuple[str, int], ...], order: tuple[str, ...],
            names: frozenset[str]) -> RankGroups:
    sizes, stride, s = dict(axes), {}, 1
    for n in order:
        stride[n] = s
        s *= sizes[n]
    members = _offsets(((sizes[n], stride[n]) for n in order if n in names), 0)  # fastest first: ascending
    bases = _offsets(((k, stride[n]) for n, k in axes if n not in names), first_rank)  # documented order
    return RankGroups(map(tuple, (bases[:, None] + members[None, :]).tolist()))


def _offsets(steps: Iterable[tuple[int, int]], start: int) -> np.ndarray:
    """``start`` plus every sum of i * stride (0 <= i < size) over ``steps`` (size, stride), the
    first step varying fastest."""
    out = np.array([start], dtype=np.int64)
    for size, stride in steps:
        out = (np.arange(size, dtype=np.int64)[:, None] * stride + out[None, :]).ravel()
    return out


def dense_order(tp_consecutive: bool) -> tuple[str, ...]:
    """Placement of the dense axes: tp, cp, ulysses neighbouring (consecutive) or dp first."""
    return DENSE_AXES if tp_consecutive else ("dp", *DENSE_AXES[:-1])


@lru_cache(maxsize=65536)
def layer_grid(first_rank: int, d: Degrees) -> RankGrid:
    """The grid of a layer with degrees ``d`` whose stage starts at ``first_rank``, with its
    expert view (etp, ep, edp) registered when ep or etp split the ranks."""
    dense = (("tp", d.tp), ("cp", d.cp), ("ulysses", d.ulysses), ("dp", d.dp))
    views = (_expert_view(first_rank, d),)
    return RankGrid(first_rank, dense, dense_order(d.tp_consecutive), views)


def _expert_view(first_rank: int, d: Degrees) -> RankGrid:
    """Megatron-Core's expert order etp-ep-edp over the stage; when the experts' tp is the dense
    split and it is strided, the experts follow the dense layout instead (ep carved out of dp)."""
    axes = (("etp", d.etp), ("ep", d.ep), ("edp", d.edp))
    strided = d.etp == d.split and not d.tp_consecutive and d.dp > 1
    return RankGrid(first_rank, axes, ("ep", "edp", "etp") if strided else EXPERT_AXES)


@lru_cache(maxsize=4096)
def stage_grid(first_rank: int, gpus: int, tp: int = 1, tp_consecutive: bool = True) -> RankGrid:
    """A plain (tp, dp) grid over a stage: the vocabulary's layout, or the whole stage (tp 1)."""
    return layer_grid(first_rank, Degrees(tp=tp, dp=gpus // tp, tp_consecutive=tp_consecutive))
