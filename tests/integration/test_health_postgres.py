"""Health against a real PostgreSQL: the server says NOT_SERVING while its event store's
database is down, and SERVING again by itself once the database is back."""

from __future__ import annotations

from health_support import NOT_SERVING, SERVING, wait_for

from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.config import load_config
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.store.postgres import PostgresEventStore
from ringfence_server.sandbox.fake import FakeBackend


def test_health_follows_the_postgres_event_store(own_pg_cluster, tmp_path):
    config = load_config(overrides={"state_dir": str(tmp_path)})
    store = PostgresEventStore(own_pg_cluster.url())
    orch = Orchestrator.from_config(config, FakeBackend(), store)
    try:
        with BackgroundServer(orch, config, health_interval_s=0.1) as s:
            assert wait_for(s.address, SERVING) == SERVING
            own_pg_cluster.pause()
            assert wait_for(s.address, NOT_SERVING) == NOT_SERVING
            assert "event store" in s.server.monitor.failing
            own_pg_cluster.resume()
            assert wait_for(s.address, SERVING) == SERVING
    finally:
        orch.close()
        store.close()
