"""Crash points: `ringfence serve` killed hard (SIGKILL semantics) at each boundary a call crosses,
on SQLite and on PostgreSQL. A client drives one run (an echo and a credit that policy says to
ASK about, approved, then the run finished); when the server dies under it, the test starts a
new one on the same log and the client simply does its work again (the same run id, the same
batch id, the approvals that are pending). Then:

- the credit took effect exactly once, counted IN THE LEDGER (the receiver), not in a reply, and
  was delivered there once (no replay that the ledger's own deduplication absorbed);
- every event a watcher saw before the crash is in the final log, unchanged, and the log's
  audit chain is intact;
- no container of the killed server (or of its successor) is left;
- the run finished `completed`.
"""

from __future__ import annotations

import threading

import pytest
from serve_support import Served

from ringfence import Client
from ringfence.errors import ControlError
from ringfence.model import ApprovalStatus, ObservationStatus, RunOutcome
from ringfence_server.control.config import token_digest
from ringfence_server.control.orchestration.crashpoints import ENV, POINTS
from ringfence_server.control.store import open_store, verify
from ringfence_server.demo_services.ledger.container import LEDGER_HOST

pytestmark = pytest.mark.docker

AGENT, APPROVER = "crash-agent-token", "crash-approver-token"
RUN = "crash-run"
CALL_POINTS = ("after_dispatch_started", "after_effect", "after_completion")
BATCH = [{"call_id": "ping", "tool": "echo", "arguments": {"text": "ping"}},
         {"call_id": "pay", "tool": "credit", "arguments": {"account": "acme-7", "amount": 42}}]


def write_config(path, ledger) -> None:
    services = ", ".join(f'"{name}" = {list(addresses)!r}' for name, addresses in ledger.services().items())
    path.write_text(
        "[tenants.acme]\n"
        "tokens = [\n"
        f'  {{ sha256 = "{token_digest(AGENT)}", role = "agent", subject = "agent" }},\n'
        f'  {{ sha256 = "{token_digest(APPROVER)}", role = "approver", subject = "approver" }},\n'
        "]\n"
        "[policy]\nautonomy = \"autonomous\"\n"
        "rules = [\n"
        '  { tool = "echo", verdict = "allow" },\n'
        '  { tool = "credit", verdict = "allow" },\n'
        "]\n"
        "[policy.egress]\n"
        f'credit = ["{LEDGER_HOST}"]\n'
        f'credit_lookup = ["{LEDGER_HOST}"]\n'
        "[egress]\n"
        f"services = {{ {services.replace(chr(39), chr(34))} }}\n"
        f'networks = ["{ledger.network}"]\n'
    )


class Watcher(threading.Thread):
    """A client watching the run's events as the server acknowledges them (durable first)."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.seen: list = []

    def run(self) -> None:
        try:
            with Client(self.address, AGENT) as c:
                for event in c.watch_run(RUN, 0):
                    self.seen.append(event)
        except Exception:  # noqa: BLE001 - the server died under it: what it saw stays recorded
            pass


def drive(address: str, watchers: list) -> None:
    """The client's whole job, idempotent: safe to run again from the top after a crash."""
    with Client(address, AGENT) as agent, Client(address, APPROVER) as approver:
        agent.start_run("one credit, exactly once", RUN)
        watcher = Watcher(address)
        watcher.start()
        watchers.append(watcher)
        agent.submit_batch(RUN, BATCH, batch_id="turn-1")
        for _ in range(200):
            pending = [a for a in approver.list_approvals(RUN) if a.status is ApprovalStatus.PENDING]
            for approval in pending:
                approver.decide_approval(approval.approval_id, True, "expected credit")
            pay = {o.call_id: o for o in agent.get_run(RUN).trajectory}.get("pay")
            if pay is not None and pay.status is not ObservationStatus.PENDING_APPROVAL:
                break
            threading.Event().wait(0.05)
        agent.finish_run(RUN)


def containers_of(docker_client, pid: int):
    return docker_client.containers.list(all=True, filters={"label": f"ringfence.pid={pid}"})


@pytest.fixture(params=["sqlite", "postgres"])
def log_target(request, tmp_path):
    """(extra serve arguments, store URL or path) of the event log the servers share."""
    if request.param == "sqlite":
        state = tmp_path / "state"
        return [], str(state / "events.sqlite3")
    url = request.getfixturevalue("pg_url")
    return ["--database-url", url], url


@pytest.mark.parametrize("point", POINTS)
def test_a_crash_at_each_boundary_loses_nothing_and_doubles_nothing(point, log_target, ledger_backend,
                                                                     docker_client, tmp_path):
    ledger, _ = ledger_backend
    config = tmp_path / "ringfence.toml"
    write_config(config, ledger)
    extra, store_at = log_target
    state = tmp_path / "state"
    watchers: list = []
    # The points a call crosses are armed for the credit (the echo crosses them first).
    armed = f"{point}:credit" if point in CALL_POINTS else point
    servers = [Served(config, state, *extra, env={ENV: armed})]
    crashed = False
    try:
        for _ in range(3):
            try:
                drive(servers[-1].address, watchers)
                break
            except ControlError:
                # The server died under the client (UNAVAILABLE): it must be the crash point.
                assert servers[-1].proc.wait(30) == -9, f"the server did not die at {point}"
                crashed = True
                servers.append(Served(config, state, *extra))
        else:
            pytest.fail("the run never completed")
    finally:
        for s in servers:
            s.stop()
        for w in watchers:
            w.join(10)
    assert crashed, f"{point} was never reached"

    # Effects: exactly once, at the receiver.
    stats = ledger.stats()
    assert stats["credits"] == 1, stats
    # Not even a second delivery that the ledger's own deduplication absorbed: recovery asked
    # the receiver (or knew) instead of sending the credit again.
    assert stats["replays"] == 0 and stats["conflicts"] == 0, stats
    assert ledger.balance("acme-7")["balance"] == 42

    # Events: the final log holds every event any watcher saw, unchanged; the chain is intact.
    store = open_store(store_at)
    try:
        final = store.read(RUN)
    finally:
        store.close()
    by_seq = {e.seq: e for e in final}
    for w in watchers:
        for e in w.seen:
            assert by_seq[e.seq].type == e.type and dict(by_seq[e.seq].data) == dict(e.data), (point, e.seq)
    report = verify(final)
    assert report.ok, report
    assert final[-1].type == "run_finished" and final[-1].data["outcome"] == RunOutcome.COMPLETED.value

    # Containers: nothing of either server is left.
    for s in servers:
        assert containers_of(docker_client, s.proc.pid) == [], point
