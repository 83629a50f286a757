"""A run's trace as a waterfall: one row per span, a bar from its start to its end.

The span tree comes from the run's own events (ringfence_server.control.tracing, the same tree
`ringfence trace` prints); this module only lays it out as rows of numbers and strings. The
template draws the rows as SVG <rect> and <text> elements, its autoescape escaping every label:
no markup is ever built from a string here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringfence_server.control.tracing import TraceNode
from ringfence_server.control.tracing.tree import format_duration, label, ordered

__all__ = ["ROW_HEIGHT", "Bar", "Waterfall", "layout"]

ROW_HEIGHT = 22
LABEL_WIDTH = 440
"""Pixels of the left column (the indented span labels: LABEL_CHARS of 12px monospace fit)."""
CHART_WIDTH = 560
MIN_BAR = 2.0
LABEL_CHARS = 58


@dataclass(frozen=True)
class Bar:
    y: int
    depth: int
    text: str
    """The span's label (name, title, duration, labels), cut to LABEL_CHARS."""
    x: float
    """Bar start, in pixels from the chart's left edge (after the label column)."""
    width: float
    instant: bool
    """No end: drawn as a thin tick."""
    kind: str
    """The span's name: its colour class (a CSS class in console.css, never a style attribute)."""
    tooltip: str


@dataclass(frozen=True)
class Waterfall:
    bars: tuple[Bar, ...]
    width: int
    height: int
    label_width: int
    chart_width: int
    total: str
    """The whole run's duration, for the axis."""


def _cut(text: str, limit: int = LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def layout(root: TraceNode, *, max_rows: int = 400) -> Waterfall:
    """Rows in drawing order (depth first, children by start), scaled to the run's span."""
    rows: list[tuple[TraceNode, int]] = []

    def walk(node: TraceNode, depth: int) -> None:
        if len(rows) >= max_rows:
            return
        rows.append((node, depth))
        for child in ordered(node.children):
            walk(child, depth + 1)

    walk(root, 0)
    start = min(n.start for n, _ in rows)
    end = max(max(n.start, n.end or n.start) for n, _ in rows)
    span = max(end - start, 1e-6)
    scale = CHART_WIDTH / span
    bars = []
    for i, (node, depth) in enumerate(rows):
        x = (node.start - start) * scale
        instant = node.end is None
        width = MIN_BAR if instant else max(MIN_BAR, ((node.end or node.start) - node.start) * scale)
        text = label(node)
        bars.append(Bar(y=i * ROW_HEIGHT, depth=depth, text=_cut(("  " * depth) + text), x=round(x, 2),
                        width=round(min(width, CHART_WIDTH - x + MIN_BAR), 2), instant=instant,
                        kind=_kind(node.name), tooltip=text))
    return Waterfall(bars=tuple(bars), width=LABEL_WIDTH + CHART_WIDTH + 10, height=len(bars) * ROW_HEIGHT + 24,
                     label_width=LABEL_WIDTH, chart_width=CHART_WIDTH, total=format_duration(span * 1000.0))


_KINDS = ("invoke_agent", "batch", "admission", "parallel", "execute_tool", "attempt", "egress", "approval")


def _kind(name: str) -> str:
    for kind in _KINDS:
        if name.startswith(kind):
            return kind.replace("_", "-")
    return "other"
