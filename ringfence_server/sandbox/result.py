"""Classified results of one sandboxed call.

The retry layer decides from `Outcome` (and `ToolErrorClass` for tool errors) alone, so the
classification is an enum, never a string match on messages.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class Outcome(enum.StrEnum):
    OK = "ok"
    TOOL_ERROR = "tool_error"  # the tool ran and reported (or exited with) a failure
    OOM = "oom"  # the memory cgroup killed it
    TIMEOUT = "timeout"  # the wall-time limit was reached; the container was killed
    OUTPUT_LIMIT = "output_limit"  # stdout or stderr went past its cap; the container was killed
    START_FAILED = "start_failed"  # engine trouble before the tool could have started: transient
    UNCERTAIN = "uncertain"  # engine trouble after the tool could have started: it may have run
    KILLED = "killed"  # ended by a signal that was not ours and not the OOM killer, or by its runtime


class ToolErrorClass(enum.StrEnum):
    INVALID = "invalid"
    TRANSIENT = "transient"
    RATE_LIMITED = "rate_limited"
    FATAL = "fatal"


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one call. `stdout`/`stderr` hold at most the profile's caps."""

    outcome: Outcome
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    image_id: str
    runtime: str
    error_class: ToolErrorClass | None = None
    message: str = ""
    # retry-after hint in seconds, from a tool's rate_limited error
    retry_after_s: float | None = None
    container_name: str = ""
    # The settings read back from the engine for this container (see DockerBackend).
    applied: Mapping[str, Any] = field(default_factory=dict)
    # Egress tools only: every decision the egress proxy took for this call (host, port,
    # allowed or denied and why, bytes), in order.
    egress_events: tuple[Mapping[str, Any], ...] = ()
    # From the request to the container started (image look-up, create, attach, start): the
    # sandbox's own cost, before `duration_ms` of the tool's time begins. 0 when nothing started.
    setup_ms: int = 0
    # It ran in a ready container of the warm pool: `setup_ms` is then the claim and hand-over
    # (a wait for the pool included), not a container's start.
    warm: bool = False
    # The sandbox worker that ran it (a worker's result as a control plane received it); "" when
    # it ran on this host's engine. Not the sandbox's own knowledge: the control plane sets it.
    worker: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "exit_code": self.exit_code,
            "stdout": self.stdout.decode("utf-8", "replace"),
            "stderr": self.stderr.decode("utf-8", "replace"),
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "duration_ms": self.duration_ms,
            "setup_ms": self.setup_ms,
            "warm": self.warm,
            "image_id": self.image_id,
            "runtime": self.runtime,
            "error_class": self.error_class.value if self.error_class else None,
            "message": self.message,
            "applied": dict(self.applied),
            "egress_events": [dict(e) for e in self.egress_events],
        }


def classify_exit(
    *,
    exit_code: int | None,
    killed_for: Outcome | None,
    oom_killed: bool,
    tool_ended: bool = True,
) -> Outcome:
    """Classify how a container ended.

    `killed_for` is set when *we* killed the container (deadline or output cap): that reason
    wins, because the exit status of a container we SIGKILLed says 137 like an OOM kill does.
    Exit 137 that we did not cause, after PID 1 reported the tool's end, is the kernel's OOM
    killer (cgroup v1 reports it reliably only for PID 1, so the status code is the second
    witness); without that report the whole container was killed from outside: `killed`.

    `tool_ended` says whether PID 1 reported the tool's end (ringfence_server.sandbox.witness). A failure
    status without that report is the runtime's (a gVisor sentry that died exits 2) or an
    outside kill: `killed`, never the tool's error.
    """
    if killed_for is not None:
        return killed_for
    if oom_killed:
        return Outcome.OOM
    if exit_code is None:
        return Outcome.KILLED
    if exit_code == 137:
        # Not our kill. The OOM killer takes the tool, and PID 1 reports the tool's end; a kill
        # of the whole container from outside (another instance's kill_run, `docker kill`)
        # takes PID 1 with it, and nothing is reported: that is `killed`, not a memory limit.
        return Outcome.OOM if tool_ended else Outcome.KILLED
    if exit_code == 0:
        return Outcome.OK
    if exit_code > 128 or not tool_ended:
        return Outcome.KILLED
    return Outcome.TOOL_ERROR
