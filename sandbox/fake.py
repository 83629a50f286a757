"""An in-memory SandboxBackend for fast control-plane unit tests. It runs nothing.

Beside, never instead of, the Docker backend: every property of the real sandbox is proven
against the real engine in tests/integration and tests/escape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sandbox.backend import SandboxRequest
from sandbox.errors import EngineError
from sandbox.result import Outcome, SandboxResult

Handler = Callable[[SandboxRequest], SandboxResult]


def ok_result(stdout: bytes = b"", *, exit_code: int = 0) -> SandboxResult:
    return SandboxResult(
        outcome=Outcome.OK,
        exit_code=exit_code,
        stdout=stdout,
        stderr=b"",
        stdout_truncated=False,
        stderr_truncated=False,
        duration_ms=0,
        image_id="sha256:fake",
        runtime="fake",
    )


class FakeBackend:
    """Answers each request with `handler(request)` and records every request it was given.

    `requests` is the witness that a call reached (or never reached) the sandbox.
    """

    def __init__(self, handler: Handler | None = None) -> None:
        self._handler = handler or (lambda request: ok_result())
        self._lock = threading.Lock()
        self.requests: list[SandboxRequest] = []
        self.kills: list[tuple[str, str]] = []
        self.closed = False
        # Health: while this holds an error message, ping() raises it as the engine's failure.
        self.unhealthy: str | None = None

    @property
    def starts(self) -> int:
        with self._lock:
            return len(self.requests)

    def run(self, request: SandboxRequest) -> SandboxResult:
        with self._lock:
            self.requests.append(request)
        return self._handler(request)

    def ping(self) -> None:
        if self.unhealthy is not None:
            raise EngineError(self.unhealthy)

    def kill_all(self, reason: str) -> int:
        with self._lock:
            self.kills.append(("*", reason))
        return 0

    def kill_run(self, run_id: str, reason: str) -> int:
        """Records the kill; a handler that models a running call may look at `kills`."""
        with self._lock:
            self.kills.append((run_id, reason))
        return 0

    def close(self) -> None:
        self.closed = True
