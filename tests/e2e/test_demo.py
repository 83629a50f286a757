"""`make demo` keeps working, and says what happened: the sandbox showcase and the reference demo
run end to end as a user runs them (the `ringfence` command, real containers, a real server).

The reference demo's claims are checked where they are made true, not only in its printout: the
run's event log (which calls were dispatched, which were asked) is read from the store the demo
kept (--workdir), and the ledger's own counts are what the demo printed from the ledger.
"""

from __future__ import annotations

import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from ringfence_server.control.store import SqliteEventStore

pytestmark = pytest.mark.docker

RINGFENCE = str(Path(sys.executable).with_name("ringfence"))
THE_END = """\
outcome     completed
turns       7
trajectory  read_file → fetch_url → issue_credit → write_file
credits     ['acme-9:50.0']
"""


def ringfence(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([RINGFENCE, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def line(out: str, label: str) -> str:
    [found] = [ln for ln in out.splitlines() if ln.startswith(label)]
    return found


def test_the_sandbox_showcase_runs_end_to_end(pinned_images):
    out = ringfence("demo", "showcase").stdout
    assert out.count("as expected") == 8 + 1 and "UNEXPECTED" not in out
    assert out.rstrip().endswith("8 of 8 as expected; containers left behind: 0")


def test_the_reference_demo_runs_end_to_end(pinned_images, tmp_path):
    out = ringfence("demo", "--workdir", str(tmp_path)).stdout
    # The four closing lines, byte for byte.
    assert out.endswith(THE_END), out[-600:]
    # The approver was asked twice ($500 declined, $50 approved), never for the repeat.
    assert line(out, "approvals").startswith("approvals       asked 2: $500 declined, $50 approved; ")
    # The ledger itself: one credit, and only one request ever reached it over the network.
    assert line(out, "ledger") == "ledger          1 credit(s) applied, 0 replay(s), 1 request(s) over the network"
    # The context grows turn by turn (each holds every earlier result) until it passes the
    # demo's budget before turn 7: one compaction folds the oldest turns, and the context shrinks.
    tokens = [int(n) for n in re.findall(r"\d+", line(out, "context tokens").split("(")[0])]
    assert len(tokens) == 7 and all(a < b for a, b in pairwise(tokens[:6])), tokens
    assert tokens[6] < tokens[5], tokens
    assert line(out, "compactions").startswith("compactions     1 (budget 2800 tokens;")
    assert line(out, "containers left") == "containers left 0"
    # The skill the agent proposed was not retrievable until the reviewer's trials passed in the sandbox.
    skill = out[out.index("skill proposed"):out.index("trace (")]
    assert skill.index("retrieve('incident') -> nothing") < skill.index("refused") < skill.index("promoted;")
    assert skill.count(" passed  fresh run ") == 2 and "UNEXPECTED" not in skill

    # The run's own log, from the store the demo kept.
    run_id = line(out, "run  ").split()[1]
    store = SqliteEventStore(tmp_path / "state" / "events.sqlite3")
    try:
        # The agent's run, and the two fresh runs of the skill's trials.
        runs = store.runs("demo")
        assert run_id in runs and len(runs) == 3
        trial_tools = [e.data["tool"] for r in runs if r != run_id
                       for e in store.read(r) if e.type == "dispatch_started"]
        assert trial_tools == ["read_file", "read_file"]
        events = store.read(run_id)
    finally:
        store.close()
    of = lambda kind: [e.data["call_id"] for e in events if e.type == kind]  # noqa: E731 - a one-line helper reads better as a lambda here
    # Executed means dispatched to a sandbox: the denied, declined and deduplicated calls never were.
    assert sorted(of("dispatch_started")) == ["t1.incident", "t1.runbook", "t4.refund", "t6.summary"]
    assert of("approval_requested") == ["t3.goodwill", "t4.refund"]
    assert [e.data["approved"] for e in events if e.type == "approval_decided"] == [False, True]
    assert len([e for e in events if e.type == "grant_added"]) == 1
    statuses = {e.data["call_id"]: e.data["status"] for e in events if e.type == "observation"}
    assert statuses == {"t1.incident": "executed", "t1.runbook": "executed", "t2.users": "denied",
                        "t3.goodwill": "declined", "t4.refund": "executed", "t5.refund-again": "deduplicated",
                        "t6.summary": "executed"}
    assert events[-1].type == "run_finished" and events[-1].data["outcome"] == "completed"
    assert line(out, "events").startswith(f"events          {len(events)} in the run's log")

    # The trace: one root; every execute_tool under a batch; turn 1's two tools ran at the same
    # time, in its parallel group; each approval a wait of its own; each try its container start.
    tree = out.split("trace (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert [ln for ln in tree if "invoke_agent" in ln] == [tree[0]] and tree[0].strip().startswith("invoke_agent")
    assert sum("execute_tool" in ln for ln in tree) == 4
    assert all(ln.startswith(("   │  ", "      ")) for ln in tree if "execute_tool" in ln)
    [group] = [ln for ln in tree if "parallel" in ln]
    assert "2 reads" in group and group.endswith("∥")
    assert [ln.split("approval_wait", 1)[1].split()[:3] for ln in tree if "approval_wait" in ln] == [
        ["issue_credit", "t3.goodwill", "declined"], ["issue_credit", "t4.refund", "approved"]]
    # A try's sandbox: a container started for it, or a warm one claimed (serve's pool is on).
    assert sum(("container_start" in ln) + ("warm_claim" in ln) for ln in tree) == 4


@pytest.mark.parametrize("which, line", [
    ("plan", "steps=1 verified=true remediation=none"),
    ("routing", "status=review route=latency evidence=fixture:L1"),
])
def test_the_plan_and_routing_demos_print_their_line_exactly(pinned_images, tmp_path, which, line):
    proc = ringfence("demo", which, "--workdir", str(tmp_path))
    assert proc.stdout == line + "\n"
    # The state is real: the demo's runs are in its event log, every one finished.
    store = SqliteEventStore(tmp_path / "state" / "events.sqlite3")
    try:
        runs = store.runs("demo")
        assert runs and all(store.read(r)[-1].type == "run_finished" for r in runs)
        tools = {e.data.get("tool") for r in runs for e in store.read(r) if e.type == "dispatch_started"}
    finally:
        store.close()
    expected = {"plan": {"assess_evidence", "check_evidence"},
                "routing": {"route_symptom", "latency_specialist"}}[which]
    assert tools == expected
