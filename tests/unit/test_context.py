"""Context assembly and compaction (ringfence.context) through the agent loop, against the
real server on a loopback port (FakeBackend in place of containers, a ScriptedModel in place of
a language model)."""

from __future__ import annotations

import json
import logging

import pytest
from api_support import TOKENS, RealCore, fake_backend, make_config

from ringfence import Client
from ringfence.agent import AgentLoop, ModelTurn, ScriptedModel, ToolCall, TurnRecord
from ringfence.context import ContextAssembler, RecalledFact, TruncatingSummarizer
from ringfence.model import Observation, ObservationStatus, Role, RunOutcome
from ringfence.turns import TRUST_NOTE
from ringfence_server.control.api.background import BackgroundServer

AGENT = TOKENS[("acme", Role.AGENT)]
# Quotes, backslashes, a newline, non-ASCII and JSON-looking text: the goal must come through
# every compaction exactly as given.
GOAL = 'Find why checkout is slow;\n keep "p99" < 300ms — ünïcødé \\ {"not": "json"}  '


@pytest.fixture
def client(tmp_path):
    core = RealCore(make_config(tmp_path / "state"), fake_backend())
    server = BackgroundServer(core.orchestrator, core.config).start()
    c = Client(server.address, AGENT)
    yield c
    c.close()
    server.stop()
    core.orchestrator.close()
    core.store.close()


def long_script(turns: int) -> list:
    """`turns - 1` distinct echo turns (never a repeat, each with a sizeable result), then an answer."""
    step = lambda ctx: ModelTurn.calls(ToolCall("echo", {"text": f"step {ctx.turn} " + "x" * 1200}, "c"))  # noqa: E731 - a one-line helper reads better as a lambda here
    return [step] * (turns - 1) + [lambda ctx: ModelTurn.answer(f"done; goal was {len(ctx.goal)} chars")]


def loop(client, model, *, max_turns: int = 40, max_cost: float = 1e9, cost_per_input_token: float = 1e-6,
         cost_per_output_token: float = 4e-6, goal: str = GOAL, **kwargs) -> AgentLoop:
    return AgentLoop(client, model, max_turns=max_turns, max_cost=max_cost, cost_per_input_token=cost_per_input_token,
                     cost_per_output_token=cost_per_output_token, goal=goal, **kwargs)


def test_a_thirty_turn_run_compacts_completes_and_keeps_the_goal_byte_for_byte(client, caplog):
    model = ScriptedModel(long_script(30))
    with caplog.at_level(logging.INFO, logger="ringfence.context"):
        result = loop(client, model, context_budget_tokens=6000).run()
    assert (result.outcome, result.turns) == (RunOutcome.COMPLETED, 30)
    assert result.compactions >= 2
    # The goal of every context, as given and as rendered, is the goal, byte for byte.
    for context in model.contexts:
        assert context.goal == GOAL
        assert json.loads(context.render())["goal"] == GOAL
    # Compaction keeps every context the model was sent within its budget, however long the run
    # (without it the 30th context would be over 20 000 tokens), and the transcript holds the
    # recent turns verbatim beside the summary.
    assert max(result.context_tokens) <= 6000
    assert result.context_tokens[-1] < result.context_tokens[0] + 29 * 600
    assert 2 <= len(model.contexts[-1].history) <= 6 and model.contexts[-1].summary.startswith("turn 1: ")
    assert result.context_tokens == result.input_tokens  # no usage reported: the estimate is the input
    # Each compaction is counted and logged once.
    logged = [r for r in caplog.records if "compaction" in r.getMessage()]
    assert len(logged) == result.compactions == model.contexts[-1].compactions


def test_without_a_budget_nothing_is_compacted(client):
    model = ScriptedModel(long_script(6))
    result = loop(client, model).run()
    assert result.compactions == 0 and all(not c.summary for c in model.contexts)
    assert [len(c.history) for c in model.contexts] == [0, 1, 2, 3, 4, 5]
    assert list(result.context_tokens) == sorted(result.context_tokens)  # the context only grows


