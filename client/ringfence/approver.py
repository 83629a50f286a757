"""`Approver`: a background thread that watches a tenant's approvals and decides each pending
one through a callable (a console prompt, a rule, a test's scripted answer)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import grpc

from ringfence.errors import ControlError, FailedPrecondition, NotFound
from ringfence.model import Approval, ApprovalStatus

__all__ = ["ApprovalDecision", "Approver", "Decide"]

log = logging.getLogger("ringfence.approver")


@dataclass(frozen=True)
class ApprovalDecision:
    """What a `Decide` callable may answer when a yes/no is not enough."""

    approve: bool
    reason: str = ""
    remember: bool = False
    """Approve and remember for this run: the exact call (same digest) is not asked again in
    the run; a call with other arguments still is. Ignored for a decline."""


Decide = Callable[[Approval], "bool | tuple[bool, str] | ApprovalDecision"]
"""approval -> approve?, (approve?, reason), or an ApprovalDecision."""


def _as_decision(verdict: bool | tuple[bool, str] | ApprovalDecision) -> ApprovalDecision:
    if isinstance(verdict, ApprovalDecision):
        return verdict
    if isinstance(verdict, tuple):
        approve, reason = verdict
        return ApprovalDecision(bool(approve), reason)
    return ApprovalDecision(bool(verdict))


class _ApprovalStream(Protocol):
    """What the watch gives back (a client's Stream[Approval]): approvals, and a way to end it."""

    def __iter__(self) -> Iterator[Approval]: ...

    def cancel(self) -> None: ...


class _ApprovalClient(Protocol):
    def watch_approvals(self, *, timeout: float | None = None) -> _ApprovalStream: ...

    def decide_approval(self, approval_id: str, approve: bool, reason: str = "", *, remember: bool = False,
                        digest: str | None = None, timeout: float | None = None) -> Approval: ...


class Approver:
    """`with Approver(client, decide): ...` decides pending approvals until the block ends.

    `client` must hold an approver (or admin) token of the tenant. The watch is reopened when
    it ends (its deadline, a server restart); the server sends every pending approval first on
    each new watch, so nothing requested meanwhile is missed. An approval decided elsewhere
    first (or expired, or its run ended) is skipped, not an error. An exception from `decide`
    leaves that approval pending and is kept in `errors`.
    """

    def __init__(self, client: _ApprovalClient, decide: Decide, *, reconnect_backoff_s: float = 0.5,
                 watch_timeout: float | None = None) -> None:
        self.client = client
        self.decide = decide
        self.reconnect_backoff_s = reconnect_backoff_s
        self.watch_timeout = watch_timeout
        self.decided: list[Approval] = []
        """Every approval this helper decided, as the server answered the decision."""
        self.errors: list[BaseException] = []
        """What went wrong along the way (a broken watch, a failed decide); the thread goes on."""
        self._done: set[str] = set()
        self._reopen = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stream: _ApprovalStream | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Approver:
        if self._thread is not None:
            raise RuntimeError("this Approver is already running")
        self._thread = threading.Thread(target=self._serve, name="rf-approver", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop watching and wait for the thread (a decision in flight completes first)."""
        self._stop.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> Approver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the thread ---------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                stream = self.client.watch_approvals(timeout=self.watch_timeout)
                with self._lock:
                    self._stream = stream
                if self._stop.is_set():  # stop() ran before the stream was published
                    stream.cancel()
                    return
                for approval in stream:
                    if self._stop.is_set():
                        break
                    self.handle(approval)
                    if self._reopen:
                        break
            except (ControlError, grpc.RpcError) as e:
                if self._stop.is_set():
                    return
                log.warning("approval watch ended: %s; reopening", e)
                self.errors.append(e)
            finally:
                self._reopen = False
                with self._lock:
                    published, self._stream = self._stream, None
                if published is not None:
                    published.cancel()
            self._stop.wait(self.reconnect_backoff_s)

    def handle(self, approval: Approval) -> Approval | None:
        """Decide one approval if it is still pending and not handled yet; the server's answer,
        or None when there was nothing to decide."""
        if approval.status is not ApprovalStatus.PENDING or approval.approval_id in self._done:
            return None
        try:
            verdict = self.decide(approval)
        except Exception as e:  # noqa: BLE001 - the caller's callable; keep serving the others
            log.warning("decide(%s) raised %r; left pending", approval.approval_id, e)
            self.errors.append(e)
            return None
        decision = _as_decision(verdict)
        try:
            # With the digest it judged: a decision never applies to a call it did not see.
            decided = self.client.decide_approval(approval.approval_id, decision.approve, decision.reason,
                                                  remember=decision.approve and decision.remember,
                                                  digest=approval.digest)
        except (FailedPrecondition, NotFound) as e:
            # Decided by someone else, expired, or its run ended: nothing left to decide.
            log.info("approval %s not decided: %s", approval.approval_id, e)
            self._done.add(approval.approval_id)
            return None
        except (ControlError, grpc.RpcError) as e:
            # Transient or unexpected: left undone, and the watch is reopened, because a new
            # watch lists the pending approvals first and so offers this one again.
            self.errors.append(e)
            self._reopen = True
            return None
        self._done.add(approval.approval_id)
        self.decided.append(decided)
        return decided
