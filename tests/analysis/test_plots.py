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
    assert np.isnan(dp_line.get_ydata()[0]) and dp_line.get_ydata()[1] == 96.0  # 8 GiB infeasible: no point
    assert "GiB" in ax.get_xlabel() and "samples/s" in fig.get_supylabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8", "16"]
    paths = save(fig, tmp_path, "paper", plots.throughput_data(paper_frame()))
    assert [p.suffix for p in paths] == [".png", ".pdf", ".csv"] and all(p.stat().st_size > 100 for p in paths)
    drawn = pd.read_csv(paths[-1])
    assert drawn.set_index(["budget_gib", "planner"]).sim_throughput[(16, "dp")] == 96.0


def test_equal_lines_are_shifted_apart_and_named_as_a_tie():
    frame = paper_frame()
    copy = frame[frame.planner == "galvatron"].assign(planner="cpsat")
    fig = plots.throughput_vs_budget(pd.concat([frame, copy], ignore_index=True))
    lines = {l.get_label(): l for l in fig.axes[0].get_lines()}
    assert list(lines["cpsat"].get_ydata()) == list(lines["galvatron"].get_ydata())
    assert all(a != b for a, b in zip(lines["cpsat"].get_xdata(), lines["galvatron"].get_xdata()))
    texts = [t.get_text() for t in fig.texts + [t for ax in fig.axes for t in ax.texts]]
    assert any("bert: galvatron = cpsat" in t for t in texts)  # ilp is 10% higher: no tie
    assert plots.ties(pd.concat([frame, copy]).query("cluster == 'titan-8'"), "sim_throughput") == \
        [["galvatron", "cpsat"]]


def test_legend_lists_every_planner_even_one_that_never_found_a_plan():
    frame = paper_frame()
    never = frame[frame.planner == "dp"].assign(planner="zero3", feasible=False, sim_throughput=None)
    fig = plots.throughput_vs_budget(pd.concat([frame, never], ignore_index=True))
    labels = [t.get_text() for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes)] if legend
              for t in legend.get_texts()]
    assert labels == ["galvatron", "ilp", "zero3 (no feasible plan)", "dp"]


def test_drawing_leaves_matplotlibs_global_settings_alone():
    import matplotlib
    before = dict(matplotlib.rcParams)
    backend = matplotlib.get_backend()
    plots.throughput_vs_budget(paper_frame())
    plots.optimality_gap_figure(plots.optimality_gaps(paper_frame(), exact=("ilp",)))
    assert dict(matplotlib.rcParams) == before and matplotlib.get_backend() == backend
    assert fig_font_size() == plots.STYLE["xtick.labelsize"]


def fig_font_size() -> float:
    fig = plots.throughput_vs_budget(paper_frame())
    return fig.axes[0].get_xticklabels()[0].get_fontsize()


def test_importing_plots_leaves_rcparams_and_pyplot_alone():
    import subprocess
    import sys
    # reading rcParams['backend'] would itself resolve the backend (importing pyplot): skip it
    code = ("import matplotlib, sys; rc = lambda: {k: matplotlib.rcParams[k] for k in matplotlib.rcParams "
            "if k != 'backend'}; before = rc(); import analysis.plots; "
            "assert rc() == before, 'rcParams changed'; assert 'matplotlib.pyplot' not in sys.modules, 'pyplot'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[2]))


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
