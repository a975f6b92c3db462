"""Flatten a simulated iteration for plotting: memory timeline to CSV, Chrome trace to intervals."""
from __future__ import annotations

import io
import json
from typing import Any, Iterable

import pandas as pd
from specs.units import GIB



def _points(series: Any) -> Iterable[tuple[float, float]]:
    """(time_s, bytes) pairs from a list of pairs or of objects with time/bytes attributes."""
    for point in series:
        if isinstance(point, (tuple, list)):
            yield float(point[0]), float(point[1])
            continue
        time_s = _first_attr(point, ("time_s", "t_s", "time"))
        if hasattr(point, "memory_gib"):
            yield time_s, float(point.memory_gib) * GIB
        else:
            yield time_s, float(_first_attr(point, ("bytes", "memory_bytes", "used_bytes")))


def _first_attr(obj: Any, names: tuple[str, ...]) -> float:
    for name in names:
        if isinstance(obj, dict) and name in obj:
            return float(obj[name])
        if hasattr(obj, name):
            return float(getattr(obj, name))
    raise ValueError(f"memory_timeline: point {obj!r} has none of {', '.join(names)}")


def memory_frame(timeline: Any) -> pd.DataFrame:
    """Columns series, time_s, memory_gib from a memory timeline: a mapping series -> points
    (rank or stage -> [(time_s, bytes), ...]) or one list of points."""
    if isinstance(timeline, pd.DataFrame):
        return timeline
    if not isinstance(timeline, dict):
        timeline = {"0": timeline}
    rows = [{"series": str(name), "time_s": t, "memory_gib": b / GIB}
            for name, series in timeline.items() for t, b in _points(series)]
    return pd.DataFrame(rows, columns=["series", "time_s", "memory_gib"])


def memory_csv(timeline: Any) -> str:
    return memory_frame(timeline).to_csv(index=False)


def read_memory_csv(text: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(text), dtype={"series": str})


def stage_memory(timeline: Any, plan: Any, world_size: int) -> dict[str, Any]:
    """The first GPU of each pipeline stage's timeline (the others mirror it), labelled."""
    per_stage = world_size // plan.pp
    return {f"stage {s} (GPU {s * per_stage})": timeline[s * per_stage] for s in range(plan.pp)}


def spans_csv(spans: Any) -> str:
    """(gpu, stream, name, start_s, end_s) spans as CSV."""
    frame = pd.DataFrame(list(spans), columns=["gpu", "stream", "name", "start_s", "end_s"])
    return frame.to_csv(index=False)


def span_kind(stream: str, name: str) -> str:
    """What a span is, for colouring: forward/backward compute, optimizer, or the comm stream."""
    if stream != "compute":
        return f"{stream} comm"
    if name.startswith("F"):
        return "forward"
    if name.startswith("B"):
        return "backward"
    return name.split()[0] if name else "other"


def read_spans_csv(text: str) -> pd.DataFrame:
    """Spans as intervals: lane (gpu and stream), category (span_kind), name, start_s, duration_s."""
    frame = pd.read_csv(io.StringIO(text), dtype={"gpu": str, "stream": str, "name": str})
    kinds = [span_kind(st, n) for st, n in zip(frame.stream, frame.name)]
    return pd.DataFrame({"lane": frame.gpu + " " + frame.stream, "category": kinds, "name": frame.name,
                         "start_s": frame.start_s, "duration_s": frame.end_s - frame.start_s})


def trace_intervals(trace_text: str) -> pd.DataFrame:
    """Complete events of a Chrome/Perfetto trace as rows: lane, name, category, start_s, duration_s."""
    raw = json.loads(trace_text)
    events = raw.get("traceEvents", []) if isinstance(raw, dict) else raw
    names = _lane_names(events)
    rows = [{"lane": names.get((e.get("pid"), e.get("tid")), f"{e.get('pid')}/{e.get('tid')}"),
             "pid": e.get("pid"), "tid": e.get("tid"),
             "name": str(e.get("name", "")), "category": str(e.get("cat", "")),
             "start_s": float(e["ts"]) / 1e6, "duration_s": float(e.get("dur", 0.0)) / 1e6}
            for e in events if e.get("ph") == "X"]
    return pd.DataFrame(rows, columns=["lane", "pid", "tid", "name", "category", "start_s", "duration_s"])


def _lane_names(events: list[dict[str, Any]]) -> dict[tuple[Any, Any], str]:
    """(pid, tid) -> 'process / thread' from the trace's metadata events."""
    process, thread = {}, {}
    for e in events:
        if e.get("ph") != "M":
            continue
        if e.get("name") == "process_name":
            process[e.get("pid")] = e.get("args", {}).get("name", str(e.get("pid")))
        elif e.get("name") == "thread_name":
            thread[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name", str(e.get("tid")))
    return {key: f"{process.get(key[0], key[0])} {name}" for key, name in thread.items()}
