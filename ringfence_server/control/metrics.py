"""Prometheus metrics of the control plane, derived from the events it writes.

Every number here is a fold of the event log as it is appended (the orchestrator's `on_event`
hook), so the metrics can never claim something the log does not hold: policy verdicts per
tool, sandbox attempts per tool and outcome with their latency, observations per status, and
runs per terminal outcome. Each Metrics has its own registry, so two servers in one process
(or two tests) do not share counters.
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from ringfence.model import Event
from ringfence_server.control.state import EventType, RunState

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._server: WSGIServer | None = None
        self.verdicts = Counter(
            "ringfence_policy_verdicts", "Admission verdicts per tool (allow, ask, deny, block, halt, ...).",
            ["tool", "verdict"], registry=self.registry)
        self.attempts = Counter(
            "ringfence_sandbox_attempts", "Sandbox attempts per tool and classified outcome.",
            ["tool", "outcome"], registry=self.registry)
        self.latency = Histogram(
            "ringfence_sandbox_attempt_seconds", "Wall time of one sandbox attempt.",
            ["tool"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.observations = Counter(
            "ringfence_observations", "Observations returned to agents, per status.",
            ["status"], registry=self.registry)
        self.runs = Counter(
            "ringfence_runs_finished", "Runs that ended, per terminal outcome.",
            ["outcome"], registry=self.registry)

    def observe(self, state: RunState, event: Event) -> None:
        """The orchestrator's on_event hook: called once for every appended event."""
        data = event.data
        if event.type == EventType.CALL_DECIDED:
            self.verdicts.labels(str(data.get("tool")), str(data.get("verdict"))).inc()
        elif event.type == EventType.ATTEMPT:
            call_id = data.get("call_id")
            started = state.inflight.get(call_id) if isinstance(call_id, str) else None
            tool = started.tool if started is not None else "unknown"
            self.attempts.labels(tool, str(data.get("outcome"))).inc()
            if data.get("duration_ms") is not None:
                self.latency.labels(tool).observe(float(data["duration_ms"]) / 1000)
        elif event.type == EventType.OBSERVATION:
            self.observations.labels(str(data.get("status"))).inc()
        elif event.type == EventType.RUN_FINISHED:
            self.runs.labels(str(data.get("outcome"))).inc()

    def serve(self, host: str, port: int) -> int:
        """Expose /metrics over HTTP on host:port (port 0 picks one); returns the port."""
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
