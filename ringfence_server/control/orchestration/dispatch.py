"""Dispatch: steps 8-11 for admitted calls, and the only code that touches the sandbox.

    idempotency -> dispatch (reads in parallel, then writes one at a time; retry of transient
    failures only; circuit breaker; an `execute_tool` span; the call's output streamed to the
    log as it runs, ringfence_server.control.orchestration.live_output) -> completion event (after the tool
    returned, never before) -> the tool's declared outputs collected (ringfence_server.control.files) -> result
    guardrail -> the observation (appended in the completion's own write, or, for parallel reads,
by the caller in batch order)

"Writes" are the calls of `ToolManifest.serial` tools: those that mutate, and those that write
the run's workspace. A workspace tool gets the run's workspace mounted at /workspace (read-only
for `read`), in a container of its own: created for the call, or a warm one made for this run's
workspace alone (ringfence_server.sandbox.pool: the mount is part of the shape).

A call whose every attempt failed before a container existed (ringfence_server.control.retry.never_started)
never ran: its completion says `executed` false, its observation is DENIED, not executed
(`sandbox:not_started`, the failure's class), and its client key is released. The runner's
result line is strict JSON (ringfence_server.sandbox.runner_protocol): NaN or Infinity fails the call
`fatal`, as any result that is not JSON does.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from ringfence.errors import ControlError, Internal
from ringfence.model import Event, Observation, ObservationStatus
from ringfence_server.control import guardrails
from ringfence_server.control.config import Config
from ringfence_server.control.events import (
    ArtifactCollected,
    AttemptFinished,
    CallCompleted,
    CallObserved,
    DispatchStarted,
    EgressDecided,
    EventPayload,
    ResultGuard,
    payload_of,
)
from ringfence_server.control.files import FileDesk
from ringfence_server.control.idempotency import client_idempotency_key, idempotency_key
from ringfence_server.control.orchestration import spans
from ringfence_server.control.orchestration.crashpoints import crash_point
from ringfence_server.control.orchestration.live_output import LiveOutput
from ringfence_server.control.orchestration.runs import RunRepository
from ringfence_server.control.orchestration.stops import RunStops
from ringfence_server.control.registry import ToolManifest
from ringfence_server.control.resource_policy import call_allowlist
from ringfence_server.control.retry import (
    Attempt,
    CircuitBreaker,
    FailureClass,
    RetryPolicy,
    classify,
    never_started,
    retry_call,
)
from ringfence_server.control.state import RunState, sandbox_run_id
from ringfence_server.control.store.base import KeyTaken, StoreError
from ringfence_server.control.validation import signature
from ringfence_server.sandbox.backend import SandboxBackend, SandboxRequest
from ringfence_server.sandbox.errors import EngineError, ImageError, SandboxError
from ringfence_server.sandbox.mcp_session import McpCall
from ringfence_server.sandbox.profile import InputMount, SandboxProfile, WorkspaceMount
from ringfence_server.sandbox.runner_protocol import read_success

_tracer = trace.get_tracer("ringfence.control")
log = logging.getLogger(__name__)


def client_key_name(key: str, generation: int = 1) -> str:
    """The store key (ringfence_server.control.store) under which a client idempotency key is claimed. A claim
    whose call provably never started released the key (Dispatcher.key_claim): the next use
    claims it again under the next generation's name. Store keys are never removed, so the
    claim of a generation stays the atomic arbiter between runs racing for the same key."""
    return f"idem:{key}" if generation == 1 else f"idem:{key}#{generation}"


@dataclass(frozen=True)
class Admitted:
    """A call that crossed admission (and its approval, if it needed one)."""

    call_id: str
    manifest: ToolManifest
    arguments: Mapping[str, Any]
    path: tuple[str, ...]
    approval_id: str | None = None
    client_key: str | None = None
    """The client's idempotency key for this call, as it sent it (None: derived from the run)."""
    recorded_key: str | None = None
    """The key this call was already dispatched with (recovery runs it again): used as it is."""


