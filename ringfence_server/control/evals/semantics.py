"""A run, recorded SEMANTICALLY: what it did, never when, how fast or under which ids.

    record(result, dispatched=None) -> {
        "outcome": "completed", "ended_by": "agent", "turns": 2,
        "calls": [{"tool": "read_file", "status": "executed", "executed": true, "dispatched": true}],
        "compacted": false, "answered": true}

Left out on purpose: run ids, call ids, approval ids, timestamps, durations, token counts, costs,
the reason text and tool output. Those change from run to run (or from one tokenizer estimate to
the next) while the behaviour under test does not; a baseline that held them would differ on
every run and so mean nothing. `dispatched` (whether the run's log holds a dispatch_started for the
call: the call was handed to a sandbox) is there when the runner read the log; it is how a denied
egress call is shown never to have left.

diff(baseline, current) -> ["calls[1].status: executed -> denied", ...]: every difference, by path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ringfence.agent import AgentResult

__all__ = ["CALL_KEYS", "SEMANTIC_KEYS", "diff", "record"]

SEMANTIC_KEYS = ("outcome", "ended_by", "turns", "calls", "compacted", "answered")
CALL_KEYS = ("tool", "status", "executed", "dispatched")


def record(result: AgentResult, dispatched: Iterable[str] | None = None) -> dict[str, Any]:
    """The semantic record of one run. `dispatched`: the call ids the run's log shows dispatched
    to a sandbox (None: unknown, and the calls carry no `dispatched` key)."""
    sent = None if dispatched is None else set(dispatched)
    calls = []
    for o in result.trajectory:
        call: dict[str, Any] = {"tool": o.tool, "status": o.status.value, "executed": bool(o.executed)}
        if sent is not None:
            call["dispatched"] = o.call_id in sent
        calls.append(call)
    return {
        "outcome": result.outcome.value,
        "ended_by": result.ended_by,
        "turns": result.turns,
        "calls": calls,
        "compacted": result.compactions > 0,
        "answered": result.final_answer is not None,
    }


def diff(baseline: Any, current: Any, path: str = "") -> list[str]:
    """Every difference between two semantic records (or any JSON values), as "path: a -> b"."""
    if isinstance(baseline, Mapping) and isinstance(current, Mapping):
        out: list[str] = []
        for key in list(baseline) + [k for k in current if k not in baseline]:
            where = f"{path}.{key}" if path else str(key)
            if key not in current:
                out.append(f"{where}: {_show(baseline[key])} -> (missing)")
            elif key not in baseline:
                out.append(f"{where}: (missing) -> {_show(current[key])}")
            else:
                out.extend(diff(baseline[key], current[key], where))
        return out
    if isinstance(baseline, list) and isinstance(current, list):
        out = []
        for i in range(max(len(baseline), len(current))):
            where = f"{path}[{i}]"
            if i >= len(current):
                out.append(f"{where}: {_show(baseline[i])} -> (missing)")
            elif i >= len(baseline):
                out.append(f"{where}: (missing) -> {_show(current[i])}")
            else:
                out.extend(diff(baseline[i], current[i], where))
        return out
    if baseline != current or type(baseline) is not type(current):
        return [f"{path or '(value)'}: {_show(baseline)} -> {_show(current)}"]
    return []


def _show(value: Any) -> str:
    if isinstance(value, Mapping) and "tool" in value and "status" in value:
        return f"{value['tool']}:{value['status']}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
