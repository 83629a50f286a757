"""RecordingBackend: the real sandbox backend, with a record of every request it was handed.

The containers still run; the record is the witness of what reached the sandbox (a call that
was denied, deduplicated or replayed is absent from it) and of exactly what crossed into each
container (its stdin).
"""

from __future__ import annotations

import json
import threading
from typing import Any


class RecordingBackend:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[Any] = []  # ringfence_server.sandbox.backend.SandboxRequest, in the order handed over
        self._lock = threading.Lock()

    def run(self, request):
        with self._lock:
            self.requests.append(request)
        return self.inner.run(request)

    def close(self) -> None:  # the test's fixture owns the real backend
        pass

    def __getattr__(self, name):  # ping, kill_run, kill_all: the real backend's
        return getattr(self.inner, name)

    # -- reading the record ----------------------------------------------------------------

    @property
    def call_ids(self) -> list[str]:
        """The sandbox call ids, attempt suffix and all ("c1.a1", ...)."""
        with self._lock:
            return [r.call_id for r in self.requests]

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def calls(self) -> list[str]:
        """The call ids without the attempt suffix: ["router", "specialist", ...]."""
        return [c.rsplit(".a", 1)[0] for c in self.call_ids]

    def sent(self, call: str) -> list[dict[str, Any]]:
        """The arguments that crossed into each container of `call` (what the tool read on stdin)."""
        with self._lock:
            return [json.loads(r.stdin)["arguments"] for r in self.requests if r.call_id.startswith(call + ".a")]

    def since(self, n: int) -> list[tuple[str, str, str]]:
        """(sandbox run id, call id, tool) of every request after the first `n`."""
        with self._lock:
            return [(r.run_id, r.call_id, _tool(r)) for r in self.requests[n:]]

    def of_run(self, sandbox_run_id: str) -> list[tuple[str, str]]:
        """(call id, tool) of every request of one run (sandbox run ids are `tenant:run`)."""
        return [(c, t) for r, c, t in self.since(0) if r == sandbox_run_id]

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()


def _tool(request: Any) -> str:
    try:
        return json.loads(request.stdin or b"{}").get("tool", "")
    except ValueError:
        return ""