class Dispatcher:
    def __init__(self, *, repo: RunRepository, backend: SandboxBackend, config: Config,
                 sleep: Callable[[float], None], rng: random.Random, clock: Callable[[], float],
                 stops: RunStops, files: FileDesk) -> None:
        self.repo = repo
        self.backend = backend
        self.config = config
        self.files = files
        limits = config.limits
        self._retry = RetryPolicy(limits.max_attempts, limits.backoff_initial_s, limits.backoff_max_s)
        self._sleep = sleep
        self._rng = rng
        self._clock = clock
        self.stops = stops
        self._breakers: dict[str, CircuitBreaker] = {}
        self._lock = threading.Lock()
        # Shared by every run: wide enough that runs do not queue behind each other (the engine,
        # not this pool, is the limit); each batch is held to max_parallel_reads by its own
        # semaphore (execute). A pool only max_parallel_reads wide would cap every run together:
        # twenty runs' reads would go four at a time.
        self._pool = ThreadPoolExecutor(max_workers=max(32, limits.max_parallel_reads),
                                        thread_name_prefix="rf-read")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _breaker(self, tool: str) -> CircuitBreaker:
        limits = self.config.limits
        with self._lock:
            return self._breakers.setdefault(
                tool, CircuitBreaker(limits.breaker_threshold, limits.breaker_cooldown_s, self._clock))

    def key_for(self, state: RunState, manifest: ToolManifest, arguments: Mapping[str, Any],
                client_key: str | None = None) -> str | None:
        """A mutating call's idempotency key: the client's (scoped to the tenant), else one
        derived from the tenant, the run and the call's signature. Reads have none."""
        if not manifest.mutates:
            return None
        if client_key is not None:
            return client_idempotency_key(state.tenant, client_key)
        return idempotency_key(state.tenant, state.run_id, manifest.name, arguments)

    def execute(self, state: RunState, admitted: list[Admitted], ctx: otel_context.Context) -> dict[str, Observation]:
        """Reads in parallel, then writes (`serial` tools: they mutate, or write the workspace)
        one at a time, in batch order; every observation is appended before this returns."""
        out: dict[str, Observation] = {}
        reads = [a for a in admitted if not a.manifest.serial]
        writes = [a for a in admitted if a.manifest.serial]
        with self.stops.deadline_watch(state):
            if reads:
                with _tracer.start_as_current_span("parallel", context=ctx, attributes={
                        "ringfence.run_id": state.run_id, "ringfence.calls": len(reads)}):
                    # Handed to each worker explicitly: pool threads start with an empty context.
                    group = otel_context.get_current()
                    if len(reads) == 1:
                        # One read: no thread hand-off to pay for, and its observation goes in
                        # its completion's write.
                        out[reads[0].call_id] = self.dispatch(state, reads[0], group, observe=True)
                    else:
                        # Announced before any claims: the warm pool makes for the reads past its
                        # ready containers now, not after each has missed.
                        self.backend.expect([self._expected_request(state, a) for a in reads
                                             if a.manifest.mcp is None])
                        width = threading.BoundedSemaphore(self.config.limits.max_parallel_reads)

                        def bounded(a: Admitted) -> Observation:
                            with width:
                                return self.dispatch(state, a, group)

                        futures = [self._pool.submit(bounded, a) for a in reads]
                        completions = [f.result() for f in futures]
                        for a, completion in zip(reads, completions, strict=True):  # in batch order
                            out[a.call_id] = self.repo.observe(state, completion)
            for a in writes:
                out[a.call_id] = self.dispatch(state, a, ctx, observe=True)
        return out

    def dispatch(self, state: RunState, a: Admitted, ctx: otel_context.Context, *,
                 observe: bool = False) -> Observation:
        """Run one admitted call; returns its observation, not yet appended unless `observe`:
        then it is appended, for a completed call in the completion's own durable write (group
        commit). Parallel reads leave it to the caller, which appends their observations in
        batch order."""
        obs, observed = self._dispatch(state, a, ctx, observe)
        if observe and not observed:
            return self.repo.observe(state, obs)
        return obs

    def _dispatch(self, state: RunState, a: Admitted, ctx: otel_context.Context,
                  observe: bool) -> tuple[Observation, bool]:
        """dispatch's work: the observation, and whether it was appended already."""
        manifest = a.manifest
        stop = self.stops.get(state)
        if stop is not None:
            return Observation(a.call_id, manifest.name, ObservationStatus.HALTED, False,
                               error=f"{stop.reason}; this call never ran", error_class=stop.outcome.value,
                               verdict_path=(*a.path, f"run:{stop.outcome.value}"), approval_id=a.approval_id), False
        key = a.recorded_key or self.key_for(state, manifest, a.arguments, a.client_key)
        if key is not None and key in state.completions and a.client_key is None:
            # 8 idempotency: recorded completion -> the stored result, no dispatch. Only for a
            # derived key, which is the call's signature: a client's key says nothing about the
            # arguments, so it is judged below against the call that claimed it, in this run
            # exactly as in a later one (other arguments: refused, never a stored result).
            trace.get_current_span(ctx).add_event("idempotency.hit", {
                "gen_ai.tool.name": manifest.name, "gen_ai.tool.call.id": a.call_id})
            return self._deduplicated(a, state.completions[key]["content"]), False
        claim: list[str] = []
        if a.client_key is not None and key is not None and not self._holds_client_key(state, a.call_id, key):
            # A client key spans the tenant's runs: the store holds it, with the call that used it.
            name, holder, events = self.key_claim(key)
            earlier = self._holder_verdict(holder, events, signature(manifest.name, a.arguments))
            if isinstance(earlier, Observation):
                return replace(earlier, call_id=a.call_id, verdict_path=a.path + earlier.verdict_path,
                               approval_id=a.approval_id), False
            if holder is not None:
                return self._deduplicated(a, earlier), False
            claim = [name]
        if manifest.workspace is not None and state.live_volume is None:
            # Admission refuses these; this is the same rule for a call that reaches dispatch
            # another way (an approval decided, recovery), never a container without the mount.
            return Observation(a.call_id, manifest.name, ObservationStatus.DENIED, False,
                               error=f"{manifest.name} uses the run's workspace, and this run has none (any more)",
                               error_class="no_workspace", verdict_path=(*a.path, "workspace:none"),
                               approval_id=a.approval_id), False
        breaker = self._breaker(manifest.name)
        if not breaker.allow():
            return Observation(a.call_id, manifest.name, ObservationStatus.DENIED, False,
                               error=f"circuit open for {manifest.name}: too many recent failures",
                               error_class=FailureClass.CIRCUIT_OPEN.value,
                               verdict_path=(*a.path, "breaker:open"), approval_id=a.approval_id), False
        try:
            self.repo.append(state, DispatchStarted(
                call_id=a.call_id, tool=manifest.name, mutates=manifest.mutates, idempotency_key=key,
                arguments=dict(a.arguments), signature=signature(manifest.name, a.arguments),
                client_key=a.client_key, verdict_path=a.path, approval_id=a.approval_id),
                keys=claim)
            crash_point("after_dispatch_started", manifest.name)
        except KeyTaken:
            # Another run claimed the same client key a moment ago: answer as if we had seen it.
            assert key is not None  # only a claimed key can be taken, and only a key is claimed
            _name, holder, events = self.key_claim(key)
            earlier = self._holder_verdict(holder, events, signature(manifest.name, a.arguments))
            if holder is None:
                # That claim was released already (its call never started): the key is free,
                # but this call lost its turn; the caller sends it again.
                earlier = _in_doubt(manifest.name)
            if isinstance(earlier, Observation):
                return replace(earlier, call_id=a.call_id, verdict_path=a.path + earlier.verdict_path,
                               approval_id=a.approval_id), False
            return self._deduplicated(a, earlier), False
        profile = self.profile(manifest, state)
        # The parent is the argument, never the thread's current context: on a pool thread
        # there is none, and the span would float free as a root of its own.
        with _tracer.start_as_current_span(
                "execute_tool", context=ctx, kind=trace.SpanKind.INTERNAL,
                attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": manifest.name,
                            "gen_ai.tool.call.id": a.call_id, "ringfence.run_id": state.run_id,
                            "ringfence.verdict_path": " > ".join(a.path),
                            "ringfence.approval_id": a.approval_id or "",
                            "ringfence.idempotency.hit": False,
                            **spans.tool_attributes(manifest, profile, a.arguments)}) as span:
            tool_ctx = otel_context.get_current()
            # Attempts of an earlier dispatch of this call (recovery runs it again) may have
            # reached a container: then it is never reported as not started.
            tried_before = a.call_id in state.attempts
            tried: list[Attempt] = []
            # The last attempt's event is written with the completion, in one durable write
            # (group commit); an attempt that is followed by another is written before it starts.
            # A crash between the two loses nothing a crash at `after_effect` would not.
            unwritten: list[AttemptFinished] = []
            request_body = json.dumps({"tool": manifest.name, "arguments": a.arguments, "call_id": a.call_id,
                                       "idempotency_key": key}, separators=(",", ":")).encode()

            def attempt(n: int) -> Attempt:
                if unwritten:
                    self.repo.append(state, unwritten.pop())
                started_ns = time.time_ns()
                if n > 1 and not breaker.allow():
                    result = Attempt(n, FailureClass.CIRCUIT_OPEN, message="circuit opened during retries")
                else:
                    result = self._attempt(state, a, profile, request_body, n, key=key)
                    breaker.record(result.failure)
                tried.append(result)
                spans.attempt_span(tool_ctx, started_ns, time.time_ns(), result)
                unwritten.append(AttemptFinished(
                    call_id=a.call_id, attempt=n, failure_class=result.failure.value if result.failure else None,
                    outcome=result.outcome, message=guardrails.redact(result.message[:1000]),
                    retry_after_s=result.retry_after_s, duration_ms=result.duration_ms,
                    setup_ms=result.setup_ms, image_id=result.image_id, runtime=result.runtime,
                    worker=result.worker))
                return result

            final = retry_call(attempt, self._retry, sleep=self._sleep, rng=self._rng)
            attempts = final.number  # the last attempt's number, as its event will record it
            # Every attempt failed before a container existed: the call never ran (not executed,
            # and its client key, if any, is free again: key_claim).
            executed = tried_before or not all(never_started(t) for t in tried)
            span.set_attribute("ringfence.attempts", attempts)
            span.set_attribute("ringfence.outcome", final.outcome or "")
            if final.image_id:
                span.set_attribute("container.image.id", final.image_id)
            if final.ok:
                span.set_attribute("ringfence.result.bytes", spans.digest_of(final.content)[0])
            if final.failure:
                span.set_attribute("error.type", final.failure.value)
                # The failure's class, not its message: a tool's message can quote its input.
                span.set_status(trace.Status(trace.StatusCode.ERROR, final.failure.value))
        # 10 completion, after the tool returned. The result guardrail's verdict is computed first
        # so that the durable record (and any deduplicated replay of it) never holds the secret.
        guard = guardrails.check_result(final.content) if final.ok else None
        completion = CallCompleted(
            call_id=a.call_id, tool=manifest.name, mutates=manifest.mutates, idempotency_key=key, ok=final.ok,
            content=guard.content if guard else None,
            guard=ResultGuard(guard.action.value, tuple(guard.redacted), guard.reason) if guard else None,
            error=None if final.ok else guardrails.redact((final.message or str(final.failure))[:2000]),
            error_class=final.failure.value if final.failure else None,
            attempts=attempts, cost=manifest.cost * attempts, executed=executed)
        # 11 result guardrail, then the observation
        observation = completion_observation(completion, a.path, a.approval_id)
        collects = final.ok and bool(manifest.outputs)  # the artifacts' event comes between the two
        settled: list[tuple[EventPayload, tuple[str, ...]]] = [*((e, ()) for e in unwritten), (completion, ())]
        if observe and not collects:
            settled.append((CallObserved.of(observation), ()))
        self.repo.append_all(state, settled)
        crash_point("after_completion", manifest.name)
        if collects:
            self._collect_outputs(state, a.call_id, manifest)
        if observe and not collects:
            return state.trajectory[a.call_id], True
        return observation, False

    def _collect_outputs(self, state: RunState, call_id: str, manifest: ToolManifest) -> None:
        """The tool's declared outputs into the run's artifacts (an `artifact_collected` event).
        The call succeeded, and stays a success: what the file desk refuses (its ControlErrors,
        the sandbox's errors) is logged and every output listed missing. A bug, or the store
        failing (the log cannot be written: nothing else of the call could be either), fails
        the dispatch like any other."""
        try:
            self.files.collect_outputs(state, call_id, manifest)
        except (Internal, StoreError):
            raise
        except (ControlError, SandboxError) as e:
            log.warning("run %s call %s: outputs of %s not collected: %s", state.run_id, call_id, manifest.name, e)
            self.repo.append(state, ArtifactCollected(call_id=call_id, files=(),
                                                      missing=tuple(sorted(set(manifest.outputs)))))

    def _holds_client_key(self, state: RunState, call_id: str, key: str) -> bool:
        """This very call claimed the key before (recovery runs it again after a restart)."""
        _name, holder, events = self.key_claim(key)
        if holder is None or holder[0] != state.key:
            return False
        started = _claiming_dispatch(events, holder[1])
        return started is not None and started.call_id == call_id

    def key_claim(self, key: str) -> tuple[str, tuple[str, int] | None, list[Event]]:
        """The claim that speaks for a client key now: (its store key name, the (run, seq) of
        the `dispatch_started` holding it or None when it is free, that run's events from the
        holder on). A claim whose call completed without ever starting (every attempt failed
        before a container existed: `executed` false) released the key: the next generation's
        claim speaks instead, and the first free one is where the key is claimed again."""
        generation = 1
        while True:
            name = client_key_name(key, generation)
            holder = self.repo.store.lookup_key(name)
            if holder is None:
                return name, None, []
            events = self.repo.store.read(holder[0], holder[1])
            if not _released(events, holder[1]):
                return name, holder, events
            generation += 1

    def lookup(self, state: RunState, call_id: str, manifest: ToolManifest, arguments: Mapping[str, Any]) -> Attempt:
        """Run a read-only look-up tool for `call_id` (reconciliation): retried like any read,
        recorded only through the egress events of its attempts, never as a call of its own."""
        admitted = Admitted(f"{call_id}.lookup", manifest, arguments, ())
        body = json.dumps({"tool": manifest.name, "arguments": dict(arguments), "call_id": admitted.call_id,
                           "idempotency_key": None}, separators=(",", ":")).encode()
        profile = self.profile(manifest, state)
        return retry_call(lambda n: self._attempt(state, admitted, profile, body, n, live=False), self._retry,
                          sleep=self._sleep, rng=self._rng)

    @staticmethod
    def _deduplicated(a: Admitted, content: Any) -> Observation:
        return Observation(a.call_id, a.manifest.name, ObservationStatus.DEDUPLICATED, False, content=content,
                           verdict_path=(*a.path, "idempotency:deduplicated"), approval_id=a.approval_id)

    def client_key_holder(self, state: RunState, key: str, call_signature: str) -> Any:
        """What an earlier use of a client key says about this call: None (never used, or only
        by calls that never started), the recorded result's content (used for the same call,
        completed: deduplicate), or an Observation refusing it (used for other arguments, or
        its outcome is not known yet)."""
        _name, holder, events = self.key_claim(key)
        return self._holder_verdict(holder, events, call_signature)

    @staticmethod
    def _holder_verdict(holder: tuple[str, int] | None, events: list[Event], call_signature: str) -> Any:
        """client_key_holder's answer from the claim key_claim found."""
        if holder is None:
            return None
        started = _claiming_dispatch(events, holder[1])
        tool = started.tool if started is not None else "?"
        if started is None or started.signature != call_signature:
            return Observation("", tool, ObservationStatus.DENIED, False,
                               error="this idempotency key was already used for a call with other arguments; "
                                     "nothing was run", error_class="idempotency_key_reused",
                               verdict_path=("idempotency:conflict",))
        completed = _completion_of(events, started.call_id)
        if completed is not None and completed.ok:
            return completed.content
        return _in_doubt(tool)

    def profile(self, manifest: ToolManifest, state: RunState | None = None) -> SandboxProfile:
        """The sandbox of one call of `manifest` (in `state`'s run: its workspace, if the tool
        uses one and the run has it)."""
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
            # The call's allowlist is its tool's declared hosts AND what policy grants (resource
            # policy has already refused private and metadata targets in its arguments); the
            # sandbox puts the call behind the egress proxy with exactly it. Nothing granted:
            # the call runs with no network at all.
            from ringfence_server.sandbox.egress.grant import EgressGrant

            extra["egress"] = EgressGrant(allow=allowlist)
        volume = state.live_volume if state is not None and manifest.workspace is not None else None
        if volume is not None:
            extra["workspace"] = WorkspaceMount(volume, read_only=manifest.workspace == "read")
        return SandboxProfile(image=manifest.image, runtime=manifest.runtime, memory_bytes=lim.memory_bytes,
                              cpus=lim.cpus, pids=lim.pids, timeout_s=lim.timeout_s, stdout_limit=lim.stdout_limit,
                              stderr_limit=lim.stderr_limit, inputs=tuple(inputs), **extra)

    def _expected_request(self, state: RunState, a: Admitted) -> SandboxRequest:
        """What `a`'s first attempt will ask the sandbox for, as far as its container's shape
        goes (the body is the attempt's own)."""
        return SandboxRequest(profile=self.profile(a.manifest, state), run_id=sandbox_run_id(state),
                              warm=a.manifest.name not in self.config.pool.exclude)

    def _attempt(self, state: RunState, a: Admitted, profile: SandboxProfile, body: bytes, n: int, *,
                 live: bool = True, key: str | None = None) -> Attempt:
        # The call's output, as it runs, becomes call_output events (a reconciliation look-up is
        # not a call of the run: `live` False).
        output = LiveOutput(repo=self.repo, state=state, call_id=a.call_id, attempt=n, clock=self._clock,
                            protocol_stdout=True) if live else None
        warm = a.manifest.name not in self.config.pool.exclude
        request = SandboxRequest(profile=profile, argv=(), stdin=body, run_id=sandbox_run_id(state),
                                 call_id=f"{a.call_id}.a{n}", warm=warm, on_output=output)
        binding = a.manifest.mcp
        if binding is not None:
            # A declared MCP server's tool: the call goes to the run's session sandbox of that
            # server (ringfence_server.sandbox.mcp_session), with the same profile, caps and
            # classification as any call; `key` (the body's idempotency key) travels in _meta.
            request = SandboxRequest(profile=profile, argv=binding.command, run_id=sandbox_run_id(state),
                                     call_id=f"{a.call_id}.a{n}", warm=False,
                                     mcp=McpCall(server=binding.server, tool=binding.tool,
                                                 arguments=dict(a.arguments), mutates=a.manifest.mutates,
                                                 idempotency_key=key, owner=state.tenant))
        try:
            try:
                result = self.backend.run(request)
            finally:
                if output is not None:
                    output.close()  # what is left of a partial line, before the attempt event
            crash_point("after_effect", a.manifest.name)
        except EngineError as e:
            # The engine, not the tool: like start_failed, transient.
            return Attempt(n, FailureClass.TRANSIENT, message=f"sandbox engine: {e}", outcome="start_failed")
        except ImageError as e:
            return Attempt(n, FailureClass.FATAL, message=f"image refused: {e}", outcome="start_failed")
        except SandboxError as e:
            return Attempt(n, FailureClass.FATAL, message=f"sandbox: {e}", outcome="start_failed")
        if result.egress_events:
            # Every decision of the egress proxy becomes an event of the call.
            self.repo.append(state, EgressDecided(call_id=a.call_id, attempt=n,
                                                  decisions=tuple(dict(e) for e in result.egress_events)))
        failure = classify(result)
        if failure is FailureClass.UNCERTAIN and not a.manifest.mutates:
            # A read that may or may not have run had no effect either way: try it again.
            failure = FailureClass.TRANSIENT
        if failure is None:
            try:
                # Strict JSON: NaN and Infinity fail the call here, as the tool's fault; the
                # store would refuse them later, and the run would end `error` instead.
                content = read_success(result.stdout)
            except (ValueError, IndexError, UnicodeDecodeError) as e:
                return Attempt(n, FailureClass.FATAL, message=f"tool output is not the runner protocol: {e}",
                               duration_ms=result.duration_ms, outcome=result.outcome.value,
                               setup_ms=result.setup_ms, image_id=result.image_id, runtime=result.runtime,
                               warm=result.warm, worker=result.worker or None)
            return Attempt(n, None, content=content, duration_ms=result.duration_ms,
                           outcome=result.outcome.value, setup_ms=result.setup_ms, image_id=result.image_id,
                           runtime=result.runtime, warm=result.warm, worker=result.worker or None)
        message = result.message or f"{result.outcome.value}"
        return Attempt(n, failure, message=message, retry_after_s=result.retry_after_s,
                       duration_ms=result.duration_ms, outcome=result.outcome.value, setup_ms=result.setup_ms,
                       image_id=result.image_id, runtime=result.runtime, warm=result.warm,
                       worker=result.worker or None)


