"""Admission (steps 1-7): every step, its order, and that nothing denied reaches the sandbox.

The witness is the FakeBackend: `backend.starts` counts the requests that reached it.
"""

from __future__ import annotations

import os

import pytest
from control_support import AGENT, APPROVER, Harness
from hypothesis import given, settings
from hypothesis import strategies as st

from ringfence.model import ObservationStatus as S
from ringfence.model import ProposedCall, RunOutcome
from ringfence_server.control.config import PolicyConfig, RuleConfig
from ringfence_server.control.policy import PolicyEngine, Verdict
from ringfence_server.control.registry import ToolManifest


def test_an_allowed_read_runs_and_says_so(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "hi"}))
    assert obs.status is S.EXECUTED and obs.executed and obs.content == {"text": "hi"}
    assert obs.verdict_path == ("registry:ok", "validation:ok", "guardrail:pass", "resource:ok",
                                "policy:rule[0]:allow", "admitted", "result:ok")
    assert h.backend.starts == 1


def test_unknown_tool_is_an_observation_and_never_dispatched(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    [obs] = h.submit(run, ("rm_rf", {"path": "/"}))
    assert obs.status is S.UNKNOWN_TOOL and not obs.executed
    assert obs.verdict_path == ("registry:unknown",)
    assert h.backend.starts == 0


def test_schema_violations_deny_with_the_field(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    [obs] = h.submit(run, ("credit", {"account": "evil; drop", "amount": -5, "extra": 1}))
    assert obs.status is S.DENIED and obs.error_class == "invalid_arguments"
    assert "arguments.account" in obs.error and "arguments.amount" in obs.error
    assert "Additional properties" in obs.error
    assert h.backend.starts == 0


def test_arguments_over_the_size_cap_are_denied(tmp_path):
    h = Harness(tmp_path, limits={"max_argument_bytes": 1024})
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "x" * 2000}))
    assert obs.status is S.DENIED and "over the 1024-byte cap" in obs.error
    assert h.backend.starts == 0


def test_canonical_form_reaches_the_tool(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("echo", {"b": 2.0, "a": [1.0, "x"]}))
    assert h.emulator.log[0].arguments == {"a": [1, "x"], "b": 2}
    assert h.emulator.log[0].request.stdin.startswith(b'{"tool":"echo","arguments":{"a":[1,"x"],"b":2}')


@pytest.mark.parametrize("secret,kind", [
    ("AKIAIOSFODNN7EXAMPLE", "aws_access_key"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9abcdefgh", "bearer_token"),
    ("ghp_Zx8Qw3Er5Ty7Ui9Op1As2Df4Gh6Jk8Lz0Xc", "high_entropy"),
])
def test_secrets_in_arguments_are_blocked(tmp_path, secret, kind):
    h = Harness(tmp_path)
    run = h.run()
    obs = h.submit(run, ("echo", {"text": f"please post {secret}"}), ("echo", {"text": "fine"}))
    assert obs[0].status is S.BLOCKED and not obs[0].executed
    assert obs[0].verdict_path[-1] == f"guardrail:block:{kind}"
    assert obs[1].status is S.EXECUTED  # a BLOCK is per call; the run goes on
    assert [c.arguments for c in h.emulator.log] == [{"text": "fine"}]


def test_resource_denial_wins_over_a_permissive_allow_rule(tmp_path):
    # The pinned order: resource policy (4) runs before contextual rules (5) and is final.
    h = Harness(tmp_path, rules=[{"tool": "*", "verdict": "allow"}])
    run = h.run()
    [obs] = h.submit(run, ("read_file", {"path": "/input/../../etc/shadow"}))
    assert obs.status is S.DENIED and obs.error_class == "resource"
    assert obs.verdict_path == ("registry:ok", "validation:ok", "guardrail:pass", "resource:deny")
    assert not any(p.startswith("policy:") for p in obs.verdict_path)
    assert h.backend.starts == 0


def test_grants_cannot_widen_a_resource_denial(tmp_path):
    h = Harness(tmp_path, rules=[{"tool": "*", "verdict": "allow"}])
    run = h.run()
    h.orch.add_grant(APPROVER, run, "read_file", {"path": "/etc/passwd"})
    [obs] = h.submit(run, ("read_file", {"path": "/etc/passwd"}))
    assert obs.status is S.DENIED and obs.verdict_path[-1] == "resource:deny"
    assert h.backend.starts == 0


def test_symlink_out_of_the_root_is_denied(tmp_path):
    inputs = tmp_path / "input"
    (inputs / "docs").mkdir(parents=True)
    (inputs / "docs" / "a.txt").write_text("ok")
    os.symlink("/etc", inputs / "docs" / "etc")  # lexically inside /input, really /etc
    h = Harness(tmp_path, inputs={"/input": str(inputs)})
    run = h.run()
    obs = h.submit(run, ("read_file", {"path": "docs/etc/passwd"}), ("read_file", {"path": "docs/a.txt"}))
    assert obs[0].status is S.DENIED and "symbolic link" in obs[0].error
    assert obs[1].status is S.EXECUTED
    assert [c.arguments["path"] for c in h.emulator.log] == ["docs/a.txt"]
    # The input directory is mounted read-only for the call that ran.
    [request] = h.backend.requests
    assert [(m.host_path, m.container_path) for m in request.profile.inputs] == [(str(inputs), "/input")]


def test_no_rule_means_deny(tmp_path):
    h = Harness(tmp_path, rules=[{"tool": "read_file", "verdict": "allow"}])
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "hi"}))
    assert obs.status is S.DENIED and obs.verdict_path[-1] == "policy:default:deny"
    assert h.backend.starts == 0


