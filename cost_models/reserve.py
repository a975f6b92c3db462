"""The allocator reserve: the part of a memory budget no plan may use (the caching allocator's
cached and fragmented blocks, communication buffers), as a share of the budget and/or fixed GiB.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specs import SpecError
from specs.units import GIB

DEFAULT_FRACTION = 0.2
"""Share of a budget kept free by default. What it covers beside the 1 GiB CUDA context (charged
separately, ``CostModel.runtime_overhead_bytes``): the caching allocator's reserved-but-unallocated
blocks (PyTorch docs, "CUDA memory management": ``memory_reserved`` exceeds ``memory_allocated`` by
the cached and split blocks; fragmentation grows with varying shapes, which ``expandable_segments``
reduces) and NCCL's buffers (NCCL docs, ``NCCL_BUFFSIZE``: 4 MiB per channel and peer and protocol,
per communicator; a plan with tp, dp, ep and pipeline groups holds several communicators, a few
hundred MiB to over a GiB). No source gives one figure for both; 20% is Galvatron's rule
(hetu-galvatron 2.4.0, DpOnModel: mem_cache = int(0.2 * max_mem) when max_mem // 1024 > 20), kept
so that default budgets and tables match that reference."""
DEFAULT_ABOVE_GIB = 20.0
"""The default share applies to budgets of more than 20 GiB (floor), as in Galvatron's rule."""


@dataclass(frozen=True, kw_only=True)
class AllocatorReserve:
    """Bytes of a budget a plan may not use: ``fraction`` of budgets above ``above_gib`` plus
    ``gib`` on every budget."""

    fraction: float = DEFAULT_FRACTION
    """Share of the budget, in [0, 1)."""
    above_gib: float = DEFAULT_ABOVE_GIB
    """The share applies only to budgets whose whole GiB exceed this (0: every budget)."""
    gib: float = 0.0
    """Fixed GiB kept free on every budget, >= 0."""

    def __post_init__(self) -> None:
        for name, value in (("fraction", self.fraction), ("above_gib", self.above_gib), ("gib", self.gib)):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
            if not ok:
                raise SpecError(f"reserve.{name}", f"must be a finite number >= 0, got {value!r}")
        if self.fraction >= 1:
            raise SpecError("reserve_fraction", f"must be in [0, 1), got {self.fraction!r}")

    @classmethod
    def fixed(cls, gib: float) -> "AllocatorReserve":
        """``gib`` GiB of every budget, no share."""
        return cls(fraction=0.0, above_gib=0.0, gib=gib)

    @classmethod
    def share(cls, fraction: float) -> "AllocatorReserve":
        """``fraction`` of every budget (no threshold)."""
        return cls(fraction=fraction, above_gib=0.0)

    def bytes_of(self, budget_bytes: float) -> float:
        """The reserve of a ``budget_bytes`` budget; a SpecError when it leaves nothing."""
        share = self.fraction * budget_bytes if budget_bytes // GIB > self.above_gib else 0.0
        reserve = self.gib * GIB + share
        if reserve > 0 and reserve >= budget_bytes:
            raise SpecError("reserve_gib", f"a {reserve / GIB:g} GiB allocator reserve leaves nothing of a "
                            f"{budget_bytes / GIB:g} GiB budget")
        return reserve

    def describe(self) -> str:
        """One phrase: what the reserve is ('20% of budgets above 20 GiB', '4 GiB', 'none')."""
        parts = []
        if self.fraction:
            parts.append(f"{self.fraction:.0%} of " + (f"budgets above {self.above_gib:g} GiB" if self.above_gib
                                                         else "every budget"))
        if self.gib:
            parts.append(f"{self.gib:g} GiB")
        return " + ".join(parts) or "none"


DEFAULT_RESERVE = AllocatorReserve()
NO_RESERVE = AllocatorReserve.fixed(0.0)


def reserve_from_options(options: dict[str, Any]) -> AllocatorReserve | None:
    """Pop the reserve options of ``cost_models.get`` (``reserve``: an AllocatorReserve,
    ``reserve_gib``, ``reserve_fraction``, ``allocator_reserve``: False for none) from
    ``options``: the reserve they name, None when they name none. Give at most one."""
    given = {k: options.pop(k) for k in ("reserve", "reserve_gib", "reserve_fraction", "allocator_reserve")
             if k in options and options[k] is not None}
    if len(given) > 1:
        raise SpecError("reserve", f"give one of {', '.join(sorted(given))}, not several")
    if not given:
        return None
    (key, value), = given.items()
    if key == "reserve":
        if not isinstance(value, AllocatorReserve):
            raise SpecError("reserve", f"must be an AllocatorReserve, got {value!r}")
        return value
    if key == "allocator_reserve":
        return DEFAULT_RESERVE if value else NO_RESERVE
    return AllocatorReserve.fixed(value) if key == "reserve_gib" else AllocatorReserve.share(value)