def completion_observation(completion: CallCompleted, path: tuple[str, ...], approval_id: str | None) -> Observation:
    """The observation of a recorded completion (also what recovery writes for a completion
    whose observation was lost in a crash)."""
    call_id, tool, attempts = completion.call_id, completion.tool, completion.attempts
    if not completion.ok and not completion.executed:
        # No attempt reached a container (a completion written before `executed` existed
        # counts as executed): the call never ran, and may be sent again, with its key.
        return Observation(call_id, tool, ObservationStatus.DENIED, False, error=completion.error,
                           error_class=completion.error_class, verdict_path=(*path, "sandbox:not_started"),
                           approval_id=approval_id, attempts=attempts)
    if not completion.ok:
        return Observation(call_id, tool, ObservationStatus.EXECUTED, True, error=completion.error,
                           error_class=completion.error_class, verdict_path=(*path, "executed:failed"),
                           approval_id=approval_id, attempts=attempts)
    # 11 the result guardrail's verdict (recorded with the completion; computed here for a
    # completion written without one)
    guard = completion.guard
    content = completion.content
    if guard is None:
        checked = guardrails.check_result(completion.content)
        guard = ResultGuard(checked.action.value, tuple(checked.redacted), checked.reason)
        content = checked.content
    if guard.action == guardrails.Action.BLOCK.value:
        # The tool ran (its effect, if any, happened): the result is withheld, not the call blocked.
        return Observation(call_id, tool, ObservationStatus.WITHHELD, True, error=guard.reason,
                           error_class="secret_in_result", verdict_path=(*path, "result:blocked"),
                           approval_id=approval_id, attempts=attempts)
    suffix = ("result:redacted",) if guard.redacted else ("result:ok",)
    return Observation(call_id, tool, ObservationStatus.EXECUTED, True, content=content,
                       error=guard.reason or None, verdict_path=path + suffix, approval_id=approval_id,
                       attempts=attempts)


