"""HTML views of plans: the self-contained page ``compare --report`` writes (throughput vs budget,
per-stage memory, the stage timeline, the plan, every cell), and PlanResult's view in Jupyter."""
from __future__ import annotations

from html import escape
from typing import Any, Sequence

from planners.svg import stacked_bars, line_chart
from specs import ClusterSpec, ModelSpec, Plan
from specs.flops import FLOP_FORMULA
from specs.units import GIB

MAX_TICKED_MICRO_BATCHES = 32
"""Up to this many micro-batches the timeline marks each one; beyond, the bars alone summarise."""
MEMORY_PARTS = ("parameters", "gradients", "optimizer states", "activations", "largest temporary", "runtime overhead")
STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:24px auto;color:#222}"
         "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;"
         "text-align:left}th{background:#f3f3f3}.note{color:#555;font-size:13px}h2{margin-top:28px}")


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = "".join(f"<th>{escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


RECOMPUTE_WORDS = {"ckpt": "recompute full", "sel": "recompute selective"}
"""The plan column's short tokens, spelled as the --recompute flags spell them."""


def _strategy(text: str) -> str:
    return " ".join(RECOMPUTE_WORDS.get(word, word) for word in text.split())


def _runs(plan: Plan, layers: Sequence[int]) -> str:
    """``L0-3 tp1/dp2 zero1; L4 ...`` for the layers of one stage (runs of equal strategies)."""
    out, start = [], 0
    layers = list(layers)
    for i in range(1, len(layers) + 1):
        if (i == len(layers) or layers[i] != layers[i - 1] + 1  # interleaved stages hold separate chunks
                or plan.layers[layers[i]] != plan.layers[layers[start]]):
            a, b = layers[start], layers[i - 1]
            out.append(f"L{a}" + (f"-{b}" if b != a else "") + f" {_strategy(plan.layers[a].short())}")
            start = i
    return "; ".join(out)


def plan_table(plan: Plan, world_size: int, stage_peak_gib: Sequence[float] = ()) -> str:
    """One row per pipeline stage: its layers, GPUs, per-layer strategies and peak memory."""
    rows = []
    for k, layers in enumerate(plan.stage_ranges()):
        peak = f"{stage_peak_gib[k]:.2f}" if k < len(stage_peak_gib) else ""
        rows.append([k, len(layers), world_size // plan.pp, _runs(plan, layers), peak])
    return _table(["stage", "layers", "GPUs", "strategy per layer", "peak GiB"], rows)


def _plan_line(plan: Plan) -> str:
    vocab = f", vocabulary tp {plan.vocab_tp}" if plan.vocab_tp > 1 else ""
    pipeline = (f"pp {plan.pp} ({plan.schedule}" + (f", {plan.virtual_stages} chunks per stage" if plan.virtual_stages > 1
                                                     else "") + "), " if plan.pp > 1 else "no pipeline, ")
    return (f"{pipeline}global batch {plan.global_batch} in {plan.micro_batches} micro-batch"
            f"{'es' if plan.micro_batches > 1 else ''}{vocab}")


def result_html(result: Any) -> str:
    """A PlanResult as a small HTML block (Jupyter's _repr_html_)."""
    if not result.feasible:
        return f"<p><b>{escape(result.planner)}</b>: no plan fits. {escape(result.message)}</p>"
    plan = result.plan
    figures = [["throughput", f"{result.throughput_samples_per_s:.2f} samples/s"],
               ["iteration", f"{result.iteration_time_s * 1e3:.1f} ms"],
               ["peak memory", f"{result.peak_memory_gib:.2f} GiB per GPU"], ["plan", _plan_line(plan)],
               ["search", f"{result.stats.wall_time_s:.2f} s ({result.stats.solver_status or 'done'})"]]
    if plan.pp > 1:
        figures.insert(3, ["pipeline bubble", f"{result.bubble_fraction:.1%} ({plan.schedule})"])
    world = plan.pp * plan.layers[0].gpus
    return (f"<div><b>{escape(result.planner)}</b>" + _table(["", ""], figures)
            + plan_table(plan, world, result.stage_peak_memory_gib) + "</div>")


def _memory_rows(cost: Any) -> list[tuple[str, list[float]]]:
    return [(f"stage {k}", [m.parameters_bytes / GIB, m.gradients_bytes / GIB, m.optimizer_bytes / GIB,
                            m.activations_bytes / GIB, m.temporary_bytes / GIB, cost.runtime_overhead_bytes / GIB])
            for k, m in enumerate(cost.stage_memory)]


def _timeline(plan: Plan, cost: Any) -> tuple[str, str]:
    """Per stage: m x T_k of micro-batch work, the rest of the iteration waiting (the bubble), the
    tail D_k (gradient sync not hidden, optimizer step); and a sentence that reads the same."""
    total_ms, m = cost.iteration_time_s * 1e3, plan.micro_batches
    rows = []
    for k, (t, d) in enumerate(zip(cost.stage_time_s, cost.stage_tail_s)):
        busy, tail = m * t * 1e3, d * 1e3
        rows.append((f"stage {k}", [busy, max(0.0, total_ms - busy - tail), tail]))
    ticks = []
    if m <= MAX_TICKED_MICRO_BATCHES and plan.pp == 1:
        ticks = [(i * cost.stage_time_s[0] * 1e3, "") for i in range(1, m)]
    svg = stacked_bars(rows, ("micro-batch work (m x T_k)", "waiting (bubble)", "tail (sync, optimizer)"), "ms",
                       ticks=ticks)
    slow = max(range(len(cost.stage_time_s)), key=lambda k: cost.stage_time_s[k])
    text = (f"{m} micro-batch{'es' if m > 1 else ''}; the slowest stage ({slow}) takes "
            f"{cost.stage_time_s[slow] * 1e3:.2f} ms per micro-batch; iteration {total_ms:.1f} ms"
            + (f", bubble {cost.bubble_fraction:.1%} ({plan.schedule})" if plan.pp > 1 else "")
            + ". From the cost model's stage times (per micro-batch T_k, per iteration tail D_k).")
    return svg, text


def _throughput_chart(records: list[dict[str, Any]]) -> str:
    series: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        if r["feasible"]:
            series.setdefault(r["planner"], []).append((r["budget_gib"], r["tokens_per_s_per_gpu"]))
    return line_chart(series, "memory budget per GPU, GiB", "tokens/s per GPU") if series else "<p>no plan fits</p>"


def _records_table(records: list[dict[str, Any]]) -> str:
    rows = [[f"{r['budget_gib']:g}", r["planner"], r["global_batch"] or "",
             f"{r['tokens_per_s_per_gpu']:.0f}" if r["feasible"] else "OOM",
             f"{r['mfu']:.1%}" if r["feasible"] else "", f"{r['iteration_time_s'] * 1e3:.1f}" if r["feasible"] else "",
             f"{r['peak_memory_gib']:.2f}" if r["feasible"] else "", r["plan_summary"]] for r in records]
    return _table(["GiB", "planner", "batch", "tok/s/GPU", "MFU", "iter ms", "peak GiB", "plan"], rows)


def report_page(*, model: ModelSpec, cluster: ClusterSpec, records: list[dict[str, Any]], chosen: dict[str, Any],
                plan: Plan, cost: Any, reserve_gib: float) -> str:
    """The whole page: the chosen cell's plan (``plan``, scored as ``cost`` = plan_cost) and every
    cell of the compare run; ``reserve_gib`` is the allocator reserve of the chosen budget."""
    title = f"{chosen['planner']} plan for {model.name} on {cluster.name}"
    usable = chosen["budget_gib"] - reserve_gib
    head = [["model", f"{model.name}: {model.param_count() / 1e9:.2f} B parameters, {model.num_layers} layers, "
             f"sequence {model.seq_len}, attention {model.layers[0].attention}"],
            ["cluster", f"{cluster.name}: {cluster.nodes} x {cluster.gpus_per_node} {cluster.gpu.name} "
             f"({cluster.gpu.memory_gib:g} GiB, {cluster.gpu.peak_tflops:g} TFLOP/s dense BF16)"],
            ["budget", f"{chosen['budget_gib']:g} GiB per GPU, of which {reserve_gib:g} GiB allocator reserve"],
            ["throughput", f"{chosen['tokens_per_s_per_gpu']:.0f} tokens/s per GPU, {chosen['tflops_per_gpu']:.1f} "
             f"TFLOP/s per GPU, MFU {chosen['mfu']:.1%} ({chosen['throughput_samples_per_s']:.2f} samples/s)"],
            ["iteration", f"{chosen['iteration_time_s'] * 1e3:.1f} ms, peak {chosen['peak_memory_gib']:.2f} GiB"],
            ["plan", _plan_line(plan)]]
    timeline, timeline_text = _timeline(plan, cost)
    memory = stacked_bars(_memory_rows(cost), MEMORY_PARTS, "GiB per GPU", limit=usable,
                          limit_label=f"budget less reserve ({usable:g} GiB)")
    body = [f"<h1>{escape(title)}</h1>", _table(["", ""], head),
            "<h2>The plan</h2>", plan_table(plan, cluster.world_size, [b / GIB for b in cost.stage_peak_bytes]),
            "<h2>Throughput against the memory budget</h2>", _throughput_chart(records),
            "<h2>Memory of one GPU per pipeline stage</h2>", memory,
            "<p class='note'>From the cost model: every part counted at its peak at once.</p>",
            "<h2>Stage timeline</h2>", timeline, f"<p class='note'>{escape(timeline_text)}</p>",
            "<h2>Every cell</h2>", _records_table(records),
            f"<p class='note'>FLOPs: {escape(FLOP_FORMULA)}</p>"]
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>" + "\n".join(body) + "</body></html>\n")
