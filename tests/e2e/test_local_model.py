"""A real language model drives the loop: Gemma 3 270M behind llama-cpp-python's OpenAI-compatible
server on a loopback port (tests/model_support.py) -> OpenAIChatModel -> AgentLoop -> the SDK ->
`ringfence serve` -> a container, and back.

A 270M model is erratic: what is asserted is the contract, never the model's choices:
- the run ends with a named outcome (a RunOutcome, ended_by said);
- every call the model proposed crossed admission: it has exactly one observation in the run's
  trajectory and, unless it is the loop's own `invalid` one (arguments that were not JSON: never
  sent), in the server's event log; an `invalid` one is nowhere in that log;
- the model's usage is reported each turn and the context grows turn by turn.
What the model did is printed (`pytest -s`); the closing note of issue 25 quotes it.

The model is steered where that helps: left to choose ("auto") it answers at once with an empty
message, so a test that needs a call names the tool (tool_choice); what it writes into the call
is its own. Temperature 0 throughout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from itertools import pairwise
from pathlib import Path

import pytest
from model_support import Recording, local_model_fixture  # noqa: F401 - the `local_model` fixture
from serve_support import Served

from ringfence import Client
from ringfence.agent import AgentLoop, AgentResult, ModelClient, TurnRecord
from ringfence.model import Event, ObservationStatus, RunOutcome
from ringfence.models.openai import OpenAIChatModel
from ringfence_server.control.demo.local_agent import Steered, describe
from ringfence_server.control.demo.local_model import LocalModelServer
from ringfence_server.control.demo.stack import INCIDENT

pytestmark = [pytest.mark.slow, pytest.mark.docker]

RINGFENCE = str(Path(sys.executable).with_name("ringfence"))
AGENT_TOKEN = "demo-agent-token"  # the embedded defaults' dev tenant (a config without [tenants] keeps it)
GOAL = "Read the incident report with read_file: its path is /input/incident.md. Then answer with what it says."
OUTCOMES = {o.value for o in RunOutcome}
DEMO_TIMEOUT_S = 600
"""The ceiling of one `ringfence demo --model local` or `ringfence eval --model` subprocess."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, pinned_images: object) -> Iterator[Served]:
    """`ringfence serve` on a free port, the demo's incident readable at /input."""
    root = tmp_path_factory.mktemp("served")
    inputs = root / "input"
    inputs.mkdir()
    inputs.chmod(0o755)  # read by the sandbox user through a read-only bind mount
    (inputs / "incident.md").write_text(INCIDENT)
    (inputs / "incident.md").chmod(0o644)
    config = root / "ringfence.toml"
    config.write_text(f'[inputs]\n"/input" = "{inputs}"\n')
    server = Served(config, root / "state")
    try:
        yield server
    finally:
        server.stop()


def chat(server: LocalModelServer, tool_choice: str, max_output_tokens: int = 128) -> OpenAIChatModel:
    # tool_results="user": llama-cpp-python's function-calling template drops `tool` messages.
    return OpenAIChatModel(server.model, base_url=server.base_url, api_key_env=None, tool_choice=tool_choice,
                           temperature=0.0, max_output_tokens=max_output_tokens, tool_results="user")


def drive(served: Served, model: ModelClient, max_turns: int) -> tuple[AgentResult, Recording, list[TurnRecord],
                                                                        list[Event]]:
    """One run of the loop with `model` on the served server; the run's whole event log after it."""
    recording = Recording(model)
    records: list[TurnRecord] = []
    with Client(served.address, AGENT_TOKEN) as client:
        result = AgentLoop(client, recording, goal=GOAL, max_turns=max_turns, max_cost=1.0,
                           cost_per_input_token=3e-6, cost_per_output_token=1.5e-5, tools_query="read_file",
                           on_turn=records.append).run()
        events: list[Event] = []
        for event in client.watch_run(result.run_id, 0, timeout=30):
            events.append(event)
            if event.type == "run_finished":
                break
    print(f"\n{result.outcome.value} (ended by {result.ended_by}: {result.reason}) after {result.turns} turn(s)")
    # (a context past the last turn: the model raised for it, and the loop ended the run)
    for n, (turn, context) in enumerate(zip(recording.turns, recording.contexts, strict=False), 1):
        usage = turn.usage
        print(f"  turn {n}: {describe(turn)}; usage {usage.input_tokens if usage else '-'} in, "
              f"{usage.output_tokens if usage else '-'} out; context {len(context.history)} earlier turn(s)")
    for o in result.trajectory:
        print(f"    -> {o.tool} {o.status.value}: {(o.error or json.dumps(o.content))[:100]}")
    return result, recording, records, events


