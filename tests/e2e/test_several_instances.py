"""Three `ringfence serve` processes on one PostgreSQL serve any run.

- A run started on one instance is served by the others (they catch up from the store).
- Two instances writing the same run at once never interleave sequence numbers: the second
  waits for the first's lease, and each batch's events stay together in the log.
- The instance running a batch is killed (SIGKILL) mid-call: the client sends the same batch
  again to another instance, which takes the run over once the dead one's lease expires,
  recovers the interrupted call and answers; a credit approved there reaches the ledger once.
- A watcher on the third instance is woken by the store (LISTEN/NOTIFY) and sees every event.
- A live instance's reaper removes the dead one's container.
"""

from __future__ import annotations

import threading

import pytest
from serve_support import Served

from ringfence import Client
from ringfence.errors import ControlError
from ringfence.model import ApprovalStatus, ObservationStatus, RunOutcome
from ringfence_server.control.config import token_digest
from ringfence_server.control.store import open_store, verify
from ringfence_server.demo_services.ledger.container import LEDGER_HOST

pytestmark = pytest.mark.docker

AGENT, APPROVER = "multi-agent-token", "multi-approver-token"
RUN = "shared-run"
LEASE_TTL_S = 3


def write_config(path, ledger) -> None:
    services = ", ".join(f'"{name}" = ["{addresses[0]}"]' for name, addresses in ledger.services().items())
    path.write_text(
        "[tenants.acme]\n"
        "tokens = [\n"
        f'  {{ sha256 = "{token_digest(AGENT)}", role = "agent", subject = "agent" }},\n'
        f'  {{ sha256 = "{token_digest(APPROVER)}", role = "approver", subject = "approver" }},\n'
        "]\n"
        f"[limits]\nlease_ttl_s = {LEASE_TTL_S}\n"
        "[policy]\nautonomy = \"autonomous\"\n"
        "rules = [\n"
        '  { tool = "echo", verdict = "allow" },\n'
        '  { tool = "sleep", verdict = "allow" },\n'
        '  { tool = "credit", verdict = "allow" },\n'
        "]\n"
        "[policy.egress]\n"
        f'credit = ["{LEDGER_HOST}"]\n'
        f'credit_lookup = ["{LEDGER_HOST}"]\n'
        "[egress]\n"
        f"services = {{ {services} }}\n"
        f'networks = ["{ledger.network}"]\n'
    )


def running_containers(docker_client, pid: int):
    return docker_client.containers.list(filters={"label": f"ringfence.pid={pid}", "status": "running"})


def test_three_instances_share_runs_and_survive_losing_one(pg_url, ledger_backend, docker_client, tmp_path):
    ledger, _ = ledger_backend
    config = tmp_path / "ringfence.toml"
    write_config(config, ledger)
    servers = [Served(config, tmp_path / f"state-{i}", "--database-url", pg_url, "--reap-every", "1")
               for i in range(3)]
    a, b, c = servers
    seen: list = []

    def watch() -> None:
        try:
            with Client(c.address, AGENT) as client:
                for event in client.watch_run(RUN, 0):
                    seen.append(event)
        except ControlError:
            pass

    try:
        with Client(a.address, AGENT) as on_a:
            on_a.start_run("shared by three instances", RUN)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()

        # Two instances write the same run at once: one waits for the other's lease.
        results: dict = {}

        def submit(server, batch_id, call_id) -> None:
            with Client(server.address, AGENT) as client:
                results[batch_id] = client.submit_batch(
                    RUN, [{"call_id": call_id, "tool": "sleep", "arguments": {"seconds": 1}}], batch_id=batch_id)

        pair = [threading.Thread(target=submit, args=(b, "on-b", "nap-b")),
                threading.Thread(target=submit, args=(c, "on-c", "nap-c"))]
        for t in pair:
            t.start()
        for t in pair:
            t.join(60)
        assert all(obs.status is ObservationStatus.EXECUTED for batch in results.values() for obs in batch), results

        # The instance running a batch dies mid-call; the same batch, sent again, is answered by another.
        lost: dict = {}

        def doomed() -> None:
            try:
                with Client(a.address, AGENT) as client:
                    client.submit_batch(RUN, [{"call_id": "long", "tool": "sleep", "arguments": {"seconds": 5}}],
                                        batch_id="on-a")
            except ControlError as e:
                lost["error"] = e

        t = threading.Thread(target=doomed, daemon=True)
        t.start()
        for _ in range(600):
            if running_containers(docker_client, a.proc.pid):
                break
            threading.Event().wait(0.05)
        assert running_containers(docker_client, a.proc.pid), "the batch never reached a container"
        a.proc.kill()
        a.proc.wait(30)
        t.join(30)
        assert "error" in lost
        with Client(b.address, AGENT) as on_b:
            [long] = on_b.submit_batch(RUN, [{"call_id": "long", "tool": "sleep", "arguments": {"seconds": 5}}],
                                      batch_id="on-a")
            assert long.error_class == "interrupted"  # recovered by b, reported, not lost

            # A credit proposed through b, approved through c, applied once.
            [pay] = on_b.submit_batch(RUN, [{"call_id": "pay", "tool": "credit",
                                             "arguments": {"account": "acme-3", "amount": 30}}], batch_id="pay")
            assert pay.status is ObservationStatus.PENDING_APPROVAL
        with Client(c.address, APPROVER) as approver:
            [approval] = [x for x in approver.list_approvals(RUN) if x.status is ApprovalStatus.PENDING]
            approver.decide_approval(approval.approval_id, True, "expected")
        with Client(c.address, AGENT) as on_c:
            paid = {o.call_id: o for o in on_c.get_run(RUN).trajectory}["pay"]
            assert paid.status is ObservationStatus.EXECUTED and paid.content["applied"] is True
            assert on_c.finish_run(RUN).outcome is RunOutcome.COMPLETED
        watcher.join(30)

        # A live instance's reaper removed the dead one's container.
        for _ in range(200):
            if not docker_client.containers.list(all=True, filters={"label": f"ringfence.pid={a.proc.pid}"}):
                break
            threading.Event().wait(0.1)
        assert docker_client.containers.list(all=True, filters={"label": f"ringfence.pid={a.proc.pid}"}) == []
    finally:
        for s in servers:
            s.stop()

    assert ledger.stats()["credits"] == 1 and ledger.stats()["replays"] == 0
    store = open_store(pg_url)
    try:
        log = store.read(RUN)
    finally:
        store.close()
    assert verify(log).ok
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    # The watcher on the third instance saw every event, in order, and nothing else.
    assert [(e.seq, e.type) for e in seen] == [(e.seq, e.type) for e in log]
    # Each batch's events stay together: between a batch_started and the next, only its calls.
    batch_of: dict[str, str] = {}
    current = None
    for e in log:
        if e.type == "batch_started":
            current = e.data["batch_id"]
            for call in e.data["calls"]:
                batch_of[call["call_id"]] = current
        elif e.type in ("call_decided", "dispatch_started", "call_completed") and current is not None:
            assert batch_of.get(e.data["call_id"]) == current, (e.seq, e.type, e.data["call_id"], current)
