"""Figures from result tables (matplotlib, paper-sized): each function takes DataFrames, returns a Figure.

Figures are explicit ``matplotlib.figure.Figure`` objects drawn under a style context, so
importing or calling this module leaves pyplot, the backend and the global rcParams alone.
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any, Callable

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

STYLE = {"font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8, "legend.fontsize": 7,
         "xtick.labelsize": 8, "ytick.labelsize": 8, "figure.dpi": 150,
         "axes.grid": True, "grid.alpha": 0.3}
"""Paper-sized text; applied only while a figure is built (matplotlib.rc_context)."""
MARKERS = "osD^vP*Xhp<>"
DODGE_FRACTION = 0.035
"""Sideways shift of each planner's points, as a fraction of the smallest gap between budgets,
so planners with equal values stay visible side by side."""
TIE_REL = 1e-3
"""Planners whose values agree within this relative difference at every budget are a tie."""


def styled(draw: Callable[..., Figure]) -> Callable[..., Figure]:
    """Run a figure function under STYLE (rcParams are restored when it returns)."""
    @functools.wraps(draw)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with matplotlib.rc_context(STYLE):
            return draw(*args, **kwargs)
    return wrapper


PLANNER_ORDER = ("galvatron", "galvatron_classic", "ilp", "cpsat", "galvatron_dp_tp", "galvatron_dp_pp", "deepspeed_3d", "gpipe",
                 "megatron_tp", "zero3", "ddp", "galvatron_paper", "galvatron_bins", "megatron_3d", "zero2")
"""Known planners, searches first: the first ten get tab10's colours, the rest tab20's light ones."""


def order_planners(planners: Any) -> list[str]:
    """Known planners in PLANNER_ORDER, then any others alphabetically."""
    names = set(planners)
    return [p for p in PLANNER_ORDER if p in names] + sorted(names - set(PLANNER_ORDER))


def planner_style(planners: Any) -> dict[str, dict[str, Any]]:
    """One colour and marker per planner, the same in every figure (keyed on PLANNER_ORDER)."""
    tab10, tab20 = matplotlib.colormaps["tab10"], matplotlib.colormaps["tab20"]
    palette = [tab10(i) for i in range(10)] + [tab20(2 * i + 1) for i in (0, 1, 2, 4, 3, 5, 6, 7, 8, 9)]
    slots = {p: i for i, p in enumerate(PLANNER_ORDER)}
    extra = [p for p in order_planners(planners) if p not in slots]
    slots.update({p: len(PLANNER_ORDER) + i for i, p in enumerate(extra)})
    return {p: {"color": palette[slots[p] % len(palette)], "marker": MARKERS[slots[p] % len(MARKERS)]}
            for p in planners}


def _grid(rows: int, cols: int, width_in: float = 1.9, height_in: float = 1.7, **kw: Any):
    fig = Figure(figsize=(width_in * cols + 0.6, height_in * rows + 0.7), layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False, **kw)


def _legend_below(fig, axes, ncol: int = 10) -> None:
    """One legend for all panels (labels in first-seen order, no duplicates): under them, or
    to the right of a figure too narrow to carry it below."""
    handles: dict[str, Any] = {}
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(l, h)
    if not handles:
        return
    if axes.shape[1] <= 2 and len(handles) > 4:
        fig.legend(list(handles.values()), list(handles), loc="outside right center", frameon=False)
    else:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncol=min(ncol, len(handles), 3 * axes.shape[1] + 1), frameon=False)


# -- Galvatron evaluation ---------------------------------------------------------------------
def throughput_data(frame: pd.DataFrame, metric: str = "sim_throughput") -> pd.DataFrame:
    """The numbers throughput_vs_budget draws: one row per (cluster, model, budget, planner)."""
    rows = frame.assign(value=frame[metric].where(frame.feasible.astype(bool)).astype(float))
    return (rows[["cluster", "model", "budget_gib", "planner", "value"]].rename(columns={"value": metric})
            .sort_values(["cluster", "model", "budget_gib", "planner"]).reset_index(drop=True))


def ties(part: pd.DataFrame, metric: str) -> list[list[str]]:
    """Groups of planners whose ``metric`` agrees (within TIE_REL) at every budget of ``part``,
    feasible or not at the same budgets: their lines coincide."""
    series = {p: rows.set_index("budget_gib")[metric].astype(float).sort_index()
              for p, rows in part.groupby("planner")}
    groups: list[list[str]] = []
    for planner in order_planners(series):
        for group in groups:
            a, b = series[group[0]], series[planner]
            if a.index.equals(b.index) and a.isna().equals(b.isna()) and \
                    np.allclose(a.fillna(0), b.fillna(0), rtol=TIE_REL, atol=0):
                group.append(planner)
                break
        else:
            groups.append([planner])
    return [g for g in groups if len(g) > 1 and series[g[0]].notna().any()]


@styled
def throughput_vs_budget(frame: pd.DataFrame, metric: str = "sim_throughput",
                         label: str = "simulated throughput (samples/s)", max_cols: int = 3):
    """One panel per (cluster, model), at most ``max_cols`` a row: throughput vs memory budget,
    a line per planner. Each planner's points are shifted sideways a little (DODGE_FRACTION)
    and drawn as open markers, so equal values stay visible; ties are listed in the panel."""
    data = throughput_data(frame, metric)
    panels = [(c, m) for c in sorted(data.cluster.unique(), key=_natural) for m in dict.fromkeys(frame.model)
              if ((data.cluster == c) & (data.model == m)).any()]
    cols = min(max_cols, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = _grid(rows, cols, width_in=2.4, height_in=1.9)
    planners = order_planners(data.planner.unique())
    style = planner_style(planners)
    budgets = np.array(sorted(data.budget_gib.unique()), dtype=float)
    step = float(np.diff(budgets).min()) if len(budgets) > 1 else 1.0
    shift = {p: (i - (len(planners) - 1) / 2) * DODGE_FRACTION * step for i, p in enumerate(planners)}
    notes: list[str] = []
    for ax, (cluster, model) in zip(axes.flat, panels):
        part = data[(data.cluster == cluster) & (data.model == model)]
        for planner in order_planners(part.planner):
            line = part[part.planner == planner].sort_values("budget_gib")
            ax.plot(line.budget_gib + shift[planner], line[metric], label=planner, lw=1.0, ms=4.5,
                    markerfacecolor="white", markeredgewidth=1.1, **style[planner])
        notes += [f"{model}: " + " = ".join(g) for g in ties(part, metric)]
        ax.set_title(f"{model}, {cluster}")
        ax.set_xticks(budgets, [f"{b:g}" for b in budgets])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("budget (GiB per GPU)")
    fig.supylabel(label, fontsize=8)
    note = (f"Each planner's points are shifted sideways (at most {max(shift.values(), default=0):.2g} GiB)"
            " so equal values stay visible." + ("\nLines that coincide (within 0.1% at every budget):\n"
                                                 + "\n".join(notes) if notes else ""))
    _planner_legend(fig, axes, planners, style, part_of=data, metric=metric, note=note)
    fig.suptitle("Throughput vs memory budget (missing point: no feasible plan)", fontsize=9)
    return fig


def _planner_legend(fig, axes, planners: list[str], style: dict, part_of: pd.DataFrame, metric: str,
                    note: str) -> None:
    """Every planner of the frame in the legend (one that never found a plan says so), and
    ``note`` under it: in the last unused panel when there is one, else under the panels."""
    found = set(part_of.planner[part_of[metric].notna()])
    handles = [Line2D([], [], lw=1.0, ms=4.5, markerfacecolor="white", markeredgewidth=1.1, **style[p])
               for p in planners]
    labels = [p if p in found else f"{p} (no feasible plan)" for p in planners]
    unused = [ax for ax in axes.flat if not ax.has_data()]
    for ax in unused:
        ax.set_axis_off()
    if unused:
        unused[-1].legend(handles, labels, loc="upper center", frameon=False, ncol=2 if len(planners) > 6 else 1,
                          fontsize=8)
        unused[-1].text(0.0, 0.0, note, transform=unused[-1].transAxes, fontsize=7, va="bottom", wrap=True)
        return
    fig.legend(handles, labels, loc="outside lower center", ncol=min(5, len(planners)), frameon=False, fontsize=8)
    fig.text(0.5, 0.0, note, fontsize=7, ha="center", va="top")


def paper_table(frame: pd.DataFrame, metric: str = "sim_throughput") -> pd.DataFrame:
    """The paper's main table: rows (cluster, model, budget), a column per planner;
    'OOM' where the planner found no plan, '-' where the cell was not run."""
    value = frame.apply(lambda r: f"{r[metric]:.1f}" if r.feasible and pd.notna(r[metric]) else "OOM", axis=1)
    table = frame.assign(value=value).pivot_table(index=["cluster", "model", "budget_gib"], columns="planner",
                                                  values="value", aggfunc="first")
    return table.fillna("-")


# -- beyond the paper -----------------------------------------------------------------------------
@styled
def search_time(frame: pd.DataFrame):
    """Search time vs layers (fewest GPUs) and vs GPUs (one layer count), a line per planner."""
    style = planner_style(list(frame.planner.unique()))
    fig, axes = _grid(1, 2, width_in=2.6, height_in=2.0)
    base_gpus = frame.gpus.min()
    by_gpus = frame[frame.gpus > base_gpus]
    base_layers = by_gpus.layers.mode().iloc[0] if len(by_gpus) else frame.layers.min()
    panels = [(frame[frame.gpus == base_gpus], "layers", f"layers ({base_gpus} GPUs)"),
              (frame[frame.layers == base_layers], "gpus", f"GPUs ({base_layers} layers)")]
    for ax, (part, x, xlabel) in zip(axes[0], panels):
        for planner in order_planners(part.planner):
            rows = part[part.planner == planner].sort_values(x)
            ax.plot(rows[x], rows.search_time_s.astype(float), label=planner, lw=1.2, ms=4, **style[planner])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted(part[x].unique()), [str(v) for v in sorted(part[x].unique())])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel("search time (s)")
    _legend_below(fig, axes)
    fig.suptitle("Planner search time vs problem size (best of repeats)", fontsize=9)
    return fig


def optimality_gaps(frame: pd.DataFrame, exact: tuple[str, ...]) -> pd.DataFrame:
    """Per problem and planner: gap (%) of cost-model throughput below the best exact planner's
    (only exact runs that proved optimality count when the frame has ``solver_status``)."""
    key = ["model", "cluster", "budget_gib"]
    feasible = frame[frame.feasible & frame.cost_model_throughput.notna()]
    reference = feasible[feasible.planner.isin(exact)]
    if "solver_status" in reference:
        reference = reference[reference.solver_status == "optimal"]
    best = reference.groupby(key).cost_model_throughput.max().rename("optimum")
    merged = frame.merge(best, left_on=key, right_index=True, how="inner")
    merged["gap_pct"] = np.where(merged.feasible, 100 * (1 - merged.cost_model_throughput / merged.optimum),
                                 np.nan)
    return merged[key + ["planner", "feasible", "cost_model_throughput", "optimum", "gap_pct"]]


@styled
def optimality_gap_figure(gaps: pd.DataFrame):
    """A dot per problem and planner (gap %), a bar for the mean; infeasible counted apart."""
    planners = order_planners(gaps.planner.unique())
    style = planner_style(planners)
    fig, axes = _grid(1, 1, width_in=max(3.0, 0.5 * len(planners)), height_in=2.2)
    ax = axes[0, 0]
    rng = np.random.default_rng(0)  # jitter only, so the picture is the same each run
    for i, planner in enumerate(planners):
        rows = gaps[gaps.planner == planner]
        vals = rows.gap_pct.dropna().to_numpy()
        ax.bar(i, vals.mean() if len(vals) else 0, color=style[planner]["color"], alpha=0.35, width=0.7)
        ax.scatter(i + rng.uniform(-0.2, 0.2, len(vals)), vals, s=8, color=style[planner]["color"])
        missed = int((~rows.feasible.astype(bool)).sum())
        if missed:
            ax.annotate(f"{missed} no plan", (i, 0), xytext=(0, -22), textcoords="offset points",
                        ha="center", fontsize=6, color="0.3")
    ax.set_xticks(range(len(planners)), planners, rotation=30, ha="right")
    ax.set_ylabel("gap to exact optimum (% throughput)")
    ax.set_title("Optimality gap (cost model; bar = mean, dot = problem)")
    return fig


@styled
def relative_throughput(frame: pd.DataFrame, metric: str = "cost_model_throughput"):
    """Grouped bars: per (model, cluster, budget) each planner's throughput / the best one's."""
    frame = frame.assign(problem=frame.model + "\n" + frame.cluster + "\n" + frame.budget_gib.astype(str) + " GiB")
    ok = frame[frame.feasible & frame[metric].notna()]
    best = ok.groupby("problem")[metric].max()
    problems, planners = list(dict.fromkeys(frame.problem)), order_planners(frame.planner.unique())
    style = planner_style(planners)
    fig, axes = _grid(1, 1, width_in=max(4.0, 0.55 * len(problems) * max(1, len(planners)) / 3), height_in=2.2)
    ax = axes[0, 0]
    width = 0.8 / len(planners)
    for j, planner in enumerate(planners):
        rows = ok[ok.planner == planner].set_index("problem")[metric]
        heights = [rows.get(p, 0.0) / best.get(p, np.nan) if p in rows else 0.0 for p in problems]
        xs = np.arange(len(problems)) + (j - (len(planners) - 1) / 2) * width
        ax.bar(xs, heights, width, label=planner, color=style[planner]["color"])
        for x, h in zip(xs, heights):
            if h == 0.0:  # no feasible plan: a mark where the bar would stand
                ax.plot(x, 0.02, marker="x", ms=3, color=style[planner]["color"], clip_on=False)
    ax.set_xticks(range(len(problems)), problems, fontsize=6)
    ax.set_ylabel("throughput / best planner's")
    ax.set_ylim(0, 1.05)
    ax.set_title("Modern clusters (cost model; x: no feasible plan)")
    _legend_below(fig, axes, ncol=8)
    return fig


@styled
def predicted_vs_measured(preds: pd.DataFrame):
    """One panel per predictor: predicted vs measured iteration time (log-log), MAPE per set."""
    preds = preds[preds.predicted_s.notna()]
    predictors = list(dict.fromkeys(preds.predictor))
    fig, axes = _grid(1, len(predictors), width_in=2.2, height_in=2.2)
    colors = {"single": "tab:blue", "multi": "tab:orange"}
    for ax, predictor in zip(axes[0], predictors):
        part = preds[(preds.predictor == predictor) & preds.predicted_s.notna()]
        for dataset, rows in part.groupby("dataset"):
            mape = 100 * ((rows.predicted_s - rows.measured_s).abs() / rows.measured_s).mean()
            ax.scatter(rows.measured_s, rows.predicted_s, s=6, alpha=0.6, color=colors.get(dataset),
                       label=f"{dataset}-node ({len(rows)}): MAPE {mape:.1f}%")
        lo = min(preds.measured_s.min(), part.predicted_s.min() if len(part) else np.inf) * 0.8
        hi = max(preds.measured_s.max(), part.predicted_s.max() if len(part) else 0) * 1.25
        ax.plot([lo, hi], [lo, hi], color="0.4", lw=0.8, ls="--")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), title=predictor,
               xlabel="measured iteration time (s)")
        ax.legend(loc="upper left", frameon=False, fontsize=6)
    axes[0, 0].set_ylabel("predicted iteration time (s)")
    fig.suptitle("Predicted vs measured (vTrain A100 runs; dashed: exact)", fontsize=9)
    return fig


# -- one plan ------------------------------------------------------------------------------------
@styled
def plan_picture(plan: dict[str, Any], intervals: pd.DataFrame, memory: pd.DataFrame, title: str = "",
                 budget_gib: float | None = None):
    """Per-layer strategies along the depth, the simulated timeline, and memory over time."""
    fig = Figure(figsize=(7.0, 6.6), layout="constrained")
    grid = fig.add_gridspec(3, 1, height_ratios=[1.0, 2.2, 1.4])
    _plan_strip(fig.add_subplot(grid[0]), plan)
    timeline = fig.add_subplot(grid[1])
    _timeline(timeline, intervals)
    _memory(fig.add_subplot(grid[2], sharex=timeline), memory, budget_gib)
    fig.suptitle(title, fontsize=9)
    return fig


def _recompute(layer: dict[str, Any]) -> str:
    """A plan file's recompute (older files say ``checkpoint``: true/false)."""
    return layer.get("recompute", "full" if layer.get("checkpoint") else "none")