def assert_contract(result: AgentResult, recording: Recording, records: Sequence[TurnRecord],
                    events: Sequence[Event]) -> None:
    # A named outcome, and who decided it.
    assert result.outcome.value in OUTCOMES and result.ended_by in ("agent", "model", "server") and result.reason
    assert events and events[-1].type == "run_finished"
    # Every proposal crossed admission: the turns' calls are the model's, in order, each with one observation...
    proposed = [turn.tool_calls for turn in recording.turns if turn.tool_calls]
    sent = [record.calls for record in records]
    assert sent == proposed[:len(sent)]
    # (a repeat the loop detector stopped is the one proposal never sent: that is its job)
    assert len(proposed) == len(sent) or (len(proposed) == len(sent) + 1
                                          and result.outcome is RunOutcome.LOOP_DETECTED)
    for record in records:
        assert len(record.observations) == len(record.calls), record
    trajectory = [o for record in records for o in record.observations]
    assert list(result.trajectory) == trajectory
    assert len({o.call_id for o in trajectory}) == len(trajectory)
    # ...and in the server's log, but the loop's own invalid ones, which never reach it.
    invalid = {o.call_id for o in trajectory if o.status is ObservationStatus.INVALID}
    logged = {e.data.get("call_id") for e in events if e.type == "observation"}
    assert logged == {o.call_id for o in trajectory} - invalid
    assert not invalid & {e.data.get("call_id") for e in events}
    # Usage: reported every turn, and growing with the context.
    assert len(recording.turns) == result.turns == len(result.input_tokens)
    reported = [turn.usage.input_tokens for turn in recording.turns if turn.usage is not None]
    assert len(reported) == result.turns and all(n > 0 for n in reported)
    assert all(a < b for a, b in pairwise(reported)), reported
    assert all(a < b for a, b in pairwise(result.input_tokens)), result.input_tokens


def test_a_real_model_drives_a_run_through_the_real_server(served, local_model):
    # Turn 1 must call read_file (what it reads is the model's choice); then it chooses.
    result, recording, records, events = drive(served, Steered([chat(local_model, "read_file")],
                                                               chat(local_model, "auto")), max_turns=3)
    assert_contract(result, recording, records, events)
    # The adapter and the server understand each other past turn 1 (the conversation then holds the
    # model's calls and their results): a provider error is no outcome of the model's making.
    assert not (result.outcome is RunOutcome.ERROR and result.ended_by == "model"), result.reason
    calls = [call for turn in recording.turns for call in turn.tool_calls]
    said = [describe(turn) for turn in recording.turns]
    assert calls, f"the model proposed no call in {result.turns} turn(s): {said}"
    assert records and records[0].calls[0].name == "read_file"
    # What became of it is ringfence's word, whatever the model wrote: it ran in a container or not.
    first = records[0].observations[0]
    assert first.status is not ObservationStatus.PENDING_APPROVAL  # read_file is allowed or denied, never asked
    assert first.executed == (first.status in (ObservationStatus.EXECUTED, ObservationStatus.WITHHELD))


def test_a_call_cut_short_is_never_sent_but_shown_to_the_model_to_repair(served, local_model):
    # Two output tokens cannot hold a read_file call's arguments ({"path": ...}): the response stops
    # mid-call. llama-cpp-python reports finish_reason "tool_calls" for it all the same, so the
    # adapter sees arguments that are not JSON: an `invalid` observation (were it reported
    # "length", the run would end model_truncated). Either way nothing of it is sent or completed.
    result, recording, records, events = drive(served, chat(local_model, "read_file", max_output_tokens=2),
                                               max_turns=2)
    assert_contract(result, recording, records, events)
    assert result.outcome is not RunOutcome.COMPLETED
    assert not [e for e in events if e.type in ("batch_admitted", "observation", "dispatch_started")]
    if result.outcome is RunOutcome.MODEL_TRUNCATED:
        assert result.ended_by == "model" and not result.trajectory
    else:
        assert result.trajectory and all(o.status is ObservationStatus.INVALID and not o.executed
                                         and o.error_class == "invalid_arguments" for o in result.trajectory)
        # The model was shown what was wrong, under its own call id, on the next turn.
        shown = recording.contexts[1].results()
        assert shown[0]["status"] == "invalid" and "not a JSON object" in shown[0]["error"]


SUITE = """\
from dataclasses import replace

from ringfence_server.control.evals.contract import CASES as ALL
from ringfence_server.control.evals.scoring import LoopOptions

# Two contract cases, two turns each (a small model takes seconds a turn): a read allowed, one denied.
CASES = [replace(c, options=LoopOptions(max_turns=2)) for c in ALL if c.name in ("path_allowed", "path_denied")]
"""


@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_eval_compares_the_local_model_with_the_script_paired_by_case(local_model, tmp_path):
    suite = tmp_path / "two_cases.py"
    suite.write_text(SUITE)
    proc = subprocess.run([RINGFENCE, "eval", str(suite), "--model", f"openai:{local_model.base_url}", "--json"],
                          capture_output=True, text=True, timeout=DEMO_TIMEOUT_S)
    print(proc.stderr[-3000:])
    assert proc.returncode in (0, 1), proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    real = report["real_model"]
    print(json.dumps(real, indent=1))
    assert real["model"] == f"openai:{local_model.model}" and real["url"] == local_model.base_url
    assert [c["case"] for c in real["cases"]] == ["path_allowed", "path_denied"]
    assert all(c["outcome"] in OUTCOMES for c in real["cases"])
    comparison = real["comparison"]
    assert (comparison["a"], comparison["b"]) == ("ScriptedModel", f"openai:{local_model.model}")
    # Every discordant case is classified, and so is every case whose runs behaved differently.
    assert set(comparison["discordant"]) <= set(real["classes"])
    assert set(real["classes"].values()) <= {"infrastructure", "adapter", "policy", "model"}
    # The exit status: the scripted cases pass here, so it is the model's discordance that decides.
    assert all(c["pass"] for c in report["cases"])
    assert proc.returncode == (1 if comparison["discordant"] else 0)
    # The model's runs were run, each case by the real model, after the scripted ones.
    assert [ln.split(":")[0] for ln in proc.stderr.splitlines() if ln.startswith("model [")] == [
        "model [1/2] path_allowed", "model [2/2] path_denied"]
