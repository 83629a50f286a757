"""Crash points: a test names a boundary, and the server kills itself there, hard.

`RINGFENCE_CRASH_AT=<point>` (or `<point>:<tool>`, for the points a call crosses: only when
that tool's call crosses it) in `ringfence serve`'s environment makes the process SIGKILL
itself when it crosses that boundary: no finally, no flush, no goodbye, exactly what a power
cut or the OOM killer would leave. The crash-point tests restart the server without it and
check that every effect happened once (counted at the receiver), that no event a client saw is
lost, and that no container is left behind.

The points, in the order a call crosses them:

    after_run_started        run_started is durable; the StartRun reply was not sent
    after_batch_admitted     every verdict of the batch is durable; nothing observed, asked or run
    after_dispatch_started   dispatch_started is durable; no container exists yet
    after_effect             the tool returned (its effect happened); nothing of it recorded
    after_completion         call_completed is durable; its observation is not
    during_run_finished      run_finished is durable; the FinishRun reply was not sent

Unset (always, outside these tests) it costs one dictionary look-up per boundary.
"""

from __future__ import annotations

import os
import signal

ENV = "RINGFENCE_CRASH_AT"
POINTS = (
    "after_run_started",
    "after_batch_admitted",
    "after_dispatch_started",
    "after_effect",
    "after_completion",
    "during_run_finished",
)


def configured() -> str | None:
    """The crash point this process was started with (ValueError: not one of POINTS)."""
    value = os.environ.get(ENV) or None
    if value is not None and value.partition(":")[0] not in POINTS:
        raise ValueError(f"{ENV}={value!r} is not a crash point ({', '.join(POINTS)}), optionally :TOOL")
    return value


def crash_point(name: str, tool: str | None = None) -> None:
    value = os.environ.get(ENV)
    if not value:
        return
    point, _, only = value.partition(":")
    if point == name and (not only or only == tool):
        os.kill(os.getpid(), signal.SIGKILL)
