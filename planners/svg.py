"""Small inline-SVG charts for the HTML report (no JavaScript, no external files): lines over a
numeric x axis, stacked horizontal bars."""
from __future__ import annotations

import math
from html import escape
from typing import Sequence

PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e",
           "#9498a0", "#1b3a8a", "#b5651d")
"""Colours in order (Observable's categorical scheme, then two darker ones)."""
FONT = 'font-family="sans-serif" font-size="12"'


def _nice_max(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above ``value`` (a clean axis end)."""
    if value <= 0:
        return 1.0
    step = 10.0 ** math.floor(math.log10(value))
    for m in (1, 2, 2.5, 5, 10):
        if m * step >= value:
            return m * step
    return 10 * step


def _legend(names: Sequence[str], x: float, y: float) -> list[str]:
    out = []
    for i, name in enumerate(names):
        yy = y + 16 * i
        out.append(f'<rect x="{x}" y="{yy - 9}" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>')
        out.append(f'<text x="{x + 14}" y="{yy}" {FONT}>{escape(name)}</text>')
    return out


def line_chart(series: dict[str, list[tuple[float, float]]], x_label: str, y_label: str,
               width: int = 760, height: int = 320) -> str:
    """One polyline with dots per series of (x, y) points; x values as ticks."""
    xs = sorted({x for pts in series.values() for x, _ in pts})
    top = _nice_max(max((y for pts in series.values() for _, y in pts), default=1.0))
    left, right, pad_top, bottom = 60, 200, 16, 40
    plot_w, plot_h = width - left - right, height - pad_top - bottom

    def px(x: float) -> float:
        return left + (plot_w * (xs.index(x) + 0.5) / len(xs) if xs else 0)

    def py(y: float) -> float:
        return pad_top + plot_h * (1 - y / top)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for k in range(5):
        v = top * k / 4
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{py(v) + 4:.1f}" text-anchor="end" {FONT}>{v:g}</text>')
    for x in xs:
        out.append(f'<text x="{px(x):.1f}" y="{pad_top + plot_h + 16}" text-anchor="middle" {FONT}>{x:g}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 4}" text-anchor="middle" {FONT}>{escape(x_label)}</text>')
    out.append(f'<text x="14" y="{pad_top + plot_h / 2}" text-anchor="middle" {FONT} '
               f'transform="rotate(-90 14 {pad_top + plot_h / 2})">{escape(y_label)}</text>')
    for i, (name, pts) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(pts))
        if len(pts) > 1:
            out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{colour}"/>' for x, y in pts]
    out += _legend(list(series), left + plot_w + 16, pad_top + 10)
    return "\n".join(out + ["</svg>"])


def stacked_bars(rows: list[tuple[str, list[float]]], parts: Sequence[str], unit: str, limit: float | None = None,
                 limit_label: str = "", width: int = 760, ticks: list[tuple[float, str]] | None = None) -> str:
    """One horizontal bar per row, split into ``parts`` (values in ``unit``); a dashed line at
    ``limit``; ``ticks`` marks extra (position, label) points along every bar (thin white lines)."""
    left, right, bar, gap, pad_top = 90, 200, 22, 10, 10
    height = max(pad_top + len(rows) * (bar + gap) + 40, pad_top + 16 * len(parts) + 10)  # room for the legend
    top = _nice_max(max([sum(v) for _, v in rows] + [limit or 0.0]))
    plot_w = width - left - right

    def px(v: float) -> float:
        return left + plot_w * v / top

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for r, (label, values) in enumerate(rows):
        y, x = pad_top + r * (bar + gap), 0.0
        out.append(f'<text x="{left - 6}" y="{y + bar * 0.7:.1f}" text-anchor="end" {FONT}>{escape(label)}</text>')
        for i, v in enumerate(values):
            if v > 0:
                out.append(f'<rect x="{px(x):.1f}" y="{y}" width="{px(x + v) - px(x):.2f}" height="{bar}" '
                           f'fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(parts[i])}: {v:.3g} {unit}</title></rect>')
            x += v
        for pos, _ in ticks or []:
            out.append(f'<line x1="{px(pos):.1f}" x2="{px(pos):.1f}" y1="{y}" y2="{y + bar}" stroke="#fff"/>')
    axis_y = pad_top + len(rows) * (bar + gap)
    for k in range(5):
        v = top * k / 4
        out.append(f'<text x="{px(v):.1f}" y="{axis_y + 14}" text-anchor="middle" {FONT}>{v:g}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{axis_y + 32}" text-anchor="middle" {FONT}>{escape(unit)}</text>')
    if limit is not None:
        out.append(f'<line x1="{px(limit):.1f}" x2="{px(limit):.1f}" y1="{pad_top - 4}" y2="{axis_y}" '
                   f'stroke="#c00" stroke-dasharray="5,3"/>')
        out.append(f'<text x="{px(limit) + 4:.1f}" y="{pad_top + 6}" fill="#c00" {FONT}>{escape(limit_label)}</text>')
    out += _legend(list(parts), left + plot_w + 16, pad_top + 10)
    return "\n".join(out + ["</svg>"])
