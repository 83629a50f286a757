"""`ringfence trace RUN_ID`: a run's span tree in the terminal, drawn from the event store alone.

Reads the store directly, like `ringfence runs show` (the same --state-dir / --config /
--database-url, the same run keys): no server and no trace collector needed. Exit codes: 0
printed, 1 an unknown run or an unusable store, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ringfence.model import Event
    from ringfence_server.control.store import EventStore

_EPILOG = """\
example:
  ringfence trace run-9cfedcb5458143c4a197 --state-dir ./.state

  invoke_agent  run run-9cfedcb5458143c4a197  2480 ms  completed: finished by the agent  ...
  ├─ batch  run-9cfedcb5458143c4a197.t1  (turn 1)  1465 ms  2 calls
  │  ├─ admission  2 ms  2 allow
  │  │  ├─ read_file  t1.incident  allow  (policy:rule[0]:allow)
  │  │  └─ fetch_url  t1.runbook  allow  (policy:rule[1]:allow)
  │  └─ parallel  2 reads  1459 ms  ∥
  │     ├─ execute_tool  read_file  t1.incident  389 ms  ok  1 attempt  result 316 B
  ...

∥ marks a node whose execute_tool children ran at the same time. A call that never ran is a
leaf with its status and why (denied, declined, deduplicated, halted...). Only names, ids,
verdicts, statuses, error classes, sizes and the control plane's reasons are shown: never a
call's arguments or a tool's output.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ringfence_server.control.store.cli import KEYS_NOTE, store_options

    p = subparsers.add_parser(
        "trace", help="a run's span tree (batches, verdicts, approvals, executions) from the event store",
        description="Draw a run's span tree from its event log: the run, each batch with its admission "
                    "verdicts, approval waits, executions (reads run in parallel grouped under `parallel`), "
                    "attempts, and the calls that never ran with why; durations from the events' times. "
                    "Reads the store directly, like `ringfence runs show`: no server or trace collector "
                    "needed. " + KEYS_NOTE,
        parents=[store_options()], epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--json", action="store_true",
                   help="print the tree as nested JSON objects (name, title, start, end, duration_ms, labels, "
                        "attributes, parallel, children) instead of drawing it")
    p.set_defaults(func=_trace)


def _trace(args: argparse.Namespace) -> int:
    from ringfence_server.control.store.cli import run_on_store

    return run_on_store(args, _do_trace)


def _do_trace(args: argparse.Namespace, store: EventStore, where: str) -> int:
    from ringfence_server.control.store.cli import StoreCommandError, run_events
    from ringfence_server.control.tracing.from_events import trace_from_events
    from ringfence_server.control.tracing.tree import render

    events: list[Event] = run_events(store, args.run_id, where)
    try:
        tree = trace_from_events(events)
    except Exception as e:
        raise StoreCommandError(f"run {args.run_id!r} has {len(events)} events but they could not be drawn as a tree "
                                f"({type(e).__name__}); `ringfence runs show {args.run_id}` prints them one by one"
                                ) from e
    if args.json:
        sys.stdout.write(json.dumps(tree.to_dict(), ensure_ascii=False, indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(render(tree)) + "\n")
    return 0
