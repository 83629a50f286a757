"""The README's first agent runs as written: the code block under "A first agent", unchanged,
against `ringfence serve` on its embedded defaults (a real process, real containers)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from serve_support import ROOT, Served

pytestmark = pytest.mark.docker


def readme_agent() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## A first agent", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


def test_the_readme_agent_runs_as_written(pinned_images, tmp_path):
    config = tmp_path / "empty.toml"
    config.write_text("")  # the embedded defaults: the demo tenant and its rules
    served = Served(config, tmp_path / "state")
    try:
        script = tmp_path / "agent.py"
        script.write_text(readme_agent())
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "RINGFENCE_SERVER": served.address,
                                                "PYTHONPATH": str(ROOT)})
    finally:
        assert served.stop() == 0
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, tokens = proc.stdout.splitlines()
    assert first == "completed [('echo', 'executed'), ('read_file', 'denied')]"
    counts = [int(n) for n in re.findall(r"\d+", tokens)]
    assert len(counts) == 2 and counts[1] > counts[0]  # the second turn's context holds the results
