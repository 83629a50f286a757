"""TicketRouter: one ticket (incident, service, symptom) routed to one specialist, in this order.

    1. the ticket is well-formed (id, a non-empty incident)         else INVALID_ARGUMENT
    2. a decision already recorded for the ticket is the answer      (a retry; `replayed`)
       unless the caller asks to reclassify
    3. the service is one the caller's tenant may route              else `denied`, before any router
    4. the router (a sandboxed tool) gets {"symptom"} and nothing else:
       failed or raised -> `route_error`; not a string, or not in the taxonomy -> `escalate`
    5. a route without a configured specialist                       -> `unavailable`
    6. the specialist (a sandboxed tool) gets exactly {"incident", "service"}, under its own
       concurrency limit (past it RESOURCE_EXHAUSTED, nothing recorded), payload cap (past it
       INVALID_ARGUMENT) and deadline (past it the call is killed):
       failed, raised or killed -> `worker_error`; not a `fixture:` locator -> `invalid_result`;
       otherwise `review` with the route and the evidence

Every decision is a revision of the ticket's `routing` record (ringfence_server.control.store records, never
changed): ticket id, correlation id, scope digest, taxonomy, router and specialist versions,
outcome. The first is `routing_decided`; a later one only comes from an explicit reclassify and is
`routing_reclassified`, under the same correlation id. The router's and specialist's calls are
an ordinary run (events, traces, policy, sandbox) named in the decision.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from ringfence.errors import AlreadyExists, FieldViolation, InvalidArgument, PermissionDenied, ResourceExhausted
from ringfence.model import Observation, ObservationStatus, Principal, ProposedCall, Role, RunView
from ringfence.routing import Decision, Ticket
from ringfence_server.control.routing.config import RoutingConfig, SpecialistConfig
from ringfence_server.control.store.base import EventStore, Record, RevisionConflict

__all__ = ["OUTCOMES", "TicketRouter"]

OUTCOMES = ("denied", "route_error", "escalate", "unavailable", "worker_error", "invalid_result", "review")
EVIDENCE = re.compile(r"fixture:[A-Za-z0-9_.-]{1,100}")
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,80}")
MAX_TEXT_CHARS = 4000

_Outcome = dict[str, str | bool]
"""A decision's fields as the steps find them (status, reason, route, evidence, run_id, ...)."""


class RoutingRuns(Protocol):
    """What the router needs of the orchestrator (ringfence_server.control.orchestration.Orchestrator): one run per
    decision, its router and specialist calls as batches, and its kill switch."""

    def start_run(self, p: Principal, goal: str, run_id: str | None = None) -> RunView:
        """Start the run (or find it: a resend starts nothing new)."""
        ...

    def submit_batch(self, p: Principal, run_id: str, calls: Sequence[ProposedCall],
                     batch_id: str | None = None) -> list[Observation]:
        """One batch through admission and the sandbox; a batch id sent again returns the
        observations recorded for it."""
        ...

    def finish_run(self, p: Principal, run_id: str) -> RunView:
        """End the run as completed (a finished run stays as it ended)."""
        ...

    def cancel_run(self, p: Principal, run_id: str) -> RunView:
        """The kill switch: a specialist past its deadline is stopped at once."""
        ...


