"""The calls running now (ringfence_server/sandbox/inflight.py): a kill reaches a call that
registers after it, when it was killed as a whole (kill_all) or with its run (kill_run), until
the run ends. Such a call was still creating its container, or waiting for the warm pool, when
the kill came; the backend then ends it `killed` before its tool can start."""

from __future__ import annotations

from ringfence_server.sandbox.inflight import Inflight, Progress


def test_a_call_of_a_killed_run_that_registers_later_is_killed():
    inflight = Inflight()
    running = Progress()
    inflight.track("run-a", "c1", running)
    inflight.mark_run("run-a", "cancelled by alice")
    assert running.killed_reason == "cancelled by alice"
    late, other = Progress(), Progress()
    inflight.track("run-a", "c2", late)  # it was waiting for the pool when the kill came
    inflight.track("run-b", "c3", other)
    assert late.killed_reason == "cancelled by alice" and other.killed_reason is None


def test_the_run_s_end_forgets_the_kill():
    inflight = Inflight()
    inflight.mark_run("run-a", "the run deadline passed")
    inflight.end_run("run-a")
    after = Progress()
    inflight.track("run-a", "c1", after)
    assert after.killed_reason is None


def test_kill_all_reaches_every_later_call():
    inflight = Inflight()
    inflight.stop("SIGTERM")
    late = Progress()
    inflight.track("run-a", "c1", late)
    assert late.killed_reason == "SIGTERM"
