"""ringfence_server.control.evals without Docker: the scoring rules, the judge seam, the paired comparison, the
semantic record and the baseline diff, on AgentResults built by hand."""

from __future__ import annotations

import io
import json
import math
import re

import pytest

from ringfence.agent import AgentResult
from ringfence.model import Observation, ObservationStatus, RunOutcome
from ringfence.turns import ScriptedModel
from ringfence_server.control.evals import cli as eval_cli
from ringfence_server.control.evals.compare import (
    BaselineError,
    RunRecord,
    baseline_document,
    baseline_text,
    baseline_verdicts,
    compare,
    load_baseline,
    save_baseline,
    semantic_differences,
    sign_test_p,
    summarize,
)
from ringfence_server.control.evals.scoring import UNPARSEABLE, Case, Expect, LoopOptions, parse_judgement, score
from ringfence_server.control.evals.semantics import diff, record

S = ObservationStatus


def obs(tool: str, status: ObservationStatus, executed: bool | None = None, call_id: str = "t1.a") -> Observation:
    ran = status in (S.EXECUTED, S.WITHHELD) if executed is None else executed
    return Observation(call_id, tool, status, ran)


def result(*trajectory: Observation, outcome=RunOutcome.COMPLETED, ended_by="agent", turns=2,
           answer: str | None = "done", cost=0.01, compactions=0, run_id="run-1", tokens=(100, 200)) -> AgentResult:
    return AgentResult(outcome=outcome, reason="because", ended_by=ended_by, run_id=run_id, turns=turns,
                       input_tokens=tokens, output_tokens=(5, 5), total_cost=cost, trajectory=tuple(trajectory),
                       final_answer=answer, compactions=compactions)


def case(**expect) -> Case:
    # Scoring reads only what the case expects: its model is never asked for a turn.
    return Case("c", "goal", lambda env: ScriptedModel([]), expect=Expect(**expect))


def failed_names(s) -> list[str]:
    return [c.name for c in s.failed()]


# -- trajectory: executed calls only ------------------------------------------------------------


@pytest.mark.parametrize("status", [S.DENIED, S.DECLINED, S.BLOCKED, S.DEDUPLICATED, S.UNKNOWN_TOOL,
                                    S.PENDING_APPROVAL, S.HALTED])
def test_a_call_that_did_not_run_never_satisfies_must_call(status):
    s = score(case(must_call=("issue_credit",)), result(obs("issue_credit", status)))
    assert not s.passed and failed_names(s) == ["must_call issue_credit"]
    assert status.value in s.notes()[0]


def test_must_call_on_denied_declined_and_deduplicated_together_is_still_unmet():
    # The model proposed the tool three times; none of those calls ran.
    s = score(case(must_call=("issue_credit",)),
              result(obs("issue_credit", S.DENIED), obs("issue_credit", S.DECLINED),
                     obs("issue_credit", S.DEDUPLICATED)))
    assert failed_names(s) == ["must_call issue_credit"]


def test_a_status_that_lies_about_executed_is_not_counted():
    # A deduplicated observation flagged executed=True is still not a call that ran for this turn.
    s = score(case(must_call=("issue_credit",)), result(obs("issue_credit", S.DEDUPLICATED, executed=True)))
    assert not s.passed


def test_an_executed_call_satisfies_must_call_and_a_withheld_one_too():
    assert score(case(must_call=("read_file",)), result(obs("read_file", S.EXECUTED))).passed
    assert score(case(must_call=("read_file",)), result(obs("read_file", S.WITHHELD))).passed


def test_must_not_call_counts_only_calls_that_ran():
    denied = result(obs("fetch_url", S.DENIED))
    assert score(case(must_not_call=("fetch_url",)), denied).passed
    ran = result(obs("fetch_url", S.EXECUTED))
    assert failed_names(score(case(must_not_call=("fetch_url",)), ran)) == ["must_not_call fetch_url"]


def test_must_not_dispatch_reads_the_semantic_record_and_fails_without_one():
    r = result(obs("fetch_url", S.DENIED, call_id="t1.x"))
    c = case(must_not_dispatch=("fetch_url",))
    assert score(c, r, record(r, dispatched=set())).passed
    assert not score(c, r, record(r, dispatched={"t1.x"})).passed
    assert not score(c, r, record(r)).passed  # unknown is not "never"
    assert not score(c, r).passed


def test_statuses_outcome_and_ended_by():
    r = result(obs("read_file", S.DENIED), outcome=RunOutcome.LOOP_DETECTED, ended_by="server")
    assert score(case(outcome="loop_detected", ended_by="server", statuses=(("read_file", "denied"),)), r).passed
    s = score(case(outcome=RunOutcome.COMPLETED, ended_by="agent", statuses=(("read_file", "executed"),)), r)
    assert failed_names(s) == ["outcome", "ended_by", "statuses"]


