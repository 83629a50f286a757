"""Second attack review, findings 5, 6 and 10, at unit speed beside their real-part tests
(tests/integration/test_review2_result_not_json.py, test_review2_engine_gone.py,
test_review2_client_key_same_run.py): strict parsing of the runner's line, which attempts
provably never reached a container, and what a client key answers in the same run. The
dispatch cases run the real Orchestrator on a SQLite file over FakeBackend."""

from __future__ import annotations

import json

import pytest
from control_support import AGENT, Harness, error_result, outcome_result

from ringfence.model import ObservationStatus as S
from ringfence.model import ProposedCall, RunOutcome
from ringfence_server.control.idempotency import client_idempotency_key
from ringfence_server.control.orchestration.dispatch import client_key_name
from ringfence_server.control.retry import Attempt, FailureClass, never_started
from ringfence_server.sandbox.errors import EngineError
from ringfence_server.sandbox.fake import ok_result
from ringfence_server.sandbox.result import Outcome, ToolErrorClass
from ringfence_server.sandbox.runner_protocol import EXIT_TOOL_ERROR, ToolFailure, parse_runner_line, read_failure

# -- finding 5: the runner's line is strict JSON --------------------------------------------


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
def test_the_runner_line_refuses_numbers_that_are_not_json(text):
    with pytest.raises(ValueError, match="finite numbers only"):
        parse_runner_line('{"ok": true, "content": {"x": ' + text + "}}")


def test_the_runner_line_takes_every_json_number():
    assert parse_runner_line(b'{"ok":true,"content":[1,-2.5,1e300,0]}') == {"ok": True, "content": [1, -2.5, 1e300, 0]}


@pytest.mark.parametrize("hint", ["NaN", '"nan"', "Infinity", '"inf"'])
def test_a_tool_error_with_a_retry_hint_that_is_not_a_number_is_fatal(hint):
    stdout = ('{"ok": false, "error": {"class": "rate_limited", "message": "m", "retry_after_s": ' + hint + "}}\n")
    assert read_failure(stdout.encode(), EXIT_TOOL_ERROR, runner=True) == ToolFailure(
        ToolErrorClass.FATAL, "runner reported an error it could not describe", None)


def test_a_nan_result_fails_the_call_fatal_and_the_run_goes_on(tmp_path):
    h = Harness(tmp_path)
    h.emulator.overrides["echo"] = lambda call: ok_result(b'{"ok":true,"content":{"ratio":NaN}}\n')
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "x"}))
    assert (obs.status, obs.executed, obs.error_class, obs.attempts) == (S.EXECUTED, True, "fatal", 1)
    assert "NaN is not a JSON number" in obs.error
    h.emulator.overrides.clear()
    [after] = h.submit(run, ("echo", {"text": "y"}))
    assert after.content == {"text": "y"}
    assert h.orch.finish_run(AGENT, run).outcome is RunOutcome.COMPLETED


# -- finding 6: never started is not executed -------------------------------------------------


@pytest.mark.parametrize(("attempt", "expected"), [
    (Attempt(1, FailureClass.TRANSIENT, outcome="start_failed"), True),
    (Attempt(1, FailureClass.FATAL, outcome="start_failed"), True),  # the image refused
    (Attempt(2, FailureClass.CIRCUIT_OPEN), True),
    (Attempt(1, FailureClass.UNCERTAIN, outcome="uncertain"), False),
    (Attempt(1, FailureClass.TRANSIENT, outcome="tool_error"), False),
    (Attempt(1, FailureClass.TIMEOUT, outcome="timeout"), False),
    (Attempt(1, None, outcome="ok"), False),
])
def test_which_attempts_never_started(attempt, expected):
    assert never_started(attempt) is expected


def keyed(call_id: str, text: str = "t", key: str = "K") -> ProposedCall:
    return ProposedCall(call_id, "write_note", {"name": "n", "text": text}, idempotency_key=key)


def down(call):
    raise EngineError("engine is down")


def test_a_call_that_never_started_is_not_executed_and_its_key_runs_once_later(tmp_path):
    released_key_runs_once(Harness(tmp_path, limits={"breaker_threshold": 50}))  # the breaker is not the point


