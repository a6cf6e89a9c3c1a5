"""Tiny SVG charts for the report (no matplotlib): scatter/line plots and stacked bars.

Output is a standalone ``<svg>`` element (inline in the HTML, so the report has no external assets).
Every plotted point is a ``<circle class="pt">`` (or ``<rect class="bar">``) carrying a ``<title>``
tooltip with its exact figures, so a reader — or a test — can trace each mark to a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f")
_W, _H = 720, 400
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 230, 34, 52


@dataclass(frozen=True)
class Series:
    name: str
    points: tuple[tuple[float, float, str], ...]  # x, y, tooltip; lines join them in this order
    color: str
    connect: bool = True
    emphasis: bool = False
    labels: tuple[str, ...] = ()  # short text beside each point (emphasized series only)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering ``[low, high]``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0, 1.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(low / step) * step
    ticks, value = [], start
    while value < high + step * 0.999:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e5 else f"{value:.3g}"


def _frame(title: str, x_label: str, y_label: str, xt: Sequence[float], yt: Sequence[float],
           sx, sy, x_names: Sequence[str] | None = None) -> list[str]:
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" '
           f'role="img" font-family="sans-serif" font-size="11">',
           f"<title>{escape(title)}</title>",
           f'<rect x="0" y="0" width="{_W}" height="{_H}" fill="white"/>',
           f'<text x="{_W / 2}" y="18" text-anchor="middle" font-size="14" font-weight="bold">{escape(title)}</text>']
    x0, x1, y0, y1 = _LEFT, _W - _RIGHT, _H - _BOTTOM, _TOP
    for tick in yt:
        y = sy(tick)
        out.append(f'<line x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{_label(tick)}</text>')
    for i, tick in enumerate(xt):
        x = sx(tick)
        text = x_names[i] if x_names else _label(tick)
        out.append(f'<text x="{x:.1f}" y="{y0 + 16}" text-anchor="middle">{escape(text)}</text>')
    out.append(f'<line x1="{x0}" x2="{x1}" y1="{y0}" y2="{y0}" stroke="black"/>')
    out.append(f'<line x1="{x0}" x2="{x0}" y1="{y0}" y2="{y1}" stroke="black"/>')
    out.append(f'<text x="{(x0 + x1) / 2}" y="{_H - 12}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text transform="translate(16 {(y0 + y1) / 2}) rotate(-90)" text-anchor="middle">'
               f"{escape(y_label)}</text>")
    return out


def _legend(entries: Sequence[tuple[str, str, bool]]) -> list[str]:
    out, x = [], _W - _RIGHT + 14
    for i, (name, color, emphasis) in enumerate(entries[:16]):
        y = _TOP + 8 + i * 16
        weight = ' font-weight="bold"' if emphasis else ""
        out.append(f'<rect x="{x}" y="{y - 8}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{x + 14}" y="{y + 1}"{weight}>{escape(name[:34])}</text>')
    return out


def scatter(series: Sequence[Series], *, title: str, x_label: str, y_label: str) -> str:
    """Points (and lines when ``connect``) of every series, axes from zero to the largest value."""
    xs = [p[0] for s in series for p in s.points if math.isfinite(p[0])]
    ys = [p[1] for s in series for p in s.points if math.isfinite(p[1])]
    xt, yt = nice_ticks(0.0, max(xs, default=1.0)), nice_ticks(0.0, max(ys, default=1.0))
    x0, x1, y0, y1 = _LEFT, _W - _RIGHT, _H - _BOTTOM, _TOP

    def sx(v: float) -> float:
        return x0 + (v - xt[0]) / (xt[-1] - xt[0]) * (x1 - x0)

    def sy(v: float) -> float:
        return y0 - (v - yt[0]) / (yt[-1] - yt[0]) * (y0 - y1)

    out = _frame(title, x_label, y_label, xt, yt, sx, sy)
    for s in sorted(series, key=lambda s: s.emphasis):  # emphasized series drawn last, on top
        kept = [i for i, p in enumerate(s.points) if math.isfinite(p[0]) and math.isfinite(p[1])]
        points = [s.points[i] for i in kept]
        width = 2.5 if s.emphasis else 1.2
        if s.connect and len(points) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in points)
            out.append(f'<polyline points="{path}" fill="none" stroke="{s.color}" stroke-width="{width}"/>')
        radius = 5 if s.emphasis else 3.5
        for x, y, tip in points:
            out.append(f'<circle class="pt" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{radius}" fill="{s.color}" '
                       f'stroke="black" stroke-width="{0.8 if s.emphasis else 0.2}"><title>{escape(tip)}</title>'
                       "</circle>")
        if s.emphasis and s.labels:
            for i in kept:
                x, y, _ = s.points[i]
                out.append(f'<text x="{sx(x) + 7:.1f}" y="{sy(y) - 5:.1f}" font-size="9" fill="#444">'
                           f"{escape(s.labels[i])}</text>")
    legend: dict[str, tuple[str, str, bool]] = {}
    for s in series:
        legend.setdefault(s.name, (s.name, s.color, s.emphasis))
    out += _legend(list(legend.values()))
    out.append("</svg>")
    return "\n".join(out)


def stacked_bars(categories: Sequence[str], stacks: Sequence[tuple[str, Sequence[float], str]], *, title: str,
                 y_label: str, tooltips: Sequence[str] = ()) -> str:
    """One bar per category, ``stacks`` (name, values, color) piled bottom to top."""
    totals = [sum(v[i] for _, v, _ in stacks) for i in range(len(categories))]
    yt = nice_ticks(0.0, max(totals, default=1.0))
    x0, x1, y0, y1 = _LEFT, _W - _RIGHT, _H - _BOTTOM, _TOP
    slot = (x1 - x0) / max(len(categories), 1)

    def sy(v: float) -> float:
        return y0 - (v - yt[0]) / (yt[-1] - yt[0]) * (y0 - y1)

    positions = [x0 + slot * (i + 0.5) for i in range(len(categories))]
    out = _frame(title, "configuration (see table)", y_label, list(range(len(categories))), yt,
                 lambda i: positions[int(i)], sy, x_names=[str(i + 1) for i in range(len(categories))])
    for i, category in enumerate(categories):
        base = 0.0
        for name, values, color in stacks:
            top = base + values[i]
            tip = f"{category}: {name} {values[i]:.1f}" + (f" ({tooltips[i]})" if i < len(tooltips) else "")
            out.append(f'<rect class="bar" x="{positions[i] - slot * 0.35:.1f}" y="{sy(top):.1f}" '
                       f'width="{slot * 0.7:.1f}" height="{max(sy(base) - sy(top), 0):.1f}" fill="{color}">'
                       f"<title>{escape(tip)}</title></rect>")
            base = top
    out += _legend([(name, color, False) for name, _, color in stacks])
    out.append("</svg>")
    return "\n".join(out)
