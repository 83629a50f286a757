"""The SandboxBackend protocol and the request it takes.

A backend runs one request in one fresh sandbox and returns a classified result. The Docker
backend is the real one; `FakeBackend` (ringfence_server.sandbox.fake) serves control-plane unit tests.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ringfence_server.sandbox.errors import ProfileError
from ringfence_server.sandbox.profile import SandboxProfile
from ringfence_server.sandbox.result import SandboxResult

if TYPE_CHECKING:
    from ringfence_server.sandbox.mcp_session import McpCall

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")


OutputListener = Callable[[str, bytes], None]


@dataclass(frozen=True)
class SandboxRequest:
    """One call to run.

    `argv` empty means the image's entrypoint (the tool runner, which reads one JSON request on
    stdin and writes one JSON result on stdout).
    """

    profile: SandboxProfile = field(default_factory=SandboxProfile)
    argv: tuple[str, ...] = ()
    stdin: bytes = b""
    run_id: str = "adhoc"
    call_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    stdin_limit: int = 4 * 1024 * 1024
    warm: bool = True
    """May run in a warm container of the backend's pool (when it has one); False: always a
    container created for this call (a tool that opts out)."""
    on_output: OutputListener | None = field(default=None, compare=False)
    """Called from the backend's reading thread with each piece of the tool's output as it
    arrives, ("stdout" | "stderr", bytes), only the bytes kept under the output caps (PID 1's
    reports are not the tool's and are never passed). It must be quick and must not raise: the
    call's wall clock runs while it works. The result's stdout/stderr are the same bytes."""

    mcp: McpCall | None = None
    """A tools/call for an MCP server (ringfence_server.sandbox.mcp_session): it runs in the
    run's session sandbox of that server (started on the run's first call to it, with this
    profile and `argv` as the server's command), not in a container of its own."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", tuple(self.argv))
        for arg in self.argv:
            if not isinstance(arg, str) or "\0" in arg:
                raise ProfileError("argv", "arguments must be strings without NUL")
        if len(self.stdin) > self.stdin_limit:
            raise ProfileError("stdin", f"{len(self.stdin)} bytes is over the {self.stdin_limit} cap")
        for name in ("run_id", "call_id"):
            if not _ID.match(getattr(self, name)):
                raise ProfileError(name, "must be 1-200 characters of [A-Za-z0-9_.:-]")


@runtime_checkable
class SandboxBackend(Protocol):
    def run(self, request: SandboxRequest) -> SandboxResult:
        """Run `request` in a fresh sandbox and classify how it ended.

        Raises ImageError when the image is not pinned and EngineError when the engine cannot
        be reached; a tool that fails is a result, not an exception.
        """
        ...

    def ping(self) -> None:
        """Raise EngineError unless the engine answers now (the server's health checks)."""
        ...

    def expect(self, requests: list[SandboxRequest]) -> None:
        """These calls are about to run (a batch's reads, announced together before they
        start): a backend with a warm pool makes ready containers for them ahead. A hint: it
        never raises, and a call never announced runs the same."""
        ...

    def kill_run(self, run_id: str, reason: str) -> int:
        """Kill every sandbox of `run_id` now (cancel, a run deadline); each call then ends
        `killed` with `reason`. Returns how many were killed."""
        ...

    def end_run(self, run_id: str) -> int:
        """The run ended: release what it held between calls (its MCP servers' session
        sandboxes, removed). Returns how many were released."""
        ...

    def kill_all(self, reason: str) -> int:
        """Kill every sandbox this backend runs (the process is stopping); returns how many."""
        ...

    def close(self) -> None: ...
