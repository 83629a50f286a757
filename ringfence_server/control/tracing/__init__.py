"""A run's span tree from its event log: `ringfence trace RUN_ID`, no trace collector needed.

    tree.py         TraceNode (a small generic span tree) and render() (box drawing, ∥)
    from_events.py  trace_from_events(events) -> the run's TraceNode
    cli.py          the `ringfence trace` subcommand
"""

from ringfence_server.control.tracing.from_events import trace_from_events
from ringfence_server.control.tracing.tree import TraceNode, render

__all__ = ["TraceNode", "render", "trace_from_events"]