def _plan_strip(ax, plan: dict[str, Any]) -> None:
    layers = plan["layers"]
    tp = np.array([l["tp"] for l in layers])
    rows = {"tp degree": np.log2(tp), "ZeRO-3": [l["dp_type"] == "zero3" for l in layers],
            "ZeRO-1/2": [l["dp_type"] in ("zero1", "zero2") for l in layers],
            "recompute": [{"none": 0, "selective": 0.5, "full": 1}[_recompute(l)] for l in layers]}
    image = np.array([np.asarray(v, dtype=float) / max(1.0, np.max(v)) for v in rows.values()])
    ax.imshow(image, aspect="auto", cmap="Blues", vmin=0, vmax=1.2, interpolation="nearest")
    for i, t in enumerate(tp):
        ax.text(i, 0, str(t), ha="center", va="center", fontsize=5)
    start = 0
    for stage, n in enumerate(plan["stage_layers"]):
        ax.axvline(start - 0.5, color="tab:red", lw=1.2)
        ax.text(start + n / 2 - 0.5, -0.75, f"stage {stage}", ha="center", va="bottom", fontsize=6, color="tab:red")
        start += n
    ax.set_yticks(range(len(rows)), list(rows))
    ax.set_xlabel("layer index (red lines: pipeline stage boundaries; number: tp degree)")
    ax.grid(False)
    ax.set_title(f"plan: pp={plan['pp']}, {plan['micro_batches']} micro-batches, global batch "
                 f"{plan['global_batch']}, {plan['schedule']}", pad=12)