@pytest.mark.parametrize("call,expected_last", [
    # unknown tool: nothing else is even looked at
    (("nope", {"path": "../../etc"}), "registry:unknown"),
    # invalid arguments AND a secret: validation (2) answers before the guardrail (3)
    (("read_file", {"path": "AKIAIOSFODNN7EXAMPLE", "bogus": 1}), "validation:invalid"),
    # a secret AND a path escape: the guardrail (3) answers before resource policy (4)
    (("read_file", {"path": "../AKIAIOSFODNN7EXAMPLE"}), "guardrail:block:aws_access_key"),
    # a path escape AND a deny rule: resource policy (4) answers before the rules (5)
    (("read_file", {"path": "/etc/passwd", "max_bytes": 5}), "resource:deny"),
    # within the root, denied by rule
    (("read_file", {"path": "a.txt", "max_bytes": 5}), "policy:rule[1]:deny"),
])
def test_the_first_failing_step_answers(tmp_path, call, expected_last):
    rules = [{"tool": "read_file", "verdict": "allow"},
             {"tool": "read_file", "verdict": "deny", "when": {"max_bytes": {"lt": 10}}}]
    h = Harness(tmp_path, rules=rules)
    run = h.run()
    [obs] = h.submit(run, call)
    assert obs.verdict_path[-1] == expected_last
    assert h.backend.starts == 0


def test_every_call_is_decided_before_any_runs(tmp_path):
    h = Harness(tmp_path, autonomy="standard")
    run = h.run()
    h.submit(run, ("echo", {"text": "1"}), ("read_file", {"path": "../x"}),
             ("credit", {"account": "acme-1", "amount": 5}), ("echo", {"text": "2"}))
    types = h.event_types(run)
    first_dispatch = types.index("dispatch_started")
    assert types.count("call_decided") == 4
    assert max(i for i, t in enumerate(types) if t == "call_decided") < first_dispatch
    assert types.index("approval_requested") < first_dispatch


def test_halt_on_call_3_means_calls_1_and_2_never_ran(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"
    obs = h.submit(run, ("echo", {"text": "1"}), ("write_note", {"name": "n", "text": "2"}), ("echo", {"text": key}))
    assert [o.status for o in obs] == [S.HALTED] * 3
    assert not any(o.executed for o in obs)
    assert h.backend.starts == 0
    view = h.orch.get_run(AGENT, run)
    assert view.outcome is RunOutcome.GUARDRAIL_STOP
    assert "dispatch_started" not in h.event_types(run)


def test_risk_metadata_tightens_allow_to_ask(tmp_path):
    rules = [{"tool": "write_note", "verdict": "allow"}, {"tool": "credit", "verdict": "allow"}]
    h = Harness(tmp_path, rules=rules, autonomy="standard")
    run = h.run()
    obs = h.submit(run, ("write_note", {"name": "a", "text": "b"}), ("credit", {"account": "acme-1", "amount": 1}))
    assert [o.status for o in obs] == [S.PENDING_APPROVAL, S.PENDING_APPROVAL]
    assert "policy:risk:mutates->ask" in obs[0].verdict_path
    assert "policy:risk:irreversible->ask" in obs[1].verdict_path
    assert h.backend.starts == 0


def test_irreversible_asks_even_when_autonomous(tmp_path):
    h = Harness(tmp_path, rules=[{"tool": "credit", "verdict": "allow"}, {"tool": "write_note", "verdict": "allow"}],
                autonomy="autonomous")
    run = h.run()
    obs = h.submit(run, ("credit", {"account": "acme-1", "amount": 1}), ("write_note", {"name": "a", "text": "b"}))
    assert obs[0].status is S.PENDING_APPROVAL
    assert obs[1].status is S.EXECUTED


def test_exact_call_grant_allows_only_that_call(tmp_path):
    h = Harness(tmp_path, rules=[])
    run = h.run()
    h.orch.add_grant(APPROVER, run, "echo", {"text": "this one"})
    obs = h.submit(run, ("echo", {"text": "this one"}), ("echo", {"text": "another"}))
    assert obs[0].status is S.EXECUTED and "policy:grant:session" in obs[0].verdict_path
    assert obs[1].status is S.DENIED
    assert h.backend.starts == 1


def test_a_deny_rule_beats_a_grant(tmp_path):
    h = Harness(tmp_path, rules=[{"tool": "echo", "verdict": "deny"}])
    run = h.run()
    h.orch.add_grant(APPROVER, run, "echo", {"text": "x"})
    [obs] = h.submit(run, ("echo", {"text": "x"}))
    assert obs.status is S.DENIED


# -- the default verdict is never ALLOW ---------------------------------------------------------

_names = st.sampled_from(["alpha", "beta", "gamma", "delta"])
_values = st.one_of(st.integers(-1000, 1000), st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.text(max_size=8), st.booleans(), st.none())
_pred = st.one_of(
    st.tuples(st.sampled_from(["lt", "lte", "gt", "gte"]), st.integers(-1000, 1000)),
    st.tuples(st.sampled_from(["eq", "ne"]), _values),
    st.tuples(st.sampled_from(["in", "not_in"]), st.lists(_values, max_size=3)),
    st.tuples(st.just("prefix"), st.text(max_size=3)),
)
_rule = st.builds(
    lambda tool, verdict, when: RuleConfig(tool, verdict, when),
    st.one_of(_names, st.just("*")), st.sampled_from(["allow", "ask", "deny"]),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), _pred.map(lambda p: {p[0]: p[1]}), max_size=2))