class TicketRouter:
    def __init__(self, orchestrator: RoutingRuns, store: EventStore, config: RoutingConfig) -> None:
        self._core = orchestrator
        self._store = store
        self.config = config
        self._slots = {route: threading.BoundedSemaphore(s.max_concurrent) for route, s in config.specialists.items()}

    # ------------------------------------------------------------------ the RPC

    def route(self, p: Principal, ticket: Ticket, correlation_id: str = "", reclassify: bool = False) -> Decision:
        if p.role not in (Role.AGENT, Role.ADMIN):
            raise PermissionDenied("only an agent routes a ticket")
        self._validate(ticket, correlation_id)
        history = self._store.read_records(p.tenant, "routing", ticket.id)
        if history:
            first = history[0].body
            if first["ticket_digest"] != ticket.digest():
                raise AlreadyExists(f"ticket {ticket.id} was routed with other content; use a new ticket id")
            if correlation_id and correlation_id != first["correlation_id"]:
                raise AlreadyExists(f"ticket {ticket.id} is routed under correlation id {first['correlation_id']}")
            if not reclassify:
                return _decision_from(history[-1], replayed=True)
        correlation_id = history[0].body["correlation_id"] if history else (
            correlation_id or "corr-" + uuid.uuid4().hex[:20])
        allowed = self.config.services.get(p.tenant, ())
        scope = hashlib.sha256(json.dumps([p.tenant, p.subject, sorted(allowed)]).encode()).hexdigest()
        outcome = self._decide(p, ticket, allowed)
        body = {
            "event": "routing_reclassified" if history else "routing_decided",
            "ticket_id": ticket.id, "ticket_digest": ticket.digest(), "correlation_id": correlation_id,
            "scope_digest": scope, "taxonomy_version": self.config.taxonomy_version,
            "router_version": self.config.router.version if outcome["router_ran"] else "",
            **{k: v for k, v in outcome.items() if k != "router_ran"},
        }
        try:
            record = self._store.append_record(p.tenant, "routing", ticket.id, body, p.subject, len(history))
        except RevisionConflict:
            # Another instance decided this ticket meanwhile: its decision stands, ours is not recorded.
            return _decision_from(self._store.read_records(p.tenant, "routing", ticket.id)[-1], replayed=True)
        return _decision_from(record)

    def history(self, p: Principal, ticket_id: str) -> list[Decision]:
        if not _ID.fullmatch(ticket_id or ""):
            raise InvalidArgument("bad ticket id", [FieldViolation("ticket_id", "must be 1-80 characters of "
                                                                                 "[A-Za-z0-9_.:-]")])
        return [_decision_from(r) for r in self._store.read_records(p.tenant, "routing", ticket_id)]

    # ------------------------------------------------------------------ the steps

    @staticmethod
    def _validate(ticket: Ticket, correlation_id: str) -> None:
        v: list[FieldViolation] = []
        if not ticket.id:
            v.append(FieldViolation("ticket.id", "is required"))
        elif not _ID.fullmatch(ticket.id):
            v.append(FieldViolation("ticket.id", "must be 1-80 characters of [A-Za-z0-9_.:-]"))
        if not ticket.incident.strip():
            v.append(FieldViolation("ticket.incident", "must not be empty"))
        for name in ("incident", "service", "symptom"):
            if len(getattr(ticket, name)) > MAX_TEXT_CHARS:
                v.append(FieldViolation(f"ticket.{name}", f"must be at most {MAX_TEXT_CHARS} characters"))
        if not ticket.service:
            v.append(FieldViolation("ticket.service", "is required"))
        if correlation_id and not _ID.fullmatch(correlation_id):
            v.append(FieldViolation("correlation_id", "must be 1-80 characters of [A-Za-z0-9_.:-]"))
        if v:
            raise InvalidArgument("the ticket is invalid; nothing was routed", v)

    def _decide(self, p: Principal, ticket: Ticket, allowed: tuple[str, ...]) -> _Outcome:
        out: _Outcome = {"route": "", "evidence": "", "run_id": "", "specialist_version": "",
                               "router_ran": False}
        if ticket.service not in allowed:
            return {**out, "status": "denied",
                    "reason": f"service {ticket.service!r} is not one tenant {p.tenant!r} may route"}
        if not self.config.router.tool:
            return {**out, "status": "route_error", "reason": "no router is configured ([routing] router)"}
        run_id = f"route.{ticket.id}.{uuid.uuid4().hex[:8]}"[:100]
        out["run_id"] = run_id
        out["router_ran"] = True
        self._core.start_run(p, f"route ticket {ticket.id}", run_id)
        try:
            return {**out, **self._route_and_dispatch(p, ticket, run_id)}
        finally:
            self._core.finish_run(p, run_id)

    def _route_and_dispatch(self, p: Principal, ticket: Ticket, run_id: str) -> _Outcome:
        # The router sees the symptom and nothing else.
        (routed,) = self._core.submit_batch(
            p, run_id, [ProposedCall("router", self.config.router.tool, {"symptom": ticket.symptom})], "router")
        if not _ran_clean(routed):
            return {"status": "route_error", "reason": f"the router failed: {_failure(routed)}"}
        route = routed.content
        if not isinstance(route, str):
            return {"status": "escalate", "reason": f"the router answered a {type(route).__name__}, not a route"}
        if route not in self.config.taxonomy:
            return {"status": "escalate", "reason": f"the router answered {route[:80]!r}, not a route of the taxonomy"}
        specialist = self.config.specialists.get(route)
        if specialist is None:
            return {"status": "unavailable", "route": route, "reason": f"no specialist handles route {route!r}"}
        envelope = {"incident": ticket.incident, "service": ticket.service}  # exactly these two
        size = len(json.dumps(envelope).encode())
        if size > specialist.max_payload_bytes:
            raise InvalidArgument("the ticket is too large for its specialist", [FieldViolation(
                "ticket.incident", f"the envelope is {size} bytes, over the {route} specialist's "
                                   f"max_payload_bytes ({specialist.max_payload_bytes})")])
        base = {"route": route, "specialist_version": specialist.version}
        worked, killed = self._call_specialist(p, run_id, route, specialist, envelope)
        if killed:
            return {**base, "status": "worker_error",
                    "reason": f"the specialist passed its deadline of {specialist.deadline_s:g} s and was stopped"}
        if not _ran_clean(worked):
            return {**base, "status": "worker_error", "reason": f"the specialist failed: {_failure(worked)}"}
        evidence = worked.content
        if not isinstance(evidence, str) or not EVIDENCE.fullmatch(evidence):
            shown = json.dumps(evidence)[:120]
            return {**base, "status": "invalid_result",
                    "reason": f"the specialist answered {shown}, not a fixture: evidence locator"}
        return {**base, "status": "review", "evidence": evidence, "reason": "routed; evidence for review"}

    def _call_specialist(self, p: Principal, run_id: str, route: str, specialist: SpecialistConfig,
                         envelope: Mapping[str, str]) -> tuple[Observation, bool]:
        slot = self._slots[route]
        if not slot.acquire(blocking=False):
            raise ResourceExhausted(f"the {route} specialist already has {specialist.max_concurrent} ticket(s) "
                                    "in flight (its max_concurrent); retry later")
        # The run's kill switch at the deadline: its running sandbox is killed at once.
        deadline = _Deadline(specialist.deadline_s, lambda: self._core.cancel_run(p, run_id))
        try:
            (obs,) = self._core.submit_batch(p, run_id, [ProposedCall("specialist", specialist.tool, dict(envelope))],
                                             "specialist")
        finally:
            killed = deadline.done()
            slot.release()
        return obs, killed


