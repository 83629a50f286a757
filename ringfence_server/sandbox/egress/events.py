"""What the egress proxy says it decided: one RequestEvent per request, JSON lines on its log.

Stdlib only; runs inside the egress-proxy image as rfegress.events.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Literal, Protocol, TextIO

JSONObject = dict[str, object]
Direction = Literal["up", "down"]


@dataclass
class RequestEvent:
    """One client request, from its first byte to its end: what it asked, what was decided,
    the bytes it moved, and why it was cut. `to_json` is the event as recorded."""

    method: str | None = None
    host: str | None = None
    port: int | None = None
    address: str | None = None
    decision: str = "denied"
    reason: str | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    cut: str | None = None
    # Present in the JSON only once set:
    detail: str | None = None
    service: bool | None = None
    sni: list[str] | None = None
    credential_of: str | None = None
    target: str | None = None

    def count(self, direction: Direction, n: int) -> None:
        if direction == "up":
            self.bytes_up += n
        else:
            self.bytes_down += n

    def to_json(self) -> JSONObject:
        out: JSONObject = {
            "method": self.method, "host": self.host, "port": self.port, "address": self.address,
            "decision": self.decision, "reason": self.reason, "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down, "cut": self.cut,
        }
        for key in ("detail", "service", "sni", "credential_of", "target"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


class EventSink(Protocol):
    """Where a call's events are kept (ringfence_server.sandbox.egress.grant_table.Grant)."""

    call_id: str
    events: list[JSONObject]
    events_dropped: int


class EventLog:
    """Events as JSON lines on `out` (the container's stdout), and kept per call, bounded."""

    def __init__(self, out: TextIO, max_per_call: int) -> None:
        self.out = out
        self.max_per_call = max_per_call

    def emit(self, event: JSONObject) -> None:
        try:
            self.out.write(json.dumps(event, sort_keys=True) + "\n")
            self.out.flush()
        except (OSError, ValueError):
            pass  # a closed stdout must not take the proxy down

    def record(self, sink: EventSink | None, fields: JSONObject) -> None:
        event: JSONObject = {"ts": round(time.time(), 3), "event": "request", **fields}
        if sink is not None:
            event["call_id"] = sink.call_id
            if len(sink.events) < self.max_per_call:
                sink.events.append(event)
            else:
                sink.events_dropped += 1
        self.emit(event)