def _in_doubt(tool: str) -> Observation:
    """The refusal of a client key whose call may have run and has no successful result."""
    return Observation("", tool, ObservationStatus.DENIED, False,
                       error="this idempotency key belongs to a call that did not complete successfully (or "
                             "has not completed yet); it is not run again: use a new key to try again",
                       error_class="idempotency_key_in_doubt", verdict_path=("idempotency:in_doubt",))


def _released(events: list[Event], seq: int) -> bool:
    """Whether the claim at `seq` (its `dispatch_started`, first of `events`) was released:
    its call completed without any attempt reaching a container."""
    started = _claiming_dispatch(events, seq)
    completed = _completion_of(events, started.call_id) if started is not None else None
    return completed is not None and not completed.executed and not completed.ok


def _claiming_dispatch(events: list[Event], seq: int) -> DispatchStarted | None:
    """The `dispatch_started` at `seq` that claimed a client key, first of `events` (a run's
    events from the claim on); None when the store holds no such event there."""
    if not events or events[0].seq != seq:
        return None
    first = payload_of(events[0])
    return first if isinstance(first, DispatchStarted) else None


def _completion_of(events: list[Event], call_id: str) -> CallCompleted | None:
    """The first `call_completed` of `call_id` among `events`."""
    for event in events:
        match payload_of(event):
            case CallCompleted() as completed if completed.call_id == call_id:
                return completed
    return None
