"""`ringfence eval SUITE --model PROVIDER:URL` without a model or a stack
(ringfence_server/control/evals/models.py): the argument's parsing (anthropic: its key from
ANTHROPIC_API_KEY; tested here only, no server reachable), a case directed at a real model, the
classification rule on runs built by hand, and the report's section and exit status. The real
model runs it in tests/e2e/test_local_model.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringfence.agent import AgentResult, ModelTurn, ScriptedModel, ToolCall
from ringfence.model import Observation, ObservationStatus, RunOutcome
from ringfence_server.control.evals import cli as eval_cli
from ringfence_server.control.evals.contract import CASES
from ringfence_server.control.evals.models import (
    ADAPTER,
    INFRASTRUCTURE,
    MODEL,
    POLICY,
    Directed,
    ModelSpec,
    ModelSpecError,
    classify,
    directed,
    model_comparison,
)
from ringfence_server.control.evals.runner import CaseRun
from ringfence_server.control.evals.scoring import Score
from ringfence_server.control.evals.semantics import record

S = ObservationStatus
URL = "http://127.0.0.1:8080/v1"


def no_listing(url: str) -> list[str]:
    raise AssertionError("the server was asked for its models")


# -- the argument --------------------------------------------------------------------------------


def test_openai_takes_the_key_when_it_is_set_and_none_otherwise():
    spec = ModelSpec.parse(f"openai:{URL}", "m", env={}, list_models=no_listing)
    assert (spec.provider, spec.url, spec.name, spec.key_env) == ("openai", URL, "m", None)
    assert ModelSpec.parse(f"openai:{URL}", "m", env={"OPENAI_API_KEY": "k"}).key_env == "OPENAI_API_KEY"


def test_openai_without_a_name_asks_the_server_and_needs_exactly_one_model():
    assert ModelSpec.parse(f"openai:{URL}", env={}, list_models=lambda url: ["gemma"]).name == "gemma"
    for listed in ([], ["a", "b"]):
        with pytest.raises(ModelSpecError, match="--model-name"):
            ModelSpec.parse(f"openai:{URL}", env={}, list_models=lambda url, listed=listed: listed)


def test_anthropic_needs_its_key_from_the_environment_and_a_model_name():
    with pytest.raises(ModelSpecError, match="ANTHROPIC_API_KEY"):
        ModelSpec.parse("anthropic:https://api.anthropic.com", "claude", env={})
    with pytest.raises(ModelSpecError, match="--model-name"):
        ModelSpec.parse("anthropic:https://api.anthropic.com", None, env={"ANTHROPIC_API_KEY": "sk-test-7f3e"})
    spec = ModelSpec.parse("anthropic:https://api.anthropic.com", "claude", env={"ANTHROPIC_API_KEY": "sk-test-7f3e"},
                           list_models=no_listing)
    assert (spec.provider, spec.url, spec.name, spec.key_env) == (
        "anthropic", "https://api.anthropic.com", "claude", "ANTHROPIC_API_KEY")
    assert "sk-test-7f3e" not in repr(spec)  # the key's name is kept, never the key


@pytest.mark.parametrize("bad", ["openai", "mistral:http://x", "openai:127.0.0.1:8080", ":http://x"])
def test_a_spec_that_is_not_provider_colon_url_is_a_usage_error(bad):
    with pytest.raises(ModelSpecError, match="--model"):
        ModelSpec.parse(bad, "m", env={}, list_models=no_listing)


def test_the_command_refuses_anthropic_without_its_key_before_starting_anything():
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    proc = subprocess.run([str(Path(sys.executable).with_name("ringfence")), "eval", "contract", "--model",
                           "anthropic:https://api.anthropic.com", "--model-name", "claude"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    assert "ANTHROPIC_API_KEY" in proc.stderr and "starting the stack" not in proc.stderr


# -- a case directed at a real model --------------------------------------------------------------


def test_a_case_is_directed_by_its_script_and_steered_to_its_tools():
    [case] = [c for c in CASES if c.name == "parallel_reads"]
    spec = ModelSpec("openai", URL, "m", None)
    real = directed(case, spec)
    assert real.goal.startswith(case.goal + "\n\nDo this, one turn at a time:\n")
    assert ('turn 1: call read_file with {"path":"/input/incident.md"} and call read_file with '
            '{"path":"/input/notes.md"}') in real.goal
    assert "turn 2: decide from the results" in real.goal
    assert (real.expect, real.options, real.approver, real.effects) == (
        case.expect, case.options, case.approver, case.effects)
    [one] = [c for c in CASES if c.name == "path_denied"]
    model = directed(one, spec).model(None)
    assert isinstance(model, Directed) and model.steering == ["read_file", None]


# -- the classification rule ----------------------------------------------------------------------


def run(name: str, *observations: Observation, calls: tuple[ToolCall, ...] = (), outcome=RunOutcome.COMPLETED,
        raised: bool = False, passed: bool = True) -> CaseRun:
    if raised:
        return CaseRun(name, 1, None, {"error": "ModelUnavailable"}, Score(()), 0.0, ((*calls,),))
    result = AgentResult(outcome=outcome, reason="r", ended_by="agent", run_id="run", turns=2,
                         input_tokens=(1, 2), output_tokens=(1, 1), total_cost=0.0, trajectory=observations,
                         final_answer="done" if outcome is RunOutcome.COMPLETED else None)
    from ringfence_server.control.evals.scoring import CheckResult

    return CaseRun(name, 1, result, record(result, None), Score((CheckResult("outcome", "outcome", passed),)), 0.0,
                   ((*calls,), ()))


READ = ToolCall("read_file", {"path": "/input/incident.md"}, "a")
SCRIPTED = run("c", Observation("t1.a", "read_file", S.EXECUTED, True), calls=(READ,))


def test_a_run_that_raised_or_ended_error_is_infrastructure():
    assert classify(SCRIPTED, run("c", calls=(READ,), raised=True, passed=False)) == INFRASTRUCTURE
    assert classify(SCRIPTED, run("c", outcome=RunOutcome.ERROR, passed=False)) == INFRASTRUCTURE


def test_an_invalid_observation_or_a_cut_response_is_the_adapter():
    bad = ToolCall.malformed("read_file", '{"path": "/inp', "invalid JSON", "a")
    assert classify(SCRIPTED, run("c", Observation("t1.a", "read_file", S.INVALID, False), calls=(bad,),
                                  passed=False)) == ADAPTER
    assert classify(SCRIPTED, run("c", outcome=RunOutcome.MODEL_TRUNCATED, passed=False)) == ADAPTER


def test_the_same_proposal_given_another_status_is_policy():
    model = run("c", Observation("t1.a", "read_file", S.DENIED, False), calls=(READ,), passed=False)
    assert classify(SCRIPTED, model) == POLICY


def test_another_proposal_is_the_model():
    elsewhere = ToolCall("read_file", {"path": "incident.md"}, "a")
    model = run("c", Observation("t1.a", "read_file", S.DENIED, False), calls=(elsewhere,), passed=False)
    assert classify(SCRIPTED, model) == MODEL


# -- the report -------------------------------------------------------------------------------------


def test_the_report_pairs_the_real_model_with_the_script_and_fails_on_a_discordant_case():
    spec = ModelSpec("openai", URL, "gemma", None)
    elsewhere = ToolCall("read_file", {"path": "incident.md"}, "a")
    scripted = [SCRIPTED, run("d", Observation("t1.a", "read_file", S.EXECUTED, True), calls=(READ,))]
    model = [run("c", Observation("t1.a", "read_file", S.DENIED, False), calls=(elsewhere,), passed=False),
             run("d", Observation("t1.a", "read_file", S.EXECUTED, True), calls=(READ,))]
    comparison = model_comparison(spec, scripted, model)
    assert comparison.discordant == ("c",) and comparison.classes == {"c": MODEL}
    out = io.StringIO()
    rc = eval_cli.report("s", scripted, None, None, 1.0, record=False, as_json=False, repeat=1, out=out,
                         model=comparison)
    text = out.getvalue()
    assert rc == 1 and "result: FAILED" in text
    assert "only ScriptedModel passes 1, only openai:gemma passes 0" in text and "  c: model" in text
    out = io.StringIO()
    assert eval_cli.report("s", scripted, None, None, 1.0, record=False, as_json=True, repeat=1, out=out,
                           model=comparison) == 1
    doc = json.loads(out.getvalue())["real_model"]
    assert doc["classes"] == {"c": "model"} and doc["comparison"]["only_a"] == ["c"]
    # The same runs without --model: the scripted suite alone decides.
    assert eval_cli.report("s", scripted, None, None, 1.0, record=False, as_json=False, repeat=1,
                           out=io.StringIO()) == 0


def test_a_scripted_turn_is_asked_for_its_effect_and_its_answer_discarded():
    acted: list[int] = []

    def effect(ctx):
        acted.append(ctx.turn)
        return ModelTurn.answer("discarded")

    class Fixed:
        def next_turn(self, context):
            return ModelTurn.answer("the model's")

    model = Directed(ModelSpec("openai", URL, "m", None), ScriptedModel([effect]))
    model._clients["auto"] = Fixed()  # the adapter's place: what it would have answered
    from ringfence.turns import AgentContext

    assert model.next_turn(AgentContext("g", "r", 1)).final_answer == "the model's"
    assert model.next_turn(AgentContext("g", "r", 2)).final_answer == "the model's"  # past the script
    assert acted == [1]
