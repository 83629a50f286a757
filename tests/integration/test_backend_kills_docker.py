"""Killing what a backend runs, on the real engine: `kill_all` (the process is stopping: what runs
is killed and nothing starts any more) and `kill_running` (a fenced sandbox worker: what runs is
killed, and the backend goes on serving the calls of its next attachment)."""

from __future__ import annotations

import threading
import time

import pytest

from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.profile import SandboxProfile
from ringfence_server.sandbox.result import Outcome

SLEEP = ("python3", "-c", "import time; time.sleep(30)")
QUICK = ("python3", "-c", "print('after')")


@pytest.fixture
def own_backend(docker_client, pinned_images):
    """A backend of the test's own: kill_all leaves one that starts nothing, never to be shared."""
    b = DockerBackend(docker_client)
    try:
        yield b
    finally:
        b.close()


def _in_background(backend, argv, run_id="kills"):
    out: list = []
    request = SandboxRequest(profile=SandboxProfile(timeout_s=60), argv=argv, run_id=run_id)
    t = threading.Thread(target=lambda: out.append(backend.run(request)))
    t.start()
    return t, out


def _wait_running(docker_client, run_id="kills") -> None:
    deadline = time.monotonic() + 60
    while not docker_client.containers.list(filters={"label": f"ringfence.run={run_id}"}):
        assert time.monotonic() < deadline, "the call's container never ran"
        time.sleep(0.05)


def test_kill_running_kills_what_runs_and_the_next_call_runs(own_backend, docker_client):
    t, out = _in_background(own_backend, SLEEP)
    _wait_running(docker_client)
    assert own_backend.kill_running("fenced: lease not renewed") == 1
    t.join(60)
    [killed] = out
    assert killed.outcome is Outcome.KILLED and "fenced: lease not renewed" in killed.message
    after = own_backend.run(SandboxRequest(profile=SandboxProfile(), argv=QUICK, run_id="kills"))
    assert after.outcome is Outcome.OK and after.stdout == b"after\n"


def test_kill_all_kills_what_runs_and_nothing_starts_after(own_backend, docker_client):
    t, out = _in_background(own_backend, SLEEP)
    _wait_running(docker_client)
    assert own_backend.kill_all("the worker is stopping") == 1
    t.join(60)
    assert out[0].outcome is Outcome.KILLED
    refused = own_backend.run(SandboxRequest(profile=SandboxProfile(), argv=QUICK, run_id="kills"))
    assert refused.outcome is Outcome.KILLED and "not started: the worker is stopping" in refused.message
