"""Where a plan leaves the regime the measured data behind the analytical model spans.

Two limits, both read from what ``data/`` holds rather than chosen:
- a collective group of more ranks than any measured run has (``at_scale_ranks`` of the
  model's constants, whose note names the runs);
- ZeRO-3 (FSDP) over more ranks than the largest published ZeRO-3 run in
  ``data/published_runs`` (its data-parallel x context-parallel group; a MoE row counts its
  dense layers' FSDP group). A run counts by its reach, not its error: ``python -m
  benchmarks.published_runs`` reports the error by ZeRO-3 group size
  (docs/results/published_runs.md).

``objective=auto`` (planners/base.py) plans robustly when the nominal plan crosses either.
"""
from __future__ import annotations

import csv
from functools import lru_cache

from specs import DPType, Plan
from specs.datasets import Dataset, data_path, has_dataset


@lru_cache(maxsize=1)
def measured_zero3_ranks() -> int:
    """The largest ZeRO-3 group (dp x cp) among the published runs (0 when the set is absent)."""
    if not has_dataset(Dataset.PUBLISHED_RUNS):
        return 0
    with data_path(Dataset.PUBLISHED_RUNS).open(newline="", encoding="utf-8") as f:
        return max((int(r["dp"]) * int(r["cp"]) for r in csv.DictReader(f) if r["dp_type"] == DPType.ZERO3),
                   default=0)


def uncovered(plan: Plan, collective_ranks: float) -> tuple[str, ...]:
    """What in ``plan`` no measured run covers, one phrase per mechanism at its largest group
    (empty: covered). ``collective_ranks``: the largest collective group measured."""
    zero3, sync = 0, 0
    degrees = [s.degrees for s in plan.layers]
    if plan.vocab_asks_split:  # else the embedding and head run in their end layers' layouts
        degrees.append(plan.vocab_degrees(plan.layers[0].degrees.gpus))
    for d in degrees:
        if d.dp_type == DPType.ZERO3:
            zero3 = max(zero3, d.grad_sync)
        else:
            sync = max(sync, d.grad_sync)
        if d.ep > 1:
            sync = max(sync, d.edp)
    out = []
    if zero3 > measured_zero3_ranks():
        out.append(f"ZeRO-3 over {zero3} ranks (published ZeRO-3 runs in data/ reach {measured_zero3_ranks()})")
    if sync > collective_ranks:
        out.append(f"a gradient sync over {sync} ranks (measured runs in data/ reach {collective_ranks:g})")
    return tuple(out)
