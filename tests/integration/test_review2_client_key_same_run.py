"""Second attack review, finding 10: a client idempotency key reused with other arguments in
the SAME run is refused (`idempotency_key_reused`, nothing run), exactly as in a later run; the
same key with the same arguments is still deduplicated.

Real parts: the gRPC server on a loopback port, the Orchestrator, a SQLite file, the Docker
backend. The witnesses: what crossed into a container (RecordingBackend), the engine's own
`start` events for the run's containers, and the run's log.
"""

from __future__ import annotations

import time

import pytest
from recording_backend import RecordingBackend
from review2_support import AGENT, served, started_containers

from ringfence import Client
from ringfence.model import ObservationStatus as S
from ringfence.model import RunOutcome

pytestmark = pytest.mark.docker

RULES = [{"tool": "write_note", "verdict": "allow"}]
KEY = "note-k-1"


def note(call_id: str, text: str) -> dict:
    return {"call_id": call_id, "tool": "write_note", "arguments": {"name": "plan", "text": text},
            "idempotency_key": KEY}


def test_a_client_key_with_other_arguments_in_the_same_run_is_refused_never_run(
        tmp_path, docker_client, backend):
    recording = RecordingBackend(backend)
    since = time.time()
    with served(tmp_path, recording, rules=RULES) as stack, Client(stack.address, AGENT) as agent:
        run = agent.start_run("write one note, then try to overwrite it under the same key", "same-run-key")
        [v1] = agent.submit_batch(run.run_id, [note("w1", "v1")])
        assert (v1.status, v1.executed) == (S.EXECUTED, True), v1
        assert v1.content["bytes"] == 2

        [v3] = agent.submit_batch(run.run_id, [note("w3", "v3")])
        assert (v3.status, v3.executed, v3.error_class) == (S.DENIED, False, "idempotency_key_reused"), v3
        assert v3.content is None and "nothing was run" in v3.error
        assert v3.verdict_path[-1] == "idempotency:conflict"

        [again] = agent.submit_batch(run.run_id, [note("w1b", "v1")])
        assert (again.status, again.executed) == (S.DEDUPLICATED, False), again
        assert again.content == v1.content

        # Counted where the effect happens: one container, and it was handed v1.
        assert recording.calls() == ["w1"]
        assert recording.sent("w1") == [{"name": "plan", "text": "v1"}]
        assert started_containers(docker_client, run.run_id, since) == ["w1.a1"]

        # The log: the refused and the deduplicated calls never reached dispatch.
        assert [t for t, _ in stack.of_call("same-run-key", "w3")] == ["call_decided", "observation"]
        assert [t for t, _ in stack.of_call("same-run-key", "w1b")] == ["call_decided", "observation"]
        assert [t for t, _ in stack.of_call("same-run-key", "w1")] == [
            "call_decided", "dispatch_started", "attempt", "call_completed", "observation"]
        assert agent.finish_run(run.run_id).outcome is RunOutcome.COMPLETED


def test_the_same_refusal_in_a_later_run(tmp_path, docker_client, backend):
    """The rule the same run now follows: a later run refuses the key with other arguments,
    and deduplicates it with the same ones (held equal to the first test's answers)."""
    recording = RecordingBackend(backend)
    with served(tmp_path, recording, rules=RULES) as stack, Client(stack.address, AGENT) as agent:
        first = agent.start_run("write the note", "first-run")
        [v1] = agent.submit_batch(first.run_id, [note("w1", "v1")])
        assert v1.status is S.EXECUTED
        second = agent.start_run("overwrite it under the same key", "second-run")
        [v3, again] = agent.submit_batch(second.run_id, [note("w3", "v3"), note("w1b", "v1")])
        assert (v3.status, v3.executed, v3.error_class) == (S.DENIED, False, "idempotency_key_reused")
        assert (again.status, again.content) == (S.DEDUPLICATED, v1.content)
        assert recording.calls() == ["w1"]
