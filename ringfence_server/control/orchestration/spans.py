"""The run's spans, after the OpenTelemetry GenAI conventions, and what they may carry.

    invoke_agent                 the run's one root (StartRun); linked to the caller's span
    ├─ batch                     one per SubmitBatch / ExecutePlan
    │  ├─ admission              every call of the batch judged before any runs
    │  ├─ parallel               the batch's reads, run at the same time on worker threads
    │  │  └─ execute_tool        one per dispatched call
    │  │     └─ attempt          one per try: container_start, then tool
    │  └─ execute_tool           the writes, one after the other, after the reads
    ├─ approval_wait             from the ask to the decision (or expiry)
    └─ batch (resumed)           an approved call, dispatched when the decision came

Context crosses threads explicitly: the parent is always passed as an argument (the worker
pool does not inherit contextvars), never taken from whatever is current.

What a span may carry: names, ids, verdicts, counts, sizes, digests, durations. Never a call's
arguments, a tool's output, a reason a tool wrote, or anything else that can hold a secret.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from ringfence_server.control.state import RunState

if TYPE_CHECKING:
    from ringfence.model import Approval
    from ringfence_server.control.registry import ToolManifest
    from ringfence_server.control.retry import Attempt
    from ringfence_server.sandbox.profile import SandboxProfile

tracer = trace.get_tracer("ringfence.control")


def start_run_trace(run_id: str, tenant: str) -> dict[str, str]:
    """The run's root span (`invoke_agent`), begun and ended at StartRun; its ids, for the log
    (empty when tracing is off). The run is a trace of its own (it outlives the RPC that started
    it, and its later batches come from other RPCs), linked to the caller's span when there is one."""
    caller = trace.get_current_span().get_span_context()
    with tracer.start_as_current_span("invoke_agent", context=otel_context.Context(),
                                      links=[trace.Link(caller)] if caller.is_valid else [],
                                      attributes={"gen_ai.operation.name": "invoke_agent",
                                                  "ringfence.run_id": run_id,
                                                  "ringfence.tenant": tenant}) as span:
        ctx = span.get_span_context()
        return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"} if ctx.is_valid else {}


def run_context(state: RunState) -> otel_context.Context:
    """The run's root span as a parent: one trace per run, across batches and restarts."""
    t = state.trace
    if not t.get("trace_id"):
        return otel_context.Context()
    parent = trace.SpanContext(trace_id=int(t["trace_id"], 16), span_id=int(t["span_id"], 16),
                               is_remote=False, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def digest_of(value: Any) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of a value's canonical JSON: what a span says about content."""
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return len(data), hashlib.sha256(data).hexdigest()


def tool_attributes(manifest: ToolManifest, profile: SandboxProfile, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The execute_tool span's attributes known before it runs: the ceilings applied, the
    arguments' size and digest."""
    size, sha = digest_of(dict(arguments))
    egress = profile.egress.allow if profile.egress is not None else ()
    return {
        "ringfence.tool.mutates": manifest.mutates,
        "ringfence.arguments.bytes": size,
        "ringfence.arguments.sha256": sha,
        "ringfence.limits.memory_bytes": profile.memory_bytes,
        "ringfence.limits.cpus": profile.cpus,
        "ringfence.limits.pids": profile.pids,
        "ringfence.limits.timeout_s": profile.timeout_s,
        "ringfence.limits.stdout_bytes": profile.stdout_limit,
        "ringfence.egress.hosts": len(egress),
        "ringfence.sandbox.runtime": profile.runtime,
    }


def attempt_span(parent: otel_context.Context, started_ns: int, ended_ns: int, result: Attempt) -> None:
    """One try, with the sandbox's start and the tool's run as its two children (their times
    come from the backend: setup_ms, then duration_ms). A try in a warm pool container has
    `warm_claim` where a cold one has `container_start`: its sandbox was started before the
    call, and what it waited for was the claim (often under a millisecond, still shown)."""
    span = tracer.start_span("attempt", context=parent, start_time=started_ns, attributes={
        "ringfence.attempt": result.number, "ringfence.outcome": result.outcome or "",
        **({"error.type": result.failure.value} if result.failure else {})})
    inside = trace.set_span_in_context(span, parent)
    setup_end = min(started_ns + result.setup_ms * 1_000_000, ended_ns)
    if result.warm:
        tracer.start_span("warm_claim", context=inside, start_time=started_ns).end(end_time=setup_end)
    elif result.setup_ms:
        tracer.start_span("container_start", context=inside, start_time=started_ns).end(end_time=setup_end)
    if result.duration_ms:
        tool_end = min(setup_end + result.duration_ms * 1_000_000, ended_ns)
        tracer.start_span("tool", context=inside, start_time=setup_end,
                          attributes={"ringfence.outcome": result.outcome or ""}).end(end_time=tool_end)
    span.end(end_time=ended_ns)


def approval_wait(parent: otel_context.Context, approval: Approval, decision: str, now: float) -> None:
    """From the ask to its decision or expiry, under the run's root. `now` is the orchestrator's
    clock (which set the approval's created_at): the wait's length is measured on it and laid
    back from this moment of wall time, so the span sits where it happened among the others."""
    end_ns = time.time_ns()
    waited_ns = _ns(max(now - approval.created_at, 0.0))
    tracer.start_span("approval_wait", context=parent, start_time=end_ns - waited_ns, attributes={
        "ringfence.run_id": approval.run_id, "ringfence.approval_id": approval.approval_id,
        "gen_ai.tool.name": approval.tool, "gen_ai.tool.call.id": approval.call_id,
        "ringfence.approval.kind": approval.kind.value, "ringfence.approval.decision": decision,
    }).end(end_time=end_ns)
