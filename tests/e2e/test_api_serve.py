"""`ringfence serve` as a process: it prints its address, serves a real call into a real
container, stops cleanly on SIGTERM, and a restarted server finds the run in its event log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from control.api.client import RingfenceClient
from control.config import token_digest
from control.model import ObservationStatus, RunStatus

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "serve-agent-token"


class Served:
    def __init__(self, config: Path, state: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "control.cli", "serve", "--listen", "127.0.0.1:0",
             "--config", str(config), "--state-dir", str(state), *extra],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        first = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                if line.startswith("ringfence: serving"):
                    first.set()
            first.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        serving = [line for line in self.lines if line.startswith("ringfence: serving")] if first.wait(60) else []
        if not serving:
            self.stop()
            raise AssertionError(f"no address printed; stderr: {self.proc.stderr.read()[-2000:]}")
        self.address = serving[0].split(" on ", 1)[1].split()[0]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self._reader.join(10)


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
        with RingfenceClient(served.address, TOKEN) as agent:
            run = agent.start_run("say hello", "served-run")
            [obs] = agent.submit_batch(run.run_id, [{"call_id": "c1", "tool": "echo", "arguments": {"text": "hi"}}])
            assert obs.status is ObservationStatus.EXECUTED and obs.content == {"text": "hi"}
    finally:
        code = served.stop()
    assert code == 0
    assert served.lines[-1] == "ringfence: stopped"

    again = Served(config_file, state)
    try:
        with RingfenceClient(again.address, TOKEN) as agent:
            view = agent.get_run("served-run")
            assert view.status is RunStatus.RUNNING
            assert [(o.call_id, o.content) for o in view.trajectory] == [("c1", {"text": "hi"})]
    finally:
        assert again.stop() == 0


def test_serve_refuses_a_bad_config_with_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits]\nmax_steps = 0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "control.cli", "serve", "--config", str(bad), "--listen", "127.0.0.1:0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "limits.max_steps" in proc.stderr


def test_serve_refuses_the_public_demo_tokens_off_loopback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "control.cli", "serve", "--listen", "0.0.0.0:0", "--state-dir", str(tmp_path)],
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
        with RingfenceClient(served.address, TOKEN) as agent:
            run = agent.start_run("count me")
            agent.submit_batch(run.run_id, [{"call_id": "c1", "tool": "echo", "arguments": {"text": "hi"}}])
        body = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        assert served.stop() == 0
    assert 'ringfence_policy_verdicts_total{tool="echo",verdict="allow"} 1.0' in body
    assert 'ringfence_sandbox_attempts_total{outcome="ok",tool="echo"} 1.0' in body
    assert 'ringfence_observations_total{status="executed"} 1.0' in body


def test_serve_refuses_a_bad_metrics_address_with_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "control.cli", "serve", "--metrics-listen", "nowhere"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--metrics-listen must be HOST:PORT" in proc.stderr
