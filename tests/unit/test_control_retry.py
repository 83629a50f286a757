"""The retry layer and the circuit breaker in isolation (no orchestrator, no wall time)."""

from __future__ import annotations

import random

import pytest
from control_support import FakeClock, error_result, outcome_result

from ringfence_server.control.retry import (
    Attempt,
    BreakerState,
    CircuitBreaker,
    FailureClass,
    RetryPolicy,
    backoff_s,
    classify,
    retry_call,
)
from ringfence_server.sandbox.fake import ok_result
from ringfence_server.sandbox.result import Outcome


@pytest.mark.parametrize("result,cls", [
    (ok_result(b"{}"), None),
    (error_result("invalid"), FailureClass.INVALID),
    (error_result("transient"), FailureClass.TRANSIENT),
    (error_result("rate_limited"), FailureClass.RATE_LIMITED),
    (error_result("fatal"), FailureClass.FATAL),
    (outcome_result(Outcome.START_FAILED), FailureClass.TRANSIENT),
    (outcome_result(Outcome.OOM), FailureClass.OOM),
    (outcome_result(Outcome.TIMEOUT), FailureClass.TIMEOUT),
    (outcome_result(Outcome.OUTPUT_LIMIT), FailureClass.OUTPUT_LIMIT),
    (outcome_result(Outcome.KILLED), FailureClass.KILLED),
    (outcome_result(Outcome.TOOL_ERROR), FailureClass.FATAL),  # no class: a crash, never retried
])
def test_classification(result, cls):
    assert classify(result) == cls


POLICY = RetryPolicy(4, 0.5, 30.0)


def run(answers, policy=POLICY):
    clock = FakeClock()
    calls = []

    def attempt(n):
        calls.append(n)
        return answers[n - 1]

    final = retry_call(attempt, policy, sleep=clock.sleep, rng=random.Random(1))
    return final, calls, clock.sleeps


def test_at_most_four_attempts():
    final, calls, sleeps = run([Attempt(n, FailureClass.TRANSIENT) for n in range(1, 10)])
    assert calls == [1, 2, 3, 4] and final.number == 4 and final.failure is FailureClass.TRANSIENT
    assert len(sleeps) == 3


@pytest.mark.parametrize("cls", sorted(set(FailureClass) - {FailureClass.TRANSIENT, FailureClass.RATE_LIMITED}))
def test_never_retried(cls):
    _final, calls, sleeps = run([Attempt(1, cls), Attempt(2, None)])
    assert calls == [1] and sleeps == []


def test_backoff_is_exponential_with_jitter_and_capped():
    rng = random.Random(7)
    p = RetryPolicy(4, 1.0, 5.0)
    for n, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (8, 5.0)]:
        waits = {backoff_s(p, n, None, rng) for _ in range(50)}
        assert all(ceiling / 2 <= w <= ceiling for w in waits) and len(waits) > 1


def test_retry_after_is_a_floor():
    final, calls, sleeps = run([Attempt(1, FailureClass.RATE_LIMITED, retry_after_s=12.0), Attempt(2, None)])
    assert calls == [1, 2] and sleeps[0] >= 12.0 and final.ok


def test_breaker_states():
    clock = FakeClock()
    b = CircuitBreaker(3, 10.0, clock)
    for _ in range(2):
        assert b.allow()
        b.record(FailureClass.FATAL)
    assert b.state is BreakerState.CLOSED
    b.record(FailureClass.TIMEOUT)
    assert b.state is BreakerState.OPEN and not b.allow()
    clock.advance(10)
    assert b.state is BreakerState.HALF_OPEN
    assert b.allow() and not b.allow()  # one probe at a time
    b.record(None)
    assert b.state is BreakerState.CLOSED and b.allow()


def test_invalid_input_does_not_count_against_the_tool():
    b = CircuitBreaker(1, 10.0, FakeClock())
    b.record(FailureClass.INVALID)
    assert b.state is BreakerState.CLOSED


def test_success_resets_the_count():
    b = CircuitBreaker(2, 10.0, FakeClock())
    b.record(FailureClass.FATAL)
    b.record(None)
    b.record(FailureClass.FATAL)
    assert b.state is BreakerState.CLOSED
