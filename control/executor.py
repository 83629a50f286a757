"""The orchestrator: the one module that depends on everything, and the only writer of runs.

Every call of a batch crosses, in this order, before any call of the batch runs (DESIGN.md,
"The one rule"): registry -> argument validation -> action guardrails -> resource policy ->
contextual policy -> approval (ASK only) -> total admission. Then, for the admitted subset:
idempotency -> dispatch (reads in parallel, then writes serially; retry + circuit breaker;
an `execute_tool` span) -> completion event -> result guardrail -> durable observation.

A run's state changes only through `_append` (store append + control.state.apply), so the
live state is the fold of the log. Methods are synchronous; the gRPC edge calls them from
worker threads. Every method takes the caller's Principal and scopes everything to its tenant:
another tenant's run or approval is NotFound, so ids do not leak.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace

from control import guardrails
from control.approvals import approval_digest, new_approval_id
from control.config import Config
from control.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from control.idempotency import idempotency_key
from control.model import (
    Approval,
    ApprovalStatus,
    Event,
    Observation,
    ObservationStatus,
    PlanStep,
    Principal,
    ProposedCall,
    Role,
    RunOutcome,
    RunView,
    ToolView,
)
from control.policy import PolicyEngine, Verdict
from control.registry import Registry, ToolManifest
from control.resource_policy import call_allowlist, check_resources
from control.retry import Attempt, CircuitBreaker, FailureClass, RetryPolicy, classify, retry_call
from control.state import PendingCall, RunState, apply, fold, observation_data
from control.store.base import EventStore
from control.validation import MAX_DEPTH, signature, validate_arguments
from sandbox.backend import SandboxBackend, SandboxRequest
from sandbox.errors import EngineError, ImageError, SandboxError
from sandbox.profile import InputMount, SandboxProfile

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")
_tracer = trace.get_tracer("ringfence.control")

_READ_ROLES = (Role.AGENT, Role.APPROVER, Role.ADMIN)
_AGENT_ROLES = (Role.AGENT, Role.ADMIN)
_APPROVER_ROLES = (Role.APPROVER, Role.ADMIN)


@dataclass
class _Decision:
    """The admission result for one call (steps 1-6)."""

    call: ProposedCall
    status: ObservationStatus | None  # terminal status, or None when admitted / asked
    verdict: str  # unknown | invalid | halt | block | deny | ask | allow
    path: list[str] = field(default_factory=list)
    reason: str = ""
    error_class: str | None = None
    manifest: ToolManifest | None = None
    arguments: dict[str, Any] | None = None  # canonical
    signature: str | None = None
    halt_kind: str = ""


@dataclass
class _Admitted:
    call_id: str
    manifest: ToolManifest
    arguments: dict[str, Any]
    path: tuple[str, ...]
    approval_id: str | None = None


def _default_image_digest() -> Callable[[str], str]:
    cache: dict[str, str] = {}

    def digest(name: str) -> str:
        if name not in cache:
            try:
                from sandbox.images import load_lock

                cache[name] = load_lock().image_id(name)
            except Exception:  # noqa: BLE001 - no lock: the digest says so, dispatch will refuse
                cache[name] = f"unpinned:{name}"
        return cache[name]

    return digest


class Orchestrator:
    def __init__(
        self,
        *,
        config: Config,
        registry: Registry,
        backend: SandboxBackend,
        store: EventStore,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        image_digest: Callable[[str], str] | None = None,
        recover: bool = True,
    ) -> None:
        self.config = config
        self.limits = config.limits
        self.registry = registry
        self.backend = backend
        self.store = store
        self.policy = PolicyEngine(config.policy)
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._image_digest = image_digest or _default_image_digest()
        self._retry = RetryPolicy(self.limits.max_attempts, self.limits.backoff_initial_s, self.limits.backoff_max_s)
        # Runs by (tenant, run id): two tenants may use the same run id without learning of
        # each other; the second one's store key is namespaced (see start_run).
        self._states: dict[tuple[str, str], RunState] = {}
        self._keys: set[str] = set()
        self._approval_runs: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()  # guards the dicts below and above
        self._run_locks: dict[str, threading.RLock] = {}  # one batch/decision at a time per run
        self._append_locks: dict[str, threading.Lock] = {}  # append+apply atomically per run
        self._tenant_slots: dict[str, threading.BoundedSemaphore] = {}
        self._breakers: dict[str, CircuitBreaker] = {}
        # Set by cancel_run: a running batch dispatches nothing more once it is set.
        self._cancelled: dict[str, threading.Event] = {}
        self._pool = ThreadPoolExecutor(max_workers=self.limits.max_parallel_reads, thread_name_prefix="rf-read")
        self._closed = False
        # Test hook: called with (state, event) after every append is applied.
        self.on_event: Callable[[RunState, Event], None] | None = None
        self._load()
        if recover:
            self.recover()

    @classmethod
    def from_config(cls, config: Config, backend: SandboxBackend, store: EventStore,
                    clock: Callable[[], float] = time.time, **kwargs: Any) -> "Orchestrator":
        registry = kwargs.pop("registry", None) or Registry.from_dir(config.tools_dir)
        return cls(config=config, registry=registry, backend=backend, store=store, clock=clock, **kwargs)

    # ------------------------------------------------------------------ state plumbing

    def _load(self) -> None:
        for _tenant, key in self.store.all_runs():
            state = fold(self.store.read(key))
            self._states[(state.tenant, state.run_id)] = state
            self._keys.add(key)
            for approval_id in state.approvals:
                self._approval_runs[approval_id] = (state.tenant, state.run_id)

    def _run_lock(self, run_id: str) -> threading.RLock:
        with self._lock:
            return self._run_locks.setdefault(run_id, threading.RLock())

    def _append_lock(self, run_id: str) -> threading.Lock:
        with self._lock:
            return self._append_locks.setdefault(run_id, threading.Lock())

    def _view(self, state: RunState) -> RunView:
        # Under the append lock: parallel dispatch threads may be applying events right now.
        with self._append_lock(state.key):
            return state.view()

    def _approvals_of(self, state: RunState) -> list[Approval]:
        with self._append_lock(state.key):
            return list(state.approvals.values())

    def _try_sweep(self, state: RunState) -> None:
        """Expire what is due, unless a batch holds the run (it sweeps itself; readers never wait)."""
        lock = self._run_lock(state.key)
        if lock.acquire(blocking=False):
            try:
                if not state.finished:
                    self._sweep_expired(state)
            finally:
                lock.release()

    def _append(self, state: RunState, type_: str, data: Mapping[str, Any]) -> Event:
        lock = self._append_lock(state.key)
        with lock:
            event = self.store.append(state.key, type_, data, expected_seq=state.last_seq + 1,
                                      tenant=state.tenant)
            apply(state, event)
            if type_ == "approval_requested":
                with self._lock:
                    self._approval_runs[data["approval_id"]] = (state.tenant, state.run_id)
            if self.on_event is not None:
                self.on_event(state, event)
        return event

    def _observe(self, state: RunState, obs: Observation) -> Observation:
        self._append(state, "observation", observation_data(obs))
        return state.trajectory[obs.call_id]

    def _finish(self, state: RunState, outcome: RunOutcome, reason: str) -> None:
        if state.finished:
            return
        # Pending approvals die with the run: their calls are declined, durably.
        for call_id, pending in list(state.pending.items()):
            approval = state.approvals.get(pending.approval_id)
            if approval is not None and approval.status is ApprovalStatus.PENDING:
                self._append(state, "approval_decided", {"approval_id": pending.approval_id, "approved": False,
                                                         "by": "system", "reason": f"run ended: {outcome}"})
            self._observe(state, Observation(call_id, pending.tool, ObservationStatus.DECLINED, False,
                                             error=f"run ended ({outcome}) before this call ran",
                                             verdict_path=pending.verdict_path + ("run:ended",),
                                             approval_id=pending.approval_id))
        self._append(state, "run_finished", {"outcome": outcome.value, "reason": reason})

    @staticmethod
    def _require(p: Principal, roles: Sequence[Role]) -> None:
        if p.role not in roles:
            raise PermissionDenied(f"role {p.role} may not do this")

    @staticmethod
    def _public(state: RunState, event: Event) -> Event:
        """Events as the caller knows them: under its run id, not the store key."""
        if event.run_id == state.run_id:
            return event
        return Event(state.run_id, event.seq, event.type, event.data, event.schema_version, event.at)

    def _get(self, p: Principal, run_id: str) -> RunState:
        with self._lock:
            state = self._states.get((p.tenant, run_id))
        if state is None:
            raise NotFound(f"run {run_id!r} not found")
        return state

    @contextmanager
    def _tenant_slot(self, tenant: str) -> Iterator[None]:
        with self._lock:
            sem = self._tenant_slots.setdefault(
                tenant, threading.BoundedSemaphore(self.limits.max_concurrent_batches))
        if not sem.acquire(blocking=False):
            raise ResourceExhausted(
                f"tenant {tenant} already has {self.limits.max_concurrent_batches} batches running")
        try:
            yield
        finally:
            sem.release()

    def _breaker(self, tool: str) -> CircuitBreaker:
        with self._lock:
            return self._breakers.setdefault(
                tool, CircuitBreaker(self.limits.breaker_threshold, self.limits.breaker_cooldown_s, self._clock))

    def _sweep_expired(self, state: RunState) -> None:
        """Expire pending approvals whose time is up (an event, so replay agrees)."""
        now = self._clock()
        for approval in list(state.approvals.values()):
            if approval.status is ApprovalStatus.PENDING and now >= approval.expires_at:
                self._append(state, "approval_expired", {"approval_id": approval.approval_id})
                pending = state.pending.get(approval.call_id)
                self._observe(state, Observation(
                    approval.call_id, approval.tool, ObservationStatus.DECLINED, False,
                    error="approval expired", error_class="approval_expired",
                    verdict_path=(pending.verdict_path if pending else ()) + ("approval:expired",),
                    approval_id=approval.approval_id))

    # ------------------------------------------------------------------ tracing

    def _run_context(self, state: RunState) -> otel_context.Context:
        """The run's root span as a parent: one trace per run, across batches and restarts."""
        t = state.trace
        if not t.get("trace_id"):
            return otel_context.Context()
        parent = trace.SpanContext(trace_id=int(t["trace_id"], 16), span_id=int(t["span_id"], 16),
                                   is_remote=False, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
        return trace.set_span_in_context(trace.NonRecordingSpan(parent))

    # ------------------------------------------------------------------ public API

    def list_tools(self, p: Principal, query: str = "") -> list[ToolView]:
        self._require(p, _READ_ROLES)
        return self.registry.list(query)

    def start_run(self, p: Principal, goal: str, run_id: str | None = None) -> RunView:
        self._require(p, _AGENT_ROLES)
        if not isinstance(goal, str) or len(goal.encode()) > self.limits.max_argument_bytes:
            raise InvalidArgument("goal is too long", [FieldViolation("goal", "at most max_argument_bytes")])
        run_id = run_id or "run-" + uuid.uuid4().hex[:20]
        if not _ID.fullmatch(run_id):
            raise InvalidArgument("bad run id", [FieldViolation("run_id", "1-100 characters of [A-Za-z0-9_.:-]")])
        with self._run_lock(f"{p.tenant}/{run_id}"):
            with self._lock:
                existing = self._states.get((p.tenant, run_id))
                if existing is None:
                    # Another tenant's run may hold this id in the store: then this run's key is
                    # namespaced, and neither tenant can tell ("/" is not allowed in run ids).
                    key = run_id if run_id not in self._keys else f"{p.tenant}/{run_id}"
                    self._keys.add(key)
            if existing is not None:
                return self._view(existing)
            now = self._clock()
            with _tracer.start_as_current_span("invoke_agent", context=otel_context.Context(),
                                               attributes={"gen_ai.operation.name": "invoke_agent",
                                                           "ringfence.run_id": run_id,
                                                           "ringfence.tenant": p.tenant}) as span:
                ctx = span.get_span_context()
                trace_ids = ({"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}
                             if ctx.is_valid else {})
            state = RunState(run_id=run_id, tenant=p.tenant, key=key)
            self._append(state, "run_started", {
                "run_id": run_id, "tenant": p.tenant, "goal": goal, "created_at": now, "deadline_at": now + self.limits.run_deadline_s,
                "policy_version": self.policy.version, "trace": trace_ids, "by": p.subject})
            with self._lock:
                self._states[(p.tenant, run_id)] = state
            return self._view(state)

    def get_run(self, p: Principal, run_id: str) -> RunView:
        self._require(p, _READ_ROLES)
        state = self._get(p, run_id)
        self._try_sweep(state)
        return self._view(state)

    def list_runs(self, p: Principal) -> list[RunView]:
        self._require(p, _READ_ROLES)
        with self._lock:
            states = [s for s in self._states.values() if s.tenant == p.tenant]
        return [self._view(s) for s in sorted(states, key=lambda s: (s.created_at, s.run_id))]

    def finish_run(self, p: Principal, run_id: str) -> RunView:
        self._require(p, _AGENT_ROLES)
        state = self._get(p, run_id)
        with self._run_lock(state.key):
            if not state.finished:
                self._finish(state, RunOutcome.COMPLETED, "finished by the agent")
            return self._view(state)

    def _cancel_flag(self, state: RunState) -> threading.Event:
        with self._lock:
            return self._cancelled.setdefault(state.key, threading.Event())

    def cancel_run(self, p: Principal, run_id: str) -> RunView:
        """The kill switch: no call of the run is dispatched after this, even in a running batch
        (calls already in a container finish; their completions are recorded)."""
        self._require(p, _READ_ROLES)
        state = self._get(p, run_id)
        if not state.finished:
            self._cancel_flag(state).set()
        with self._run_lock(state.key):
            if not state.finished:
                self._finish(state, RunOutcome.CANCELLED, f"cancelled by {p.subject}")
            return self._view(state)

    def submit_batch(self, p: Principal, run_id: str, calls: Sequence[ProposedCall]) -> list[Observation]:
        self._require(p, _AGENT_ROLES)
        state = self._get(p, run_id)
        calls = list(calls)
        self._check_batch_shape(state, calls)
        with self._tenant_slot(p.tenant), self._run_lock(state.key):
            if state.finished:
                raise FailedPrecondition(f"run {run_id} is finished ({state.outcome})")
            self._check_batch_shape(state, calls)  # again under the lock: ids may have been used meanwhile
            return self._run_batch(state, calls)

    def validate_plan(self, p: Principal, steps: Sequence[PlanStep], max_steps: int | None) -> None:
        self._require(p, _AGENT_ROLES)
        violations: list[FieldViolation] = []
        cap = self.limits.max_plan_steps
        limit = self.limits.max_steps if max_steps in (None, 0) else max_steps
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            violations.append(FieldViolation("max_steps", "must be a positive integer"))
            limit = self.limits.max_steps
        elif limit > cap:
            violations.append(FieldViolation("max_steps", f"{limit} is over the hard cap of {cap}"))
            limit = cap
        if not steps:
            violations.append(FieldViolation("steps", "a plan needs at least one step"))
        if len(steps) > limit:
            violations.append(FieldViolation("steps", f"{len(steps)} steps is over max_steps {limit}"))
        seen: set[str] = set()
        for i, step in enumerate(steps):
            if not isinstance(step.key, str) or not _ID.fullmatch(step.key):
                violations.append(FieldViolation(f"steps[{i}].key", "1-100 characters of [A-Za-z0-9_.:-]"))
            elif step.key in seen:
                violations.append(FieldViolation(f"steps[{i}].key", f"duplicate key {step.key!r}"))
            seen.add(step.key)
            manifest = self.registry.get(step.tool)
            if manifest is None:
                violations.append(FieldViolation(f"steps[{i}].tool", f"unknown tool {step.tool!r}"))
                continue
            _, errs = validate_arguments(manifest, step.arguments, max_bytes=self.limits.max_argument_bytes,
                                         field_prefix=f"steps[{i}].arguments")
            violations.extend(errs)
        if violations:
            raise InvalidArgument(f"the plan has {len(violations)} problem(s)", violations)

    def execute_plan(self, p: Principal, run_id: str, steps: Sequence[PlanStep],
                     max_steps: int | None) -> Iterator[Event]:
        """Validate the whole plan now (raising InvalidArgument), then return an iterator that
        runs it as ONE batch (total admission of every step before any runs) and yields the
        run's events as they are appended."""
        self.validate_plan(p, steps, max_steps)
        state = self._get(p, run_id)
        if state.finished:
            raise FailedPrecondition(f"run {run_id} is finished ({state.outcome})")
        calls = [ProposedCall(s.key, s.tool, s.arguments) for s in steps]
        self._check_batch_shape(state, calls)
        return self._stream_batch(p, state, calls)

    def _stream_batch(self, p: Principal, state: RunState, calls: list[ProposedCall]) -> Iterator[Event]:
        from_seq = state.last_seq + 1
        done = threading.Event()
        failure: list[BaseException] = []

        def work() -> None:
            try:
                self.submit_batch(p, state.run_id, calls)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                failure.append(e)
            finally:
                done.set()

        worker = threading.Thread(target=work, name=f"rf-plan-{state.run_id}", daemon=True)
        worker.start()
        while True:
            version = self.store.version()
            finished = done.is_set()
            for event in self.store.read(state.key, from_seq):
                from_seq = event.seq + 1
                yield self._public(state, event)
            if finished:
                break
            self.store.wait(version, 0.1)
        worker.join()
        if failure:
            raise failure[0]

    def watch_run(self, p: Principal, run_id: str, from_seq: int, stop: threading.Event) -> Iterator[Event]:
        self._require(p, _READ_ROLES)
        state = self._get(p, run_id)
        # Clamp: SQLite integers are 64-bit signed, and no run has 2**62 events.
        return self._watch(state, min(max(int(from_seq or 0), 1), 2**62), stop)

    def _watch(self, state: RunState, from_seq: int, stop: threading.Event) -> Iterator[Event]:
        while not stop.is_set():
            version = self.store.version()
            finished = state.finished
            events = self.store.read(state.key, from_seq)
            for event in events:
                from_seq = event.seq + 1
                yield self._public(state, event)
                if event.type == "run_finished":
                    return
            # A finished run (read before the events, so nothing is missed) ends the watch even
            # when the caller asked to start past its last event.
            if finished or self._closed:
                return
            self.store.wait(version, 0.25)

    def list_approvals(self, p: Principal, run_id: str | None = None) -> list[Approval]:
        self._require(p, _READ_ROLES)
        if run_id is not None:
            states = [self._get(p, run_id)]
        else:
            with self._lock:
                states = [s for s in self._states.values() if s.tenant == p.tenant]
        out: list[Approval] = []
        for state in states:
            self._try_sweep(state)
            out.extend(self._approvals_of(state))
        return sorted(out, key=lambda a: (a.created_at, a.approval_id))

    def watch_approvals(self, p: Principal, stop: threading.Event) -> Iterator[Approval]:
        self._require(p, _APPROVER_ROLES)
        return self._watch_approvals(p, stop)

    def _watch_approvals(self, p: Principal, stop: threading.Event) -> Iterator[Approval]:
        seen: set[str] = set()
        first = True
        while not stop.is_set():
            version = self.store.version()
            for approval in self.list_approvals(p):
                if approval.approval_id in seen:
                    continue
                seen.add(approval.approval_id)
                if first and approval.status is not ApprovalStatus.PENDING:
                    continue  # at start only the pending ones matter; later every new one
                yield approval
            first = False
            if self._closed:
                return
            self.store.wait(version, 0.25)

    def add_grant(self, p: Principal, run_id: str, tool: str, arguments: Mapping[str, Any]) -> None:
        """An exact-call session grant for this run (approver/admin). Policy DENY still wins."""
        self._require(p, _APPROVER_ROLES)
        state = self._get(p, run_id)
        manifest = self.registry.get(tool)
        if manifest is None:
            raise InvalidArgument("unknown tool", [FieldViolation("tool", f"unknown tool {tool!r}")])
        canon, errs = validate_arguments(manifest, arguments, max_bytes=self.limits.max_argument_bytes)
        if errs:
            raise InvalidArgument("invalid arguments", errs)
        with self._run_lock(state.key):
            self._append(state, "grant_added", {"tool": tool, "arguments": canon,
                                                "signature": signature(tool, canon), "by": p.subject})

    def decide_approval(self, p: Principal, approval_id: str, approve: bool, reason: str) -> Approval:
        self._require(p, _APPROVER_ROLES)
        if not isinstance(reason, str) or len(reason.encode()) > 4096:
            raise InvalidArgument("reason is too long", [FieldViolation("reason", "at most 4096 bytes")])
        with self._lock:
            where = self._approval_runs.get(approval_id)
            state = self._states.get(where) if where else None
        if state is None or state.tenant != p.tenant:
            raise NotFound(f"approval {approval_id!r} not found")
        with self._run_lock(state.key):
            if state.finished:
                raise FailedPrecondition(f"run {state.run_id} is finished ({state.outcome})")
            self._sweep_expired(state)
            approval = state.approvals[approval_id]
            if approval.status is ApprovalStatus.EXPIRED:
                return approval
            if approval.status is not ApprovalStatus.PENDING:
                raise FailedPrecondition(f"approval {approval_id} is already {approval.status}")
            self._append(state, "approval_decided", {"approval_id": approval_id, "approved": bool(approve),
                                                     "by": p.subject, "reason": reason or ""})
            pending = state.pending[approval.call_id]
            if not approve:
                self._observe(state, Observation(
                    pending.call_id, pending.tool, ObservationStatus.DECLINED, False,
                    error=f"declined by {p.subject}" + (f": {reason}" if reason else ""),
                    verdict_path=pending.verdict_path + ("approval:declined",), approval_id=approval_id))
            else:
                self._resume(state, pending)
            return state.approvals[approval_id]

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------ recovery

    def recover(self) -> None:
        """Bring every unfinished run to a consistent point after a restart.

        - a mutating call whose dispatch started but whose completion was never recorded:
          the effect may or may not have happened; it is NOT re-run, the run ends `uncertain`
        - a read in the same state: recorded as interrupted (reads have no effect)
        - a completion without its observation: the observation is written now
        - an approved call not yet dispatched: dispatched now (the approval is in the log)
        """
        with self._lock:
            states = [s for s in self._states.values() if not s.finished]
        for state in states:
            with self._run_lock(state.key):
                self._recover_run(state)

    def _recover_run(self, state: RunState) -> None:
        for call_id, data in list(state.unobserved.items()):
            self._observe(state, self._completion_observation(call_id, data["tool"], data, (), None))
        uncertain = []
        for call_id, data in list(state.inflight.items()):
            if data.get("mutates"):
                uncertain.append(call_id)
                self._observe(state, Observation(
                    call_id, data["tool"], ObservationStatus.EXECUTED, True,
                    error="the control plane stopped while this call ran; whether it took effect is unknown, "
                          "and it is not re-run", error_class="uncertain",
                    attempts=state.attempts.get(call_id, 0)))
            else:
                self._observe(state, Observation(
                    call_id, data["tool"], ObservationStatus.EXECUTED, True,
                    error="interrupted by a control-plane restart", error_class="interrupted",
                    attempts=state.attempts.get(call_id, 0)))
        if uncertain:
            self._finish(state, RunOutcome.UNCERTAIN, "mutating call(s) without a recorded completion: "
                         + ", ".join(uncertain))
            return
        self._sweep_expired(state)
        for pending in list(state.pending.values()):
            approval = state.approvals.get(pending.approval_id)
            if approval is not None and approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.USED):
                self._resume(state, pending)

    # ------------------------------------------------------------------ batches

    def _check_batch_shape(self, state: RunState, calls: list[ProposedCall]) -> None:
        violations = []
        if not calls:
            violations.append(FieldViolation("calls", "a batch needs at least one call"))
        if len(calls) > self.limits.max_batch_calls:
            raise ResourceExhausted(f"{len(calls)} calls is over the {self.limits.max_batch_calls}-call batch cap")
        seen: set[str] = set()
        for i, call in enumerate(calls):
            if not isinstance(call.call_id, str) or not _ID.fullmatch(call.call_id):
                violations.append(FieldViolation(f"calls[{i}].call_id", "1-100 characters of [A-Za-z0-9_.:-]"))
            elif call.call_id in seen:
                violations.append(FieldViolation(f"calls[{i}].call_id", f"duplicate call id {call.call_id!r}"))
            elif call.call_id in state.call_ids:
                violations.append(FieldViolation(f"calls[{i}].call_id",
                                                 f"call id {call.call_id!r} was already used in this run"))
            seen.add(call.call_id)
            if not isinstance(call.tool, str) or not call.tool:
                violations.append(FieldViolation(f"calls[{i}].tool", "must be a non-empty string"))
        if violations:
            raise InvalidArgument("the batch is malformed", violations)

    def _halt_all(self, state: RunState, calls: list[ProposedCall], outcome: RunOutcome, reason: str,
                  paths: Mapping[str, Sequence[str]] | None = None) -> list[Observation]:
        observations = [
            self._observe(state, Observation(c.call_id, c.tool, ObservationStatus.HALTED, False, error=reason,
                                             error_class=outcome.value,
                                             verdict_path=tuple((paths or {}).get(c.call_id, ())) + ("run:halted",)))
            for c in calls
        ]
        self._finish(state, outcome, reason)
        return observations

    def _boundary_check(self, state: RunState) -> tuple[RunOutcome, str] | None:
        """Run ceilings, checked at batch boundaries (and before a resumed call)."""
        now = self._clock()
        if state.deadline_at is not None and now >= state.deadline_at:
            return RunOutcome.DEADLINE_EXCEEDED, f"the run deadline passed ({self.limits.run_deadline_s:g}s)"
        if state.turns + 1 > self.limits.max_turns:
            return RunOutcome.BUDGET_EXHAUSTED, f"turn ceiling reached ({self.limits.max_turns})"
        if state.cost >= self.limits.max_cost:
            return RunOutcome.BUDGET_EXHAUSTED, f"cost ceiling reached ({state.cost:g} >= {self.limits.max_cost:g})"
        return None

    def _run_batch(self, state: RunState, calls: list[ProposedCall]) -> list[Observation]:
        self._sweep_expired(state)
        stop = self._boundary_check(state)
        if stop is not None:
            return self._halt_all(state, calls, *stop)
        batch_id = uuid.uuid4().hex[:12]
        with _tracer.start_as_current_span(
                "batch", context=self._run_context(state),
                attributes={"ringfence.run_id": state.run_id, "ringfence.batch_id": batch_id,
                            "ringfence.calls": len(calls)}):
            batch_ctx = otel_context.get_current()
            # Steps 1-6 for EVERY call before any runs (a pure function of the run's state).
            counts: Counter = Counter()
            decisions = [self._admit(state, call, counts) for call in calls]
            # The log never keeps a secret the scanner found: arguments are recorded redacted
            # (a no-op for clean ones; only clean calls go further than the log).
            self._append(state, "batch_started", {
                "batch_id": batch_id, "turn": state.turns + 1,
                "calls": [{"call_id": c.call_id, "tool": c.tool, "arguments": guardrails.redact(_plain(c.arguments))}
                          for c in calls]})
            for d in decisions:
                self._append(state, "call_decided", {
                    "call_id": d.call.call_id, "tool": d.call.tool,
                    "arguments": guardrails.redact(d.arguments if d.arguments is not None else _plain(d.call.arguments)),
                    "signature": d.signature, "verdict": d.verdict, "verdict_path": d.path, "reason": d.reason})
            halts = [d for d in decisions if d.verdict == "halt"]
            if halts:
                first = halts[0]
                outcome = RunOutcome.LOOP_DETECTED if first.halt_kind == "loop" else RunOutcome.GUARDRAIL_STOP
                return self._halt_all(state, calls, outcome, f"{first.call.call_id}: {first.reason}",
                                      {d.call.call_id: d.path for d in decisions})
            results: dict[str, Observation] = {}
            admitted: list[_Admitted] = []
            for d in decisions:
                if d.status is not None:
                    results[d.call.call_id] = self._observe(state, Observation(
                        d.call.call_id, d.call.tool, d.status, False, error=d.reason, error_class=d.error_class,
                        verdict_path=tuple(d.path)))
                elif d.verdict == "ask":
                    results[d.call.call_id] = self._request_approval(state, d)
                else:
                    admitted.append(_Admitted(d.call.call_id, d.manifest, d.arguments, tuple(d.path)))
            # Step 7: total admission is done; the admitted subset runs.
            try:
                results.update(self._execute(state, admitted, batch_ctx))
            except Exception as e:  # noqa: BLE001 - an unexpected failure ends the run as `error`
                reason = f"unexpected {type(e).__name__} in dispatch: {e}"[:1000]
                for a in admitted:
                    if a.call_id not in state.trajectory or (
                            state.trajectory[a.call_id].status is ObservationStatus.PENDING_APPROVAL):
                        results[a.call_id] = self._observe(state, Observation(
                            a.call_id, a.manifest.name, ObservationStatus.HALTED, a.call_id in state.inflight,
                            error=reason, error_class="error", verdict_path=a.path + ("run:error",)))
                self._finish(state, RunOutcome.ERROR, reason)
            return [results.get(c.call_id) or state.trajectory[c.call_id] for c in calls]

    def _admit(self, state: RunState, call: ProposedCall, counts: Counter) -> _Decision:
        d = _Decision(call=call, status=None, verdict="allow")
        # 1 registry
        manifest = self.registry.get(call.tool)
        if manifest is None:
            d.status, d.verdict, d.reason = ObservationStatus.UNKNOWN_TOOL, "unknown", f"unknown tool {call.tool!r}"
            d.path.append("registry:unknown")
            d.error_class = "unknown_tool"
            return d
        d.manifest = manifest
        d.path.append("registry:ok")
        # 2 argument validation
        canon, errs = validate_arguments(manifest, call.arguments, max_bytes=self.limits.max_argument_bytes)
        if errs:
            d.status, d.verdict, d.error_class = ObservationStatus.DENIED, "invalid", "invalid_arguments"
            # jsonschema quotes the offending value: redact, a secret may be what failed to validate.
            d.reason = guardrails.redact("; ".join(f"{v.field}: {v.description}" for v in errs)[:2000])
            d.path.append("validation:invalid")
            return d
        d.arguments = canon
        d.path.append("validation:ok")
        # 3 action guardrails: secrets, then the loop detector
        g = guardrails.check_arguments(canon)
        if g.action is guardrails.Action.HALT:
            d.verdict, d.reason, d.halt_kind = "halt", g.reason, g.kind
            d.path.append(f"guardrail:halt:{g.kind}")
            return d
        if g.action is guardrails.Action.BLOCK:
            d.status, d.verdict, d.reason, d.error_class = ObservationStatus.BLOCKED, "block", g.reason, "secret"
            d.path.append(f"guardrail:block:{g.kind}")
            return d
        # Only calls that reach the loop detector are counted (and logged with their signature).
        d.signature = signature(manifest.name, canon)
        previous = state.signatures[d.signature] + counts[d.signature]
        counts[d.signature] += 1
        loop = guardrails.check_loop(previous, self.limits.loop_threshold)
        if loop.action is guardrails.Action.HALT:
            d.verdict, d.reason, d.halt_kind = "halt", loop.reason, "loop"
            d.path.append("guardrail:halt:loop")
            return d
        d.path.append("guardrail:pass")
        # 4 resource policy, before any rule; its DENY is final
        r = check_resources(manifest, canon, self.config.inputs, self.config.policy.egress_for(manifest.name))
        if not r.allowed:
            d.status, d.verdict, d.reason, d.error_class = ObservationStatus.DENIED, "deny", r.reason, "resource"
            d.path.append("resource:deny")
            return d
        d.path.append("resource:ok")
        # 5 contextual policy
        decision = self.policy.decide(manifest, canon, frozenset(state.grants))
        d.path.extend(f"policy:{x}" for x in decision.path)
        if decision.verdict is Verdict.DENY:
            d.status, d.verdict, d.reason, d.error_class = ObservationStatus.DENIED, "deny", decision.reason, "policy"
            return d
        if decision.verdict is Verdict.ASK:
            d.verdict, d.reason = "ask", decision.reason
            return d
        d.path.append("admitted")
        return d

    def _digest(self, state: RunState, manifest: ToolManifest, arguments: Mapping[str, Any]) -> str:
        return approval_digest(tenant=state.tenant, run_id=state.run_id, tool=manifest.name, arguments=arguments,
                               image_digest=self._image_digest(manifest.image), policy_version=self.policy.version)

    def _request_approval(self, state: RunState, d: _Decision) -> Observation:
        # 6 approval: durable, bound to the exact call, expiring.
        assert d.manifest is not None and d.arguments is not None
        now = self._clock()
        approval_id = new_approval_id()
        path = tuple(d.path) + ("approval:requested",)
        self._append(state, "approval_requested", {
            "approval_id": approval_id, "call_id": d.call.call_id, "tool": d.manifest.name,
            "arguments": d.arguments, "digest": self._digest(state, d.manifest, d.arguments),
            "created_at": now, "expires_at": now + self.limits.approval_ttl_s, "mutates": d.manifest.mutates,
            "idempotency_key": (idempotency_key(state.run_id, d.manifest.name, d.arguments)
                                if d.manifest.mutates else None),
            "image_digest": self._image_digest(d.manifest.image), "policy_version": self.policy.version,
            "verdict_path": list(path)})
        return self._observe(state, Observation(d.call.call_id, d.manifest.name, ObservationStatus.PENDING_APPROVAL,
                                                False, error="waiting for approval", verdict_path=path,
                                                approval_id=approval_id))

    def _resume(self, state: RunState, pending: PendingCall) -> Observation:
        """Dispatch an approved call, re-deriving everything from the log."""
        approval = state.approvals[pending.approval_id]
        manifest = self.registry.get(pending.tool)
        path = pending.verdict_path
        if manifest is None or self._digest(state, manifest, pending.arguments) != approval.digest:
            # The world changed since the approver looked (policy, image, tool): not this approval.
            return self._observe(state, Observation(
                pending.call_id, pending.tool, ObservationStatus.DECLINED, False,
                error="the approval no longer matches this call (policy, image or tool changed)",
                error_class="approval_mismatch", verdict_path=path + ("approval:mismatch",),
                approval_id=approval.approval_id))
        stop = self._boundary_check(state)
        if stop is not None and stop[0] is RunOutcome.DEADLINE_EXCEEDED:
            self._finish(state, *stop)
            return state.trajectory[pending.call_id]
        if approval.status is ApprovalStatus.APPROVED:
            self._append(state, "approval_used", {"approval_id": approval.approval_id})
        item = _Admitted(pending.call_id, manifest, dict(pending.arguments), path + ("approval:approved", "admitted"),
                         approval_id=approval.approval_id)
        with _tracer.start_as_current_span("batch", context=self._run_context(state),
                                           attributes={"ringfence.run_id": state.run_id, "ringfence.resumed": True}):
            ctx = otel_context.get_current()
            try:
                return self._execute(state, [item], ctx)[pending.call_id]
            except Exception as e:  # noqa: BLE001
                reason = f"unexpected {type(e).__name__} in dispatch: {e}"[:1000]
                obs = self._observe(state, Observation(
                    item.call_id, manifest.name, ObservationStatus.HALTED, item.call_id in state.inflight,
                    error=reason, error_class="error", verdict_path=item.path + ("run:error",),
                    approval_id=approval.approval_id))
                self._finish(state, RunOutcome.ERROR, reason)
                return obs

    # ------------------------------------------------------------------ dispatch

    def _execute(self, state: RunState, admitted: list[_Admitted], ctx: otel_context.Context) -> dict[str, Observation]:
        """Steps 8-11: reads in parallel, then writes one at a time, in batch order."""
        out: dict[str, Observation] = {}
        reads = [a for a in admitted if not a.manifest.mutates]
        writes = [a for a in admitted if a.manifest.mutates]
        if reads:
            futures = [self._pool.submit(self._dispatch, state, a, ctx) for a in reads]
            completions = [f.result() for f in futures]
            for a, completion in zip(reads, completions):
                out[a.call_id] = self._observe(state, completion)
        for a in writes:
            out[a.call_id] = self._observe(state, self._dispatch(state, a, ctx))
        return out

    def _dispatch(self, state: RunState, a: _Admitted, ctx: otel_context.Context) -> Observation:
        """Run one admitted call; returns its observation (not yet appended)."""
        manifest = a.manifest
        if self._cancel_flag(state).is_set():
            return Observation(a.call_id, manifest.name, ObservationStatus.HALTED, False,
                               error="the run was cancelled before this call ran", error_class="cancelled",
                               verdict_path=a.path + ("run:cancelled",), approval_id=a.approval_id)
        key = idempotency_key(state.run_id, manifest.name, a.arguments) if manifest.mutates else None
        if key is not None and key in state.completions:
            # 8 idempotency: recorded completion -> the stored result, no dispatch.
            stored = state.completions[key]
            return Observation(a.call_id, manifest.name, ObservationStatus.DEDUPLICATED, False,
                               content=stored["content"], verdict_path=a.path + ("idempotency:deduplicated",),
                               approval_id=a.approval_id)
        breaker = self._breaker(manifest.name)
        if not breaker.allow():
            return Observation(a.call_id, manifest.name, ObservationStatus.DENIED, False,
                               error=f"circuit open for {manifest.name}: too many recent failures",
                               error_class=FailureClass.CIRCUIT_OPEN.value,
                               verdict_path=a.path + ("breaker:open",), approval_id=a.approval_id)
        self._append(state, "dispatch_started", {"call_id": a.call_id, "tool": manifest.name,
                                                 "mutates": manifest.mutates, "idempotency_key": key})
        with _tracer.start_as_current_span(
                "execute_tool", context=ctx, kind=trace.SpanKind.INTERNAL,
                attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": manifest.name,
                            "gen_ai.tool.call.id": a.call_id, "ringfence.run_id": state.run_id}) as span:
            request_body = json.dumps({"tool": manifest.name, "arguments": a.arguments, "call_id": a.call_id,
                                       "idempotency_key": key}, separators=(",", ":")).encode()
            profile = self._profile(manifest)

            def attempt(n: int) -> Attempt:
                if n > 1 and not breaker.allow():
                    result = Attempt(n, FailureClass.CIRCUIT_OPEN, message="circuit opened during retries")
                else:
                    result = self._attempt(state, a, profile, request_body, n)
                    breaker.record(result.failure)
                self._append(state, "attempt", {
                    "call_id": a.call_id, "attempt": n,
                    "failure_class": result.failure.value if result.failure else None,
                    "outcome": result.outcome, "message": guardrails.redact(result.message[:1000]),
                    "retry_after_s": result.retry_after_s, "duration_ms": result.duration_ms})
                return result

            final = retry_call(attempt, self._retry, sleep=self._sleep, rng=self._rng)
            attempts = state.attempts.get(a.call_id, final.number)
            span.set_attribute("ringfence.attempts", attempts)
            if final.failure:
                span.set_attribute("error.type", final.failure.value)
                span.set_status(trace.Status(trace.StatusCode.ERROR, final.message[:200]))
        # 10 completion, after the tool returned. The result guardrail's verdict is computed first
        # so that the durable record (and any deduplicated replay of it) never holds the secret.
        guard = guardrails.check_result(final.content) if final.ok else None
        completion = {"call_id": a.call_id, "tool": manifest.name, "mutates": manifest.mutates,
                      "idempotency_key": key, "ok": final.ok, "content": guard.content if guard else None,
                      "guard": ({"action": guard.action.value, "redacted": list(guard.redacted), "reason": guard.reason}
                                if guard else None),
                      "error": None if final.ok else guardrails.redact((final.message or str(final.failure))[:2000]),
                      "error_class": final.failure.value if final.failure else None,
                      "attempts": attempts, "cost": manifest.cost * attempts}
        self._append(state, "call_completed", completion)
        # 11 result guardrail, then the observation
        return self._completion_observation(a.call_id, manifest.name, completion, a.path, a.approval_id)

    def _completion_observation(self, call_id: str, tool: str, completion: Mapping[str, Any],
                                path: tuple[str, ...], approval_id: str | None) -> Observation:
        attempts = int(completion.get("attempts") or 0)
        if not completion.get("ok"):
            return Observation(call_id, tool, ObservationStatus.EXECUTED, True, error=completion.get("error"),
                               error_class=completion.get("error_class"), verdict_path=path + ("executed:failed",),
                               approval_id=approval_id, attempts=attempts)
        # 11 the result guardrail's verdict (recorded with the completion; computed here for a
        # completion written without one)
        guard = completion.get("guard")
        if guard is None:
            checked = guardrails.check_result(completion.get("content"))
            guard = {"action": checked.action.value, "redacted": list(checked.redacted), "reason": checked.reason}
            content = checked.content
        else:
            content = completion.get("content")
        if guard["action"] == guardrails.Action.BLOCK.value:
            return Observation(call_id, tool, ObservationStatus.BLOCKED, True, error=guard["reason"],
                               error_class="secret_in_result", verdict_path=path + ("result:blocked",),
                               approval_id=approval_id, attempts=attempts)
        suffix = ("result:redacted",) if guard["redacted"] else ("result:ok",)
        return Observation(call_id, tool, ObservationStatus.EXECUTED, True, content=content,
                           error=guard["reason"] or None, verdict_path=path + suffix, approval_id=approval_id,
                           attempts=attempts)

    def _profile(self, manifest: ToolManifest) -> SandboxProfile:
        inputs = []
        roots = sorted({r for rs in manifest.paths.values() for r in rs})
        for root in roots:
            host = self.config.inputs.get(root)
            if host:
                inputs.append(InputMount(host, root))
        lim = manifest.limits
        extra: dict[str, Any] = {}
        allowlist = call_allowlist(manifest, self.config.policy.egress_for(manifest.name))
        if allowlist:
            # The call's allowlist is its tool's declared hosts AND what policy grants
            # (resource policy has already refused private and metadata targets in its
            # arguments); the sandbox puts the call behind the egress proxy with exactly it.
            # Nothing granted: the call runs with no network at all.
            from sandbox.egress.grant import EgressGrant

            extra["egress"] = EgressGrant(allow=allowlist)
        return SandboxProfile(image=manifest.image, runtime=manifest.runtime, memory_bytes=lim.memory_bytes,
                              cpus=lim.cpus, pids=lim.pids, timeout_s=lim.timeout_s, stdout_limit=lim.stdout_limit,
                              stderr_limit=lim.stderr_limit, inputs=tuple(inputs), **extra)

    def _attempt(self, state: RunState, a: _Admitted, profile: SandboxProfile, body: bytes, n: int) -> Attempt:
        request = SandboxRequest(profile=profile, argv=(), stdin=body, run_id=state.run_id,
                                 call_id=f"{a.call_id}.a{n}")
        try:
            result = self.backend.run(request)
        except EngineError as e:
            # The engine, not the tool: like start_failed, transient.
            return Attempt(n, FailureClass.TRANSIENT, message=f"sandbox engine: {e}", outcome="start_failed")
        except ImageError as e:
            return Attempt(n, FailureClass.FATAL, message=f"image refused: {e}", outcome="start_failed")
        except SandboxError as e:
            return Attempt(n, FailureClass.FATAL, message=f"sandbox: {e}", outcome="start_failed")
        if result.egress_events:
            # Every decision of the egress proxy becomes an event of the call.
            self._append(state, "egress", {"call_id": a.call_id, "attempt": n,
                                           "decisions": [dict(e) for e in result.egress_events]})
        failure = classify(result)
        if failure is None:
            try:
                line = result.stdout.decode("utf-8").strip().splitlines()[-1]
                doc = json.loads(line)
                if not isinstance(doc, dict) or doc.get("ok") is not True or "content" not in doc:
                    raise ValueError("not a runner success document")
            except (ValueError, IndexError, UnicodeDecodeError) as e:
                return Attempt(n, FailureClass.FATAL, message=f"tool output is not the runner protocol: {e}",
                               duration_ms=result.duration_ms, outcome=result.outcome.value)
            return Attempt(n, None, content=doc["content"], duration_ms=result.duration_ms,
                           outcome=result.outcome.value)
        message = result.message or f"{result.outcome.value}"
        return Attempt(n, failure, message=message, retry_after_s=result.retry_after_s,
                       duration_ms=result.duration_ms, outcome=result.outcome.value)


def _plain(value: Any, depth: int = 0) -> Any:
    """Frozen mappings back to plain JSON-able values (for event data). What validation refuses
    (too deep, a lone surrogate, NaN) is still recorded, as a readable trace of it."""
    if depth > MAX_DEPTH:
        return f"<nested deeper than {MAX_DEPTH} levels>"
    if isinstance(value, Mapping):
        return {_plain_text(str(k)): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return repr(value)  # not JSON; validation rejects the call, the log keeps a trace of it
    if isinstance(value, str):
        return _plain_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return repr(value)[:1000]


def _plain_text(value: str) -> str:
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:  # a lone surrogate: SQLite and JSON readers would choke on it
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
