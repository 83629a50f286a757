"""Prometheus metrics are a fold of the events the orchestrator appends."""

from __future__ import annotations

import urllib.request

from control_support import AGENT, Harness, error_result

from ringfence.model import ObservationStatus as S
from ringfence_server.control.metrics import Metrics


def value(metrics: Metrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_verdicts_attempts_observations_and_outcomes_are_counted(tmp_path):
    h = Harness(tmp_path, limits={"max_attempts": 2})
    metrics = Metrics()
    h.orch.on_event = metrics.observe
    h.emulator.overrides["fail"] = lambda call: error_result("transient")
    run = h.run()
    obs = h.submit(run, ("echo", {"text": "hi"}), ("read_file", {"path": "/etc/shadow"}),
                   ("fail", {"class": "transient"}))
    assert [o.status for o in obs] == [S.EXECUTED, S.DENIED, S.EXECUTED]
    h.orch.finish_run(AGENT, run)
    assert value(metrics, "ringfence_policy_verdicts_total", tool="echo", verdict="allow") == 1
    assert value(metrics, "ringfence_policy_verdicts_total", tool="read_file", verdict="deny") == 1
    assert value(metrics, "ringfence_sandbox_attempts_total", tool="echo", outcome="ok") == 1
    assert value(metrics, "ringfence_sandbox_attempts_total", tool="fail", outcome="tool_error") == 2  # retried once
    assert value(metrics, "ringfence_sandbox_attempt_seconds_count", tool="fail") == 2
    assert value(metrics, "ringfence_observations_total", status="denied") == 1
    assert value(metrics, "ringfence_observations_total", status="executed") == 2
    assert value(metrics, "ringfence_runs_finished_total", outcome="completed") == 1


def test_metrics_are_served_over_http_on_loopback():
    metrics = Metrics()
    metrics.runs.labels("completed").inc()
    port = metrics.serve("127.0.0.1", 0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        metrics.close()
    assert 'ringfence_runs_finished_total{outcome="completed"} 1.0' in body