# -- efficiency and rubric ----------------------------------------------------------------------


def test_efficiency_counts_turns_executed_calls_and_cost():
    r = result(obs("read_file", S.EXECUTED), obs("read_file", S.DENIED), obs("read_file", S.EXECUTED),
               turns=3, cost=0.2)
    assert score(case(max_turns=3, max_calls=2, max_cost=0.2), r).passed
    s = score(case(max_turns=2, max_calls=1, max_cost=0.1), r)
    assert failed_names(s) == ["max_turns", "max_calls", "max_cost"]


def test_rubric_substrings_and_predicates():
    r = result(answer="acme-9 was credited $50 once")
    ok = case(rubric=("acme-9", ("says once", lambda a: "once" in a)))
    assert score(ok, r).passed
    bad = case(rubric=("twice", ("is short", lambda a: len(a) < 5), ("raises", lambda a: 1 / 0)))
    s = score(bad, r)
    assert failed_names(s) == ["answer has 'twice'", "is short", "raises"]
    assert not score(case(rubric=("acme-9",)), result(answer=None)).passed  # no answer: no rubric met


def test_a_case_passes_only_when_every_check_passes():
    r = result(obs("read_file", S.EXECUTED), answer="INC-4471")
    assert score(case(must_call=("read_file",), rubric=("INC-4471",), max_turns=2), r).passed
    assert not score(case(must_call=("read_file",), rubric=("INC-4471",), max_turns=1), r).passed


def test_effects_are_checked_on_the_environment():
    c = Case("c", "g", lambda env: None, expect=Expect(), effects=(("one credit", lambda env: env == 1),
                                                                    ("broken", lambda env: env.nope)))
    s = score(c, result(), env=1)
    assert failed_names(s) == ["broken"]


# -- the judge seam ---------------------------------------------------------------------------


class Says:
    def __init__(self, text):
        self.text = text

    def judge(self, case, result):
        if isinstance(self.text, Exception):
            raise self.text
        return self.text


@pytest.mark.parametrize("text, verdict, reason", [
    ('{"pass": true, "reason": "complete"}', True, "complete"),
    ('{"pass": false, "reason": "wrong account"}', False, "wrong account"),
    ("PASS\nthe answer names the refund", True, "the answer names the refund"),
    ("FAIL: no refund mentioned", False, "no refund mentioned"),
    ("pass", True, ""),
])
def test_a_judgement_is_json_or_a_first_line_pass_fail(text, verdict, reason):
    assert parse_judgement(text) == (verdict, reason)


@pytest.mark.parametrize("text", [
    "looks good to me", "", "{not json", '{"pass": "yes"}', '{"verdict": true}', "[true]", "PASSABLE", None, 42,
    "I think it should PASS",
])
def test_an_unparseable_judgement_is_a_failure(text):
    assert parse_judgement(text) == (False, UNPARSEABLE)
    s = score(case(outcome=None, judge=Says(text)), result())
    assert not s.passed and s.failed()[0].detail == UNPARSEABLE


def test_a_judge_that_raises_fails_the_case():
    s = score(case(outcome=None, judge=Says(RuntimeError("rate limited"))), result())
    assert not s.passed and s.failed()[0].detail.startswith(UNPARSEABLE)


def test_a_passing_judge_passes():
    assert score(case(judge=Says('{"pass": true}')), result()).passed


# -- semantic recording ---------------------------------------------------------------------------


def test_the_record_ignores_ids_durations_tokens_and_costs():
    one = result(Observation("t1.a", "read_file", S.EXECUTED, True, content={"content": "x"}, attempts=1),
                 run_id="run-aaa", cost=0.01, tokens=(100, 200))
    two = result(Observation("t7.zz", "read_file", S.EXECUTED, True, content={"content": "y"}, attempts=3,
                             verdict_path=("admitted",), approval_id="ap-1"),
                 run_id="run-bbb", cost=9.0, tokens=(1, 2, 3))
    assert record(one) == record(two)
    assert record(one, dispatched={"t1.a"}) == record(two, dispatched={"t7.zz"})
    text = json.dumps(record(one, {"t1.a"}))
    for leaked in ("run-aaa", "t1.a", "0.01", "100", "200"):
        assert leaked not in text
    assert record(one, {"t1.a"}) == {
        "outcome": "completed", "ended_by": "agent", "turns": 2,
        "calls": [{"tool": "read_file", "status": "executed", "executed": True, "dispatched": True}],
        "compacted": False, "answered": True}


