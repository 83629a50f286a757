"""The run's spans tell the truth: one root per run, every span under the right parent (across
the worker threads the reads run on), an approval wait between admission and execution, the
caller's span linked, and nothing in any attribute that could hold a secret.

The orchestrator is real (its store a real SQLite file); the sandbox is the fake backend, which
is what makes the shapes exact. The same shapes are checked through a real server and a real
OTLP receiver in tests/e2e/test_otlp_export.py.
"""

from __future__ import annotations

import pytest
from control_support import APPROVER, Harness
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ringfence_server.control.orchestration import dispatch as dispatch_module

SECRET = "AKIAIOSFODNN7EXAMPLE"


def of_run(exporter: InMemorySpanExporter, run_id: str) -> list:
    """Every span of the run's trace (the trace of its invoke_agent root)."""
    finished = exporter.get_finished_spans()
    roots = [s for s in finished if s.name == "invoke_agent" and (s.attributes or {}).get("ringfence.run_id") == run_id]
    traces = {r.context.trace_id for r in roots}
    return [s for s in finished if s.context.trace_id in traces]


def named(spans_, name: str) -> list:
    return [s for s in spans_ if s.name == name]


def parent_of(span) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_one_root_admission_parallel_reads_and_serial_writes(tmp_path, spans):
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("echo", {"text": "1"}), ("echo", {"text": "2"}), ("write_note", {"name": "n", "text": "x"}),
             ("read_file", {"path": "/etc/passwd"}))
    h.submit(run, ("write_note", {"name": "m", "text": "y"}))
    got = of_run(spans, run)
    [root] = [s for s in got if s.parent is None]
    assert root.name == "invoke_agent" and root.attributes["gen_ai.operation.name"] == "invoke_agent"
    batches = named(got, "batch")
    assert len(batches) == 2 and all(parent_of(b) == root.context.span_id for b in batches)
    first, second = sorted(batches, key=lambda s: s.start_time)
    # Each batch: an admission child, judged before anything of the batch ran.
    admissions = named(got, "admission")
    assert sorted(parent_of(a) for a in admissions) == sorted(b.context.span_id for b in batches)
    [first_admission] = [a for a in admissions if parent_of(a) == first.context.span_id]
    assert first_admission.attributes["ringfence.calls"] == 4
    assert first_admission.attributes["ringfence.verdicts.allow"] == 3
    assert first_admission.attributes["ringfence.verdicts.deny"] == 1
    # The reads: under the batch's parallel group, each on a worker thread, never a root.
    [group] = named(got, "parallel")
    assert parent_of(group) == first.context.span_id and group.attributes["ringfence.calls"] == 2
    tools = named(got, "execute_tool")
    reads = [t for t in tools if t.attributes["gen_ai.tool.name"] == "echo"]
    writes = [t for t in tools if t.attributes["gen_ai.tool.name"] == "write_note"]
    assert len(reads) == 2 and all(parent_of(t) == group.context.span_id for t in reads)
    # The writes: directly under their batch, after the reads.
    assert sorted(parent_of(w) for w in writes) == sorted([first.context.span_id, second.context.span_id])
    first_write = next(w for w in writes if parent_of(w) == first.context.span_id)
    assert first_write.start_time >= max(r.end_time for r in reads)
    assert first_admission.end_time <= min(t.start_time for t in tools)
    # The denied read never became an execute_tool span.
    assert sorted(t.attributes["gen_ai.tool.call.id"] for t in tools) == ["c1", "c2", "c3", "c5"]
    # One trace for the whole run.
    assert {s.context.trace_id for s in got} == {root.context.trace_id}


def test_execute_tool_says_what_ran_and_under_which_ceilings(tmp_path, spans):
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("write_note", {"name": "n", "text": "x"}))
    [tool] = named(of_run(spans, run), "execute_tool")
    a = tool.attributes
    assert (a["gen_ai.operation.name"], a["gen_ai.tool.name"], a["gen_ai.tool.call.id"]) == (
        "execute_tool", "write_note", "c1")
    assert a["ringfence.verdict_path"].endswith("admitted") and a["ringfence.idempotency.hit"] is False
    assert a["ringfence.attempts"] == 1 and a["ringfence.outcome"] == "ok" and a["ringfence.tool.mutates"] is True
    assert a["ringfence.limits.memory_bytes"] > 0 and a["ringfence.limits.timeout_s"] > 0
    assert a["ringfence.limits.pids"] > 0 and a["ringfence.sandbox.runtime"] == "runc"
    assert len(a["ringfence.arguments.sha256"]) == 64 and a["ringfence.arguments.bytes"] > 0
    assert a["ringfence.result.bytes"] > 0
    # Each try: an attempt span under the tool's span.
    [attempt] = [s for s in of_run(spans, run) if s.name == "attempt"]
    assert parent_of(attempt) == tool.context.span_id and attempt.attributes["ringfence.attempt"] == 1


def test_retries_are_attempt_spans_and_a_failure_is_its_class(tmp_path, spans):
    from control_support import error_result

    h = Harness(tmp_path, rules=[{"tool": "fail", "verdict": "allow"}])
    flaky = iter(["transient", None])
    h.emulator.overrides["fail"] = lambda call: error_result(cls) if (cls := next(flaky)) else {"ok": 1}
    run = h.run()
    h.submit(run, ("fail", {"class": "transient"}))
    got = of_run(spans, run)
    [tool] = named(got, "execute_tool")
    attempts = sorted(named(got, "attempt"), key=lambda s: s.attributes["ringfence.attempt"])
    assert [s.attributes["ringfence.attempt"] for s in attempts] == [1, 2]
    assert attempts[0].attributes["error.type"] == "transient" and "error.type" not in attempts[1].attributes
    assert all(parent_of(s) == tool.context.span_id for s in attempts)
    assert tool.attributes["ringfence.attempts"] == 2


