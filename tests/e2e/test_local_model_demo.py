"""`ringfence demo --model local`: the reference agent driven by a real local model (Gemma 3 270M,
tests/e2e/test_local_model.py says what is asserted of a model and why).

A module of its own so that no other model server runs beside the demo's: test_local_model.py's
module-scoped server is stopped when that module ends, and one still generating an answer nobody
waits for any more took the CPU the demo's own server needed (its requests then ran past their
timeout on a 2-core machine).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ringfence.model import RunOutcome
from ringfence_server.control.store import SqliteEventStore

pytestmark = [pytest.mark.slow, pytest.mark.docker]

RINGFENCE = str(Path(sys.executable).with_name("ringfence"))
OUTCOMES = {o.value for o in RunOutcome}
DEMO_TIMEOUT_S = 600
"""The ceiling of the `ringfence demo --model local` subprocess."""


@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_ringfence_demo_with_the_local_model(tmp_path):
    # 35 s on a quiet 2-core machine; a busy one has taken over 300 s, so the demo gets its own
    # ceiling, and a demo that outlives it is shown (its turns so far, the model server's log).
    proc = subprocess.Popen([RINGFENCE, "demo", "--model", "local", "--workdir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=DEMO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # SIGTERM, not SIGKILL: the demo then stops the model server it started (a session of its
        # own, which a kill of the demo alone would leave generating for minutes).
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        log = tmp_path / "local-model.log"
        pytest.fail(f"the demo ran past {DEMO_TIMEOUT_S} s; its output so far:\n{_text(out)}\n"
                    f"{_text(err)[-3000:]}\nthe model server's log ends:\n"
                    f"{log.read_text(errors='replace')[-3000:] if log.exists() else '(none)'}")
    print(out)
    # The demo checks its own contract (exit 1 and UNEXPECTED lines otherwise).
    assert proc.returncode == 0, out[-4000:] + err[-4000:]
    assert "UNEXPECTED" not in err
    [outcome] = re.findall(r"^outcome +(\S+)$", out, re.M)
    assert outcome in OUTCOMES
    assert re.search(r"^containers left 0$", out, re.M)
    assert re.search(r"sha256 [0-9a-f]{16}…, checked", out)
    # Each turn says what the model proposed and what ringfence made of it.
    assert out.count("\nturn ") >= 1 and "   proposes " in out and "   -> " in out
    # The approver decided every ask there was (the model may have asked for none).
    run_id = re.findall(r"^run +(\S+)$", out, re.M)[0]
    store = SqliteEventStore(tmp_path / "state" / "events.sqlite3")
    try:
        events = store.read(run_id)
    finally:
        store.close()
    asked = [e.data["approval_id"] for e in events if e.type == "approval_requested"]
    decided = [e.data["approval_id"] for e in events if e.type == "approval_decided"]
    assert sorted(asked) == sorted(decided)
    # The server's word: the outcome, or `cancelled` when the loop or the model ended the run (the
    # loop cancels it on the server, and says why in its own outcome).
    [ended_by] = re.findall(r"^ended by +(\w+):", out, re.M)
    assert events[-1].type == "run_finished"
    assert events[-1].data["outcome"] == (outcome if ended_by == "server" or outcome == "completed" else "cancelled")


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