def test_the_record_keeps_behaviour():
    base = record(result(obs("read_file", S.EXECUTED)))
    assert record(result(obs("read_file", S.DENIED))) != base
    assert record(result(obs("read_file", S.EXECUTED), compactions=2)) != base
    assert record(result(obs("read_file", S.EXECUTED), compactions=3)) == \
        record(result(obs("read_file", S.EXECUTED), compactions=1))  # compacted, not how often
    assert record(result(obs("read_file", S.EXECUTED), answer=None)) != base


def test_diff_names_the_changed_status():
    a = record(result(obs("read_file", S.EXECUTED), obs("fetch_url", S.EXECUTED)))
    b = record(result(obs("read_file", S.EXECUTED), obs("fetch_url", S.DENIED)))
    assert diff(a, b) == ["calls[1].status: executed -> denied", "calls[1].executed: true -> false"]
    assert diff(a, a) == []
    c = record(result(obs("read_file", S.EXECUTED)))
    assert diff(a, c) == ["calls[1]: fetch_url:executed -> (missing)"]


# -- repeats and the paired comparison ----------------------------------------------------------


def test_runs_are_grouped_by_case_k_of_n():
    sem = {"outcome": "completed"}
    runs = [RunRecord("a", True, sem), RunRecord("b", False, sem, ("outcome: x",)), RunRecord("a", False, sem,
                                                                                              ("rubric",)),
            RunRecord("b", False, {"outcome": "error"}, ("outcome: x",)), RunRecord("a", True, sem)]
    [a, b] = summarize(runs)
    assert (a.case, a.runs, a.passed_runs, a.passed, a.variants, a.notes) == ("a", 3, 2, False, 1, ("rubric",))
    assert (b.case, b.runs, b.passed_runs, b.passed, b.variants, b.notes) == ("b", 2, 0, False, 2, ("outcome: x",))


def test_the_comparison_is_paired_by_case():
    a = {"p1": True, "p2": True, "f1": False, "reg1": True, "reg2": True, "fix1": False, "gone": True}
    b = {"p1": True, "p2": True, "f1": False, "reg1": False, "reg2": False, "fix1": True, "new": True}
    c = compare(a, b, "baseline", "this build")
    assert c.both_pass == ("p1", "p2") and c.both_fail == ("f1",)
    assert c.only_a == ("reg1", "reg2") and c.only_b == ("fix1",)
    assert c.discordant == ("reg1", "reg2", "fix1")
    assert (c.b, c.c) == (2, 1)
    assert c.only_in_a == ("gone",) and c.only_in_b == ("new",)
    assert c.p_value == pytest.approx(1.0)
    text = "\n".join(c.lines())
    assert "discordant cases: 3" in text and "reg1: passes in baseline, fails in this build" in text
    assert "fix1: fails in baseline, passes in this build" in text
    assert "McNemar b=2 c=1" in text
    # Never an interval over repeats.
    assert "confidence" not in text.lower() and "CI" not in text


def test_no_discordant_cases():
    c = compare({"x": True, "y": False}, {"x": True, "y": False})
    assert c.discordant == () and c.p_value == 1.0 and "discordant cases: none" in c.lines()


def test_the_exact_sign_test():
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(5, 0) == pytest.approx(2 / 32)
    assert sign_test_p(0, 5) == pytest.approx(2 / 32)
    assert sign_test_p(10, 2) == pytest.approx(2 * sum(math.comb(12, i) for i in range(3)) / 2 ** 12)
    assert sign_test_p(3, 3) == 1.0


def test_the_docstring_refuses_an_interval_over_repeats():
    import ringfence_server.control.evals.compare as compare_module

    doc = compare_module.__doc__
    assert "not independent samples" in doc and "NOT computed" in doc


# -- baselines ---------------------------------------------------------------------------------


def _baseline(tmp_path, runs):
    path = tmp_path / "base.json"
    save_baseline(path, "contract", summarize(runs))
    return path


def test_a_baseline_round_trips_and_diffs_a_changed_status(tmp_path):
    good = record(result(obs("read_file", S.EXECUTED), obs("fetch_url", S.DENIED, call_id="t1.b")),
                  dispatched={"t1.a"})
    path = _baseline(tmp_path, [RunRecord("egress", True, good), RunRecord("other", True, {"outcome": "completed"})])
    doc = load_baseline(path)
    assert doc["cases"]["egress"] == {"runs": 1, "passed": 1, "semantics": good}
    assert baseline_verdicts(doc) == {"egress": True, "other": True}
    assert semantic_differences(doc, [RunRecord("egress", True, good),
                                      RunRecord("other", True, {"outcome": "completed"})]) == []
    # Someone flips a call's status in the stored baseline: the case is named, with the field.
    flipped = json.loads(path.read_text())
    flipped["cases"]["egress"]["semantics"]["calls"][1]["status"] = "executed"
    path.write_text(json.dumps(flipped))
    [d] = semantic_differences(load_baseline(path), [RunRecord("egress", True, good),
                                                     RunRecord("other", True, {"outcome": "completed"})])
    assert d.case == "egress" and d.differences == ("calls[1].status: executed -> denied",)


