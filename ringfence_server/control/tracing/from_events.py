"""A run's span tree, rebuilt from its event log alone (no trace collector needed).

    invoke_agent  run R                      run_started -> run_finished (or the last event)
    ├─ batch  R.t1  (turn 1)                 one per batch_started, to its calls' last event
    │  ├─ admission                          batch_started -> the batch's last call_decided
    │  │  └─ read_file  t1.a  allow  (policy:rule[0]:allow)      one verdict per call
    │  ├─ parallel  2 reads  ∥               the batch's reads, dispatched together
    │  │  ├─ execute_tool  read_file  t1.a   dispatch_started -> call_completed
    │  │  │  └─ attempt  1                   one per try (container start · tool when known)
    │  │  └─ execute_tool  fetch_url  t1.b
    │  │     └─ attempt  1
    │  │        └─ egress                    the proxy's decisions for that try
    │  ├─ execute_tool  write_file  t1.c     writes: after the reads, one at a time
    │  └─ read_file  t1.d  denied: ...       a call that never ran, and why
    └─ batch  R.t2  (turn 2)
       ├─ admission
       ├─ approval wait  apr-…                approval_requested -> decided / expired
       └─ batch  resumed after approval      the approved call's dispatch, when the decision came
          └─ execute_tool  issue_credit  t2.x

Structure comes from the log's own facts, never from timing: a call belongs to the batch that
listed it; a dispatch is "in its batch" unless the call's approval was decided first (resumed
after approval), its verdict path says recovery resumed it after a restart, or a later batch had
already started. Times are the events' `at`.

What is printed: tool names, call ids, verdicts and the policy step that gave them, statuses,
error classes, counts, sizes and digests, and the reasons the control plane and approvers wrote
(redacted by the server already; redacted again and truncated here). Never a call's arguments,
a tool's output or a message a tool wrote: either can hold a secret.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ringfence_server.control import guardrails
from ringfence_server.control.events import (
    ApprovalDecided,
    ApprovalExpired,
    ApprovalRequested,
    ApprovalUsed,
    ApprovalWithdrawn,
    ArtifactCollected,
    AttemptFinished,
    BatchStarted,
    CallCompleted,
    CallDecided,
    CallObserved,
    CallOutput,
    DispatchStarted,
    EgressDecided,
    EventPayload,
    FilesDownloaded,
    FilesUploaded,
    GrantAdded,
    RunFinished,
    RunStarted,
    WorkspaceCreated,
    WorkspaceRemoved,
    parse_event,
)
from ringfence_server.control.tracing.tree import TraceNode
from ringfence_server.control.values import plain

REASON_CHARS = 80

# Statuses of calls that never ran (their leaf says so).
_NOT_RUN = ("denied", "blocked", "unknown_tool", "declined", "deduplicated", "halted")

_order = itertools.count()


class LogEvent(Protocol):
    """What the tree is built from: one event of a run's log (a ringfence.model.Event)."""

    @property
    def run_id(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def type(self) -> str: ...
    @property
    def data(self) -> Mapping[str, object]: ...
    @property
    def at(self) -> float: ...


def short(text: object, limit: int = REASON_CHARS) -> str:
    """One line, at most `limit` characters, secrets redacted (again: the server did it first)."""
    s = " ".join(guardrails.redact(str(text)).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _size_and_digest(value: object) -> tuple[int, str]:
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return len(data), hashlib.sha256(data).hexdigest()


def _bytes(n: int) -> str:
    if n < 10_000:
        return f"{n} B"
    if n < 10_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.1f} MB"


def _count(value: object) -> int:
    """A byte count the egress proxy recorded (0 when it recorded none)."""
    return int(value) if isinstance(value, int | float | str) and value else 0


def _step(verdict_path: Iterable[object] | None) -> str:
    """The step that decided: the last one before `admitted` (or the last one)."""
    steps = [str(s) for s in (verdict_path or ()) if str(s) != "admitted"]
    return steps[-1] if steps else ""


@dataclass(eq=False)
class _Node:
    """A node while the tree is being built (mutable); frozen into a TraceNode at the end."""

    name: str
    start: float
    end: float | None = None
    title: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    attributes: dict[str, Any] = field(default_factory=dict)
    children: list[_Node] = field(default_factory=list)
    order: int = field(default_factory=lambda: next(_order))

    def extend(self, at: float) -> None:
        if self.end is None or at > self.end:
            self.end = at

    def freeze(self) -> TraceNode:
        kids = sorted(self.children, key=lambda n: (n.start, n.order))
        return TraceNode(self.name, self.start, self.end, tuple(self.title), tuple(self.labels),
                         plain(self.attributes), tuple(k.freeze() for k in kids))


@dataclass(eq=False)
class _Group:
    """Where executions go: a batch, or a batch resumed later (after an approval, a restart)."""

    node: _Node
    reads: list[_Node] = field(default_factory=list)


@dataclass(eq=False)
class _Batch(_Group):
    batch_id: str = ""
    admission: _Node | None = None
    calls: dict[str, str] = field(default_factory=dict)  # call_id -> tool, in the batch's order
    resumed: dict[tuple[str, str], _Group] = field(default_factory=dict)


@dataclass(eq=False)
class _Call:
    call_id: str
    tool: str
    batch: _Batch
    signature: str | None = None  # matched, never printed (it holds the arguments)
    observation: CallObserved | None = None
    observed_at: float = 0.0
    execs: list[_Node] = field(default_factory=list)
    approved: set[str] = field(default_factory=set)  # approval ids decided `approved`


class _Builder:
    def __init__(self, events: list[tuple[LogEvent, EventPayload]]) -> None:
        self.events = events
        first, started = events[0]
        self.root = _Node("invoke_agent", first.at)
        self.run_id = (started.run_id or first.run_id) if isinstance(started, RunStarted) else first.run_id
        self.root.title = [f"run {self.run_id}"]
        self.finished: RunFinished | None = None
        self.current: _Batch | None = None
        self.batches: list[_Batch] = []
        self.calls: dict[str, _Call] = {}
        self.open_exec: dict[str, _Node] = {}
        self.pending_egress: dict[tuple[str, int], list[_Node]] = {}
        self.approvals: dict[str, _Node] = {}
        self.approval_call: dict[str, str] = {}
        self.dispatched: dict[str, list[str]] = {}  # signature -> call ids dispatched with it
        self.completed_ok: set[str] = set()
        self.turns = 0
        self.cost = 0.0
        self.orphans: _Batch | None = None

    # -- the walk --------------------------------------------------------------------------

    def build(self) -> TraceNode:
        for e, payload in self.events:
            at = float(e.at)
            match payload:
                case RunStarted():
                    self.on_run_started(payload, at)
                case BatchStarted():
                    self.on_batch_started(e, payload, at)
                case CallDecided():
                    self.on_call_decided(payload, at)
                case ApprovalRequested():
                    self.on_approval_requested(payload, at)
                case ApprovalDecided():
                    self.on_approval_decided(payload, at)
                case ApprovalExpired(approval_id=approval_id):
                    self.on_approval_expired(approval_id, at)
                case ApprovalUsed(approval_id=approval_id):
                    self.on_approval_used(approval_id, at)
                case ApprovalWithdrawn():
                    self.on_approval_withdrawn(payload, at)
                case GrantAdded():
                    self.on_grant_added(payload, at)
                case DispatchStarted():
                    self.on_dispatch_started(payload, at)
                case EgressDecided():
                    self.on_egress(payload, at)
                case AttemptFinished():
                    self.on_attempt(payload, at)
                case CallCompleted():
                    self.on_call_completed(payload, at)
                case CallObserved():
                    self.on_observation(payload, at)
                case RunFinished():
                    self.finished = payload
                    self.root.end = at
                case WorkspaceCreated() | WorkspaceRemoved() | CallOutput() | FilesUploaded() | FilesDownloaded() \
                        | ArtifactCollected():
                    pass  # not drawn
        self.finish()
        return self.root.freeze()

    def on_run_started(self, started: RunStarted, at: float) -> None:
        self.root.start = at
        self.root.attributes.update({"run_id": self.run_id, "tenant": started.tenant,
                                     "policy_version": started.policy_version})
        if started.trace.get("trace_id"):
            self.root.attributes["trace_id"] = started.trace.get("trace_id")
            self.root.attributes["span_id"] = started.trace.get("span_id")

    def on_batch_started(self, e: LogEvent, started: BatchStarted, at: float) -> None:
        batch_id = started.batch_id or f"seq {e.seq}"
        turn = started.turn
        node = _Node("batch", at, at, title=[batch_id] + ([f"(turn {turn})"] if turn is not None else []),
                     attributes={"batch_id": batch_id, "turn": turn})
        calls = {c.call_id: c.tool for c in started.calls}
        node.labels.append(_plural(len(calls), "call"))
        node.attributes["calls"] = [{"call_id": c, "tool": t} for c, t in calls.items()]
        admission = _Node("admission", at, at)
        node.children.append(admission)
        batch = _Batch(node, batch_id=batch_id, admission=admission, calls=calls)
        self.batches.append(batch)
        self.root.children.append(node)
        self.current = batch
        self.turns += 1
        for call_id, tool in calls.items():
            self.calls[call_id] = _Call(call_id, tool, batch)

    def _call(self, call_id: str, tool: str | None = None) -> _Call:
        """The call (one no batch listed goes to a catch-all group: a log this view does not know)."""
        call = self.calls.get(call_id)
        if call is None:
            if self.orphans is None:
                node = _Node("batch", float("inf"), title=["(calls outside any batch)"])
                self.orphans = _Batch(node, batch_id="")
                self.root.children.append(node)
            call = self.calls[call_id] = _Call(call_id, tool or "?", self.orphans)
            self.orphans.calls[call_id] = call.tool
        return call

    @staticmethod
    def _touch(call: _Call, at: float) -> None:
        """An event of the call: its batch lasts at least until then."""
        node = call.batch.node
        node.start = min(node.start, at)
        node.extend(at)

    def on_call_decided(self, decided: CallDecided, at: float) -> None:
        call = self._call(decided.call_id, decided.tool)
        call.signature = decided.signature
        self._touch(call, at)
        verdict = decided.verdict.value
        step = _step(decided.verdict_path)
        leaf = _Node(call.tool, at, title=[call.call_id], labels=[verdict] + ([f"({step})"] if step else []),
                     attributes={"call_id": call.call_id, "tool": call.tool, "verdict": verdict,
                                 "verdict_path": list(decided.verdict_path), "reason": short(decided.reason, 200)})
        admission = call.batch.admission
        if admission is None:  # an orphan call: no batch, no admission node
            call.batch.node.children.append(leaf)
            return
        admission.children.append(leaf)
        admission.extend(at)

    def on_approval_requested(self, requested: ApprovalRequested, at: float) -> None:
        call = self._call(requested.call_id, requested.tool)
        self._touch(call, at)
        approval_id = requested.approval_id
        kind = requested.approval_kind.value
        node = _Node("approval wait", at, title=[approval_id],
                     labels=[f"{call.tool} {call.call_id}"] + ([f"kind {kind}"] if kind != "call" else []),
                     attributes={"approval_id": approval_id, "call_id": call.call_id, "tool": call.tool,
                                 "kind": kind, "digest": requested.digest, "expires_at": requested.expires_at,
                                 "decision": "pending"})
        self.approvals[approval_id] = node
        self.approval_call[approval_id] = call.call_id
        call.batch.node.children.append(node)

    def _approval(self, approval_id: str, at: float) -> tuple[_Node | None, _Call | None]:
        node = self.approvals.get(approval_id)
        call = self.calls.get(self.approval_call.get(approval_id, ""))
        if call is not None:
            self._touch(call, at)
        return node, call

    def on_approval_decided(self, decided: ApprovalDecided, at: float) -> None:
        node, call = self._approval(decided.approval_id, at)
        if call is not None and decided.approved:
            call.approved.add(decided.approval_id)
        if node is None:
            return
        node.end = at
        by = decided.by or "?"
        decision = "approved" if decided.approved else "declined"
        text = f"{decision} by {by}"
        if decided.reason:
            text += f": {short(decided.reason, 60)}"
        node.labels.append(text)
        if decided.remember:
            node.labels.append("remembered for the run")
        node.attributes.update({"decision": decision, "by": by, "remember": bool(decided.remember)})

    def on_approval_withdrawn(self, withdrawn: ApprovalWithdrawn, at: float) -> None:
        node, _call = self._approval(withdrawn.approval_id, at)
        if node is not None:
            node.end = at
            by = withdrawn.by or "?"
            node.labels.append(f"withdrawn by {by}" + (f": {short(withdrawn.reason, 60)}" if withdrawn.reason else ""))
            node.attributes.update({"decision": "withdrawn", "by": by})

    def on_approval_expired(self, approval_id: str, at: float) -> None:
        node, _call = self._approval(approval_id, at)
        if node is not None:
            node.end = at
            node.labels.append("expired")
            node.attributes["decision"] = "expired"

    def on_approval_used(self, approval_id: str, at: float) -> None:
        node, _call = self._approval(approval_id, at)
        if node is not None:
            node.attributes["used"] = True

    def on_grant_added(self, grant: GrantAdded, at: float) -> None:
        node, _call = self._approval(grant.approval_id or "", at)
        if node is not None:
            node.attributes["grant"] = True
            return
        # A grant an admin added by hand: an instant under the run.
        self.root.children.append(_Node("grant", at, title=[grant.tool or "?"],
                                        labels=[f"added by {grant.by or '?'}"],
                                        attributes={"tool": grant.tool, "by": grant.by}))

    def _group_for(self, call: _Call, started: DispatchStarted) -> tuple[_Group, str]:
        batch = call.batch
        approval_id = started.approval_id
        if approval_id and approval_id in call.approved:
            key = ("resumed after approval", approval_id)
        elif any(s.startswith("recovery:") for s in started.verdict_path):
            key = ("resumed after restart", "")
        elif batch is not self.current and batch is not self.orphans:
            key = ("resumed", "")
        else:
            return batch, "batch"
        group = batch.resumed.get(key)
        if group is None:
            node = _Node("batch", float("inf"), title=[key[0]], attributes={"batch_id": batch.batch_id,
                                                                            "resumed": key[0]})
            group = batch.resumed[key] = _Group(node)
            batch.node.children.append(node)
        return group, key[0]

    def on_dispatch_started(self, started: DispatchStarted, at: float) -> None:
        call = self._call(started.call_id, started.tool)
        self._touch(call, at)
        group, where = self._group_for(call, started)
        if group is not call.batch:
            group.node.start = min(group.node.start, at)
            group.node.extend(at)
        tool = started.tool or call.tool
        node = _Node("execute_tool", at, title=[tool, call.call_id],
                     attributes={"call_id": call.call_id, "tool": tool, "mutates": started.mutates,
                                 "idempotency_key": started.idempotency_key, "approval_id": started.approval_id,
                                 "dispatched": where})
        call.execs.append(node)
        superseded = self.open_exec.get(call.call_id)
        if superseded is not None:  # dispatched again (after a restart) before any completion
            superseded.labels.append("no completion in the log")
        self.open_exec[call.call_id] = node
        if started.signature:
            self.dispatched.setdefault(started.signature, []).append(call.call_id)
        if started.mutates:
            group.node.children.append(node)
        else:
            group.reads.append(node)

    def on_egress(self, egress: EgressDecided, at: float) -> None:
        call = self._call(egress.call_id)
        self._touch(call, at)
        decisions = egress.decisions
        kinds = Counter(str(x.get("decision") or "?") for x in decisions)
        up = sum(_count(x.get("bytes_up")) for x in decisions)
        down = sum(_count(x.get("bytes_down")) for x in decisions)
        cut = sum(1 for x in decisions if x.get("cut"))
        labels = [_plural(len(decisions), "request")] + [f"{n} {k}" for k, n in sorted(kinds.items())]
        if cut:
            labels.append(f"{cut} cut")
        labels.append(f"{_bytes(up)} up · {_bytes(down)} down")
        node = _Node("egress", at, labels=labels,
                     attributes={"requests": len(decisions), "decisions": dict(kinds), "bytes_up": up,
                                 "bytes_down": down, "cut": cut})
        self.pending_egress.setdefault((call.call_id, egress.attempt), []).append(node)

    def on_attempt(self, attempt: AttemptFinished, at: float) -> None:
        call = self._call(attempt.call_id)
        self._touch(call, at)
        n = attempt.attempt
        setup = int(attempt.setup_ms or 0)
        duration = int(attempt.duration_ms or 0)
        exec_node = self.open_exec.get(call.call_id)
        start = at - (setup + duration) / 1000.0
        if exec_node is not None:
            start = max(start, exec_node.start)
        outcome = attempt.outcome or ""
        failure = attempt.failure_class
        labels = [outcome or str(failure or "?")]
        if failure and outcome:
            labels.append(failure)
        if setup:
            labels.append(f"start {setup} ms · tool {duration} ms")
        if attempt.retry_after_s is not None:
            labels.append(f"retry after {attempt.retry_after_s:g} s")
        if attempt.runtime:
            labels.append(f"runtime {short(attempt.runtime, 20)}")
        if attempt.image_id:
            image = attempt.image_id
            labels.append("image " + (image[:19] if image.startswith("sha256:") else short(image, 19)))
        node = _Node("attempt", start, at, title=[str(n)], labels=labels,
                     attributes={"attempt": n, "outcome": outcome, "failure_class": failure,
                                 "duration_ms": duration, "setup_ms": setup if attempt.setup_ms is not None else None,
                                 "retry_after_s": attempt.retry_after_s, "image_id": attempt.image_id,
                                 "runtime": attempt.runtime})
        node.children.extend(self.pending_egress.pop((call.call_id, n), []))
        (exec_node.children if exec_node is not None else call.batch.node.children).append(node)

    def on_call_completed(self, completed: CallCompleted, at: float) -> None:
        call = self._call(completed.call_id, completed.tool)
        self._touch(call, at)
        node = self.open_exec.pop(call.call_id, None)
        if node is None:  # a completion whose dispatch is not in the log: shown where it happened
            node = _Node("execute_tool", at, title=[completed.tool or call.tool, call.call_id],
                         labels=["no dispatch_started in the log"],
                         attributes={"call_id": call.call_id, "tool": call.tool})
            call.execs.append(node)
            call.batch.node.children.append(node)
        node.end = at
        ok = completed.ok
        attempts = completed.attempts
        node.labels.append("ok" if ok else completed.error_class or "failed")
        node.labels.append(_plural(attempts, "attempt"))
        content = completed.content
        if isinstance(content, Mapping) and content.get("reconciled") is True:
            node.labels.append("reconciled: the receiver had it")
        guard = completed.guard
        if guard is not None and guard.action == "block":
            node.labels.append("result withheld (secret)")
        elif guard is not None and guard.redacted:
            node.labels.append("result redacted: " + ", ".join(short(k, 30) for k in guard.redacted))
        attrs: dict[str, Any] = {"ok": ok, "error_class": completed.error_class, "attempts": attempts,
                                 "cost": completed.cost, "guard": guard.action if guard is not None else None}
        if ok and content is not None:
            size, digest = _size_and_digest(content)
            node.labels.append(f"result {_bytes(size)}")
            attrs.update({"result_bytes": size, "result_sha256": digest})
        node.attributes.update(attrs)
        self.cost += completed.cost
        if ok:
            self.completed_ok.add(call.call_id)

    def on_observation(self, observed: CallObserved, at: float) -> None:
        call = self._call(observed.call_id, observed.tool)
        self._touch(call, at)
        call.observation = observed
        call.observed_at = at
        for group in call.batch.resumed.values():
            if any(n is e for n in group.node.children + group.reads for e in call.execs):
                group.node.extend(at)

    # -- the end ---------------------------------------------------------------------------

    def finish(self) -> None:
        last, _payload = self.events[-1]
        if self.finished is not None:
            outcome = self.finished.outcome.value
            reason = self.finished.reason
            self.root.labels.append(outcome + (f": {short(reason)}" if reason else ""))
            self.root.attributes.update({"outcome": outcome, "reason": short(reason or "", 200)})
        else:
            self.root.end = float(last.at)
            self.root.labels.append(f"not finished (last event seq {last.seq})")
            self.root.attributes["outcome"] = None
        for node in self.open_exec.values():
            node.labels.append("no completion in the log")
        executed = sum(1 for c in self.calls.values() if c.execs)
        self.root.labels += [_plural(self.turns, "turn"), f"{_plural(len(self.calls), 'call')} ({executed} ran)"]
        if self.cost:
            self.root.labels.append(f"cost {self.cost:g}")
        self.root.attributes.update({"turns": self.turns, "calls": len(self.calls), "executed": executed,
                                     "cost": round(self.cost, 9), "events": len(self.events)})
        for batch in self.batches + ([self.orphans] if self.orphans else []):
            for group in [batch, *batch.resumed.values()]:
                self._place_reads(group)
            self._admission_summary(batch)
            for call_id in batch.calls:
                self._outcome(self.calls[call_id])
        for (call_id, _n), nodes in self.pending_egress.items():  # egress of a try never recorded
            call = self.calls.get(call_id)
            if call is not None:
                (call.execs[-1] if call.execs else call.batch.node).children.extend(nodes)
        for approval in self.approvals.values():
            if approval.end is None:
                approval.labels.append("no decision yet")

    def _place_reads(self, group: _Group) -> None:
        if len(group.reads) >= 2:
            ends = [n.end for n in group.reads]
            parallel = _Node("parallel", min(n.start for n in group.reads),
                             None if any(x is None for x in ends) else max(ends),  # type: ignore[type-var]  # None is ruled out just before
                             title=[_plural(len(group.reads), "read")], children=list(group.reads),
                             attributes={"calls": [n.attributes.get("call_id") for n in group.reads]},
                             order=min(n.order for n in group.reads))
            group.node.children.append(parallel)
        else:
            group.node.children.extend(group.reads)

    @staticmethod
    def _admission_summary(batch: _Batch) -> None:
        if batch.admission is None:
            return
        verdicts = Counter(str(n.attributes.get("verdict")) for n in batch.admission.children)
        batch.admission.labels.append(" · ".join(f"{n} {v}" for v, n in verdicts.items()))
        batch.admission.attributes["verdicts"] = dict(verdicts)

    def _outcome(self, call: _Call) -> None:
        """Label the call's last execution with how it ended, or add the leaf of a call that never ran."""
        obs = call.observation
        if obs is None:
            if not call.execs and not any(self.approval_call.get(a) == call.call_id for a in self.approvals):
                call.batch.node.children.append(_Node(call.tool, call.batch.node.end or call.batch.node.start,
                                                      title=[call.call_id], labels=["no observation in the log"],
                                                      attributes={"call_id": call.call_id, "tool": call.tool,
                                                                  "status": None}))
            return
        status = obs.status.value
        error = obs.error
        error_class = obs.error_class
        if call.execs:
            node = call.execs[-1]
            node.attributes["status"] = status
            if status != "executed":
                node.labels.append(status)
            if node.end is None and error_class:  # how the log ended it (interrupted, uncertain)
                node.labels.append(str(error_class))
            return
        if status == "pending_approval" or (status not in _NOT_RUN and obs.executed):
            return  # the approval wait says it; or it ran and the log shows no dispatch (reconciled)
        text = status
        if error_class and error_class != status:
            text += f" ({short(error_class, 40)})"
        same_as = None
        if status == "deduplicated":
            same_as = self._same_call(call)
            text += f": {same_as}'s recorded result, nothing ran" if same_as else ": a recorded result, nothing ran"
        elif error and error.startswith(status):  # "declined by boss: ..." says it already
            text = short(error)
        elif error:
            text += f": {short(error)}"
        call.batch.node.children.append(_Node(call.tool, call.observed_at, title=[call.call_id], labels=[text],
                                              attributes={"call_id": call.call_id, "tool": call.tool,
                                                          "status": status, "error_class": error_class,
                                                          "error": short(error, 200) if error else None,
                                                          "same_as": same_as}))

    def _same_call(self, call: _Call) -> str | None:
        """The earlier call of this run whose recorded result a deduplicated call got."""
        if not call.signature:
            return None
        uses = [c for c in self.dispatched.get(call.signature, []) if c != call.call_id and c in self.completed_ok]
        return uses[-1] if uses else None


def trace_from_events(events: Iterable[LogEvent]) -> TraceNode:
    """The run's tree: one root, `invoke_agent`. `events` are one run's, in any order (sorted by
    seq here). ValueError when there are none."""
    ordered = sorted(events, key=lambda e: e.seq)
    if not ordered:
        raise ValueError("no events: nothing to draw")
    return _Builder([(e, parse_event(e.type, e.data)) for e in ordered]).build()
