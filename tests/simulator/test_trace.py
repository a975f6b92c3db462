"""The Perfetto trace is well formed: one name per process, events that nest, the shortcut named."""
import json
from collections import defaultdict

import pytest

from simulator import simulate
from simulator.trace import chrome_trace, rank_ranges
from specs import load_cluster, load_model, uniform_plan
from tests.simulator.handmade import HandCostModel, hand_cluster, tiny_model

EPS_US = 1e-6


def nesting_errors(events: list[dict]) -> list[str]:
    """Complete events ("X") on one thread must nest or be disjoint; B/E pairs must balance."""
    errors = []
    by_thread = defaultdict(list)
    for e in events:
        if e["ph"] in ("X", "B", "E"):
            by_thread[(e["pid"], e["tid"])].append(e)
    for thread, evs in by_thread.items():
        stack: list[float] = []
        for e in sorted((e for e in evs if e["ph"] == "X"), key=lambda e: (e["ts"], -e["dur"])):
            end = e["ts"] + e["dur"]
            while stack and stack[-1] <= e["ts"] + EPS_US:
                stack.pop()
            if stack and end > stack[-1] + EPS_US:
                errors.append(f"{thread}: {e['name']} [{e['ts']}, {end}] overlaps the enclosing event")
            stack.append(end)
        depth = 0
        for e in sorted((e for e in evs if e["ph"] in "BE"), key=lambda e: (e["ts"], e["ph"] == "B")):
            depth += 1 if e["ph"] == "B" else -1
            if depth < 0:
                errors.append(f"{thread}: E without B at {e['ts']}")
        if depth:
            errors.append(f"{thread}: {depth} B without E")
    return errors


def test_the_checker_catches_partial_overlap_and_unbalanced_pairs():
    x = lambda ts, dur: {"ph": "X", "name": "a", "pid": 0, "tid": 0, "ts": ts, "dur": dur}  # noqa: E731
    assert nesting_errors([x(0, 10), x(2, 3), x(10, 5)]) == []
    assert len(nesting_errors([x(0, 10), x(5, 10)])) == 1
    assert len(nesting_errors([{"ph": "B", "pid": 0, "tid": 0, "ts": 0.0}])) == 1


def _trace(tmp_path, full: bool, **plan) -> dict:
    cluster = hand_cluster(4, bytes_per_s=1e6)
    path = tmp_path / "t.json"
    simulate(tiny_model(2), cluster, uniform_plan(2, **plan), HandCostModel(cluster), full=full, trace_path=path)
    return json.loads(path.read_text())


@pytest.mark.parametrize("full", [True, False])
def test_one_process_name_per_pid_and_events_nest(tmp_path, full):
    # tp, dp and pp on 8 GPUs: collectives and sends overlap on shared links, so link tracks need lanes
    plan = uniform_plan(4, tp=2, dp=2, pp=2, global_batch=8, micro_batches=4)
    simulate(load_model("tiny-gpt"), load_cluster("dgx-a100-80g"), plan, full=full, trace_path=tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    names = [e["pid"] for e in events if e["name"] == "process_name"]
    assert sorted(names) == sorted(set(names)) == sorted({e["pid"] for e in events})
    threads = [(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"]
    assert len(threads) == len(set(threads))
    assert nesting_errors(events) == []
    links = next(e["pid"] for e in events if e["name"] == "process_name" and e["args"]["name"] == "links")
    lanes = {e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == links}
    assert any("(2)" in lane for lane in lanes)  # some link carried two flows at once


def test_the_symmetry_shortcut_says_which_ranks_each_played_gpu_stands_for(tmp_path):
    trace = _trace(tmp_path, False, dp=2, pp=2, global_batch=4, micro_batches=2)
    processes = {e["args"]["name"]: e["pid"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert set(processes) == {"GPU 0", "GPU 2", "links"}
    assert trace["otherData"]["stands_for"] == {"GPU 0": [0, 1], "GPU 2": [2, 3]}
    assert "GPU 0 stands for ranks 0-1" in trace["otherData"]["symmetry_shortcut"]
    labels = {e["pid"]: e["args"]["labels"] for e in trace["traceEvents"] if e["name"] == "process_labels"}
    assert labels == {processes["GPU 0"]: "stands for ranks 0-1", processes["GPU 2"]: "stands for ranks 2-3"}
    assert "otherData" not in _trace(tmp_path, True, dp=2, pp=2, global_batch=4, micro_batches=2)


def test_rank_ranges_and_a_trace_without_flows():
    assert rank_ranges([8, 0, 1, 2, 3, 5]) == "0-3, 5, 8"
    trace = chrome_trace([("GPU 0", "compute", "F0", 0.0, 1.0), ("GPU 0", "compute", "B0", 1.0, 3.0)], [],
                         {"GPU 0": [0]})
    assert "otherData" not in trace  # a rank standing for itself only is no shortcut
    assert [e["dur"] for e in trace["traceEvents"] if e["ph"] == "X"] == [1e6, 2e6]
