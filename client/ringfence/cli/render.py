"""How events, runs and durations read on a terminal: one line per event (the detail picked from
each event type's fields), a call's output lines made terminal-safe, a run's summary and its
trajectory.

The events are read as the wire gives them (a type and a data mapping), field by field.
"""

from __future__ import annotations

from ringfence.cli.output import Output, compact, jsonable, short
from ringfence.model import AdmissionVerdict, ApprovalKind, Event, EventType, Observation, ObservationStatus, RunView


def event_detail(event: Event) -> str:  # noqa: C901 - one arm per event type: the table is the point
    """What one event says, in a line: the fields of its type that a person follows a run by."""
    d, t = event.data, event.type
    if t == EventType.RUN_STARTED:
        return f"goal: {short(d.get('goal', ''), 70)}"
    if t == EventType.BATCH_STARTED:
        calls = d.get("calls") or []
        tools = ", ".join(str(c.get("tool")) for c in calls[:6]) + (", ..." if len(calls) > 6 else "")
        return f"turn {d.get('turn')}: {len(calls)} call{'s' if len(calls) != 1 else ''} ({tools})"
    if t == EventType.CALL_DECIDED:
        verdict, reason = d.get("verdict"), d.get("reason") or ""
        because = f" - {short(reason, 70)}" if reason and verdict != AdmissionVerdict.ALLOW else ""
        return f"{d.get('tool')}: {verdict}{because}"
    if t == EventType.APPROVAL_REQUESTED:
        kind = " (reconcile)" if d.get("kind") == ApprovalKind.RECONCILE else ""
        return f"{d.get('tool')} waits for approval {d.get('approval_id')}{kind}, digest {str(d.get('digest'))[:16]}..."
    if t == EventType.APPROVAL_DECIDED:
        word = "approved" if d.get("approved") else "declined"
        reason = d.get("reason") or ""
        return f"{d.get('approval_id')} {word} by {d.get('by')}" + (f": {short(reason, 50)}" if reason else "")
    if t == EventType.APPROVAL_EXPIRED:
        return f"{d.get('approval_id')} expired"
    if t == EventType.APPROVAL_WITHDRAWN:
        reason = d.get("reason") or ""
        return f"{d.get('approval_id')} withdrawn by {d.get('by')}" + (f": {short(reason, 50)}" if reason else "")
    if t == EventType.APPROVAL_USED:
        return f"{d.get('approval_id')} used"
    if t == EventType.GRANT_ADDED:
        return f"grant for {d.get('tool')} by {d.get('by')}"
    if t == EventType.DISPATCH_STARTED:
        return f"{d.get('tool')} dispatched" + (" (mutates)" if d.get("mutates") else "")
    if t == EventType.ATTEMPT:
        text = f"attempt {d.get('attempt')}: {d.get('outcome')}"
        if d.get("failure_class"):
            text += f" ({d.get('failure_class')})"
        if d.get("message"):
            text += f" {short(d.get('message'), 50)}"
        return text
    if t == EventType.EGRESS:
        decisions = d.get("decisions") or []
        return f"{len(decisions)} egress decision{'s' if len(decisions) != 1 else ''}"
    if t == EventType.CALL_COMPLETED:
        if d.get("ok"):
            return f"{d.get('tool')} ok: {short(d.get('content'), 60)}"
        return f"{d.get('tool')} failed ({d.get('error_class')}): {short(d.get('error') or '', 60)}"
    if t == EventType.OBSERVATION:
        text = f"{d.get('tool')}: {d.get('status')}"
        if d.get("error"):
            text += f" - {short(d.get('error'), 60)}"
        elif d.get("content") is not None:
            text += f" {short(d.get('content'), 60)}"
        return text
    if t == EventType.RUN_FINISHED:
        reason = d.get("reason") or ""
        return f"outcome {d.get('outcome')}" + (f": {short(reason, 60)}" if reason else "")
    if t == EventType.WORKSPACE_CREATED:
        return f"workspace {d.get('volume')}: {d.get('bytes')} bytes, {d.get('inodes')} inodes"
    if t == EventType.WORKSPACE_REMOVED:
        return f"workspace {d.get('volume')} removed ({d.get('reason')})"
    if t in (EventType.FILES_UPLOADED, EventType.FILES_DOWNLOADED, EventType.ARTIFACT_COLLECTED):
        files = d.get("files") or []
        size = sum(int(f.get("size") or 0) for f in files)
        names = ", ".join(str(f.get("path")) for f in files[:4]) + (", ..." if len(files) > 4 else "")
        text = f"{len(files)} file{'s' if len(files) != 1 else ''}, {size} bytes ({names})"
        if t == EventType.FILES_UPLOADED:
            return f"{text} into /workspace/{d.get('dest') or ''} by {d.get('by')}"
        if t == EventType.FILES_DOWNLOADED:
            return f"{text}{' (artifacts)' if d.get('artifacts') else ''} by {d.get('by')}"
        missing = d.get("missing") or []
        return text + (f"; missing: {', '.join(map(str, missing[:4]))}" if missing else "")
    return short(d)