def test_results_are_labelled_data_and_the_legend_is_always_there(client):
    model = ScriptedModel(long_script(2))
    loop(client, model).run()
    rendered = json.loads(model.contexts[1].render())
    assert rendered["trust"] == TRUST_NOTE
    [result] = rendered["turns"][0]["results"]
    assert result["trust"] == "data" and result["status"] == "executed"


class Facts:
    """A MemoryRecall double: what it was asked, and two facts (one from a call that never ran)."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def recall(self, query, *, limit=5):
        self.queries.append(query)

        class Prov:
            def __init__(self, executed):
                self.executed = executed

        class Fact:
            def __init__(self, kind, text, executed):
                self.kind, self.text, self.provenance = kind, text, Prov(executed)

        return [Fact("semantic", "checkout's p99 budget is 300ms", True),
                Fact("episodic", "a denied read of /etc/passwd", False)][:limit]


def test_recalled_memory_is_in_the_context_as_labelled_data(client):
    facts = Facts()
    model = ScriptedModel(long_script(2))
    loop(client, model, memory=facts).run()
    assert facts.queries == [GOAL, GOAL]
    assert json.loads(model.contexts[0].render())["memory"] == [
        {"kind": "semantic", "text": "checkout's p99 budget is 300ms", "executed": True, "trust": "data"},
        {"kind": "episodic", "text": "a denied read of /etc/passwd", "executed": False, "trust": "data"}]


def record(turn: int, text: str) -> TurnRecord:
    obs = Observation(f"t{turn}.c", "echo", ObservationStatus.EXECUTED, True, {"text": text})
    return TurnRecord(turn, (ToolCall("echo", {"text": text}, "c"),), (obs,))


def test_the_truncating_summarizer_keeps_heads_and_tails():
    summary = TruncatingSummarizer(head=40, tail=20).summarize("earlier", [record(1, "A" * 500 + "THE-END")])
    first, second = summary.splitlines()
    assert first == "earlier"
    assert second.startswith('turn 1: {"calls":[{"arguments":{"text":"AAAA') and " […] " in second
    assert second.endswith('"turn":1}') and len(second) < 100


def test_a_summarizer_of_ones_own_is_used():
    class Counting:
        def __init__(self):
            self.folded: list[int] = []

        def summarize(self, summary, folded):
            self.folded += [r.turn for r in folded]
            return f"{len(self.folded)} turns so far"

    s = Counting()
    assembler = ContextAssembler(200, summarizer=s, keep_recent=1)
    history = [record(i, "y" * 400) for i in range(1, 5)]
    context = assembler.assemble(GOAL, "r", 5, (), history)
    assert s.folded == [1, 2, 3] and context.summary == "3 turns so far"
    assert [r.turn for r in context.history] == [4] and context.goal == GOAL and assembler.compactions == 1


def test_recalled_fact_as_json():
    assert RecalledFact("procedural", "restart with care", True).as_json() == {
        "kind": "procedural", "text": "restart with care", "executed": True, "trust": "data"}


def test_the_loop_recalls_from_a_real_tenant_memory(client, tmp_path):
    from ringfence.memory import MemoryKind, Provenance, SqliteMemoryStore

    with SqliteMemoryStore(tmp_path / "memory.sqlite3") as store:
        acme = store.for_tenant("acme")
        acme.remember(MemoryKind.SEMANTIC, "checkout p99 budget is 300ms", Provenance("r-1", "t1.c", True))
        store.for_tenant("globex").remember(MemoryKind.SEMANTIC, "checkout p99 secret of globex",
                                            Provenance("r-9", None, True))
        model = ScriptedModel(long_script(2))
        loop(client, model, memory=acme).run()
    memory = json.loads(model.contexts[0].render())["memory"]
    assert memory == [{"kind": "semantic", "text": "checkout p99 budget is 300ms", "executed": True, "trust": "data"}]
