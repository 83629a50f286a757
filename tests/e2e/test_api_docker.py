"""One run through the real gRPC server, the real Orchestrator and the real DockerBackend.

An agent client submits a turn with a denied path, a parallel pair of reads and an ASK; an
approver client on a second channel watches approvals and answers the ASK; a repeated
mutation is deduplicated. The witness that a call did or did not reach a container is the
backend itself (every request it was handed), and the run's log, read back with WatchRun from
0, must hold exactly the expected events.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from recording_backend import RecordingBackend

from ringfence import Client
from ringfence.model import ApprovalStatus, ObservationStatus, RunOutcome
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.config import load_config, token_digest
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.store import SqliteEventStore
from ringfence_server.demo_services.ledger.container import LEDGER_HOST

pytestmark = pytest.mark.docker

AGENT, APPROVER = "e2e-agent-token", "e2e-approver-token"


@pytest.fixture
def stack(tmp_path, ledger_backend):
    ledger, backend = ledger_backend
    inputs = tmp_path / "input"
    inputs.mkdir(mode=0o755)
    inputs.chmod(0o755)  # the sandbox user (10001) reads it through a read-only bind mount
    (inputs / "hello.txt").write_text("hello from the host\n")
    (inputs / "hello.txt").chmod(0o644)
    config = load_config(
        overrides={
            "state_dir": str(tmp_path / "state"),
            "inputs": {"/input": str(inputs)},
            "policy": {"egress": {"credit": [LEDGER_HOST]}},
            "tenants": {
                "acme": {
                    "tokens": [
                        {"sha256": token_digest(AGENT), "role": "agent", "subject": "agent-1"},
                        {"sha256": token_digest(APPROVER), "role": "approver", "subject": "alice"},
                    ]
                }
            },
        }
    )
    recording = RecordingBackend(backend)
    store = SqliteEventStore(config.db_path)
    orchestrator = Orchestrator.from_config(config, recording, store)
    try:
        with BackgroundServer(orchestrator, config) as server:
            yield server, recording, ledger
    finally:
        orchestrator.close()
        store.close()


def approve_as_they_come(address: str, expected: int, seen: list, stop: threading.Event) -> None:
    """An approver client: watch approvals, approve each pending one."""
    with Client(address, APPROVER) as approver:
        stream = approver.watch_approvals()
        try:
            for approval in stream:
                if approval.status is ApprovalStatus.PENDING:
                    seen.append(approver.decide_approval(approval.approval_id, True, "known customer, small amount"))
                if len(seen) >= expected or stop.is_set():
                    break
        finally:
            stream.cancel()


def test_a_run_through_the_real_server_and_real_containers(stack):
    server, recording, ledger = stack
    with Client(server.address, AGENT) as agent:
        run = agent.start_run("read the greeting and credit acme-9 with 50", "e2e-run")

        # Turn 1: a denied path, two reads (parallel), one ASK.
        turn1 = agent.submit_batch(
            run.run_id,
            [
                {"call_id": "deny", "tool": "read_file", "arguments": {"path": "/etc/shadow"}},
                {"call_id": "read", "tool": "read_file", "arguments": {"path": "/input/hello.txt"}},
                {"call_id": "ping", "tool": "echo", "arguments": {"text": "ping"}},
                {"call_id": "pay", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}},
            ],
        )
        obs = {o.call_id: o for o in turn1}
        assert obs["deny"].status is ObservationStatus.DENIED and not obs["deny"].executed
        assert "resource:deny" in obs["deny"].verdict_path
        assert obs["read"].status is ObservationStatus.EXECUTED
        assert obs["read"].content["content"] == "hello from the host\n"
        assert obs["ping"].status is ObservationStatus.EXECUTED and obs["ping"].content == {"text": "ping"}
        assert obs["pay"].status is ObservationStatus.PENDING_APPROVAL
        assert sorted(recording.call_ids) == ["ping.a1", "read.a1"]  # the denied call never reached Docker

        # The approver, on its own channel, answers the ASK.
        decisions: list = []
        stop = threading.Event()
        approver = threading.Thread(target=approve_as_they_come, args=(server.address, 1, decisions, stop))
        approver.start()
        approver.join(120)
        assert not approver.is_alive()
        # The decision resumes the call at once: by the time it returns, the approval is used.
        assert [(d.call_id, d.status, d.decided_by) for d in decisions] == [("pay", ApprovalStatus.USED, "alice")]
        paid = {o.call_id: o for o in agent.get_run(run.run_id).trajectory}["pay"]
        assert paid.status is ObservationStatus.EXECUTED and paid.executed, paid
        assert paid.content["applied"] is True and paid.content["idempotency_key"]
        # Counted where the effect happens: the ledger applied exactly this credit.
        assert ledger.stats()["credits"] == 1
        assert ledger.credits(paid.content["idempotency_key"])["amount"] == 50
        assert recording.call_ids[-1] == "pay.a1"

        # Turn 2: the same credit again is another ASK; approved, it is answered from the log.
        [again] = agent.submit_batch(
            run.run_id, [{"call_id": "pay-again", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}}]
        )
        assert again.status is ObservationStatus.PENDING_APPROVAL
        decisions.clear()
        approver = threading.Thread(target=approve_as_they_come, args=(server.address, 1, decisions, stop))
        approver.start()
        approver.join(120)
        assert not approver.is_alive() and len(decisions) == 1
        repeated = {o.call_id: o for o in agent.get_run(run.run_id).trajectory}["pay-again"]
        assert repeated.status is ObservationStatus.DEDUPLICATED and repeated.executed is False
        assert repeated.content == paid.content
        assert sorted(recording.call_ids) == ["pay.a1", "ping.a1", "read.a1"]  # no second credit container
        assert ledger.stats()["credits"] == 1 and ledger.balance("acme-9")["balance"] == 50

        finished = agent.finish_run(run.run_id)
        assert finished.outcome is RunOutcome.COMPLETED
        log = [e.type for e in agent.watch_run(run.run_id, 0)]

    # The exact log. The two reads run in parallel, so their dispatch events may interleave:
    # that stretch is compared as a multiset, everything else in order.
    head = (["run_started", "batch_started"] + ["call_decided"] * 4
            + ["observation", "approval_requested", "observation"])
    reads = Counter({"dispatch_started": 2, "attempt": 2, "call_completed": 2})
    after_reads = ["observation", "observation"]
    # The credit's attempt carries the egress proxy's decision (its request to the ledger).
    approved = ["approval_decided", "approval_used", "dispatch_started", "egress", "attempt", "call_completed",
                "observation"]
    turn2 = ["batch_started", "call_decided", "approval_requested", "observation",
             "approval_decided", "approval_used", "observation"]
    tail = ["run_finished"]
    n = len(head)
    assert log[:n] == head, log
    assert Counter(log[n : n + 6]) == reads, log
    # call_completed of a read comes only after its dispatch_started: never a completion first.
    assert log[n] == "dispatch_started", log
    assert log[n + 6 :] == after_reads + approved + turn2 + tail, log