def event_line(event: Event, progress: str = "") -> str:
    """seq, type, call id and detail (and `progress`, e.g. [2/3]), in aligned columns."""
    call = event.data.get("call_id") or "-"
    return f"{event.seq:>5}  {event.type:<18} {call:<12} {event_detail(event)}{progress}"


def _terminal_safe(line: str) -> str:
    # A tool's output is untrusted text: no escape sequence of it reaches the person's terminal.
    return "".join(ch if ch == "\t" or ch.isprintable() else f"\\x{ord(ch):02x}" for ch in line)


def output_lines(event: Event) -> list[str]:
    """A `call_output` event as the lines it holds, each prefixed by the call id and the stream
    (what the tool printed, as it printed it, after the server's secret redaction). The first
    line is the event's own line (seq, type); the others are aligned under it."""
    d = event.data
    call = str(d.get("call_id") or "-")
    tag = f"{call:<12} {d.get('stream')}| "
    head = f"{event.seq:>5}  {event.type:<18} {tag}"
    pad = " " * (5 + 2 + 18 + 1) + tag
    lines = str(d.get("text") or "").splitlines() or [""]
    return [(head if i == 0 else pad) + _terminal_safe(line) for i, line in enumerate(lines)]


def print_event(out: Output, event: Event, progress: str = "") -> None:
    """One event on `out`: its JSON object, its output lines (call_output) or its line."""
    if out.json:
        out.obj(event_obj(event))
    elif event.type == EventType.CALL_OUTPUT:
        for line in output_lines(event):
            out.line(line)
    else:
        out.line(event_line(event, progress))


def event_obj(event: Event) -> dict[str, object]:
    """An event as `--json` prints it (kind "event")."""
    return {"kind": "event", "run_id": event.run_id, "seq": event.seq, "type": event.type,
            "call_id": event.data.get("call_id"), "at": event.at, "data": jsonable(event.data)}


def observation_line(o: Observation) -> str:
    """One call of a run's trajectory: call id, tool, status and its result, error or approval."""
    if o.error:
        what = short(o.error, 70)
    elif o.content is not None:
        what = short(o.content, 70)
    else:
        what = ""
    if o.approval_id and o.status == ObservationStatus.PENDING_APPROVAL:
        what = f"approval {o.approval_id}"
    return f"  {o.call_id:<12} {o.tool:<12} {o.status:<17} {what}".rstrip()


def run_summary(run: RunView) -> str:
    """A run in a line: status, outcome, turns, calls and cost."""
    outcome = run.outcome if run.outcome else "none yet"
    u = run.usage
    return (f"run {run.run_id}: status {run.status}, outcome {outcome} "
            f"(turns {run.turns}, calls {u.calls}, cost {u.cost:g})")


def print_run(out: Output, run: RunView) -> None:
    """A run's summary, goal, trajectory and pending approvals, as `ringfence run` shows it."""
    out.line(run_summary(run))
    out.line(f"goal: {run.goal}")
    if run.trajectory:
        out.line("trajectory:")
        for o in run.trajectory:
            out.line(observation_line(o))
    else:
        out.line("trajectory: (no calls yet)")
    if run.pending_approvals:
        out.line("pending approvals:")
        for a in run.pending_approvals:
            out.line(f"  {a.approval_id}  call {a.call_id}  {a.tool} {compact(a.arguments)}")


def ago(seconds: float) -> str:
    """A duration the way a person reads it: 45s, 3m07s, 2h05m (negative: 0s)."""
    seconds = int(max(seconds, 0))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