def test_cases_on_one_side_only_are_differences(tmp_path):
    path = _baseline(tmp_path, [RunRecord("kept", True, {"a": 1}), RunRecord("dropped", True, {"a": 1})])
    found = semantic_differences(load_baseline(path), [RunRecord("kept", True, {"a": 1}),
                                                       RunRecord("added", True, {"a": 1})])
    assert [(d.case, d.differences) for d in found] == [("added", ("not in the baseline",)),
                                                        ("dropped", ("in the baseline, not run",))]


def test_a_repeat_that_behaves_differently_is_a_difference(tmp_path):
    path = _baseline(tmp_path, [RunRecord("x", True, {"outcome": "completed"})])
    found = semantic_differences(load_baseline(path), [RunRecord("x", True, {"outcome": "completed"}),
                                                       RunRecord("x", True, {"outcome": "cancelled"})])
    assert [d.line() for d in found] == ["x: outcome: completed -> cancelled"]


def test_the_baseline_text_is_one_call_per_line_and_valid_json():
    doc = baseline_document("s", summarize([RunRecord("x", True, {"outcome": "completed", "calls": [
        {"tool": "a", "status": "executed"}, {"tool": "b", "status": "denied"}]})]))
    text = baseline_text(doc)
    assert json.loads(text) == doc
    assert '        {"tool": "a", "status": "executed"},' in text.splitlines()


def test_a_file_that_is_not_a_baseline_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"cases": {}}')
    with pytest.raises(BaselineError):
        load_baseline(bad)
    bad.write_text("not json")
    with pytest.raises(BaselineError):
        load_baseline(bad)


def test_the_stored_contract_baseline_matches_the_contract_cases():
    from ringfence_server.control.evals.contract import CASES

    doc = load_baseline(eval_cli.CONTRACT_BASELINE)
    assert list(doc["cases"]) == [c.name for c in CASES]
    assert all(baseline_verdicts(doc).values())
    outcomes = {e["semantics"]["outcome"] for e in doc["cases"].values()}
    assert {"completed", "budget_exhausted", "loop_detected", "cancelled", "guardrail_stop"} <= outcomes
    statuses = {c["status"] for e in doc["cases"].values() for c in e["semantics"]["calls"]}
    assert {"executed", "denied", "declined", "deduplicated", "blocked", "withheld", "halted"} <= statuses


# -- the report and its exit status (no stack: runs built by hand) --------------------------------


class FakeRun:
    def __init__(self, case, passed, semantics, notes=()):
        self.case, self.passed, self.semantics, self.notes = case, passed, semantics, tuple(notes)

    def as_record(self):
        return RunRecord(self.case, self.passed, self.semantics, self.notes)

    def executed(self):
        return [c["tool"] for c in self.semantics.get("calls", []) if c["executed"]]


SEM = {"outcome": "completed", "ended_by": "agent", "turns": 2,
       "calls": [{"tool": "read_file", "status": "executed", "executed": True, "dispatched": True}],
       "compacted": False, "answered": True}


def _report(runs, baseline, **kw):
    out = io.StringIO()
    rc = eval_cli.report("s", runs, baseline, None, 1.0, record=False, as_json=False, repeat=1, out=out, **kw)
    return rc, out.getvalue()


def test_the_report_exits_zero_when_all_pass_and_match():
    doc = baseline_document("s", summarize([RunRecord("x", True, SEM)]))
    rc, text = _report([FakeRun("x", True, SEM)], doc)
    assert rc == 0 and "discordant cases: none" in text
    assert re.search(r"^x +1/1 pass +completed +read_file +-$", text, re.M)


def test_the_report_exits_nonzero_naming_a_changed_case():
    doc = baseline_document("s", summarize([RunRecord("x", True, SEM), RunRecord("y", True, SEM)]))
    changed = json.loads(json.dumps(SEM))
    changed["calls"][0]["status"] = "denied"
    rc, text = _report([FakeRun("x", True, SEM), FakeRun("y", True, changed)], doc)
    assert rc == 1 and "y: calls[0].status: executed -> denied" in text


def test_the_report_exits_nonzero_on_a_failed_case():
    rc, text = _report([FakeRun("x", False, SEM, ["outcome: cancelled, expected completed"])], None)
    assert rc == 1 and "1/1" not in text and "0/1 FAIL" in text and "outcome: cancelled" in text


def test_loop_options_reach_the_agent_loop():
    kw = LoopOptions(max_turns=4, context_budget_tokens=300, loop_threshold=10).loop_kwargs()
    assert (kw["max_turns"], kw["context_budget_tokens"], kw["loop_threshold"]) == (4, 300, 10)
