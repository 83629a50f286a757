"""Who is attached now, what each runs, and the calls waiting for their workers' reports.

Shared by the hub (grpc's event loop: attach, reports, detach) and the remote backend
(dispatch's threads: reserve a worker, send an envelope, wait for its outcome), so every change
is under one lock, and what crosses to the event loop goes through each attachment's `send`
(which must be thread-safe: the hub's puts onto the stream's queue with call_soon_threadsafe).

An attachment is one stream of one worker under one lease epoch. A worker that attaches again
replaces its older attachment, and everything waiting on the older one ends as lost: from the
control plane's side a call on a lost attachment may or may not have run.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ringfence.v1 import workers_pb2
from ringfence_server.control.workers.placement import Advertised, Need, WorkerLoad, place
from ringfence_server.control.workers.sealing import Placed
from ringfence_server.sandbox.result import SandboxResult

__all__ = ["Attachment", "Outcome", "Pending", "WorkerRegistry"]


@dataclass(frozen=True)
class Outcome:
    """How a placed call ended, as far as this control plane knows.

    kind: "result" (the worker's result, checked), "uncertain" (the worker started it and cannot
    say how it ended), "refused" (the worker ran nothing), "lost" (the attachment ended or was
    fenced while the call was out: it may or may not have run)."""

    kind: str
    result: SandboxResult | None = None
    message: str = ""


@dataclass
class Pending:
    """One envelope out on one attachment."""

    placed: Placed
    attachment: Attachment
    future: concurrent.futures.Future[Outcome] = field(default_factory=concurrent.futures.Future)

    def settle(self, outcome: Outcome) -> bool:
        """Set the outcome once; False when it was already settled (a later report is late)."""
        if self.future.done():
            return False
        self.future.set_result(outcome)
        return True


@dataclass(eq=False)
class Attachment:
    """One worker's stream under one lease epoch."""

    worker_id: str
    epoch: int
    holder: str
    advertised: Advertised
    send: Callable[[workers_pb2.HubMessage], None]
    running: int = 0
    last_placed: int = 0
    closed: bool = False
    pending: dict[str, Pending] = field(default_factory=dict)


