"""A real language model for the tests: Gemma 3 270M behind llama-cpp-python's OpenAI-compatible
server on a loopback port, started by ringfence_server.control.demo.local_model (the one
implementation `ringfence demo --model local` uses too: the file's SHA256 checked before the
server starts, stopped with its process group at teardown, whatever happened).

    from model_support import local_model_fixture  # noqa: F401 - the `local_model` fixture
    def test_x(local_model): OpenAIChatModel(local_model.model, base_url=local_model.base_url, ...)

Without the `local-model` extra the fixture skips, naming `make local-model` (in CI a skip is a
failure: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ringfence.turns import AgentContext, ModelClient, ModelTurn
from ringfence_server.control.demo.local_model import LocalModelMissing, LocalModelServer


@pytest.fixture(scope="module", name="local_model")
def local_model_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalModelServer]:
    """One server per test module that asks for it."""
    server = LocalModelServer(log_path=tmp_path_factory.mktemp("local-model") / "server.log")
    try:
        try:
            server.start()
        except LocalModelMissing as e:
            pytest.skip(f"{e} (make local-model)")
        yield server
    finally:
        server.stop()


class Recording:
    """A ModelClient that keeps what its model was given and what it answered, turn by turn."""

    def __init__(self, model: ModelClient) -> None:
        self.model = model
        self.contexts: list[AgentContext] = []
        self.turns: list[ModelTurn] = []

    def next_turn(self, context: AgentContext) -> ModelTurn:
        self.contexts.append(context)
        turn = self.model.next_turn(context)
        self.turns.append(turn)
        return turn
