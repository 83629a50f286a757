"""Structured logs: one JSON line per event a run appends, and JSON lines for the rest.

`EventLogger.observe` is an `on_event` hook (called once per appended event, like
ringfence_server.control.metrics): it logs one JSON object per event to the `ringfence.events` logger with the
run id, tenant, call id, the run's trace id (from its root span, kept in the run's state) and
the event's seq, so a log line, a span and an event of the log find each other. What a line
holds is chosen field by field: ids, tool names, verdicts, statuses, outcomes, error classes,
attempts, durations, and of arguments and content only their size and sha256 digest. Never an
argument, a tool's output or a tool's error message (either can quote what the agent sent).
Approvers' reasons and a run's finish reason are people's and policy's text: kept, redacted
and truncated.

`configure_logging("json")` (`ringfence serve --log-format json`) makes every log line of the
process a JSON object (`JsonFormatter`), the events' lines as they are built here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import IO, Any

from ringfence.model import Event, RunOutcome
from ringfence_server.control import guardrails
from ringfence_server.control.state import AdmissionVerdict, EventType, RunState
from ringfence_server.control.values import plain

LOGGER = "ringfence.events"
EVENT_ATTR = "ringfence_event"  # the LogRecord attribute holding an event line's fields
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_MAX_TEXT = 200

log = logging.getLogger("ringfence.eventlog")


def iso_utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _text(value: Any, limit: int = _MAX_TEXT) -> str | None:
    """People's or policy's text, fit for a log line: secrets redacted, truncated."""
    if value is None:
        return None
    return guardrails.redact(str(value))[:limit]


def _measure(value: Any) -> dict[str, Any]:
    """The size (bytes of compact, key-sorted, ASCII JSON) and sha256 of a value: all a line
    says about content. The same encoding as the spans' `*.bytes`/`*.sha256` attributes, so a
    line and a span about the same arguments carry the same digest."""
    raw = json.dumps(plain(value), sort_keys=True, separators=(",", ":"), default=str).encode()
    return {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def _fields(type_: str, d: Mapping[str, Any]) -> dict[str, Any]:  # noqa: C901 - one arm per event type: the table is the point
    """The safe fields of one event's data (see the module docstring); unknown types: none."""
    out: dict[str, Any] = {}

    def keep(*names: str) -> None:
        for n in names:
            if d.get(n) is not None:
                out[n] = d[n]

    def measure(name: str, value: Any) -> None:
        if value is not None:
            out[name] = _measure(value)

    if d.get("signature") is not None:  # "tool:{canonical arguments}": the arguments themselves
        out["signature_sha256"] = hashlib.sha256(str(d["signature"]).encode()).hexdigest()
    if "tool" in d:
        out["tool"] = _text(d["tool"], 100)  # the agent names it: an unknown tool's name is its text
    if type_ == EventType.RUN_STARTED:
        keep("policy_version", "deadline_at", "by")
        measure("goal", d.get("goal"))
    elif type_ == EventType.BATCH_STARTED:
        keep("batch_id", "turn", "fingerprint")
        calls = d.get("calls") or []
        out["calls"] = len(calls)
        out["tools"] = [_text(c.get("tool"), 100) for c in calls]
    elif type_ == EventType.CALL_DECIDED:
        keep("verdict", "verdict_path")
        measure("arguments", d.get("arguments"))
    elif type_ == EventType.APPROVAL_REQUESTED:
        keep("approval_id", "digest", "expires_at", "kind", "mutates", "proposed_by")
        measure("arguments", d.get("arguments"))
    elif type_ == EventType.APPROVAL_DECIDED:
        keep("approval_id", "approved", "by", "remember")
        out["reason"] = _text(d.get("reason"))
    elif type_ == EventType.APPROVAL_WITHDRAWN:
        keep("approval_id", "by")
        out["reason"] = _text(d.get("reason"))
    elif type_ in (EventType.APPROVAL_EXPIRED, EventType.APPROVAL_USED):
        keep("approval_id")
    elif type_ == EventType.GRANT_ADDED:
        keep("by", "approval_id")
    elif type_ == EventType.DISPATCH_STARTED:
        keep("mutates", "approval_id", "verdict_path")
        measure("arguments", d.get("arguments"))
    elif type_ == EventType.ATTEMPT:
        keep("attempt", "outcome", "failure_class", "retry_after_s", "duration_ms")
    elif type_ == EventType.EGRESS:
        decisions = d.get("decisions") or []
        keep("attempt")
        out["decisions"] = len(decisions)
        out["denied"] = sum(1 for e in decisions if isinstance(e, Mapping) and e.get("decision") != "allowed")
    elif type_ == EventType.CALL_COMPLETED:
        keep("ok", "mutates", "error_class", "attempts", "cost")
        measure("content", d.get("content"))
        guard = d.get("guard")
        if isinstance(guard, Mapping):
            out["guard"] = {"action": guard.get("action"), "redacted": list(guard.get("redacted") or ())}
    elif type_ == EventType.OBSERVATION:
        keep("status", "executed", "error_class", "attempts", "approval_id", "verdict_path")
        measure("content", d.get("content"))
    elif type_ == EventType.RUN_FINISHED:
        keep("outcome")
        out["reason"] = _text(d.get("reason"))
    return out


