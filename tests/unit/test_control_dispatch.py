"""Steps 8-11: idempotency, retries and the circuit breaker, parallel reads / serial writes,
the result guardrail. All on FakeBackend with a fake clock: no wall time is spent sleeping."""

from __future__ import annotations

import threading

import pytest
from control_support import AGENT, APPROVER, Harness, content_result, error_result, outcome_result

from ringfence.model import ObservationStatus as S
from ringfence.model import RunOutcome
from ringfence_server.control.idempotency import idempotency_key
from ringfence_server.sandbox.errors import EngineError
from ringfence_server.sandbox.result import Outcome


def attempts_of(h: Harness, run: str, call_id: str) -> list[dict]:
    return [dict(e.data) for e in h.events(run) if e.type == "attempt" and e.data["call_id"] == call_id]


# -- idempotency ----------------------------------------------------------------------------


def test_a_recorded_mutation_is_not_repeated(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    [first] = h.submit(run, ("write_note", {"name": "n", "text": "hello"}))
    [second] = h.submit(run, ("write_note", {"name": "n", "text": "hello"}))
    assert first.status is S.EXECUTED and second.status is S.DEDUPLICATED
    assert not second.executed and second.content == first.content
    assert h.backend.starts == 1
    key = idempotency_key("acme", run, "write_note", {"name": "n", "text": "hello"})
    assert h.emulator.log[0].idempotency_key == key == first.content["idempotency_key"]


def test_reads_carry_no_idempotency_key_and_different_writes_do_not_collide(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("echo", {"text": "a"}), ("write_note", {"name": "a", "text": "1"}),
             ("write_note", {"name": "a", "text": "2"}))
    keys = [c.idempotency_key for c in h.emulator.log]
    assert keys[0] is None and keys[1] != keys[2] and None not in keys[1:]
    assert h.backend.starts == 3


def test_a_completed_approved_mutation_is_not_rerun_after_restart(tmp_path):
    h = Harness(tmp_path, rules=[{"tool": "credit", "verdict": "ask"}])
    run = h.run()
    [obs] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    h.orch.decide_approval(APPROVER, obs.approval_id, True, "")
    h.restart()
    h.restart()
    assert h.backend.starts == 1
    assert h.orch.get_run(AGENT, run).trajectory[0].status is S.EXECUTED


# -- retries ---------------------------------------------------------------------------------


def test_transient_failures_are_retried_to_the_limit(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    [obs] = h.submit(run, ("fail", {"class": "transient"}))
    assert obs.status is S.EXECUTED and obs.executed and obs.error_class == "transient"
    assert obs.attempts == 4 and h.backend.starts == 4
    assert [a["failure_class"] for a in attempts_of(h, run, obs.call_id)] == ["transient"] * 4
    assert len(h.clock.sleeps) == 3  # between attempts, on the fake clock


def test_transient_then_success(tmp_path):
    h = Harness(tmp_path)
    answers = iter([error_result("transient"), outcome_result(Outcome.START_FAILED), content_result({"x": 1})])
    h.emulator.overrides["echo"] = lambda call: next(answers)
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "x"}))
    assert obs.status is S.EXECUTED and obs.content == {"x": 1} and obs.attempts == 3
    assert [a["failure_class"] for a in attempts_of(h, run, obs.call_id)] == ["transient", "transient", None]


@pytest.mark.parametrize("answer,cls", [
    (error_result("invalid"), "invalid"),
    (error_result("fatal"), "fatal"),
    (outcome_result(Outcome.OOM), "oom"),
    (outcome_result(Outcome.TIMEOUT), "timeout"),
    (outcome_result(Outcome.OUTPUT_LIMIT), "output_limit"),
    (outcome_result(Outcome.KILLED), "killed"),
])
def test_non_retryable_classes_run_once(tmp_path, answer, cls):
    h = Harness(tmp_path)
    h.emulator.overrides["echo"] = lambda call: answer
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "x"}))
    assert obs.error_class == cls and obs.attempts == 1
    assert h.backend.starts == 1 and h.clock.sleeps == []


