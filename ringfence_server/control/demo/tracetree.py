"""A run's spans as a tree in the terminal, from the spans the demo's own tracer provider kept.

    invoke_agent  run demo-…                            the run's root
    ├─ batch  demo-….t1  2 call(s)  1486 ms             one per batch
    │  ├─ admission  2 allow  2 ms                       every call judged before any runs
    │  └─ parallel  2 reads  1477 ms  ∥                  ∥ = its tools ran at the same time
    │     ├─ execute_tool  read_file  t1.c1  ok  412 ms
    │     │  └─ attempt  1  ok  380 ms
    │     │     ├─ container_start  250 ms
    │     │     └─ tool  130 ms

Parents are taken from the spans themselves (parent span id), never inferred from timing: a
span whose parent is missing shows up as a second root, which is the bug this view exists to
make visible.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from itertools import pairwise

from opentelemetry.sdk.trace import ReadableSpan

_LABELS = ("ringfence.run_id", "ringfence.batch_id", "gen_ai.tool.name", "gen_ai.tool.call.id")


def _label(span: ReadableSpan) -> str:
    attrs = span.attributes or {}
    parts = [span.name]
    if span.name == "invoke_agent":
        parts.append("run " + str(attrs.get("ringfence.run_id", "?")))
    elif span.name == "batch":
        parts.append(str(attrs.get("ringfence.batch_id", "resumed after approval"
                                   if attrs.get("ringfence.resumed") else "?")))
        if "ringfence.calls" in attrs:
            parts.append(str(attrs["ringfence.calls"]) + " call(s)")
    elif span.name == "admission":
        verdicts = sorted((k.rsplit(".", 1)[1], v) for k, v in attrs.items() if k.startswith("ringfence.verdicts."))
        parts.append(" ".join(str(n) + " " + verdict for verdict, n in verdicts))
    elif span.name == "parallel":
        parts.append(f"{attrs.get('ringfence.calls', '?')} reads")
    elif span.name == "approval_wait":
        parts += [str(attrs.get("gen_ai.tool.name", "?")), str(attrs.get("gen_ai.tool.call.id", "?")),
                  str(attrs.get("ringfence.approval.decision", "?"))]
    elif span.name == "execute_tool":
        parts += [str(attrs.get("gen_ai.tool.name", "?")), str(attrs.get("gen_ai.tool.call.id", "?")),
                  str(attrs.get("ringfence.outcome", ""))]
    elif span.name == "attempt":
        parts += [str(attrs.get("ringfence.attempt", "?")), str(attrs.get("ringfence.outcome", ""))]
    if span.name != "invoke_agent" and span.end_time and span.start_time:
        parts.append(f"{(span.end_time - span.start_time) / 1e6:.0f} ms")
    return "  ".join(p for p in parts if p)


def _overlap(spans: Sequence[ReadableSpan]) -> bool:
    """Did any two of these spans run at the same time?"""
    ordered = sorted(spans, key=lambda s: s.start_time or 0)
    return any((a.end_time or 0) > (b.start_time or 0) for a, b in pairwise(ordered))


def run_spans(spans: Iterable[ReadableSpan], run_id: str) -> list[ReadableSpan]:
    """The spans of `run_id`'s trace (the trace of its invoke_agent root)."""
    spans = list(spans)
    trace_ids = {s.context.trace_id for s in spans
                 if s.name == "invoke_agent" and (s.attributes or {}).get("ringfence.run_id") == run_id}
    return [s for s in spans if s.context.trace_id in trace_ids]


def render(spans: Sequence[ReadableSpan]) -> list[str]:
    """The tree, one line per span, children in start order."""
    ids = {s.context.span_id for s in spans}
    children: dict[int | None, list[ReadableSpan]] = defaultdict(list)
    for s in spans:
        parent = s.parent.span_id if s.parent is not None and s.parent.span_id in ids else None
        children[parent].append(s)
    for kids in children.values():
        kids.sort(key=lambda s: s.start_time or 0)
    lines: list[str] = []

    def walk(span: ReadableSpan, prefix: str, last: bool, root: bool) -> None:
        kids = children.get(span.context.span_id, [])
        tools = [k for k in kids if k.name == "execute_tool"]
        mark = "  ∥" if len(tools) > 1 and _overlap(tools) else ""
        lines.append(("" if root else prefix + ("└─ " if last else "├─ ")) + _label(span) + mark)
        inner = "" if root else prefix + ("   " if last else "│  ")
        for i, kid in enumerate(kids):
            walk(kid, inner, i == len(kids) - 1, False)

    for root in children.get(None, []):
        walk(root, "", True, True)
    return lines
