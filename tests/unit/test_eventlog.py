"""ringfence_server.control.eventlog: one JSON line per event, with the run's ids and trace id, and no secret.

The run goes through the real Orchestrator (control_support.Harness: a real SQLite log, the
FakeBackend answering like the tools); the secrets are sent where a careless log would copy
them: arguments that execute, arguments the guardrail blocks, a tool's output, a tool's error
message, a path the resource policy refuses, a value that fails validation, an approver's
reason. Some are strings no scanner recognises, so redaction cannot be what keeps them out.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import uuid
from typing import ClassVar

import pytest
from control_support import AGENT, APPROVER, Harness
from opentelemetry import trace

from ringfence_server.control.eventlog import EventLogger, JsonFormatter, configure_logging, fan_out

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"  # the scanner finds it: the call is BLOCKED
ARG_SECRET = "correct-horse-battery-staple"  # no scanner finds it: the call runs
OUT_SECRET = "tool-output-xyzzy-plugh"
ERROR_SECRET = "leaky-message-quux"
PATH_SECRET = "secret-path-frobnicate"
INVALID_SECRET = "invalid-value-zork"
SECRETS = (AWS_KEY, ARG_SECRET, OUT_SECRET, ERROR_SECRET, PATH_SECRET, INVALID_SECRET)


def json_logger() -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    logger = logging.getLogger(f"test.eventlog.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    return logger, out


def test_one_json_line_per_event_with_ids_and_no_secret(tmp_path, spans):
    h = Harness(tmp_path)
    logger, out = json_logger()
    h.orch.on_event = EventLogger(logger).observe
    h.emulator.overrides["echo"] = lambda call: {"echoed": call.arguments, "said": OUT_SECRET}
    run = h.run("find the incident")
    h.submit(run, ("echo", {"text": ARG_SECRET}),  # runs: its arguments and output hold secrets
             ("echo", {"text": f"key {AWS_KEY}"}),  # blocked by the guardrail
             ("fail", {"class": "fatal", "message": ERROR_SECRET}),  # the tool's error message
             ("read_file", {"path": f"/etc/{PATH_SECRET}"}),  # denied, the reason names the path
             ("echo", {"text": [INVALID_SECRET]}),  # invalid, jsonschema quotes the value
             ("credit", {"account": "acme-9", "amount": 50}))  # asks
    [approval] = h.orch.list_approvals(APPROVER, run)
    h.orch.decide_approval(APPROVER, approval.approval_id, True, f"fine, but not {AWS_KEY}")
    h.orch.finish_run(AGENT, run)

    text = out.getvalue()
    for secret in SECRETS:
        assert secret not in text, secret
    lines = [json.loads(line) for line in text.splitlines()]
    events = h.events(run)
    assert [(d["seq"], d["event"]) for d in lines] == [(e.seq, e.type) for e in events]
    [root] = [s for s in spans.get_finished_spans()
              if s.name == "invoke_agent" and s.attributes.get("ringfence.run_id") == run]
    trace_id = f"{root.context.trace_id:032x}"
    for line, event in zip(lines, events, strict=True):  # one line per event, as asserted above
        assert line["run_id"] == run and line["tenant"] == "acme" and line["trace_id"] == trace_id, line
        assert line["level"] in ("info", "warning") and line["ts"].endswith("Z")
        if "call_id" in event.data:
            assert line["call_id"] == event.data["call_id"], line
        for field in ("arguments", "content", "goal"):
            if field in line:  # content is only ever measured
                assert set(line[field]) == {"bytes", "sha256"}, line
    by_type = {}
    for line in lines:
        by_type.setdefault(line["event"], []).append(line)
    assert {d["call_id"]: d["verdict"] for d in by_type["call_decided"]} == {
        "c1": "allow", "c2": "block", "c3": "allow", "c4": "deny", "c5": "invalid", "c6": "ask"}
    assert {d["call_id"]: d["status"] for d in by_type["observation"]} == {
        "c1": "executed", "c2": "blocked", "c3": "executed", "c4": "denied", "c5": "denied", "c6": "executed"}
    assert {d["call_id"]: d.get("error_class") for d in by_type["observation"]} == {
        "c1": None, "c2": "secret", "c3": "fatal", "c4": "resource", "c5": "invalid_arguments", "c6": None}
    assert {d["call_id"] for d in by_type["observation"] if d["level"] == "warning"} == {"c2", "c3", "c4", "c5"}
    assert [d["call_id"] for d in by_type["approval_decided"]] == ["c6"]
    assert by_type["approval_decided"][0]["reason"] == "fine, but not [REDACTED:aws_access_key]"
    assert [d["level"] for d in by_type["call_decided"]] == ["info", "warning", "info", "warning", "warning", "info"]
    assert {d["call_id"]: (d["attempt"], d["outcome"]) for d in by_type["attempt"]}["c1"] == (1, "ok")
    assert by_type["run_finished"][0]["outcome"] == "completed"
    # The event holds what the line leaves out (the scanner cannot tell these secrets from
    # text), and the line's size and digest are those of the event's content.
    executed = next(e for e in events if e.type == "call_completed" and e.data["call_id"] == "c1")
    assert OUT_SECRET in repr(executed.data) and ARG_SECRET in repr(executed.data)
    completed = next(d for d in by_type["call_completed"] if d["call_id"] == "c1")
    raw = json.dumps(h.orch.get_run(AGENT, run).trajectory[0].content, sort_keys=True, separators=(",", ":")).encode()
    assert completed["content"] == {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def test_a_failing_hook_neither_stops_the_others_nor_the_run(tmp_path):
    h = Harness(tmp_path)
    seen = []

    def broken(state, event):
        raise RuntimeError("boom")

    h.orch.on_event = fan_out(broken, lambda state, event: seen.append(event.type))
    run = h.run()
    h.submit(run, ("echo", {"text": "hi"}))
    assert seen == h.event_types(run)

    class Unprintable:
        type, seq, run_id, at = "observation", 1, "r", "not a time"
        data: ClassVar[dict[str, str]] = {"call_id": "c1"}

    EventLogger(json_logger()[0]).observe(object(), Unprintable())  # logged as a failure, not raised


@pytest.fixture()
def root_logging():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in saved[0]:
            handler.close()
    root.handlers[:], _ = saved
    root.setLevel(saved[1])


def test_json_log_format_makes_every_line_json(root_logging, spans):
    out = io.StringIO()
    configure_logging("json", out)
    logging.getLogger("ringfence.serve").info("serving %d runs", 3)
    logging.getLogger("ringfence.serve").info("a careless %s", AWS_KEY)
    with trace.get_tracer("t").start_as_current_span("rpc") as span:
        logging.getLogger("ringfence.api").warning("inside a span")
    try:
        raise ValueError("bad")
    except ValueError:
        logging.getLogger("ringfence.api").exception("failed")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(d["level"], d["logger"], d["message"]) for d in lines] == [
        ("info", "ringfence.serve", "serving 3 runs"),
        ("info", "ringfence.serve", "a careless [REDACTED:aws_access_key]"),
        ("warning", "ringfence.api", "inside a span"), ("error", "ringfence.api", "failed")]
    assert "trace_id" not in lines[0] and lines[2]["trace_id"] == f"{span.get_span_context().trace_id:032x}"
    assert "ValueError: bad" in lines[3]["exc"]
    configure_logging("text", out)
    logging.getLogger("ringfence.serve").info("plain")
    assert out.getvalue().splitlines()[-1].endswith("INFO ringfence.serve: plain")
    with pytest.raises(ValueError):
        configure_logging("xml", out)