def test_a_mutation_that_timed_out_is_not_retried(tmp_path):
    h = Harness(tmp_path)
    h.emulator.overrides["write_note"] = lambda call: outcome_result(Outcome.TIMEOUT)
    run = h.run()
    [obs] = h.submit(run, ("write_note", {"name": "a", "text": "b"}))
    assert obs.error_class == "timeout" and h.backend.starts == 1


def test_retry_after_is_honoured(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    [obs] = h.submit(run, ("fail", {"class": "rate_limited", "retry_after_s": 7}))
    assert obs.attempts == 4 and obs.error_class == "rate_limited"
    assert len(h.clock.sleeps) == 3 and all(s >= 7 for s in h.clock.sleeps)
    assert [a["retry_after_s"] for a in attempts_of(h, run, obs.call_id)] == [7, 7, 7, 7]


def test_engine_errors_are_transient(tmp_path):
    h = Harness(tmp_path)

    def down(call):
        raise EngineError("engine is down")

    h.emulator.overrides["echo"] = down
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "x"}))
    assert obs.error_class == "transient" and obs.attempts == 4 and "engine is down" in obs.error


def test_the_breaker_opens_and_half_opens(tmp_path):
    h = Harness(tmp_path, limits={"breaker_threshold": 2, "breaker_cooldown_s": 30.0})
    healthy = {"ok": False}
    h.emulator.overrides["echo"] = lambda call: content_result("up") if healthy["ok"] else error_result("fatal")
    run = h.run()
    h.submit(run, ("echo", {"text": "1"}), ("echo", {"text": "2"}))
    assert h.backend.starts == 2
    [blocked] = h.submit(run, ("echo", {"text": "3"}))
    assert blocked.status is S.DENIED and blocked.error_class == "circuit_open" and not blocked.executed
    assert h.backend.starts == 2  # not dispatched
    h.clock.advance(30)
    healthy["ok"] = True
    [probe] = h.submit(run, ("echo", {"text": "4"}))  # half-open: one probe goes through
    assert probe.status is S.EXECUTED and probe.content == "up"
    [after] = h.submit(run, ("echo", {"text": "5"}))  # closed again
    assert after.status is S.EXECUTED and h.backend.starts == 4


def test_a_failed_probe_opens_the_breaker_again(tmp_path):
    h = Harness(tmp_path, limits={"breaker_threshold": 1, "breaker_cooldown_s": 10.0})
    h.emulator.overrides["echo"] = lambda call: error_result("fatal")
    run = h.run()
    h.submit(run, ("echo", {"text": "1"}))
    h.clock.advance(10)
    [probe] = h.submit(run, ("echo", {"text": "2"}))
    assert probe.executed and probe.error_class == "fatal"
    [blocked] = h.submit(run, ("echo", {"text": "3"}))
    assert blocked.error_class == "circuit_open" and h.backend.starts == 2


# -- order of dispatch -----------------------------------------------------------------------


def test_reads_run_in_parallel_and_writes_serially_after_them(tmp_path):
    h = Harness(tmp_path, limits={"max_parallel_reads": 3})
    trace: list[str] = []
    lock = threading.Lock()
    # All three reads must be inside the tool at once to pass the barrier: proof of parallelism
    # that does not depend on timing (a serial dispatcher breaks the barrier).
    barrier = threading.Barrier(3, timeout=10)

    def record(what):
        with lock:
            trace.append(what)

    def read(call):
        record(f"start {call.arguments['text']}")
        barrier.wait()
        record(f"end {call.arguments['text']}")
        return "read"

    def write(call):
        record(f"start {call.arguments['name']}")
        record(f"end {call.arguments['name']}")
        return "written"

    h.emulator.overrides.update(echo=read, write_note=write)
    run = h.run()
    obs = h.submit(run, ("write_note", {"name": "w1", "text": "x"}), ("echo", {"text": "r1"}),
                   ("write_note", {"name": "w2", "text": "x"}), ("echo", {"text": "r2"}), ("echo", {"text": "r3"}))
    assert [o.status for o in obs] == [S.EXECUTED] * 5
    reads, writes = trace[:6], trace[6:]
    assert sorted(reads) == ["end r1", "end r2", "end r3", "start r1", "start r2", "start r3"]
    assert all(x.startswith("start") for x in reads[:3])  # every read started before any ended
    assert writes == ["start w1", "end w1", "start w2", "end w2"]  # serial, in proposal order
    # The trajectory is in proposal order whatever the dispatch order.
    assert [o.call_id for o in h.orch.get_run(AGENT, run).trajectory] == ["c1", "c2", "c3", "c4", "c5"]


