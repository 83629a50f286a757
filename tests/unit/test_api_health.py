"""grpc.health.v1 tells the truth: NOT_SERVING while the sandbox engine (or the store) does not
answer, SERVING again by itself once it does. Through the real server on a real port."""

from __future__ import annotations

from api_support import RealCore, fake_backend, make_config
from control.api.background import BackgroundServer
from health_support import NOT_SERVING, SERVING, status_of, wait_for


def test_health_follows_the_sandbox_engine(tmp_path):
    backend = fake_backend()
    with RealCore(make_config(tmp_path), backend) as core, \
            BackgroundServer(core.orchestrator, core.config, health_interval_s=0.05) as s:
        assert status_of(s.address) == SERVING
        backend.unhealthy = "Cannot connect to the Docker daemon"
        assert wait_for(s.address, NOT_SERVING) == NOT_SERVING
        assert wait_for(s.address, NOT_SERVING, "ringfence.v1.RunService") == NOT_SERVING
        assert "sandbox engine" in s.server.monitor.failing
        backend.unhealthy = None
        assert wait_for(s.address, SERVING) == SERVING
        assert s.server.monitor.failing == {}


def test_health_follows_the_event_store(tmp_path):
    with RealCore(make_config(tmp_path), fake_backend()) as core, \
            BackgroundServer(core.orchestrator, core.config, health_interval_s=0.05) as s:
        broken = {"on": True}
        real_ping = core.store.ping

        def ping():
            if broken["on"]:
                raise OSError("disk gone")
            real_ping()

        core.store.ping = ping
        assert wait_for(s.address, NOT_SERVING) == NOT_SERVING
        assert "event store" in s.server.monitor.failing
        broken["on"] = False
        assert wait_for(s.address, SERVING) == SERVING