def released_key_runs_once(h: Harness) -> None:
    """The engine refuses every attempt of a keyed mutation in two runs, then is back: the call
    was never executed, its key was released twice, and the third run's call runs once and
    claims the key's third generation (tests/integration/test_review2_key_release_postgres.py
    runs this on PostgreSQL)."""
    h.emulator.overrides["write_note"] = down
    run = h.run()
    [first] = h.submit(run, keyed("w1"))
    assert (first.status, first.executed, first.error_class, first.attempts) == (S.DENIED, False, "transient", 4)
    assert first.verdict_path[-1] == "sandbox:not_started"
    # Still down, in another run (a third time in one run would be the loop detector's): the
    # key was released, so this is not in doubt; it is released again.
    [second] = h.submit(h.run(run_id="second"), keyed("w2"))
    assert (second.executed, second.error_class) == (False, "transient")
    h.emulator.overrides.clear()
    [third] = h.submit(h.run(run_id="third"), keyed("w3"))
    assert (third.status, third.executed) == (S.EXECUTED, True)
    # Two releases, so the third generation of the claim holds it now.
    key = client_idempotency_key("acme", "K")
    assert h.store.lookup_key(client_key_name(key, 3)) is not None
    assert h.store.lookup_key(client_key_name(key, 4)) is None
    later = h.run(run_id="later")
    [again] = h.submit(later, keyed("w4"))
    assert (again.status, again.content) == (S.DEDUPLICATED, third.content)
    # Handed over: four attempts each for w1 and w2 (the engine refused them all), one for w3.
    assert [c.call_id for c in h.emulator.log] == ["w1"] * 4 + ["w2"] * 4 + ["w3"]


def test_a_call_that_reached_a_container_once_stays_executed_and_in_doubt(tmp_path):
    h = Harness(tmp_path)
    not_started = outcome_result(Outcome.START_FAILED)
    answers = iter([not_started, error_result("transient"), not_started, not_started])
    h.emulator.overrides["write_note"] = lambda call: next(answers)
    run = h.run()
    [first] = h.submit(run, keyed("w1"))
    assert (first.status, first.executed, first.error_class) == (S.EXECUTED, True, "transient")
    h.emulator.overrides.clear()
    [second] = h.submit(run, keyed("w2"))
    assert (second.status, second.error_class) == (S.DENIED, "idempotency_key_in_doubt")


def test_an_uncertain_mutation_keeps_its_key_in_doubt(tmp_path):
    h = Harness(tmp_path)
    h.emulator.overrides["write_note"] = lambda call: outcome_result(Outcome.UNCERTAIN)
    run = h.run()
    [first] = h.submit(run, keyed("w1"))
    assert (first.executed, first.error_class) == (True, "uncertain")
    [second] = h.submit(run, keyed("w2"))
    assert (second.executed, second.error_class) == (False, "idempotency_key_in_doubt")
    completed = [e.data for e in h.events(run) if e.type == "call_completed"]
    assert [c["executed"] for c in completed] == [True]


# -- finding 10: a client key in the same run ---------------------------------------------------


def test_a_client_key_with_other_arguments_in_the_same_run_is_refused(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    [v1] = h.submit(run, keyed("w1", "v1"))
    [v3] = h.submit(run, keyed("w3", "v3"))
    [same] = h.submit(run, keyed("w1b", "v1"))
    assert v1.status is S.EXECUTED
    assert (v3.status, v3.executed, v3.error_class, v3.content) == (S.DENIED, False, "idempotency_key_reused", None)
    assert (same.status, same.content) == (S.DEDUPLICATED, v1.content)
    assert [json.dumps(c.arguments, sort_keys=True) for c in h.emulator.log] == ['{"name": "n", "text": "v1"}']


def test_a_derived_key_still_deduplicates_from_the_run_state(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    [first] = h.submit(run, ("write_note", {"name": "n", "text": "same"}))
    [second] = h.submit(run, ("write_note", {"name": "n", "text": "same"}))
    assert (first.status, second.status, second.content) == (S.EXECUTED, S.DEDUPLICATED, first.content)
    assert len(h.emulator.log) == 1