_WARN_VERDICTS = {AdmissionVerdict.DENY, AdmissionVerdict.BLOCK, AdmissionVerdict.HALT, AdmissionVerdict.INVALID,
                  AdmissionVerdict.UNKNOWN}


def _level(type_: str, d: Mapping[str, Any]) -> int:
    if (type_ == EventType.CALL_DECIDED and d.get("verdict") in _WARN_VERDICTS) \
            or (type_ == EventType.ATTEMPT and d.get("failure_class")) \
            or (type_ == EventType.CALL_COMPLETED and not d.get("ok")) \
            or (type_ == EventType.OBSERVATION and d.get("error_class")) \
            or (type_ == EventType.RUN_FINISHED and d.get("outcome") != RunOutcome.COMPLETED):
        return logging.WARNING
    return logging.INFO


class EventLogger:
    """An on_event hook: one JSON line per appended event on the `ringfence.events` logger."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger(LOGGER)

    def line(self, state: RunState, event: Event) -> dict[str, Any]:
        """The fields of `event`'s line (`state`: its run's state, the event applied)."""
        d = event.data if isinstance(event.data, Mapping) else {}
        trace = getattr(state, "trace", None) or {}
        if event.type == EventType.RUN_STARTED and not trace:
            trace = d.get("trace") or {}
        doc: dict[str, Any] = {
            "ts": iso_utc(event.at),
            "level": logging.getLevelName(_level(event.type, d)).lower(),
            "event": event.type,
            "run_id": getattr(state, "run_id", "") or event.run_id,
            "tenant": getattr(state, "tenant", None),
            "trace_id": trace.get("trace_id") or None,
            "seq": event.seq,
        }
        call_id = d.get("call_id")
        if call_id is None and d.get("approval_id") is not None:  # approval_decided/_used/_expired/_withdrawn
            approval = (getattr(state, "approvals", None) or {}).get(d["approval_id"])
            call_id = getattr(approval, "call_id", None)
        if call_id is not None:
            doc["call_id"] = _text(call_id, 100)
        doc.update(_fields(event.type, d))
        return doc

    def observe(self, state: RunState, event: Event) -> None:
        """The orchestrator's on_event hook. Never raises: a log line is not worth a failed call."""
        try:
            doc = self.line(state, event)
            level = logging.WARNING if doc["level"] == "warning" else logging.INFO
            self.logger.log(level, "%s", _dumps(doc), extra={EVENT_ATTR: doc})
        except Exception:
            log.exception("could not log event %s of run %s", getattr(event, "seq", "?"),
                          getattr(event, "run_id", "?"))


EventHook = Callable[[RunState, Event], None]
"""An on_event hook (ringfence_server.control.orchestration.runs): called with a run's state after each append."""


def fan_out(*hooks: EventHook) -> EventHook:
    """One on_event callable calling each hook in turn; a hook that raises is logged and the
    others still run (the event is durable already when the hooks are called)."""

    def observe(state: RunState, event: Event) -> None:
        for hook in hooks:
            try:
                hook(state, event)
            except Exception:
                log.exception("on_event hook %r failed", hook)

    return observe


def _dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, default=str)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: an event line as EventLogger built it; any other record as
    ts, level, logger, message (and the current span's trace id, the exception if any), with
    secret-looking strings redacted."""

    def format(self, record: logging.LogRecord) -> str:
        event = getattr(record, EVENT_ATTR, None)
        if isinstance(event, Mapping):
            return _dumps(event)
        doc: dict[str, Any] = {"ts": iso_utc(record.created), "level": record.levelname.lower(),
                               "logger": record.name, "message": guardrails.redact(record.getMessage())}
        from opentelemetry import trace

        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            doc["trace_id"] = f"{ctx.trace_id:032x}"
        if record.exc_info:
            doc["exc"] = guardrails.redact(self.formatException(record.exc_info))
        return _dumps(doc)


def configure_logging(fmt: str = "text", stream: IO[str] | None = None, level: int = logging.INFO) -> None:
    """The process's root logging: `text` (the readable default) or `json` (JsonFormatter), on
    `stream` (stderr)."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be text or json, not {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