class WorkerRegistry:
    """The attached workers of this control plane, and their calls in flight."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._cond = threading.Condition()
        self._attached: dict[str, Attachment] = {}
        self._ticks = itertools.count(1)
        self._clock = clock
        self._ended_runs: dict[str, None] = {}
        # Envelopes whose callers stopped waiting without a report (lost, past their deadline):
        # a report for one of them later is late because the call was fenced, not unknown.
        self._fenced: dict[str, None] = {}

    # -- the hub's side ---------------------------------------------------------------------

    def attach(self, attachment: Attachment) -> Attachment | None:
        """`attachment` is now its worker's; returns the one it replaced (already lost)."""
        with self._cond:
            old = self._attached.get(attachment.worker_id)
            self._attached[attachment.worker_id] = attachment
            if old is not None:
                self._lose(old, f"worker {old.worker_id} attached again (epoch {attachment.epoch})")
            self._cond.notify_all()
            return old

    def detach(self, attachment: Attachment, reason: str) -> int:
        """The stream ended or was fenced: its calls are lost. Returns how many were out."""
        with self._cond:
            if self._attached.get(attachment.worker_id) is attachment:
                del self._attached[attachment.worker_id]
            lost = self._lose(attachment, reason)
            self._cond.notify_all()
            return lost

    def _lose(self, attachment: Attachment, reason: str) -> int:
        attachment.closed = True
        out = list(attachment.pending.values())
        for pending in out:
            pending.settle(Outcome("lost", message=reason))
        return len(out)

    def pending_for(self, attachment: Attachment, envelope_id: str) -> Pending | None:
        with self._cond:
            return attachment.pending.get(envelope_id)

    def same_call(self, attachment: Attachment, report: workers_pb2.WorkReport) -> list[Pending]:
        """The calls out on `attachment` that a report's logical call answers: the delivery it
        names, and any other delivery of the same call (which the worker answered "in
        progress")."""
        key = (report.tenant, report.run_id, report.call_id, report.attempt)
        with self._cond:
            return [p for p in attachment.pending.values()
                    if p.placed.envelope.envelope_id == report.envelope_id or _key(p) == key]

    def run_ended(self, run_label: str) -> bool:
        with self._cond:
            return run_label in self._ended_runs

    # -- the backend's side -----------------------------------------------------------------

    def reserve(self, need: Need, timeout_s: float) -> Attachment | None:
        """A slot on a worker that can run the call (placement's order), waiting up to
        `timeout_s` for one to attach or free a slot; None after that."""
        deadline = self._clock() + timeout_s
        with self._cond:
            while True:
                loads = [WorkerLoad(a.worker_id, a.advertised, a.running, a.last_placed)
                         for a in self._attached.values() if not a.closed]
                chosen = place(need, loads)
                if chosen is not None:
                    attachment = self._attached[chosen]
                    attachment.running += 1
                    attachment.last_placed = next(self._ticks)
                    return attachment
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def submit(self, attachment: Attachment, placed: Placed) -> Pending:
        """Record the call as out on `attachment` and send its envelope; an attachment lost in
        between settles it as lost at once (nothing was sent)."""
        pending = Pending(placed, attachment)
        with self._cond:
            if attachment.closed:
                pending.settle(Outcome("lost", message=f"worker {attachment.worker_id} went away before it was sent"))
                return pending
            attachment.pending[placed.envelope.envelope_id] = pending
        attachment.send(workers_pb2.HubMessage(work=workers_pb2.Work(sealed=placed.sealed.to_bytes())))
        return pending

    def finish(self, attachment: Attachment, pending: Pending | None) -> None:
        """The caller is done with its reservation (the call's outcome read, given up, or never
        sent): free the slot. A report arriving after this finds nothing waiting: it is late."""
        with self._cond:
            if pending is not None:
                envelope_id = pending.placed.envelope.envelope_id
                attachment.pending.pop(envelope_id, None)
                if pending.future.done() and pending.future.result().kind == "lost":
                    _remember(self._fenced, envelope_id)
            attachment.running = max(0, attachment.running - 1)
            self._cond.notify_all()

    def was_fenced(self, envelope_id: str) -> bool:
        """The control plane gave this envelope's call up as lost (a report now is late)."""
        with self._cond:
            return envelope_id in self._fenced

    def kill_run(self, run_label: str, reason: str) -> int:
        """Ask every worker running a call of the run to kill its sandboxes; how many calls."""
        count = 0
        with self._cond:
            targets = []
            for attachment in self._attached.values():
                n = sum(1 for p in attachment.pending.values() if _label(p) == run_label)
                if n:
                    targets.append(attachment)
                    count += n
        for attachment in targets:
            attachment.send(workers_pb2.HubMessage(kill_run=workers_pb2.KillRun(run_id=run_label, reason=reason)))
        return count

    def kill_all(self, reason: str) -> int:
        """kill_run for every run with a call out; how many calls."""
        with self._cond:
            labels = {_label(p) for a in self._attached.values() for p in a.pending.values()}
        return sum(self.kill_run(label, reason) for label in labels)

    def end_run(self, run_label: str) -> None:
        """The run ended: a report for one of its calls that comes later is late (run_ended)."""
        with self._cond:
            _remember(self._ended_runs, run_label)

    def attached(self) -> Mapping[str, Attachment]:
        with self._cond:
            return dict(self._attached)

    def wait_attached(self, count: int, timeout_s: float) -> bool:
        """True once `count` workers are attached (for tests and the demo), False at the timeout."""
        deadline = self._clock() + timeout_s
        with self._cond:
            while len(self._attached) < count:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True


_REMEMBERED = 100_000
"""Ended runs and fenced envelopes kept to name why a late report is late (the oldest are
forgotten first: a report older than that is recorded as `unknown_envelope`, still never applied)."""


def _remember(table: dict[str, None], key: str) -> None:
    table[key] = None
    while len(table) > _REMEMBERED:
        del table[next(iter(table))]


def _key(pending: Pending) -> tuple[str, str, str, int]:
    e = pending.placed.envelope
    return (e.tenant, e.run_id, e.call_id, e.attempt)


def _label(pending: Pending) -> str:
    e = pending.placed.envelope
    return f"{e.tenant}:{e.run_id}"
