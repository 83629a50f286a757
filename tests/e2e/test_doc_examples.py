"""The pages' Python examples run as written: the README's "A first agent", "A real model" (against
the local model: Gemma 3 270M on llama.cpp's server), docs/agent-harness.md's "The same with Anthropic" (against a local
server replaying the Messages API's documented responses), docs/control-plane.md's
"Plans an independent verifier checks" and "Routing tickets to specialists", and
docs/workspaces.md's "An agent's workspace, end to end", unchanged, against `ringfence serve` on
its embedded defaults (a real process, real containers). The one in "Your own tools" needs a
project of its own: tests/e2e/test_own_tools.py runs it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from docs_support import DOCS, README, python_block
from model_fakes import ReplayServer, anthropic_message, anthropic_text, anthropic_tool_use, reply
from model_support import local_model_fixture  # noqa: F401 - the `local_model` fixture
from serve_support import ROOT, Served

from ringfence.model import ObservationStatus, RunOutcome

pytestmark = pytest.mark.docker


def run_against_serve(code: str, tmp_path: Path, env: dict[str, str] | None = None,
                      timeout: float = 120) -> subprocess.CompletedProcess:
    """`code` as a script against `ringfence serve` on its embedded defaults (the demo tenant)."""
    config = tmp_path / "empty.toml"
    config.write_text("")
    served = Served(config, tmp_path / "state")
    try:
        script = tmp_path / "example.py"
        script.write_text(code)
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, **(env or {}), "RINGFENCE_SERVER": served.address,
                                                "PYTHONPATH": str(ROOT)})
    finally:
        assert served.stop() == 0
    return proc


def test_the_readme_agent_runs_as_written(pinned_images, tmp_path):
    proc = run_against_serve(python_block(README, "A first agent"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "completed [('echo', 'executed'), ('read_file', 'denied')]\n"


def test_the_readme_real_model_runs_as_written_against_the_local_model(pinned_images, tmp_path, local_model):
    """Not byte for byte: a real model chooses. The example runs, ends with a named outcome and
    prints what ran."""
    env = {"RINGFENCE_MODEL": local_model.model, "RINGFENCE_MODEL_URL": local_model.base_url,
           "RINGFENCE_MODEL_KEY_ENV": ""}
    proc = run_against_serve(python_block(README, "A real model"), tmp_path, env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome_line, trajectory_line = proc.stdout.splitlines()
    assert outcome_line.split(" ", 1)[0] in {o.value for o in RunOutcome}, outcome_line
    trajectory = ast.literal_eval(trajectory_line)
    assert all(status in {s.value for s in ObservationStatus} for _tool, status in trajectory), trajectory
    print(f"\nthe local model, README example: {proc.stdout.strip()}")


def test_the_readme_anthropic_example_runs_as_written_against_replayed_responses(pinned_images, tmp_path):
    replies = [reply(200, anthropic_message([anthropic_text("Saying hello."),
                                             anthropic_tool_use("toolu_1", "echo", {"text": "hello"})],
                                            stop_reason="tool_use")),
               reply(200, anthropic_message([anthropic_text("I said hello.")]))]
    with ReplayServer(replies) as fake:
        env = {"RINGFENCE_MODEL": "claude-test", "RINGFENCE_MODEL_URL": fake.url,
               "ANTHROPIC_API_KEY": "sk-ant-replayed"}
        proc = run_against_serve(python_block(DOCS / "agent-harness.md", "The same with Anthropic"), tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "completed the model gave its final answer\n[('echo', 'executed')]\n"
    # The echo's result went back to the model as a tool_result for its tool_use.
    [_first, second] = fake.seen
    results = [block for message in second.body["messages"] if message["role"] == "user"
               and isinstance(message["content"], list) for block in message["content"]
               if block.get("type") == "tool_result"]
    assert [r["tool_use_id"] for r in results] == ["toolu_1"], second.body["messages"]


@pytest.mark.parametrize("heading, printed", [
    ("Plans an independent verifier checks", "steps=1 verified=true remediation=none"),
    ("Routing tickets to specialists", "status=review route=latency evidence=fixture:L1"),
])
def test_the_plan_and_routing_examples_run_as_written(pinned_images, tmp_path, heading, printed):
    proc = run_against_serve(python_block(DOCS / "control-plane.md", heading), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == printed + "\n"


def test_the_workspace_example_runs_as_written(pinned_images, tmp_path):
    proc = run_against_serve(python_block(DOCS / "workspaces.md", "An agent's workspace, end to end"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    # The test run's lines arrived while the call ran (printed by the example's watcher), then
    # the call's result, the module downloaded as written, and the report collected.
    assert any(line.startswith("live | ") and "test_add" in line for line in lines), lines
    assert lines[-1] == "passed=True ran=1 same_module=True report_ends=OK"
