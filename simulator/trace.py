"""Chrome / Perfetto trace (JSON "traceEvents"): one track per GPU stream and per link lane.

Events on one track never overlap (a link's concurrent flows get one lane each), so the
viewer's nesting rule holds; the symmetry shortcut's stand-ins are named in the metadata.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Hashable, Iterable, Mapping, Sequence

from simulator.network import Flow
from specs.files import atomic_write_text

LINKS = "links"
"""Process name of the link tracks."""


def resource_name(res: Hashable) -> str:
    """``("nic_out", 0)`` -> ``nic_out 0``; ``("uplink_up", 0, 1)`` -> ``uplink_up 0.1``."""
    if isinstance(res, tuple) and res:
        return f"{res[0]} " + ".".join(str(x) for x in res[1:])
    return str(res)


def rank_ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``0-3, 8``."""
    parts, ordered = [], sorted(ranks)
    start = prev = ordered[0]
    for r in ordered[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    return ", ".join(parts)


def _link_rows(flows: Iterable[Flow]) -> list[tuple]:
    """Flow segments per link, each on the first lane of that link free at its start (a link
    carries several flows at once; overlapping events on one track would break nesting)."""
    pieces = sorted(((resource_name(res), start, end, f.name, rate * w / 1e9, w)
                     for f in flows for start, end, rate in f.segments for res, w in f.weights.items()),
                    key=lambda p: (p[0], p[1], p[2]))
    lanes: dict[str, list[float]] = {}
    rows = []
    for link, start, end, name, gbytes_per_s, streams in pieces:
        ends = lanes.setdefault(link, [])
        lane = next((i for i, e in enumerate(ends) if e <= start), len(ends))
        ends[lane:lane + 1] = [end]
        track = link if lane == 0 else f"{link} ({lane + 1})"
        rows.append((LINKS, track, name, start, end, {"gbytes_per_s": gbytes_per_s, "streams": streams}))
    return rows


def _track_ids(rows: list[tuple]) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Process ids by name and thread ids by (process, track), numbered in first-seen order."""
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    per_process: dict[str, int] = {}
    for process, track, *_ in rows:
        pids.setdefault(process, len(pids))
        if (process, track) not in tids:
            tids[(process, track)] = per_process.get(process, 0)
            per_process[process] = tids[(process, track)] + 1
    return pids, tids


def chrome_trace(spans, flows: Iterable[Flow], stands_for: Mapping[str, Sequence[int]] | None = None) -> dict:
    """The trace object: spans are (gpu, stream, name, start_s, end_s); flows add link tracks.

    ``stands_for`` (symmetry shortcut): process name -> the ranks that played process stands
    for; each such process gets a label and the trace's otherData says which ranks it covers."""
    rows = [(g, s, n, a, b, {}) for g, s, n, a, b in spans] + _link_rows(flows)
    pids, tids = _track_ids(rows)
    events = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}} for name, pid in pids.items()]
    events += [{"ph": "M", "name": "thread_name", "pid": pids[p], "tid": tid, "args": {"name": t}}
               for (p, t), tid in tids.items()]
    covered = {p: list(r) for p, r in (stands_for or {}).items() if p in pids and len(r) > 1}
    events += [{"ph": "M", "name": "process_labels", "pid": pids[p],
                "args": {"labels": f"stands for ranks {rank_ranges(r)}"}} for p, r in covered.items()]
    for pid_name, tid_name, name, start, end, args in rows:
        events.append({"ph": "X", "name": name, "pid": pids[pid_name], "tid": tids[(pid_name, tid_name)],
                       "ts": start * 1e6, "dur": (end - start) * 1e6, "args": args})
    trace = {"traceEvents": events, "displayTimeUnit": "ms"}
    if covered:
        trace["otherData"] = {
            "symmetry_shortcut": "one rank was played for each group of symmetric ranks: "
                                 + "; ".join(f"{p} stands for ranks {rank_ranges(r)}" for p, r in covered.items()),
            "stands_for": covered}
    return trace


def write_trace(path: str | Path, spans, flows: Iterable[Flow],
                stands_for: Mapping[str, Sequence[int]] | None = None) -> None:
    """Write atomically; open the file in https://ui.perfetto.dev or chrome://tracing."""
    atomic_write_text(path, json.dumps(chrome_trace(spans, flows, stands_for)))
