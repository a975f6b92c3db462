"""A planner call's time limit as one deadline (a ``time.monotonic()`` instant, None: no limit),
checked from the call's first second: while the cost tables are built, while the seeds are
scored, between and inside the group searches."""
from __future__ import annotations

import time


class DeadlinePassed(Exception):
    """A search reached the planner call's deadline, or its work budget (max_candidates),
    part-way (nothing of the step under way is kept)."""


def passed(deadline: float | None) -> bool:
    """Whether ``deadline`` (time.monotonic) has passed; never where there is none."""
    return deadline is not None and time.monotonic() > deadline


def check(deadline: float | None) -> None:
    """Raise DeadlinePassed once ``deadline`` has passed."""
    if passed(deadline):
        raise DeadlinePassed
