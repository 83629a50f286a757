"""A small batch through the real DockerBackend and the real `tool` image.

The orchestrator on a real SQLite file, the real engine: an allowed echo runs in a container and
its observation carries the tool's answer; a read outside the input root is denied before
dispatch (the backend is wrapped to count what reached the engine); a tool error is classified
from the runner's protocol, not from strings.
"""

from __future__ import annotations

import threading

import pytest

from ringfence.model import ObservationStatus as S
from ringfence.model import Principal, ProposedCall, Role
from ringfence_server.control.config import load_config
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.store.sqlite import SqliteEventStore

pytestmark = pytest.mark.docker

AGENT = Principal("acme", Role.AGENT, "agent")


class Counting:
    """Wraps the real backend; `requests` is the witness of what reached the engine."""

    def __init__(self, backend):
        self.backend = backend
        self.requests = []

    def run(self, request):
        self.requests.append(request)
        return self.backend.run(request)

    def close(self):
        pass

    def __getattr__(self, name):
        # The rest of the backend's surface (expect, end_run, the pool's hooks) passes through:
        # only run() is witnessed, and a wrapper that lacked a method would fail the batch, not
        # the assertion.
        return getattr(self.backend, name)


def test_a_batch_through_the_real_sandbox(tmp_path, backend):
    inputs = tmp_path / "input"
    inputs.mkdir()
    (inputs / "hello.txt").write_text("hello from the host\n")
    inputs.chmod(0o755)
    (inputs / "hello.txt").chmod(0o644)
    config = load_config(overrides={
        "state_dir": str(tmp_path), "inputs": {"/input": str(inputs)},
        "policy": {"autonomy": "autonomous", "rules": [{"tool": "*", "verdict": "allow"}]},
        "limits": {"max_attempts": 1}})
    counting = Counting(backend)
    store = SqliteEventStore(tmp_path / "events.sqlite3")
    orch = Orchestrator.from_config(config, counting, store)
    try:
        run = orch.start_run(AGENT, "docker smoke").run_id
        obs = orch.submit_batch(AGENT, run, [
            ProposedCall("echo", "echo", {"text": "hi"}),
            ProposedCall("escape", "read_file", {"path": "/input/../etc/passwd"}),
            ProposedCall("read", "read_file", {"path": "hello.txt"}),
            ProposedCall("fail", "fail", {"class": "invalid", "message": "bad input"}),
        ])
        by_id = {o.call_id: o for o in obs}
        assert by_id["echo"].status is S.EXECUTED and by_id["echo"].content == {"text": "hi"}
        assert by_id["escape"].status is S.DENIED and by_id["escape"].verdict_path[-1] == "resource:deny"
        assert by_id["read"].status is S.EXECUTED, by_id["read"]
        assert by_id["read"].content["content"] == "hello from the host\n"
        assert by_id["fail"].executed and by_id["fail"].error_class == "invalid"
        assert by_id["fail"].error == "bad input"
        # The denied call never reached the engine; the others each ran in their own container.
        assert sorted(r.call_id for r in counting.requests) == ["echo.a1", "fail.a1", "read.a1"]
        assert all(r.argv == () and r.run_id == f"acme:{run}" for r in counting.requests)
    finally:
        orch.close()
        store.close()


def test_a_mutation_gets_its_idempotency_key_and_is_not_repeated(tmp_path, backend):
    from ringfence_server.control.idempotency import idempotency_key

    config = load_config(overrides={
        "state_dir": str(tmp_path),
        "policy": {"autonomy": "autonomous", "rules": [{"tool": "write_note", "verdict": "allow"}]}})
    counting = Counting(backend)
    store = SqliteEventStore(tmp_path / "events.sqlite3")
    orch = Orchestrator.from_config(config, counting, store)
    try:
        run = orch.start_run(AGENT, "notes").run_id
        args = {"name": "n1", "text": "hello"}
        [first] = orch.submit_batch(AGENT, run, [ProposedCall("w1", "write_note", args)])
        assert first.status is S.EXECUTED, first
        # The real tool saw the key the control plane derived.
        assert first.content["idempotency_key"] == idempotency_key("acme", run, "write_note", args)
        [second] = orch.submit_batch(AGENT, run, [ProposedCall("w2", "write_note", args)])
        assert second.status is S.DEDUPLICATED and second.content == first.content
        assert len(counting.requests) == 1
    finally:
        orch.close()
        store.close()


def _orchestrator(tmp_path, backend, **limits):
    config = load_config(overrides={
        "state_dir": str(tmp_path),
        "policy": {"autonomy": "autonomous", "rules": [{"tool": "*", "verdict": "allow"}]},
        "limits": {"max_attempts": 1, **limits}})
    store = SqliteEventStore(tmp_path / "events.sqlite3")
    return Orchestrator.from_config(config, backend, store), store


def _wait_for_container(docker_client, run_label: str) -> None:
    for _ in range(400):
        if docker_client.containers.list(filters={"label": f"ringfence.run={run_label}", "status": "running"}):
            return
        threading.Event().wait(0.05)
    raise AssertionError("the call's container never started")


def test_cancel_kills_the_running_container_at_once(tmp_path, backend, docker_client):
    orch, store = _orchestrator(tmp_path, backend)
    try:
        run = orch.start_run(AGENT, "cancel me").run_id
        result = {}
        t = threading.Thread(target=lambda: result.setdefault(
            "obs", orch.submit_batch(AGENT, run, [ProposedCall("nap", "sleep", {"seconds": 8})])))
        t.start()
        _wait_for_container(docker_client, f"acme:{run}")
        view = orch.cancel_run(AGENT, run)
        t.join(30)
        [obs] = result["obs"]
        assert view.outcome.value == "cancelled"
        assert obs.executed and obs.error_class == "killed", obs
        assert "cancelled by agent" in obs.error
        assert docker_client.containers.list(all=True, filters={"label": f"ringfence.run=acme:{run}"}) == []
    finally:
        orch.close()
        store.close()


def test_the_run_deadline_kills_the_running_container(tmp_path, backend, docker_client):
    orch, store = _orchestrator(tmp_path, backend, run_deadline_s=2)
    try:
        run = orch.start_run(AGENT, "too slow").run_id
        [obs] = orch.submit_batch(AGENT, run, [ProposedCall("nap", "sleep", {"seconds": 8})])
        assert obs.executed and obs.error_class == "killed" and "deadline" in obs.error, obs
        assert orch.get_run(AGENT, run).outcome.value == "deadline_exceeded"
        assert docker_client.containers.list(all=True, filters={"label": f"ringfence.run=acme:{run}"}) == []
    finally:
        orch.close()
        store.close()
