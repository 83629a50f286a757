"""`ringfence demo coding` end to end, as a user runs it (the `ringfence` command, a real server on
a loopback port, real containers, a real workspace), and what it claims checked where it is made
true: the run's event log (kept with --workdir), the artifacts in the store, the bytes the demo
downloaded, and the engine (the workspace's volume is gone).
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ringfence_server.control.demo.coding import BUGGY, FIXED, TESTS
from ringfence_server.control.store import SqliteEventStore

pytestmark = pytest.mark.docker

RINGFENCE = str(Path(sys.executable).with_name("ringfence"))
LAST = re.compile(r"coding: tests failed then passed; downloaded calc\.py \(sha256 ([0-9a-f]{12})\)")
REPORT = "reports/tests.txt"

# The run's log, every event in order; a call's consecutive call_output events are one entry here
# (how many there are depends on how the output was chunked, not on meaning). Only run_tests has
# output (its lines on stderr); the runner's result line on stdout is the result, not output.
SEQUENCE = [
    ("run_started", None),
    ("workspace_created", None),
    # turn 1: two writes of the workspace, one after the other
    ("batch_started", None),
    ("call_decided", "t1.module"), ("call_decided", "t1.tests"),
    ("dispatch_started", "t1.module"), ("attempt", "t1.module"),
    ("call_completed", "t1.module"), ("observation", "t1.module"),
    ("dispatch_started", "t1.tests"), ("attempt", "t1.tests"),
    ("call_completed", "t1.tests"), ("observation", "t1.tests"),
    # turn 2: the failing tests, their lines before their completion, the report collected
    ("batch_started", None), ("call_decided", "t2.run"),
    ("dispatch_started", "t2.run"), ("call_output", "t2.run"), ("attempt", "t2.run"), ("call_completed", "t2.run"),
    ("artifact_collected", "t2.run"), ("observation", "t2.run"),
    # turn 3: the fix
    ("batch_started", None), ("call_decided", "t3.fix"),
    ("dispatch_started", "t3.fix"), ("attempt", "t3.fix"), ("call_completed", "t3.fix"),
    ("observation", "t3.fix"),
    # turn 4: the passing tests
    ("batch_started", None), ("call_decided", "t4.rerun"),
    ("dispatch_started", "t4.rerun"), ("call_output", "t4.rerun"), ("attempt", "t4.rerun"),
    ("call_completed", "t4.rerun"), ("artifact_collected", "t4.rerun"), ("observation", "t4.rerun"),
    # between turns 4 and 5: the module from the workspace, the report from the artifacts
    ("files_downloaded", None), ("files_downloaded", None),
    # turn 5: the answer finishes the run; its workspace goes as it ends
    ("workspace_removed", None),
    ("run_finished", None),
]


def collapsed(events) -> list[tuple[str, str | None]]:
    """(type, call_id) of each event, a call's consecutive call_output events as one."""
    pairs: list[tuple[str, str | None]] = []
    for e in events:
        pair = (e.type, e.data.get("call_id"))
        if not (e.type == "call_output" and pairs and pairs[-1] == pair):
            pairs.append(pair)
    return pairs


def test_the_coding_demo_runs_end_to_end(pinned_images, docker_client, tmp_path):
    proc = subprocess.run([RINGFENCE, "demo", "coding", "--workdir", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout.splitlines()
    printed = LAST.fullmatch(out[-1])
    assert printed, out[-10:]
    [run_id] = re.findall(r"^run +(coding-[0-9a-f]+):", proc.stdout, re.M)

    store = SqliteEventStore(tmp_path / "state" / "events.sqlite3")
    try:
        assert store.runs("demo") == [run_id]
        events = store.read(run_id)
        # The run's store key is its id (no other tenant had taken it): artifacts are keyed by it.
        artifacts = store.read_records("demo", "artifact", f"{run_id}:{REPORT}")
    finally:
        store.close()
    assert collapsed(events) == SEQUENCE
    of = lambda kind, call_id=None: [e for e in events if e.type == kind  # noqa: E731 - a one-line query
                                     and (call_id is None or e.data.get("call_id") == call_id)]

    # What turn 1 and turn 3 wrote, as the log says it was proposed (the dispatched arguments).
    wrote = {e.data["call_id"]: e.data for e in of("observation") if e.data["tool"] == "workspace_write"}
    assert {c: wrote[c]["content"]["sha256"] for c in wrote} == {
        "t1.module": hashlib.sha256(BUGGY.encode()).hexdigest(),
        "t1.tests": hashlib.sha256(TESTS.encode()).hexdigest(),
        "t3.fix": hashlib.sha256(FIXED.encode()).hexdigest()}
    # The downloaded module is, byte for byte, what turn 3 wrote; the log and the last line agree.
    downloaded = (tmp_path / "calc.py").read_bytes()
    assert downloaded == FIXED.encode()
    digest = hashlib.sha256(downloaded).hexdigest()
    assert printed.group(1) == digest[:12]
    module_download, report_download = of("files_downloaded")
    assert module_download.data["artifacts"] is False
    assert [(f["path"], f["size"], f["sha256"]) for f in module_download.data["files"]] == [
        ("calc.py", len(downloaded), digest)]

    # The failing run's lines were events before that call completed, and they are its report:
    # the live stderr joined is byte for byte the first revision of reports/tests.txt.
    for call_id in ("t2.run", "t4.rerun"):
        [completed] = of("call_completed", call_id)
        lines = [e for e in of("call_output", call_id) if e.data["stream"] == "stderr"]
        assert lines and all(e.seq < completed.seq for e in lines)
        assert [e.data["seq"] for e in lines] == list(range(1, len(lines) + 1))
        assert not any(e.data["redacted"] for e in lines)
    failing_live = "".join(e.data["text"] for e in of("call_output", "t2.run") if e.data["stream"] == "stderr")
    assert "FAIL: test_add (test_calc.CalcTest.test_add)" in failing_live
    assert failing_live.rstrip().endswith("FAILED (failures=2)")
    passing_live = "".join(e.data["text"] for e in of("call_output", "t4.rerun") if e.data["stream"] == "stderr")
    assert passing_live.rstrip().endswith("\nOK")

    # The report: collected after each run; the artifact the demo downloaded is the second one,
    # with the sha256 its artifact_collected event recorded.
    collected = [e.data for e in of("artifact_collected")]
    assert [c["call_id"] for c in collected] == ["t2.run", "t4.rerun"] and all(c["missing"] == [] for c in collected)
    [first], [second] = (c["files"] for c in collected)
    assert (first["path"], first["revision"], second["path"], second["revision"]) == (REPORT, 1, REPORT, 2)
    assert [base64.b64decode(r.body["data_b64"]).decode() for r in artifacts] == [failing_live, passing_live]
    report = (tmp_path / "tests.txt").read_bytes()
    assert report == passing_live.encode() and hashlib.sha256(report).hexdigest() == second["sha256"]
    assert report_download.data["artifacts"] is True
    assert [(f["path"], f["sha256"]) for f in report_download.data["files"]] == [(REPORT, second["sha256"])]

    # The workspace: made at the start, removed at the end, and gone from the engine.
    [created], [removed] = of("workspace_created"), of("workspace_removed")
    assert created.data["volume"] == removed.data["volume"] and removed.data["reason"]
    assert docker_client.volumes.list(filters={"name": created.data["volume"]}) == []
    assert events[-1].type == "run_finished" and events[-1].data["outcome"] == "completed"