# -- result guardrail ------------------------------------------------------------------------


def test_secrets_in_results_are_redacted(tmp_path):
    h = Harness(tmp_path)
    h.emulator.overrides["echo"] = lambda call: {"log": "key=AKIAIOSFODNN7EXAMPLE ok"}
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "x"}))
    assert obs.status is S.EXECUTED and obs.content == {"log": "key=[REDACTED:aws_access_key] ok"}
    assert obs.verdict_path[-1] == "result:redacted"
    # The raw secret is not in the observation the caller (or a replay) sees.
    assert "AKIAIOSFODNN7EXAMPLE" not in str([dict(e.data) for e in h.events(run)])


def test_a_private_key_in_a_result_withholds_it(tmp_path):
    h = Harness(tmp_path)
    h.emulator.overrides["echo"] = lambda call: "-----BEGIN RSA PRIVATE KEY-----\nMIIE...\n"
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "x"}))
    # The call ran (executed): its result is WITHHELD, never BLOCKED (which says it never ran).
    assert obs.status is S.WITHHELD and obs.executed and obs.content is None
    assert h.orch.get_run(AGENT, run).outcome is None  # the run goes on
    assert "PRIVATE KEY" not in str([dict(e.data) for e in h.events(run)])


def test_runner_output_that_is_not_the_protocol_is_fatal(tmp_path):
    from ringfence_server.sandbox.fake import ok_result

    h = Harness(tmp_path)
    h.emulator.overrides["echo"] = lambda call: ok_result(b"hello, not json\n")
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "x"}))
    assert obs.error_class == "fatal" and obs.attempts == 1


def test_unexpected_exception_in_dispatch_ends_the_run_as_error(tmp_path):
    h = Harness(tmp_path)

    def bug(call):
        raise ZeroDivisionError("bug")

    h.emulator.overrides["echo"] = bug
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "x"}))
    assert obs.status is S.HALTED and obs.error_class == "error"
    assert h.orch.get_run(AGENT, run).outcome is RunOutcome.ERROR


def test_a_deduplicated_result_is_the_guarded_one(tmp_path):
    h = Harness(tmp_path)
    h.emulator.overrides["write_note"] = lambda call: {"receipt": "AKIAIOSFODNN7EXAMPLE"}
    run = h.run()
    [first] = h.submit(run, ("write_note", {"name": "n", "text": "t"}))
    [again] = h.submit(run, ("write_note", {"name": "n", "text": "t"}))
    assert again.status is S.DEDUPLICATED
    assert first.content == again.content == {"receipt": "[REDACTED:aws_access_key]"}


def test_secrets_in_error_messages_are_redacted(tmp_path):
    h = Harness(tmp_path)
    h.emulator.overrides["echo"] = lambda call: error_result("fatal", "auth failed for AKIAIOSFODNN7EXAMPLE")
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "x"}))
    assert obs.error == "auth failed for [REDACTED:aws_access_key]"
    assert "AKIAIOSFODNN7EXAMPLE" not in str([dict(e.data) for e in h.events(run)])