def test_an_approval_wait_sits_between_admission_and_execution(tmp_path, spans):
    h = Harness(tmp_path)
    run = h.run()
    [asked] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    h.clock.advance(30)  # the approver takes half a minute
    h.orch.decide_approval(APPROVER, asked.approval_id, True, "fine")
    got = of_run(spans, run)
    [root] = [s for s in got if s.parent is None]
    [admission] = named(got, "admission")
    [wait] = named(got, "approval_wait")
    [tool] = named(got, "execute_tool")
    resumed = next(b for b in named(got, "batch") if b.attributes.get("ringfence.resumed"))
    assert parent_of(wait) == root.context.span_id and parent_of(resumed) == root.context.span_id
    assert parent_of(tool) == resumed.context.span_id
    assert wait.attributes["ringfence.approval.decision"] == "approved"
    assert wait.attributes["ringfence.approval_id"] == asked.approval_id
    assert (wait.end_time - wait.start_time) == pytest.approx(30e9, rel=0.01)
    # In time: judged, then waited, then run.
    assert admission.end_time <= wait.end_time <= tool.start_time


def test_a_declined_approval_is_a_wait_that_ends_declined_and_nothing_runs(tmp_path, spans):
    h = Harness(tmp_path)
    run = h.run()
    [asked] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    h.orch.decide_approval(APPROVER, asked.approval_id, False, "no")
    got = of_run(spans, run)
    [wait] = named(got, "approval_wait")
    assert wait.attributes["ringfence.approval.decision"] == "declined"
    assert named(got, "execute_tool") == []


def test_a_deduplicated_call_is_an_event_on_its_batch_not_an_execution(tmp_path, spans):
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("write_note", {"name": "n", "text": "x"}))
    h.submit(run, ("write_note", {"name": "n", "text": "x"}))
    got = of_run(spans, run)
    assert len(named(got, "execute_tool")) == 1
    second = max(named(got, "batch"), key=lambda s: s.start_time)
    [hit] = [e for e in second.events if e.name == "idempotency.hit"]
    assert hit.attributes["gen_ai.tool.call.id"] == "c2"


def test_the_run_root_links_to_the_callers_span(tmp_path, spans):
    h = Harness(tmp_path)
    caller = trace.get_tracer("a caller").start_span("agent turn")
    with trace.use_span(caller, end_on_exit=True):
        run = h.run()
    [root] = [s for s in of_run(spans, run) if s.parent is None]
    [link] = root.links
    assert link.context.trace_id == caller.get_span_context().trace_id
    assert link.context.span_id == caller.get_span_context().span_id
    # A trace of its own: the run outlives the RPC that started it.
    assert root.context.trace_id != caller.get_span_context().trace_id


def test_no_argument_or_output_reaches_any_attribute(tmp_path, spans):
    h = Harness(tmp_path)
    h.emulator.overrides["write_note"] = lambda call: {"echo": f"output-{SECRET}"}
    run = h.run()
    h.submit(run, ("write_note", {"name": "n", "text": "plain words for a note"}),
             ("echo", {"text": SECRET}))  # the guardrail blocks this one
    got = of_run(spans, run)
    assert named(got, "execute_tool")
    for s in got:
        values = [str(v) for v in s.attributes.values()] + [str(v) for e in s.events for v in e.attributes.values()]
        values.append(s.status.description or "")
        assert not any(SECRET in v or "plain words" in v for v in values), (s.name, s.attributes)


def test_reads_float_free_without_the_explicit_context(tmp_path, spans, monkeypatch):
    """The red check of the shape test, kept: dispatch on a worker thread with the thread's own
    (empty) context instead of the parent it is handed, and the reads become roots."""
    original = dispatch_module.Dispatcher.dispatch

    def careless(self, state, a, ctx):
        from opentelemetry import context as otel_context

        return original(self, state, a, otel_context.get_current())

    monkeypatch.setattr(dispatch_module.Dispatcher, "dispatch", careless)
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("echo", {"text": "1"}), ("echo", {"text": "2"}))
    everything = spans.get_finished_spans()
    reads = [s for s in everything if s.name == "execute_tool" and s.attributes.get("ringfence.run_id") == run]
    assert len(reads) == 2 and all(s.parent is None for s in reads)  # what the shape test forbids


def test_a_trys_sandbox_is_a_container_start_or_a_warm_claim(spans):
    """Under each attempt: `container_start` when a container was started for it, `warm_claim`
    when a warm pool container served it (even a claim under a millisecond), then `tool`."""
    import time

    from opentelemetry import context as otel_context

    from ringfence_server.control.orchestration import spans as spans_module
    from ringfence_server.control.retry import Attempt

    tracer = trace.get_tracer("test")
    children: dict[str, list[str]] = {}
    for label, attempt in (("cold", Attempt(1, None, setup_ms=250, duration_ms=40)),
                           ("warm", Attempt(1, None, setup_ms=0, duration_ms=40, warm=True))):
        with tracer.start_as_current_span(f"execute_tool {label}") as parent:
            started = time.time_ns()
            spans_module.attempt_span(otel_context.get_current(), started, started + 400_000_000, attempt)
        finished = spans.get_finished_spans()
        parent_id = parent.get_span_context().span_id
        [attempt_span] = [s for s in finished if s.name == "attempt" and parent_of(s) == parent_id]
        children[label] = [s.name for s in sorted(finished, key=lambda s: s.start_time)
                           if parent_of(s) == attempt_span.context.span_id]
    assert children == {"cold": ["container_start", "tool"], "warm": ["warm_claim", "tool"]}
