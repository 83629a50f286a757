"""Removal of ended containers off the call's critical path: one thread, one queue.

A warm call's result is returned as soon as its container ended; removing the container (a
round trip to the engine that can take tens of milliseconds) happens here, after it, and not at
once: GRACE_S later, when the call's own last steps (its durable writes, the reply) are done.
The engine's removal work is CPU the reply would otherwise compete with (seen in
bench/bench_warm_steps.py). The container has exited: waiting holds nothing but a name.
close() removes what is queued without waiting, so nothing of ours outlives the backend.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from docker.models.containers import Container

from ringfence_server.sandbox import engine

log = logging.getLogger("ringfence.sandbox.docker")

# How long after its call an ended container is removed.
GRACE_S = 0.2


class Remover:
    """Removes queued containers on a thread of its own, started on the first `later`."""

    def __init__(self, remove: Callable[[Container], None] = engine.remove, grace_s: float = GRACE_S) -> None:
        self._remove = remove
        self._grace_s = grace_s
        self._closing = threading.Event()
        self._queue: queue.SimpleQueue[tuple[float, Container] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def later(self, container: Container) -> None:
        """Remove `container` on the remover thread (close() waits for it)."""
        with self._mutex:
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="rf-remover", daemon=True)
                self._thread.start()
        self._queue.put((time.monotonic() + self._grace_s, container))

    def close(self, timeout_s: float = 60) -> None:
        """Remove what is queued, then stop the thread (waiting at most `timeout_s`)."""
        with self._mutex:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._closing.set()  # no more grace: drain now
            self._queue.put(None)
            thread.join(timeout_s)

    def _drain(self) -> None:
        while (item := self._queue.get()) is not None:
            due, container = item
            self._closing.wait(max(0.0, due - time.monotonic()))
            # This thread serves every removal of the backend's life: an unexpected error on
            # one container must not end it (seen: requests iterating os.environ while a test
            # changed it raised KeyError, and every later container stayed behind).
            for attempt in (1, 2):
                try:
                    self._remove(container)
                    break
                except Exception:  # the reaper removes it later by label if both attempts fail
                    log.warning("removing container %s failed (attempt %d)", container.id, attempt,
                                exc_info=True)
