"""How a call's container ended, in words: its Outcome's message, and the engine's account
of an unexplained SIGKILL.

The Outcome itself is ringfence_server.sandbox.result.classify_exit (pure); this module adds what the engine
must be asked (was exit 137 the OOM killer?) and what the result says about each outcome (for
a tool error, the runner's own classified error: ringfence_server.sandbox.runner_protocol).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import cast

import docker
import docker.errors
import requests

from ringfence_server.sandbox.profile import SandboxProfile
from ringfence_server.sandbox.result import Outcome, ToolErrorClass
from ringfence_server.sandbox.runner_protocol import read_failure


@dataclass(frozen=True)
class Explanation:
    """What a result says about how its call ended, beside the Outcome."""

    message: str = ""
    error_class: ToolErrorClass | None = None
    """Set for a tool error only: the runner's class, or `fatal`."""
    retry_after_s: float | None = None
    """The tool's retry-after hint (a rate_limited tool error)."""


def explain(outcome: Outcome, profile: SandboxProfile, *, exit_code: int | None, killed_reason: str | None,
            tool_ended: bool, stdout: bytes, runner: bool) -> Explanation:
    """The message (and, for a tool error, the class) of a call that ended with `outcome`.
    `killed_reason`: why we killed it, if we did; `runner`: the image's runner was the command."""
    if outcome is Outcome.KILLED and killed_reason is not None:
        return Explanation(f"container killed: {killed_reason}")
    if outcome is Outcome.KILLED and not tool_ended:
        return Explanation(f"the sandbox ended with status {exit_code} before its init reported the tool's "
                           f"end: the {profile.runtime} runtime (or an outside kill) stopped it, not the tool")
    if outcome is Outcome.TOOL_ERROR:
        failure = read_failure(stdout, exit_code, runner=runner)
        return Explanation(failure.message, failure.error_class, failure.retry_after_s)
    if outcome is Outcome.OOM:
        return Explanation(f"memory limit of {profile.memory_bytes} bytes reached")
    if outcome is Outcome.TIMEOUT:
        return Explanation(f"wall time of {profile.timeout_s}s reached; container killed")
    if outcome is Outcome.OUTPUT_LIMIT:
        return Explanation("output cap reached; container killed")
    return Explanation()


# How long an unexplained SIGKILL waits for the engine's account of it: the `oom` event follows
# `die` by a few milliseconds; an outside kill's `kill` event precedes it.
KILL_ACCOUNT_WAIT_S = 2.0


def oom_in_events(actions: list[str]) -> bool | None:
    """What the engine's events of one container say about a SIGKILL: True (the OOM killer),
    False (someone killed it through the engine), None (nothing yet)."""
    if "kill" in actions:
        return False
    if "oom" in actions:
        return True
    return None


def engine_reported_oom(client: docker.DockerClient, container_id: str, since_monotonic: float,
                        *, wait_s: float = KILL_ACCOUNT_WAIT_S) -> bool:
    """Whether the engine logged an `oom` (and no `kill`) for the container since the call began.
    Asked only for an unexplained exit 137, so the wait costs nothing on the usual paths."""
    since = int(time.time() - (time.monotonic() - since_monotonic)) - 1
    give_up = time.monotonic() + wait_s
    while True:
        try:
            # `until` as a fractional string: an int would cut off this second's events, and a
            # later one would hold the stream open until then. The stubs say int; the API
            # takes Docker's "seconds.fraction" form.
            now = cast(int, f"{time.time():.6f}")
            events = client.events(since=since, until=now, decode=True,
                                   filters={"container": container_id, "event": ["oom", "kill"]})
            verdict = oom_in_events([str(e.get("Action") or e.get("status") or "") for e in events])
        except (docker.errors.APIError, requests.exceptions.RequestException):
            return False  # no account from the engine: the kill stays unexplained (`killed`)
        if verdict is not None or time.monotonic() >= give_up:
            return bool(verdict)
        time.sleep(0.05)

