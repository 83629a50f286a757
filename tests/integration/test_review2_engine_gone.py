"""Second attack review, finding 6: a call whose every attempt failed before a container
existed (the engine unreachable) is not executed (`executed` false, class transient), and its
client idempotency key is free again: once the engine is back, the same call with the same key
runs, exactly once. A failure after the container could have started stays in doubt.

The engine really goes away: the server's Docker client talks to a unix socket this test
forwards to the engine's, and the forwarder is stopped (its socket file removed, every
forwarded connection cut), then started again at the same path. The witnesses: the engine's
own `start` events for the run's containers, and the run's log in the SQLite file.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import docker
import pytest
from review2_support import AGENT, served, started_containers

from ringfence import Client
from ringfence.model import ObservationStatus as S
from ringfence.model import RunOutcome
from ringfence_server.sandbox.docker_backend import DockerBackend

pytestmark = pytest.mark.docker

RULES = [{"tool": "echo", "verdict": "allow"}, {"tool": "write_note", "verdict": "allow"}]
# Quick retries, and a breaker that the engine's absence does not open: this test is about
# what the attempts say, not about the breaker (tests/unit/test_control_dispatch.py).
LIMITS = {"max_attempts": 3, "backoff_initial_s": 0.01, "backoff_max_s": 0.05, "breaker_threshold": 50}
KEY = "note-while-engine-gone"


def engine_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        pytest.skip(f"the engine is not on a unix socket ({host})")
    return host[len("unix://"):]


class EngineForwarder:
    """A unix socket at `path` whose connections are spliced to the engine's socket: the engine
    as the server's client sees it, which `stop` takes away and `start` gives back."""

    def __init__(self, path: Path, target: str) -> None:
        self.path = path
        self.target = target
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    @property
    def running(self) -> bool:
        return self._listener is not None

    def start(self) -> EngineForwarder:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        listener.listen(64)
        self._listener = listener
        self._spawn(self._accept, listener)
        return self

    def stop(self) -> None:
        """The engine is gone: no socket file, and every connection made through it is cut."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        self.path.unlink(missing_ok=True)
        with self._lock:
            conns, self._open = set(self._open), set()
        for conn in conns:
            _close(conn)
        for t in self._threads:
            t.join(10)
        self._threads = [t for t in self._threads if t.is_alive()]

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept(self, listener: socket.socket) -> None:
        listener.settimeout(0.1)  # closing a socket does not wake a thread blocked in accept()
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # stopped
            client.settimeout(None)
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.target)
            with self._lock:
                self._open.update((client, upstream))
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            # A half-close goes on as one (the attach stream closes the tool's stdin this
            # way and then reads its output): both sockets are closed by stop().
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@pytest.fixture
def forwarded_backend(tmp_path, docker_client, pinned_images):
    """(forwarder, a DockerBackend whose client goes through it); both closed at the end."""
    forwarder = EngineForwarder(tmp_path / "engine.sock", engine_socket()).start()
    client = docker.DockerClient(base_url=f"unix://{forwarder.path}", timeout=60)
    backend = DockerBackend(client, lock=pinned_images)
    try:
        yield forwarder, backend
    finally:
        if not forwarder.running:
            forwarder.start()  # the backend's close needs the engine
        backend.close()
        forwarder.stop()


def note(call_id: str) -> dict:
    return {"call_id": call_id, "tool": "write_note", "arguments": {"name": "gone", "text": "once"},
            "idempotency_key": KEY}


def test_calls_that_never_reached_a_container_are_not_executed_and_their_key_is_free(
        tmp_path, docker_client, forwarded_backend):
    forwarder, backend = forwarded_backend
    since = time.time()
    with served(tmp_path, backend, rules=RULES, limits=LIMITS) as stack, \
            Client(stack.address, AGENT) as agent:
        run = agent.start_run("write a note while the engine is away", "engine-gone")
        forwarder.stop()
        echo, first = agent.submit_batch(run.run_id, [
            {"call_id": "e1", "tool": "echo", "arguments": {"text": "hi"}}, note("w1")])
        for obs in (echo, first):
            assert (obs.executed, obs.error_class, obs.attempts) == (False, "transient", 3), obs
            assert obs.status is S.DENIED and obs.verdict_path[-1] == "sandbox:not_started", obs
            assert "engine" in obs.error
        # The log says the same: three start_failed attempts, a completion that never ran.
        calls = stack.of_call("engine-gone", "w1")
        assert [t for t, _ in calls] == ["call_decided", "dispatch_started", "attempt", "attempt", "attempt",
                                         "call_completed", "observation"]
        assert [d["outcome"] for t, d in calls if t == "attempt"] == ["start_failed"] * 3
        [completed] = [d for t, d in calls if t == "call_completed"]
        assert (completed["ok"], completed["executed"], completed["error_class"]) == (False, False, "transient")

        forwarder.start()  # the engine is back
        [second] = agent.submit_batch(run.run_id, [note("w2")])
        assert (second.status, second.executed, second.error) == (S.EXECUTED, True, None), second
        assert second.content["path"] == "/tmp/notes/gone", second

        # Counted at the engine: the only container of the run is the one that wrote the note.
        assert started_containers(docker_client, run.run_id, since) == ["w2.a1"]
        assert agent.finish_run(run.run_id).outcome is RunOutcome.COMPLETED

        # A later run with the key: the recorded result, nothing run (a third time in the same
        # run would be the loop detector's).
        later = agent.start_run("the same note again", "engine-back")
        [again] = agent.submit_batch(later.run_id, [note("w3")])
        assert (again.status, again.executed, again.content) == (S.DEDUPLICATED, False, second.content), again
        assert started_containers(docker_client, later.run_id, since) == []


class _EngineDropsAfterStart(DockerBackend):
    """The engine's connection breaks once the tool has run (the real container started and
    wrote its note): the sandbox reports `uncertain`, never `start_failed`."""

    @staticmethod
    def _pump(sock, stdin, streams, deadline, demux):
        DockerBackend._pump(sock, stdin, streams, deadline, demux)
        raise ConnectionError("connection to the engine reset")


def test_a_failure_after_the_container_started_keeps_its_key_in_doubt(tmp_path, docker_client, pinned_images):
    """The other side of the line: the container existed and ran, so the call is executed and
    its key is not free (sending it again is refused, nothing run)."""
    backend = _EngineDropsAfterStart(docker_client, lock=pinned_images)
    since = time.time()
    with served(tmp_path, backend, rules=RULES, limits=LIMITS) as stack, \
            Client(stack.address, AGENT) as agent:
        run = agent.start_run("a note whose outcome is not known", "engine-dropped")
        [first] = agent.submit_batch(run.run_id, [note("w1")])
        assert (first.status, first.executed, first.error_class, first.attempts) == (
            S.EXECUTED, True, "uncertain", 1), first
        [completed] = [d for t, d in stack.of_call("engine-dropped", "w1") if t == "call_completed"]
        assert completed.get("executed", True) is True  # (a log written before the field: executed)
        [again] = agent.submit_batch(run.run_id, [note("w2")])
        assert (again.status, again.executed, again.error_class) == (S.DENIED, False, "idempotency_key_in_doubt")
        assert started_containers(docker_client, run.run_id, since) == ["w1.a1"]
