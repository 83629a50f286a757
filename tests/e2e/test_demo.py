"""`make demo` keeps working: the showcase runs end to end against the real engine."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.docker


def test_the_demo_runs_end_to_end(pinned_images):
    proc = subprocess.run([sys.executable, "-m", "control.demo"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert out.count("as expected") == 8 and "UNEXPECTED" not in out
    assert "shadow     read_file  denied" in out
    assert "pay-again  credit     deduplicated" in out
    assert "outcome completed" in out
    # The effect, counted at the receiver: one credit applied, never a second.
    assert "ledger (the receiver): credits applied 1, replays 0, acme-9 balance 50" in out
    assert out.rstrip().endswith("containers of the demo still present: 0")
