"""Server-rendered SVG charts (no JavaScript): bars and lines with axes, month labels, a
legend and a ``<title>`` per point. Every text is escaped."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from html import escape

from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 560, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 28, 44
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
COLORS = ("#417690", "#ba2121", "#e4a11b", "#5b9b3a", "#7d5ba6")

Number = int | float | Decimal


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude: int = 10 ** (len(str(int(value))) - 1)
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10.0 * magnitude


def _fmt(value: float) -> str:
    if abs(value) >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if abs(value) >= 10_000:
        return f"{value / 1_000:g}k"
    return f"{value:g}" if value != int(value) else str(int(value))


def _frame(title: str, labels: Sequence[str], top: float, unit: str) -> list[str]:
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="billing-chart" role="img" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'aria-label="{escape(title)}" font-family="sans-serif" font-size="10">',
        f"<title>{escape(title)}</title>",
        f'<text x="{LEFT}" y="14" font-size="12" font-weight="bold">{escape(title)}</text>',
    ]
    for i in range(5):
        value = top * i / 4
        y = TOP + PLOT_H - PLOT_H * i / 4
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">'
            f"{escape(_fmt(value))}{escape(unit) if i == 4 else ''}</text>"
        )
    out.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + PLOT_H}" stroke="#333"/>')
    out.append(
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + PLOT_H}" '
        f'y2="{TOP + PLOT_H}" stroke="#333"/>'
    )
    slot = PLOT_W / max(len(labels), 1)
    for i, label in enumerate(labels):
        x = LEFT + slot * (i + 0.5)
        out.append(
            f'<text x="{x:.1f}" y="{TOP + PLOT_H + 14}" text-anchor="middle">'
            f"{escape(label[2:] if len(label) == 7 else label)}</text>"
        )
    return out


def _legend(names: Sequence[str]) -> list[str]:
    out, x = [], LEFT
    for i, name in enumerate(names):
        color = COLORS[i % len(COLORS)]
        out.append(f'<rect x="{x}" y="{HEIGHT - 14}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{x + 14}" y="{HEIGHT - 5}">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    return out


Series = dict[str, Sequence[Number | None]]


def _chart(bars: bool, title: str, labels: Sequence[str], series: Series, unit: str) -> SafeString:
    values = {k: [float(v or 0) for v in vs] for k, vs in series.items()}
    top = _nice_max(max((v for vs in values.values() for v in vs), default=0))
    out = _frame(title, labels, top, unit)
    slot = PLOT_W / max(len(labels), 1)
    width = slot * 0.8 / max(len(values), 1)
    for s, (name, vs) in enumerate(values.items()):
        color = COLORS[s % len(COLORS)]
        if not bars:
            points = [
                (LEFT + slot * (i + 0.5), TOP + PLOT_H - PLOT_H * v / top) for i, v in enumerate(vs)
            ]
            xys = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            out.append(f'<polyline fill="none" stroke-width="2" stroke="{color}" points="{xys}"/>')
        for i, (v, label) in enumerate(zip(vs, labels, strict=False)):
            tip = f"<title>{escape(name)} {escape(label)}: {escape(_fmt(v))}</title>"
            if bars:
                h = PLOT_H * v / top
                x = LEFT + slot * i + slot * 0.1 + width * s
                out.append(
                    f'<rect x="{x:.1f}" y="{TOP + PLOT_H - h:.1f}" width="{width:.1f}" '
                    f'height="{h:.1f}" fill="{color}">{tip}</rect>'
                )
            else:
                x, y = points[i]
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}">{tip}</circle>')
    out += _legend(list(values))
    out.append("</svg>")
    return mark_safe("".join(out))  # noqa: S308 - every text above is escaped


def bar_chart(title: str, labels: Sequence[str], series: Series, unit: str = "") -> SafeString:
    """Grouped bars, one group per label, one bar per series."""
    return _chart(True, title, labels, series, unit)


def line_chart(title: str, labels: Sequence[str], series: Series, unit: str = "") -> SafeString:
    """One polyline per series with a dot per point."""
    return _chart(False, title, labels, series, unit)