def _timeline(ax, intervals: pd.DataFrame) -> None:
    lanes = sorted(intervals.lane.unique(), key=_natural)
    kinds = sorted(intervals.category.replace("", "other").unique())
    cmap = matplotlib.colormaps["tab10"]
    colour = {k: cmap(i % 10) for i, k in enumerate(kinds)}
    for i, lane in enumerate(lanes):
        part = intervals[intervals.lane == lane]
        for kind, rows in part.groupby(part.category.replace("", "other")):
            ax.broken_barh(list(zip(rows.start_s, rows.duration_s)), (i - 0.4, 0.8), color=colour[kind], lw=0)
    ax.set_yticks(range(len(lanes)), lanes, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (s)")
    handles = [Rectangle((0, 0), 1, 1, color=colour[k]) for k in kinds]
    ax.legend(handles, kinds, loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=6,
              ncol=len(kinds), frameon=False, title="simulated iteration (one lane per GPU stream)",
              title_fontsize=8)


def _memory(ax, memory: pd.DataFrame, budget_gib: float | None = None) -> None:
    for series, rows in sorted(memory.groupby("series"), key=lambda kv: _natural(kv[0])):
        ax.step(rows.time_s, rows.memory_gib, where="post", lw=1.0, label=str(series))
    if budget_gib:
        ax.axhline(budget_gib, color="tab:red", ls="--", lw=0.8, label=f"budget {budget_gib:g} GiB")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("memory (GiB)")
    top = max([memory.memory_gib.max() if len(memory) else 0.0, budget_gib or 0.0])
    ax.set_ylim(0, top * 1.08 if top else None)
    if memory.series.nunique() <= 16:
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=6, ncol=5, frameon=False,
                  title="GPU memory over the iteration (one GPU per stage)", title_fontsize=8)


def _natural(text: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(text)))


def load_plan(text: str) -> dict[str, Any]:
    return json.loads(text)


def picture_of(plan: Any, sim: Any, world_size: int, title: str = "", budget_gib: float | None = None):
    """plan_picture straight from a Plan and a SimResult run with keep_spans=True."""
    from analysis.timeline import memory_frame, read_spans_csv, spans_csv, stage_memory
    if not sim.spans:
        raise ValueError("sim.spans: empty; simulate with keep_spans=True to draw the timeline")
    intervals = read_spans_csv(spans_csv(sim.spans))
    memory = memory_frame(stage_memory(sim.memory_timeline, plan, world_size))
    return plan_picture(plan.to_dict(), intervals, memory, title, budget_gib)
