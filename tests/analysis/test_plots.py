"""Figures and tables from result frames: the numbers they show, not just that they draw."""
import numpy as np
import pandas as pd
import pytest

from analysis import plots
from analysis.figures import save
from analysis.timeline import memory_frame, read_memory_csv, memory_csv, trace_intervals


def paper_frame() -> pd.DataFrame:
    rows = []
    for budget in (8, 16):
        for planner, thr in (("galvatron", 10.0), ("dp", 6.0), ("ilp", 11.0)):
            feasible = not (planner == "dp" and budget == 8)
            rows.append({"cluster": "titan-8", "model": "bert", "budget_gib": budget, "planner": planner,
                         "feasible": feasible, "sim_throughput": thr * budget if feasible else None,
                         "cost_model_throughput": thr * budget * 1.1 if feasible else None})
    return pd.DataFrame(rows)


def test_paper_table_marks_infeasible_cells_oom_and_formats_throughput():
    table = plots.paper_table(paper_frame())
    assert table.loc[("titan-8", "bert", 8), "dp"] == "OOM"
    assert table.loc[("titan-8", "bert", 16), "dp"] == "96.0"
    assert table.loc[("titan-8", "bert", 8), "galvatron"] == "80.0"


def test_optimality_gap_is_relative_to_the_best_exact_planner():
    gaps = plots.optimality_gaps(paper_frame(), exact=("ilp",)).set_index(["budget_gib", "planner"])
    assert gaps.loc[(16, "galvatron"), "gap_pct"] == pytest.approx(100 * (1 - 10 / 11))
    assert gaps.loc[(16, "ilp"), "gap_pct"] == pytest.approx(0.0)
    assert np.isnan(gaps.loc[(8, "dp"), "gap_pct"])


def test_throughput_figure_has_one_line_per_planner_and_labelled_axes(tmp_path):
    fig = plots.throughput_vs_budget(paper_frame())
    ax = fig.axes[0]
    assert sorted(line.get_label() for line in ax.get_lines()) == ["dp", "galvatron", "ilp"]
    dp_line = next(l for l in ax.get_lines() if l.get_label() == "dp")
    ys = dict(zip(dp_line.get_xdata(), dp_line.get_ydata()))
    assert np.isnan(ys[8]) and ys[16] == 96.0  # the infeasible 8 GiB point is not drawn
    assert "GiB" in ax.get_xlabel() and "samples/s" in fig.get_supylabel()
    paths = save(fig, tmp_path, "paper")
    assert [p.suffix for p in paths] == [".png", ".pdf"] and all(p.stat().st_size > 1000 for p in paths)


def test_memory_timeline_round_trips_through_csv():
    timeline = {"stage 0": [(0.0, 2 * 1024**3), (0.5, 3 * 1024**3)], "stage 1": [(0.0, 1024**3)]}
    frame = read_memory_csv(memory_csv(timeline))
    assert list(frame.series) == ["stage 0", "stage 0", "stage 1"]
    assert list(frame.memory_gib) == [2.0, 3.0, 1.0]
    assert list(memory_frame([(1.0, 1024**3)]).series) == ["0"]


def test_trace_intervals_reads_complete_events_and_lane_names():
    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "rank 1"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "compute"}},
        {"ph": "X", "name": "fwd L0 mb0", "cat": "compute", "pid": 1, "tid": 2, "ts": 1000.0, "dur": 250.0},
        {"ph": "i", "name": "marker", "pid": 1, "tid": 2, "ts": 0.0}]}
    import json
    frame = trace_intervals(json.dumps(trace))
    assert len(frame) == 1
    row = frame.iloc[0]
    assert (row.lane, row.category, row.start_s, row.duration_s) == ("rank 1 compute", "compute", 0.001, 0.00025)
