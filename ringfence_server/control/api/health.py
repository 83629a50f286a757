"""grpc.health.v1 that tells the truth: NOT_SERVING while the sandbox engine or the event store
does not answer, SERVING again as soon as both do.

A load balancer or an agent's client asks health before sending work; a server that says
SERVING while its engine is down would take batches it can only fail. The monitor probes every
`interval_s` on a worker thread (a probe that hangs counts as a failure after `timeout_s`) and
changes the status only on a transition, logging which dependency failed and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from grpc_health.v1 import health_pb2

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthReporter(Protocol):
    """The part of grpc_health's asyncio HealthServicer the server drives."""

    async def set(self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None: ...

    async def enter_graceful_shutdown(self) -> None: ...


@dataclass(frozen=True)
class Probe:
    name: str
    """What is probed, for the log: "sandbox engine", "event store"."""

    check: Callable[[], None]
    """Returns when the dependency answers; raises (anything) when it does not."""


class HealthMonitor:
    def __init__(self, servicer: HealthReporter, services: Sequence[str], probes: Sequence[Probe], *,
                 interval_s: float = 2.0, timeout_s: float = 5.0) -> None:
        self._servicer = servicer
        self._services = tuple(services)
        self._probes = tuple(probes)
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.failing: dict[str, str] = {}
        """Probe name -> why it failed last time; empty while everything answers."""

    async def check_once(self) -> bool:
        failing: dict[str, str] = {}
        for probe in self._probes:
            try:
                await asyncio.wait_for(asyncio.to_thread(probe.check), self._timeout_s)
            except TimeoutError:
                failing[probe.name] = f"no answer within {self._timeout_s:g}s"
            except Exception as e:  # noqa: BLE001 - any failure of a probe means "not answering"
                failing[probe.name] = f"{type(e).__name__}: {e}"[:500]
        if failing != self.failing:
            if failing:
                log.warning("health: NOT_SERVING (%s)", "; ".join(f"{k}: {v}" for k, v in failing.items()))
            else:
                log.info("health: SERVING (every dependency answers again)")
        was_serving = not self.failing
        self.failing = failing
        if was_serving != (not failing) or self._task is None:
            status = SERVING if not failing else NOT_SERVING
            for name in self._services:
                await self._servicer.set(name, status)
        return not failing

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            await self.check_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)

    async def start(self) -> None:
        await self.check_once()
        self._task = asyncio.create_task(self._loop(), name="rf-health")

    async def stop(self) -> None:
        if self._task is None:
            return
        # Cancelling alone is not enough: before Python 3.12, asyncio.wait_for swallows a
        # cancellation that arrives as its inner future completes (a probe answering just
        # then), and the loop ran on while stop() waited for ever: `ringfence serve` stopped
        # right after it started hung. The flag ends the loop at its next turn regardless.
        self._stopping.set()
        self._task.cancel()
        await asyncio.wait({self._task})
        self._task = None
