"""grpc.health.v1 tells the truth: NOT_SERVING while the sandbox engine (or the store) does not
answer, SERVING again by itself once it does. Through the real server on a real port."""

from __future__ import annotations

from api_support import RealCore, fake_backend, make_config
from health_support import NOT_SERVING, SERVING, status_of, wait_for

from ringfence_server.control.api.background import BackgroundServer


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


def test_the_monitor_stops_even_when_its_cancellation_is_swallowed():
    # Before Python 3.12 asyncio.wait_for can swallow a cancellation (when its inner future
    # completes at that moment); a monitor that relied on cancel() alone then never stopped,
    # and `ringfence serve` hung on SIGTERM. This servicer swallows it on purpose, every time.
    import asyncio
    import contextlib

    from ringfence_server.control.api.health import HealthMonitor, Probe

    class Swallowing:
        def __init__(self) -> None:
            self.sets = 0

        async def set(self, name, status):
            self.sets += 1
            with contextlib.suppress(asyncio.CancelledError):  # what wait_for does in that race: the task goes on
                await asyncio.sleep(0.01)

        async def enter_graceful_shutdown(self) -> None:
            pass

    async def scenario() -> int:
        servicer = Swallowing()
        flip = iter(range(10**6))

        def check() -> None:  # alternates: every check is a transition, so set() is awaited each time
            if next(flip) % 2:
                raise OSError("down")

        monitor = HealthMonitor(servicer, [""], [Probe("engine", check)], interval_s=0)
        await monitor.start()
        for _ in range(2000):  # until the loop has been through set() a few times (a busy machine is slow)
            if servicer.sets >= 3:
                break
            await asyncio.sleep(0.005)
        await asyncio.wait_for(monitor.stop(), 10)
        return servicer.sets

    # On a thread of its own: a monitor that does not stop must fail this test, not hang it.
    import threading

    done: list[int] = []
    thread = threading.Thread(target=lambda: done.append(asyncio.run(scenario())), daemon=True)
    thread.start()
    thread.join(30)
    assert done and done[0] >= 2, "the monitor did not stop"
