"""Chrome / Perfetto trace (JSON "traceEvents"): one track per GPU stream and per link."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Hashable, Iterable

from simulator.network import Flow


def resource_name(res: Hashable) -> str:
    """``("nic_out", 0)`` -> ``nic_out 0``; ``("uplink_up", 0, 1)`` -> ``uplink_up 0.1``."""
    if isinstance(res, tuple) and res:
        return f"{res[0]} " + ".".join(str(x) for x in res[1:])
    return str(res)


def _track_ids(names: Iterable[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, int]]:
    pids: dict[str, int] = {}
    tracks_of: dict[str, int] = {}
    ids = {}
    for pid_name, tid_name in names:
        pid = pids.setdefault(pid_name, len(pids))
        ids[(pid_name, tid_name)] = (pid, tracks_of.get(pid_name, 0))
        tracks_of[pid_name] = tracks_of.get(pid_name, 0) + 1
    return ids


def chrome_trace(spans, flows: Iterable[Flow]) -> dict:
    """The trace object: spans are (gpu, stream, name, start_s, end_s); flows add link tracks."""
    rows = [(g, s, n, a, b, {}) for g, s, n, a, b in spans]
    for f in flows:
        for start, end, rate in f.segments:
            for res, w in f.weights.items():
                rows.append(("links", resource_name(res), f.name, start, end,
                             {"gbytes_per_s": rate * w / 1e9, "streams": w}))
    ids = _track_ids(dict.fromkeys((r[0], r[1]) for r in rows))
    events = []
    for (pid_name, tid_name), (pid, tid) in ids.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": pid_name}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": tid_name}})
    for pid_name, tid_name, name, start, end, args in rows:
        pid, tid = ids[(pid_name, tid_name)]
        events.append({"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": start * 1e6,
                       "dur": (end - start) * 1e6, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str | Path, spans, flows: Iterable[Flow]) -> None:
    """Write atomically; open the file in https://ui.perfetto.dev or chrome://tracing."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(chrome_trace(spans, flows)))
    tmp.replace(path)
