"""Retries and circuit breaking for dispatch (step 9), decided from the failure class alone.

    classify(SandboxResult) -> FailureClass | None        None = success
    retry_call(attempt, policy, *, sleep, rng) -> Attempt  tenacity; transient/rate_limited only
    CircuitBreaker(threshold, cooldown_s, clock)          per tool: closed -> open -> half-open
    never_started(Attempt) -> bool                        it provably reached no container

Only `transient` (start_failed included: the engine had trouble before the tool could have
started) and `rate_limited` are retried; `uncertain` (the engine failed after it could have
started) never is. invalid/fatal would fail the same way again; oom/timeout/
output_limit/killed would burn the same resources again (and a timed-out write may have
happened). The clock, sleep and random source are injectable so tests take no wall time.
"""

from __future__ import annotations

import enum
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_attempt

from ringfence_server.sandbox.result import Outcome, SandboxResult


class FailureClass(enum.StrEnum):
    INVALID = "invalid"
    TRANSIENT = "transient"
    RATE_LIMITED = "rate_limited"
    FATAL = "fatal"
    OOM = "oom"
    TIMEOUT = "timeout"
    OUTPUT_LIMIT = "output_limit"
    KILLED = "killed"
    CIRCUIT_OPEN = "circuit_open"
    """Not dispatched: the tool's breaker is open."""
    UNCERTAIN = "uncertain"
    """The engine failed after the tool could have started: it may have had its effect. Never
    retried (a second run could be a second effect); a read, which has none, is reported as
    transient by the dispatcher instead."""


RETRYABLE = frozenset({FailureClass.TRANSIENT, FailureClass.RATE_LIMITED})
# Failures that say nothing about the tool's health (the caller's input was wrong, or we refused).
_NOT_HEALTH = frozenset({FailureClass.INVALID, FailureClass.CIRCUIT_OPEN})

_BY_OUTCOME = {
    Outcome.START_FAILED: FailureClass.TRANSIENT,
    Outcome.OOM: FailureClass.OOM,
    Outcome.TIMEOUT: FailureClass.TIMEOUT,
    Outcome.OUTPUT_LIMIT: FailureClass.OUTPUT_LIMIT,
    Outcome.KILLED: FailureClass.KILLED,
    Outcome.UNCERTAIN: FailureClass.UNCERTAIN,
}


def classify(result: SandboxResult) -> FailureClass | None:
    if result.outcome is Outcome.OK:
        return None
    if result.outcome is Outcome.TOOL_ERROR:
        # A tool error without a class (a crash that did not speak the protocol) is fatal.
        return FailureClass(result.error_class.value) if result.error_class else FailureClass.FATAL
    return _BY_OUTCOME[result.outcome]


@dataclass(frozen=True)
class Attempt:
    """One try of one call."""

    number: int
    failure: FailureClass | None
    content: Any = None
    message: str = ""
    retry_after_s: float | None = None
    duration_ms: int = 0
    outcome: str = ""
    setup_ms: int = 0
    """The sandbox's start (create, attach, start) before the tool's `duration_ms`."""
    warm: bool = False
    """The sandbox was a warm pool container: `setup_ms` is its claim, not a start."""
    worker: str | None = None
    """The sandbox worker it ran on; None: this control plane's own engine."""
    image_id: str = ""
    runtime: str = ""

    @property
    def ok(self) -> bool:
        return self.failure is None


def never_started(attempt: Attempt) -> bool:
    """Whether `attempt` provably never reached a tool: the sandbox failed before any container
    could run it (`start_failed`: the engine unreachable, the image refused, create or start
    refused) or the breaker refused it. A call whose every attempt is such never ran: it is
    not executed, and its idempotency key is free for a call that does run. A failure after
    the container could have started is `uncertain`, never this."""
    return attempt.failure is FailureClass.CIRCUIT_OPEN or (
        attempt.failure is not None and attempt.outcome == Outcome.START_FAILED.value)


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    initial_s: float = 0.5
    max_s: float = 30.0


def backoff_s(policy: RetryPolicy, attempt_number: int, retry_after_s: float | None, rng: random.Random) -> float:
    """Exponential backoff with equal jitter, never shorter than the tool's retry-after hint."""
    ceiling = min(policy.max_s, policy.initial_s * 2 ** (attempt_number - 1))
    wait: float = ceiling / 2 + rng.uniform(0, ceiling / 2)
    if retry_after_s is not None:
        wait = max(wait, min(float(retry_after_s), policy.max_s * 4))
    return wait


def retry_call(
    attempt: Callable[[int], Attempt],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> Attempt:
    """Call `attempt(n)` for n = 1.. until it succeeds, fails for good, or attempts run out."""
    rng = rng or random.Random()
    counter = iter(range(1, policy.max_attempts + 1))

    def last_attempt(retry_state: RetryCallState) -> Attempt:
        # tenacity calls `wait` and the error callback only after an attempt ended.
        assert retry_state.outcome is not None
        result: Attempt = retry_state.outcome.result()
        return result

    def wait(retry_state: RetryCallState) -> float:
        return backoff_s(policy, retry_state.attempt_number, last_attempt(retry_state).retry_after_s, rng)

    retrying = Retrying(
        stop=stop_after_attempt(policy.max_attempts),
        retry=retry_if_result(lambda a: a.failure in RETRYABLE),
        wait=wait,
        sleep=sleep,
        # Out of attempts: the last failed attempt is the answer, not a RetryError.
        retry_error_callback=last_attempt,
        reraise=True,
    )
    return retrying(lambda: attempt(next(counter)))


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Opens after `threshold` consecutive failures; after `cooldown_s` lets one probe through.

    A successful probe closes it; a failed probe opens it for another cool-down.
    """

    def __init__(self, threshold: int, cooldown_s: float, clock: Callable[[], float] = time.time) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False

    @property
    def state(self) -> BreakerState:
        with self._lock:
            return self._state()

    def _state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._probing or self._clock() - self._opened_at >= self.cooldown_s:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def allow(self) -> bool:
        with self._lock:
            state = self._state()
            if state is BreakerState.CLOSED:
                return True
            if state is BreakerState.HALF_OPEN and not self._probing:
                self._probing = True  # exactly one probe at a time
                return True
            return False

    def record(self, failure: FailureClass | None) -> None:
        if failure in _NOT_HEALTH:
            with self._lock:
                self._probing = False
            return
        with self._lock:
            if failure is None:
                self._failures = 0
                self._opened_at = None
            else:
                self._failures += 1
                if self._probing or self._failures >= self.threshold:
                    self._opened_at = self._clock()
            self._probing = False