def test_the_profile_comes_from_the_manifest(tmp_path):
    from ringfence_server.control.registry import Registry, ToolLimits, ToolManifest

    fetch = ToolManifest("fetch", "f", {"type": "object"}, mutates=False, reversible=True,
                         egress_hosts=("api.example.com",), url_arguments=("url",),
                         limits=ToolLimits(memory_bytes=96 * 1024 * 1024, cpus=0.25, pids=20, timeout_s=3.0,
                                           stdout_limit=4096))
    h = Harness(tmp_path, rules=[{"tool": "fetch", "verdict": "allow"}], registry=Registry([fetch]),
                egress={"fetch": ["api.example.com"]})
    h.emulator.overrides["fetch"] = lambda call: "fetched"
    run = h.run()
    obs = h.submit(run, ("fetch", {"url": "https://api.example.com/x"}), ("fetch", {"url": "http://169.254.169.254/"}))
    assert [o.status for o in obs] == [S.EXECUTED, S.DENIED]
    [request] = h.backend.requests
    p = request.profile
    assert (p.memory_bytes, p.cpus, p.pids, p.timeout_s, p.stdout_limit) == (96 * 1024 * 1024, 0.25, 20, 3.0, 4096)
    assert p.egress is not None and p.egress.allow == ("api.example.com:443", "api.example.com:80")


def _fetcher(hosts):
    from ringfence_server.control.registry import ToolManifest

    return ToolManifest("fetch", "f", {"type": "object"}, mutates=False, reversible=True,
                        egress_hosts=hosts, url_arguments=("url",))


def test_a_calls_allowlist_is_the_tools_hosts_and_what_policy_grants(tmp_path):
    """Egress: the tool declares *.example.com, policy grants only api.example.com on 443: the
    call's allowlist is exactly that; a sibling host or port 80 is denied at admission."""
    from ringfence_server.control.registry import Registry

    h = Harness(tmp_path, rules=[{"tool": "fetch", "verdict": "allow"}],
                registry=Registry([_fetcher(("*.example.com",))]),
                egress={"fetch": ["api.example.com:443", "elsewhere.test"]})
    h.emulator.overrides["fetch"] = lambda call: "fetched"
    run = h.run()
    obs = h.submit(run, ("fetch", {"url": "https://api.example.com/x"}), ("fetch", {"url": "https://www.example.com/"}),
                   ("fetch", {"url": "http://api.example.com/"}), ("fetch", {"url": "https://elsewhere.test/"}))
    assert [o.status for o in obs] == [S.EXECUTED, S.DENIED, S.DENIED, S.DENIED]
    [request] = h.backend.requests
    assert request.profile.egress.allow == ("api.example.com:443",)


def test_nothing_granted_means_nothing_reachable(tmp_path):
    """Default policy grants no egress: a host argument is denied, and a call without one runs
    with no network at all (no egress grant on its profile)."""
    from ringfence_server.control.registry import Registry

    h = Harness(tmp_path, rules=[{"tool": "fetch", "verdict": "allow"}],
                registry=Registry([_fetcher(("api.example.com",))]))
    h.emulator.overrides["fetch"] = lambda call: "fetched"
    run = h.run()
    denied, ran = h.submit(run, ("fetch", {"url": "https://api.example.com/"}), ("fetch", {}))
    assert (denied.status, ran.status) == (S.DENIED, S.EXECUTED)
    assert "not on the call's egress allowlist" in denied.error
    [request] = h.backend.requests
    assert request.profile.egress is None


def test_egress_decisions_of_a_call_become_an_event_of_the_run(tmp_path):
    """Egress: every decision the proxy took for a call is in the run's log, between the
    attempt's dispatch and its completion; the fold of the log is unchanged by it."""
    import dataclasses

    from ringfence_server.control.state import fold

    decisions = ({"host": "api.example.test", "port": 443, "decision": "allowed", "reason": None, "bytes_down": 10},
                 {"host": "evil.test", "port": 443, "decision": "denied", "reason": "not_allowlisted"})
    h = Harness(tmp_path)
    h.emulator.overrides["echo"] = lambda call: dataclasses.replace(
        content_result({"text": "hi"}), egress_events=decisions)
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "hi"}))
    assert obs.status is S.EXECUTED
    egress = [e for e in h.events(run) if e.type == "egress"]
    assert [dict(e.data) for e in egress] == [{"call_id": obs.call_id, "attempt": 1, "decisions": list(decisions)}]
    types = h.event_types(run)
    assert types.index("dispatch_started") < types.index("egress") < types.index("call_completed")
    assert fold(h.events(run)).trajectory[obs.call_id].status is S.EXECUTED  # the fold accepts it
