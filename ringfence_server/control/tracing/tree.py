"""A small, generic span tree and its terminal rendering (pure: no I/O, no clock).

    invoke_agent  run r-1  2480 ms  completed
    ├─ batch  r-1.t1  (turn 1)  1474 ms  2 calls
    │  ├─ admission  3 ms
    │  │  ├─ read_file  t1.a  allow  (policy:rule[0]:allow)
    │  │  └─ read_file  t1.b  allow  (policy:rule[0]:allow)
    │  └─ parallel  2 reads  1462 ms  ∥
    │     ├─ execute_tool  read_file  t1.a  388 ms  ok  1 attempt
    │     └─ execute_tool  read_file  t1.b  1458 ms  ok  1 attempt

A line is the node's name, its title (what it is: ids, tool names), its duration when it has an
end, its labels (what happened), and `∥` when two or more of its `execute_tool` children ran at
the same time. Children are drawn in start order (ties keep the order they were given in). A
node with no end is an instant (an event, a verdict): no duration is drawn for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

PARALLEL_MARK = "∥"
"""Drawn after a node whose execute_tool children overlapped in time."""


@dataclass(frozen=True)
class TraceNode:
    name: str
    """What kind of span it is: invoke_agent, batch, admission, parallel, execute_tool, attempt..."""
    start: float
    """Epoch seconds."""
    end: float | None = None
    """Epoch seconds; None: an instant, or a span whose end is not known (see its labels)."""
    title: tuple[str, ...] = ()
    """What it is, printed after the name: ids, tool names."""
    labels: tuple[str, ...] = ()
    """What happened, printed after the duration: verdicts, outcomes, counts."""
    attributes: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Machine-readable facts for --json (ids, statuses, counts, sizes, digests: never content)."""
    children: tuple[TraceNode, ...] = ()

    @property
    def duration_ms(self) -> float | None:
        return None if self.end is None else max(0.0, (self.end - self.start) * 1000.0)

    def walk(self) -> Iterable[TraceNode]:
        """This node and every node under it, depth first, in drawing order."""
        yield self
        for child in ordered(self.children):
            yield from child.walk()

    def find(self, name: str) -> list[TraceNode]:
        return [n for n in self.walk() if n.name == name]

    def to_dict(self) -> dict[str, Any]:
        """The node and its subtree as plain JSON values."""
        duration = self.duration_ms
        return {
            "name": self.name,
            "title": list(self.title),
            "start": self.start,
            "end": self.end,
            "duration_ms": None if duration is None else round(duration, 3),
            "labels": list(self.labels),
            "attributes": dict(self.attributes),
            "parallel": parallel(self),
            "children": [c.to_dict() for c in ordered(self.children)],
        }


def ordered(nodes: Sequence[TraceNode]) -> list[TraceNode]:
    """In start order; ties keep their given order."""
    return sorted(nodes, key=lambda n: n.start)


def format_duration(ms: float) -> str:
    if ms < 10_000:
        return f"{ms:.0f} ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    if ms < 2 * 3_600_000:
        return f"{ms / 60_000:.0f} min"
    return f"{ms / 3_600_000:.1f} h"


def overlapping(nodes: Sequence[TraceNode]) -> bool:
    """Did any two of these spans run at the same time? (Spans with no end never count.)"""
    spans = sorted((n for n in nodes if n.end is not None), key=lambda n: n.start)
    return any(a.end is not None and a.end > b.start for a, b in pairwise(spans))


def parallel(node: TraceNode) -> bool:
    """Two or more of the node's execute_tool children overlapped in time."""
    tools = [c for c in node.children if c.name == "execute_tool"]
    return len(tools) > 1 and overlapping(tools)


def label(node: TraceNode) -> str:
    parts = [node.name, *node.title]
    if node.duration_ms is not None:
        parts.append(format_duration(node.duration_ms))
    parts += [part for part in node.labels if part]
    return "  ".join(parts) + (f"  {PARALLEL_MARK}" if parallel(node) else "")


def render(roots: TraceNode | Sequence[TraceNode]) -> list[str]:
    """The tree(s), one line per node, with box-drawing characters."""
    if isinstance(roots, TraceNode):
        roots = [roots]
    lines: list[str] = []

    def walk(node: TraceNode, prefix: str, last: bool, root: bool) -> None:
        lines.append(("" if root else prefix + ("└─ " if last else "├─ ")) + label(node))
        inner = "" if root else prefix + ("   " if last else "│  ")
        kids = ordered(node.children)
        for i, kid in enumerate(kids):
            walk(kid, inner, i == len(kids) - 1, False)

    for root in ordered(list(roots)):
        walk(root, "", True, True)
    return lines
