"""`ringfence eval contract` as a user runs it: its own stack (real server, real containers, the
runbooks and ledger services), every contract case passes, and the run matches the stored
baseline; a baseline with one call's status flipped makes the command fail, naming the case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ringfence_server.control.evals.cli import CONTRACT_BASELINE
from ringfence_server.control.evals.contract import CASES

pytestmark = pytest.mark.docker

RINGFENCE = str(Path(sys.executable).with_name("ringfence"))


def ringfence_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([RINGFENCE, "eval", *args], capture_output=True, text=True, timeout=300)


def table(out: str) -> dict[str, list[str]]:
    """{case: its row's cells}, from the header line to the first blank line."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("case ") and " runs " in ln)
    rows = {}
    for ln in lines[start + 1:]:
        if not ln.strip():
            break
        rows[ln.split()[0]] = ln.split()
    return rows


def test_the_contract_suite_passes_and_matches_its_baseline(pinned_images, tmp_path):
    stored = CONTRACT_BASELINE.read_bytes()
    # As the README's second line: every case twice, k/N per case.
    proc = ringfence_eval("contract", "--repeat", "2", "--workdir", str(tmp_path))
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    rows = table(out)
    assert list(rows) == [c.name for c in CASES]
    assert all(cells[1:3] == ["2/2", "pass"] for cells in rows.values()), out
    assert f"cases passed {len(CASES)} of {len(CASES)}" in out
    assert f"both pass {len(CASES)}, both fail 0, only baseline passes 0, only this build passes 0" in out
    assert "discordant cases: none" in out
    assert f"semantics: all {len(CASES)} case(s) as recorded" in out
    # Progress went to stderr, one line per case; the stored baseline was only read.
    assert sum(1 for ln in proc.stderr.splitlines() if ln.startswith("eval [")) == 2 * len(CASES)
    assert CONTRACT_BASELINE.read_bytes() == stored
    # The terminal outcomes the contract reaches, as the table shows them.
    outcomes = {cells[3] for cells in rows.values()}
    assert {"completed", "budget_exhausted", "loop_detected", "cancelled", "guardrail_stop"} <= outcomes


def test_a_baseline_with_a_flipped_status_fails_naming_the_case(pinned_images, tmp_path):
    doc = json.loads(CONTRACT_BASELINE.read_text())
    calls = doc["cases"]["egress_denied"]["semantics"]["calls"]
    assert calls[0]["status"] == "denied"
    calls[0]["status"] = "executed"  # as if the denied egress call had once been let through
    flipped = tmp_path / "flipped.json"
    flipped.write_text(json.dumps(doc))
    proc = ringfence_eval("contract", "--baseline", str(flipped), "--json")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    assert all(c["pass"] for c in report["cases"])  # every case still passes its own checks...
    assert report["semantic_differences"] == {"egress_denied": ["calls[0].status: executed -> denied"]}
    assert report["comparison"]["discordant"] == []  # ...so the pass/fail pairing has nothing discordant
    assert json.loads(flipped.read_text()) == doc  # compared with, never rewritten
