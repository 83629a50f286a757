"""The pages' Python examples run as written: the README's "A first agent", docs/control-plane.md's
"Plans an independent verifier checks" and "Routing tickets to specialists", and
docs/workspaces.md's "An agent's workspace, end to end", unchanged, against `ringfence serve` on
its embedded defaults (a real process, real containers). The one in "Your own tools" needs a
project of its own: tests/e2e/test_own_tools.py runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from docs_support import DOCS, README, python_block
from serve_support import ROOT, Served

pytestmark = pytest.mark.docker


def run_against_serve(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`code` as a script against `ringfence serve` on its embedded defaults (the demo tenant)."""
    config = tmp_path / "empty.toml"
    config.write_text("")
    served = Served(config, tmp_path / "state")
    try:
        script = tmp_path / "example.py"
        script.write_text(code)
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "RINGFENCE_SERVER": served.address,
                                                "PYTHONPATH": str(ROOT)})
    finally:
        assert served.stop() == 0
    return proc


def test_the_readme_agent_runs_as_written(pinned_images, tmp_path):
    proc = run_against_serve(python_block(README, "A first agent"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "completed [('echo', 'executed'), ('read_file', 'denied')]\n"


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