@settings(max_examples=300, deadline=None)
@given(tool=_names, mutates=st.booleans(), reversible=st.booleans(),
       arguments=st.dictionaries(st.sampled_from(["a", "b", "c"]), _values, max_size=3),
       rules=st.lists(_rule, max_size=6), autonomy=st.sampled_from(["supervised", "standard", "autonomous"]))
def test_without_a_matching_allow_rule_the_verdict_is_never_allow(tool, mutates, reversible, arguments, rules,
                                                                  autonomy):
    from ringfence_server.control.policy import rule_matches

    manifest = ToolManifest(tool, "t", {"type": "object"}, mutates=mutates, reversible=reversible)
    rules = [r for r in rules if not (r.verdict == "allow" and rule_matches(r, tool, arguments))]
    decision = PolicyEngine(PolicyConfig(autonomy=autonomy, rules=tuple(rules))).decide(manifest, arguments)
    assert decision.verdict is not Verdict.ALLOW


@settings(max_examples=200, deadline=None)
@given(arguments=st.dictionaries(st.sampled_from(["a", "b"]), _values, max_size=2),
       rules=st.lists(_rule, max_size=6))
def test_a_matching_deny_rule_always_wins(arguments, rules):
    manifest = ToolManifest("alpha", "t", {"type": "object"}, mutates=False, reversible=True)
    rules = [*rules, RuleConfig("*", "deny", {})]
    decision = PolicyEngine(PolicyConfig(autonomy="autonomous", rules=tuple(rules))).decide(manifest, arguments)
    assert decision.verdict is Verdict.DENY


def test_batch_shape_errors_list_every_violation(tmp_path):
    from ringfence.errors import InvalidArgument

    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ProposedCall("used", "echo", {}))
    with pytest.raises(InvalidArgument) as e:
        h.orch.submit_batch(AGENT, run, [ProposedCall("bad id!", "echo", {}), ProposedCall("x", "echo", {}),
                                         ProposedCall("x", "echo", {}), ProposedCall("used", "echo", {})])
    fields = [v.field for v in e.value.violations]
    assert fields == ["calls[0].call_id", "calls[2].call_id", "calls[3].call_id"]
    assert h.backend.starts == 1


def test_secrets_found_in_arguments_are_not_kept_in_the_log(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("echo", {"text": "AKIAIOSFODNN7EXAMPLE"}))
    h.submit(run, ("credit", {"account": "AKIAIOSFODNN7EXAMPLE", "amount": 1}))  # invalid AND a secret
    h.submit(run, ("echo", {"text": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq4mZPz1x9QkLw3sYt\n"}))
    log = str([dict(e.data) for e in h.events(run)])
    assert "AKIAIOSFODNN7EXAMPLE" not in log and "BEGIN RSA PRIVATE KEY" not in log
    assert "MIIEowIBAAKCAQEA7bq4mZPz1x9QkLw3sYt" not in log
    assert h.backend.starts == 0


def test_arguments_the_edge_would_refuse_are_refused_by_the_core_too(tmp_path):
    """An Orchestrator used without the gRPC edge: a lone surrogate or nesting past 32 levels is
    an invalid-arguments denial naming the problem, never an exception, never a dispatch."""
    h = Harness(tmp_path)
    run = h.run()
    deep: dict = {"text": "x"}
    for _ in range(500):
        deep = {"n": deep}
    surrogate, nested = h.submit(run, ("echo", {"text": "\ud800"}), ("echo", deep))
    assert (surrogate.status, nested.status) == (S.DENIED, S.DENIED)
    assert "lone surrogate" in surrogate.error and "deeper than 32" in nested.error
    assert h.backend.starts == 0
