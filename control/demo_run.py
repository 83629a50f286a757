"""The control-plane half of `make demo`: one agent run through the real gRPC server.

An agent client proposes a turn with a path outside the tool's roots (denied before anything
runs), two reads (dispatched in parallel, each in its own container) and a credit that policy
says to ASK about; an approver client on a second channel approves it; the credit reaches the
ledger (a real service with its own SQLite file) through the egress proxy; the same credit
proposed again is answered from the log (deduplicated), never run twice. The effect is counted
where it happens: in the ledger. Then the run's event log.
"""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path

from control.api.background import BackgroundServer
from control.api.client import RingfenceClient
from control.config import load_config
from control.orchestration import Orchestrator
from control.model import ApprovalStatus
from control.store import SqliteEventStore
from sandbox.docker_backend import DockerBackend
from sandbox.egress.proxy import EgressProxy, ProxySettings
from sandbox.ledger.container import LEDGER_HOST, Ledger

# The embedded config's public dev tokens (see control/default_config.toml).
AGENT, APPROVER = "demo-agent-token", "demo-approver-token"


def _approve_next(address: str, done: threading.Event) -> None:
    with RingfenceClient(address, APPROVER) as approver:
        stream = approver.watch_approvals()
        try:
            for approval in stream:
                if approval.status is ApprovalStatus.PENDING:
                    print(f"   approver sees {approval.tool}({json.dumps(dict(approval.arguments))}) "
                          f"digest {approval.digest[:19]}... -> approve")
                    approver.decide_approval(approval.approval_id, True, "known customer, small amount")
                    break
        finally:
            stream.cancel()
            done.set()


def _approve_one(address: str) -> None:
    done = threading.Event()
    thread = threading.Thread(target=_approve_next, args=(address, done), daemon=True)
    thread.start()
    done.wait(120)


def _show(observations) -> None:
    for o in observations:
        detail = o.error or json.dumps(o.content)[:60] if (o.error or o.content is not None) else ""
        print(f"   {o.call_id:<10} {o.tool:<10} {o.status.value:<17} executed={str(o.executed):<5} "
              f"path={'>'.join(o.verdict_path)}  {detail}")


def run(showcase_backend) -> int:
    client = showcase_backend.client
    with tempfile.TemporaryDirectory(prefix="ringfence-demo-") as tmp, \
            Ledger(client) as ledger, \
            EgressProxy(client, settings=ProxySettings(services=ledger.services(),
                                                       service_networks=(ledger.network,))) as proxy:
        print(f"ledger on its own network ({ledger.network}), reached only through the egress proxy as "
              f"{LEDGER_HOST}")
        backend = DockerBackend(client, egress_proxy=proxy)
        inputs = Path(tmp) / "input"
        inputs.mkdir()
        inputs.chmod(0o755)
        (inputs / "greeting.txt").write_text("hello from the host\n")
        (inputs / "greeting.txt").chmod(0o644)
        config = load_config(overrides={"state_dir": str(Path(tmp) / "state"), "inputs": {"/input": str(inputs)},
                                        "policy": {"egress": {"credit": [LEDGER_HOST]}}})
        store = SqliteEventStore(config.db_path)
        orchestrator = Orchestrator.from_config(config, backend, store)
        try:
            with BackgroundServer(orchestrator, config) as server, RingfenceClient(server.address, AGENT) as agent:
                print(f"control plane listening on {server.address} (SQLite log {config.db_path})")
                run_view = agent.start_run("read the greeting, then credit acme-9 with 50", "demo-run")
                print("\nturn 1: one denied path, two reads, one credit (policy: ask)")
                _show(agent.submit_batch(run_view.run_id, [
                    {"call_id": "shadow", "tool": "read_file", "arguments": {"path": "/input/../etc/shadow"}},
                    {"call_id": "greeting", "tool": "read_file", "arguments": {"path": "/input/greeting.txt"}},
                    {"call_id": "ping", "tool": "echo", "arguments": {"text": "ping"}},
                    {"call_id": "pay", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}},
                ]))
                _approve_one(server.address)
                pay = {o.call_id: o for o in agent.get_run(run_view.run_id).trajectory}["pay"]
                print("   after approval:")
                _show([pay])
                print("\nturn 2: the same credit again (approved again, answered from the log)")
                [again] = agent.submit_batch(run_view.run_id, [
                    {"call_id": "pay-again", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}},
                ])
                _show([again])
                _approve_one(server.address)
                again = {o.call_id: o for o in agent.get_run(run_view.run_id).trajectory}["pay-again"]
                _show([again])
                finished = agent.finish_run(run_view.run_id)
                print(f"\nrun {finished.run_id}: {finished.status.value}, outcome {finished.outcome.value}")
                stats, balance = ledger.stats(), ledger.balance("acme-9")
                print(f"ledger (the receiver): credits applied {stats['credits']}, replays {stats['replays']}, "
                      f"acme-9 balance {balance['balance']:g}")
                print("\nevent log (WatchRun from 0):")
                for event in agent.watch_run(run_view.run_id, 0):
                    call = event.data.get("call_id", "")
                    print(f"   {event.seq:>3} {event.type:<20} {call}")
        finally:
            orchestrator.close()
            store.close()
    return 0
