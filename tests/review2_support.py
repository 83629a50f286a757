"""What the second attack review's dispatch tests share: the real stack (a real gRPC server on
a loopback port, the real Orchestrator, a real SQLite file, a real DockerBackend), a run's log
read back from the store, and the engine's own account of which containers started.

The engine is the witness of an effect: a call that never reached a container has no `start`
event in the engine's log, whatever the control plane said about it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ringfence.model import Event
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.config import load_config, token_digest
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.store import SqliteEventStore
from ringfence_server.sandbox import labels as L

AGENT = "review2-agent-token"
TENANT = "acme"


class Stack:
    """The server's address, its store and its orchestrator, for one test."""

    def __init__(self, server: BackgroundServer, store: SqliteEventStore, orchestrator: Orchestrator) -> None:
        self.server = server
        self.store = store
        self.orchestrator = orchestrator

    @property
    def address(self) -> str:
        return self.server.address

    def events(self, run_id: str) -> list[Event]:
        """The run's whole log, as the store holds it."""
        return self.store.read(run_id)

    def of_call(self, run_id: str, call_id: str) -> list[tuple[str, Mapping[str, Any]]]:
        """(type, data) of every event of one call, in log order."""
        return [(e.type, e.data) for e in self.events(run_id) if e.data.get("call_id") == call_id]


@contextlib.contextmanager
def served(tmp_path, backend, *, rules: Sequence[Mapping[str, Any]], limits: Mapping[str, Any] | None = None,
           **overrides: Any) -> Iterator[Stack]:
    """A real server over `backend`, allowing exactly `rules` (autonomous: no approvals for
    reversible mutations), with `limits` over the defaults."""
    config = load_config(overrides={
        "state_dir": str(tmp_path / "state"),
        "policy": {"autonomy": "autonomous", "rules": [dict(r) for r in rules]},
        "limits": dict(limits or {}),
        "tenants": {TENANT: {"tokens": [{"sha256": token_digest(AGENT), "role": "agent", "subject": "agent-1"}]}},
        **overrides,
    })
    store = SqliteEventStore(config.db_path)
    orchestrator = Orchestrator.from_config(config, backend, store)
    try:
        with BackgroundServer(orchestrator, config) as server:
            yield Stack(server, store, orchestrator)
    finally:
        orchestrator.close()
        store.close()


def started_containers(docker_client, run_id: str, since: float) -> list[str]:
    """The call ids (`call.aN`) of every container of `run_id` that the engine started since
    `since` (a wall-clock time), from the engine's own event log."""
    events = docker_client.events(
        since=int(since) - 1, until=f"{time.time() + 1:.6f}", decode=True,
        filters={"type": "container", "event": "start", "label": f"{L.RUN_LABEL}={TENANT}:{run_id}"})
    return sorted(e["Actor"]["Attributes"][L.CALL_LABEL] for e in events)