class _Deadline:
    """Calls `cancel` when `seconds` pass before `done()`.

    `done()` says whether it fired, and returns only after that cancel has landed: otherwise the
    caller's finish_run could take the run's lock first and log a killed call's run as
    "completed". A deadline that fires after `done()` does nothing.
    """

    def __init__(self, seconds: float, cancel: Callable[[], object]) -> None:
        self._cancel = cancel
        self._lock = threading.Lock()
        self._over = False
        self._fired = False
        self._landed = threading.Event()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._over:
                return
            self._fired = True
        try:
            self._cancel()
        finally:
            self._landed.set()

    def done(self) -> bool:
        with self._lock:
            self._over = True
        self._timer.cancel()
        if self._fired:
            self._landed.wait()
        return self._fired


def _ran_clean(obs: Observation) -> bool:
    return obs.status == ObservationStatus.EXECUTED and not obs.error


def _failure(obs: Observation) -> str:
    if obs.status != ObservationStatus.EXECUTED:
        return f"the call was {obs.status.value}" + (f" ({obs.error})" if obs.error else "")
    return f"{obs.error_class or 'error'}: {obs.error}"


def _decision_from(record: Record, replayed: bool = False) -> Decision:
    b = record.body
    return Decision(b["ticket_id"], b["correlation_id"], b["status"], b["route"], b["evidence"], b["reason"],
                    record.revision, b["scope_digest"], b["taxonomy_version"], b["router_version"],
                    b["specialist_version"], b["run_id"], record.at, replayed)
