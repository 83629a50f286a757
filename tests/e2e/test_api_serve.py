"""`ringfence serve` as a process: it prints its address, serves a real call into a real
container, stops cleanly on SIGTERM, and a restarted server finds the run in its event log."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serve_support import Served

from ringfence import Client
from ringfence.model import ObservationStatus, RunStatus
from ringfence_server.control.config import token_digest

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "serve-agent-token"


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "ringfence.toml"
    path.write_text(
        "[tenants.acme]\n"
        f'tokens = [{{ sha256 = "{token_digest(TOKEN)}", role = "agent", subject = "serve-test" }}]\n'
    )
    return path


@pytest.mark.docker
def test_serve_prints_serves_stops_and_recovers_its_runs(pinned_images, config_file, tmp_path):
    state = tmp_path / "state"
    served = Served(config_file, state)
    try:
        assert served.lines[0].startswith("ringfence: serving ringfence.v1 on 127.0.0.1:")
        with grpc.insecure_channel(served.address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        with Client(served.address, TOKEN) as agent:
            run = agent.start_run("say hello", "served-run")
            [obs] = agent.submit_batch(run.run_id, [{"call_id": "c1", "tool": "echo", "arguments": {"text": "hi"}}])
            assert obs.status is ObservationStatus.EXECUTED and obs.content == {"text": "hi"}
    finally:
        code = served.stop()
    assert code == 0
    assert served.lines[-1] == "ringfence: stopped"

    again = Served(config_file, state)
    try:
        with Client(again.address, TOKEN) as agent:
            view = agent.get_run("served-run")
            assert view.status is RunStatus.RUNNING
            assert [(o.call_id, o.content) for o in view.trajectory] == [("c1", {"text": "hi"})]
    finally:
        assert again.stop() == 0


@pytest.mark.parametrize("setting", [
    "max_steps = 0",
    # Second attack review, finding 7: each of these once started a server whose every StartRun
    # (inf) or ASK (nan) answered INTERNAL, or whose cost ceiling was off (nan).
    "run_deadline_s = inf",
    "approval_ttl_s = nan",
    "max_cost = nan",
])
def test_serve_refuses_a_bad_config_with_exit_2(tmp_path, setting):
    bad = tmp_path / "bad.toml"
    bad.write_text(f"[limits]\n{setting}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ringfence.cli", "serve", "--config", str(bad), "--listen", "127.0.0.1:0",
         "--state-dir", str(tmp_path / "state")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert f"limits.{setting.split()[0]}" in proc.stderr


def test_serve_refuses_the_public_demo_tokens_off_loopback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ringfence.cli", "serve", "--listen", "0.0.0.0:0", "--state-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "refusing to serve the public demo tokens" in proc.stderr


@pytest.mark.docker
def test_serve_exposes_prometheus_metrics_of_what_it_did(pinned_images, config_file, tmp_path):
    import urllib.request

    served = Served(config_file, tmp_path / "state", "--metrics-listen", "127.0.0.1:0")
    try:
        [metrics_line] = [line for line in served.lines if line.startswith("ringfence: metrics on ")]
        url = metrics_line.split(" on ", 1)[1]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        with Client(served.address, TOKEN) as agent:
            run = agent.start_run("count me")
            agent.submit_batch(run.run_id, [{"call_id": "c1", "tool": "echo", "arguments": {"text": "hi"}}])
        body = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        assert served.stop() == 0
    assert 'ringfence_policy_verdicts_total{tool="echo",verdict="allow"} 1.0' in body
    assert 'ringfence_sandbox_attempts_total{outcome="ok",tool="echo"} 1.0' in body
    assert 'ringfence_observations_total{status="executed"} 1.0' in body


def test_serve_refuses_a_bad_metrics_address_with_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ringfence.cli", "serve", "--metrics-listen", "nowhere"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--metrics-listen must be HOST:PORT" in proc.stderr


def _containers_of(docker_client, pid: int, **filters):
    # ignore_removed: the list inspects each container it found, and one may be gone by then
    # (a call's container, or a workspace helper's, removed a moment after the listing).
    return docker_client.containers.list(all=True, filters={"label": f"ringfence.pid={pid}", **filters},
                                         ignore_removed=True)


def _start_a_nap(served: Served) -> tuple[threading.Thread, dict]:
    """A 5 s call running in a container of `served`, submitted from a client thread."""
    outcome: dict = {}

    def submit() -> None:
        try:
            with Client(served.address, TOKEN) as agent:
                agent.start_run("nap", "nap-run")
                outcome["obs"] = agent.submit_batch("nap-run", [{"call_id": "nap", "tool": "sleep",
                                                                  "arguments": {"seconds": 5}}])
        except Exception as e:  # noqa: BLE001 - the server may go away mid-call: recorded, asserted
            outcome["error"] = e

    t = threading.Thread(target=submit, daemon=True)
    t.start()
    return t, outcome


def _wait_until_running(docker_client, pid: int) -> None:
    for _ in range(600):
        if _containers_of(docker_client, pid, status="running"):
            return
        threading.Event().wait(0.05)
    raise AssertionError("the call's container never ran")


@pytest.mark.docker
def test_sigterm_kills_the_servers_running_calls_and_records_them(pinned_images, docker_client, config_file, tmp_path):
    state = tmp_path / "state"
    served = Served(config_file, state)
    try:
        t, _ = _start_a_nap(served)
        _wait_until_running(docker_client, served.proc.pid)
    finally:
        code = served.stop()
    t.join(30)
    assert code == 0
    assert _containers_of(docker_client, served.proc.pid) == []
    again = Served(config_file, state)
    try:
        with Client(again.address, TOKEN) as agent:
            [nap] = agent.get_run("nap-run").trajectory
        assert nap.executed and nap.error_class == "killed" and "shutting down" in nap.error
    finally:
        assert again.stop() == 0


@pytest.mark.docker
def test_a_restarted_server_removes_a_killed_instances_containers(pinned_images, docker_client, config_file, tmp_path):
    """SIGKILL leaves the call's container behind (nobody could remove it); the next server's
    start-up reaper removes it, and recovery reports the interrupted call."""
    state = tmp_path / "state"
    served = Served(config_file, state)
    t, _ = _start_a_nap(served)
    try:
        _wait_until_running(docker_client, served.proc.pid)
    finally:
        served.proc.kill()
        served.stop()
    t.join(30)
    assert _containers_of(docker_client, served.proc.pid), "SIGKILL should have left the container"
    again = Served(config_file, state)
    try:
        assert _containers_of(docker_client, served.proc.pid) == []  # reaped before serving
        with Client(again.address, TOKEN) as agent:
            [nap] = agent.get_run("nap-run").trajectory
        assert nap.error_class == "interrupted"
    finally:
        assert again.stop() == 0
