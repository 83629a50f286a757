"""An in-memory SandboxBackend and WorkspaceStore for fast control-plane unit tests. They run
and mount nothing.

Beside, never instead of, the Docker backend: every property of the real sandbox is proven
against the real engine in tests/integration and tests/escape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.errors import EngineError
from ringfence_server.sandbox.result import Outcome, SandboxResult
from ringfence_server.sandbox.workspace import WorkspaceInfo, WorkspaceSpec, volume_name

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
        self.ended_runs: list[str] = []
        self.expected: list[list[SandboxRequest]] = []  # each expect()'s calls, in order
        self.closed = False
        # Health: while this holds an error message, ping() raises it as the engine's failure.
        self.unhealthy: str | None = None

    @property
    def starts(self) -> int:
        with self._lock:
            return len(self.requests)

    def run(self, request: SandboxRequest) -> SandboxResult:
        """The handler's result; its stdout and stderr also go to `request.on_output` (each in
        one piece), as the real backend streams them while the call runs."""
        with self._lock:
            self.requests.append(request)
        result = self._handler(request)
        if request.on_output is not None:
            if result.stdout:
                request.on_output("stdout", result.stdout)
            if result.stderr:
                request.on_output("stderr", result.stderr)
        return result

    def ping(self) -> None:
        if self.unhealthy is not None:
            raise EngineError(self.unhealthy)

    def expect(self, requests: list[SandboxRequest]) -> None:
        """Records the announcement (the real backend's pool makes ahead for it)."""
        with self._lock:
            self.expected.append(list(requests))

    def kill_all(self, reason: str) -> int:
        with self._lock:
            self.kills.append(("*", reason))
        return 0

    def kill_run(self, run_id: str, reason: str) -> int:
        """Records the kill; a handler that models a running call may look at `kills`."""
        with self._lock:
            self.kills.append((run_id, reason))
        return 0

    def end_run(self, run_id: str) -> int:
        """Records the run's end (the real backend closes its MCP session sandboxes then)."""
        with self._lock:
            self.ended_runs.append(run_id)
        return 0

    def close(self) -> None:
        self.closed = True


class FakeWorkspaces:
    """A WorkspaceStore in memory: `workspaces` (run key -> (tenant, volume, spec)) is what
    "exists", and `created`/`removed` list the run keys in the order they were made and removed.
    While `unhealthy` holds a message, every operation raises it as the engine's failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.workspaces: dict[str, tuple[str, str, WorkspaceSpec]] = {}
        self.created: list[str] = []
        self.removed: list[str] = []
        self.unhealthy: str | None = None

    def _check(self) -> None:
        if self.unhealthy is not None:
            raise EngineError(self.unhealthy)

    def create(self, run_key: str, tenant: str, spec: WorkspaceSpec) -> str:
        self._check()
        with self._lock:
            if run_key not in self.workspaces:
                self.workspaces[run_key] = (tenant, volume_name(run_key), spec)
                self.created.append(run_key)
            return self.workspaces[run_key][1]

    def remove(self, run_key: str) -> bool:
        self._check()
        with self._lock:
            if self.workspaces.pop(run_key, None) is None:
                return False
            self.removed.append(run_key)
            return True

    def find(self, run_key: str) -> WorkspaceInfo | None:
        self._check()
        with self._lock:
            found = self.workspaces.get(run_key)
        return None if found is None else WorkspaceInfo(run_key, found[0], found[1], keeper_running=True)

    def list(self) -> list[WorkspaceInfo]:
        self._check()
        with self._lock:
            return [WorkspaceInfo(key, tenant, volume, keeper_running=True)
                    for key, (tenant, volume, _) in self.workspaces.items()]

    def reap(self, keep: Callable[[WorkspaceInfo], bool]) -> int:
        doomed = [info for info in self.list() if not keep(info)]
        return sum(self.remove(info.run_key) for info in doomed)
