"""Galvatron-2's sequence-parallel communication profile (``sp_time_<N>nodes_<G>gpus_per_node.json``):
measured all-to-all and all-reduce times per group size and message size, read into a table
that answers the time of any message by piecewise-linear interpolation in bytes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specs import SpecError
from specs.errors import read_json
from specs.schema import check_galvatron_file

MIB = 1024**2
KEY = re.compile(r"^(all2all|allreduce)_size_(\d+)_(\d+)MB_time$")
KINDS = {"all2all": "all_to_all", "allreduce": "all_reduce"}


@dataclass(frozen=True)
class SpTimeTable:
    """time_ms[(kind, group size)] = (message MiB ascending, measured ms)."""

    points: dict[tuple[str, int], tuple[tuple[float, ...], tuple[float, ...]]]

    def time_s(self, kind: str, group: int, nbytes: float) -> float | None:
        """Interpolated time of one ``kind`` collective of ``nbytes`` over ``group`` ranks; linear
        extrapolation beyond the measured sizes; None where the group size was not measured."""
        entry = self.points.get((kind, group))
        if entry is None or nbytes <= 0:
            return None if entry is None else 0.0
        sizes, times = np.array(entry[0]) * MIB, np.array(entry[1])
        if nbytes <= sizes[0]:
            slope = (times[1] - times[0]) / (sizes[1] - sizes[0])
            ms = times[0] - slope * (sizes[0] - nbytes)
        elif nbytes >= sizes[-1]:
            slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
            ms = times[-1] + slope * (nbytes - sizes[-1])
        else:
            ms = float(np.interp(nbytes, sizes, times))
        return max(float(ms), 0.0) * 1e-3

    def groups(self, kind: str) -> list[int]:
        return sorted(g for k, g in self.points if k == kind)


def read_sp_time(path: str | Path) -> SpTimeTable:
    """Parse one sp_time file; a key of another shape is a one-line SpecError."""
    raw = read_json(path)
    try:
        check_galvatron_file("sp_time", raw)  # every time a finite number >= 0, before any float() below
    except SpecError as err:
        raise err.with_source(str(path)) from None
    collected: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for key, value in raw.items():
        match = KEY.match(key)
        if not match:
            raise SpecError("sp_time", f"{path}: unexpected key {key!r} (want all2all|allreduce_size_<p>_<n>MB_time)")
        kind, group, mib = KINDS[match[1]], int(match[2]), float(match[3])
        collected.setdefault((kind, group), []).append((mib, float(value)))
    points = {}
    for k, rows in collected.items():
        if len(rows) < 2:
            raise SpecError("sp_time", f"{path}: {k[0]} over {k[1]} ranks needs two sizes, has {len(rows)}")
        rows.sort()
        points[k] = (tuple(r[0] for r in rows), tuple(r[1] for r in rows))
    return SpTimeTable(points)


def find_sp_time(folder: str | Path, nodes: int, gpus_per_node: int) -> Path | None:
    """The folder's sp_time file for this cluster shape, if Galvatron wrote one."""
    path = Path(folder) / f"sp_time_{nodes}nodes_{gpus_per_node}gpus_per_node.json"
    return path if path.exists() else None
