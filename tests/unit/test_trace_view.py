"""`ringfence trace RUN_ID`: a run's span tree from its event log (ringfence_server.control.tracing).

Real logs: an Orchestrator with the fake backend on a SQLite file (control_support.Harness),
with a clock that ticks on every read so that the events' times say what happened first; and
a small log appended by hand through the real store API for the exact drawing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from control_support import AGENT, APPROVER, FakeClock, Harness, content_result

from ringfence.model import ObservationStatus as S
from ringfence.model import ProposedCall
from ringfence_server.control.store.sqlite import SqliteEventStore
from ringfence_server.control.tracing import TraceNode, render, trace_from_events
from ringfence_server.control.tracing.tree import PARALLEL_MARK

ROOT = Path(__file__).resolve().parents[2]
SECRET_ARGUMENT = "AKIAIOSFODNN7EXAMPLE"
PLAIN_ARGUMENT = "hunter2-private-notes.txt"  # no scanner finds it: it is in the log as it was sent
TOOL_OUTPUT = "the-body-of-file-a-TOP-SECRET-42"  # stored in the log's completion and observation


class TickingClock(FakeClock):
    """Every read moves time on by 1 ms: later events have later times, deterministically."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += 0.001
            return self.now


def ticking(tmp_path: Path, **kwargs) -> Harness:
    h = Harness(tmp_path, **kwargs)
    h.clock = TickingClock()
    h.restart()  # the store and the orchestrator now stamp times with the ticking clock
    return h


def both_reads_in_the_sandbox_at_once(h: Harness) -> None:
    """read_file answers only once two of them are running: they really overlap."""
    barrier = threading.Barrier(2, timeout=10)

    def read(call):
        barrier.wait()
        body = TOOL_OUTPUT if call.arguments["path"].endswith("a.txt") else "other file"
        return content_result({"path": call.arguments["path"], "content": body, "truncated": False})

    h.emulator.overrides["read_file"] = read


def submit(h: Harness, run: str, turn: int, *calls: ProposedCall):
    return h.orch.submit_batch(AGENT, run, list(calls), batch_id=f"{run}.t{turn}")


@pytest.fixture()
def incident(tmp_path):
    """The demo's story on the fake backend: parallel reads with a denied and a blocked call, an
    ask approved (remembered), an ask declined, the repeat deduplicated, the run finished."""
    h = ticking(tmp_path)
    both_reads_in_the_sandbox_at_once(h)
    run = h.run(run_id="r-trace")
    obs = submit(h, run, 1, ProposedCall("t1.a", "read_file", {"path": "/input/a.txt"}),
                   ProposedCall("t1.b", "read_file", {"path": "/input/" + PLAIN_ARGUMENT}),
                   ProposedCall("t1.bad", "read_file", {"path": "/etc/passwd"}),
                   ProposedCall("t1.key", "echo", {"text": SECRET_ARGUMENT}))
    assert [o.status for o in obs] == [S.EXECUTED, S.EXECUTED, S.DENIED, S.BLOCKED]
    [pending] = submit(h, run, 2, ProposedCall("t2.refund", "credit", {"account": "acme-9", "amount": 50}))
    assert pending.status is S.PENDING_APPROVAL
    h.orch.decide_approval(APPROVER, pending.approval_id, True, "within my limit", remember=True)
    [goodwill] = submit(h, run, 3, ProposedCall("t3.goodwill", "credit", {"account": "acme-9", "amount": 90}))
    h.orch.decide_approval(APPROVER, goodwill.approval_id, False, "over my limit")
    [again] = submit(h, run, 4, ProposedCall("t4.again", "credit", {"account": "acme-9", "amount": 50}))
    assert again.status is S.DEDUPLICATED
    [note] = submit(h, run, 5, ProposedCall("t5.note", "write_note", {"name": "summary", "text": "done"}))
    assert note.status is S.EXECUTED
    h.orch.finish_run(AGENT, run)
    events = h.events(run)
    h.orch.close()
    h.store.close()
    return tmp_path, run, events


def child(node: TraceNode, name: str, *title: str) -> TraceNode:
    found = [c for c in node.children if c.name == name and tuple(c.title[:len(title)]) == title]
    seen = [(c.name, c.title) for c in node.children]
    assert len(found) == 1, f"{name} {title} under {node.name} {node.title}: {seen}"
    return found[0]


def execs(node: TraceNode) -> dict[str, TraceNode]:
    return {n.attributes["call_id"]: n for n in node.walk() if n.name == "execute_tool"}


# -- the structure --------------------------------------------------------------------------


def test_one_root_and_parallel_reads_share_one_parallel_node(incident):
    _dir, run, events = incident
    root = trace_from_events(events)
    assert root.name == "invoke_agent" and root.title == (f"run {run}",)
    lines = render(root)
    assert [line for line in lines if not line.startswith(("├─", "└─", "│", " "))] == [lines[0]]
    assert [c.name for c in root.children] == ["batch"] * 5
    assert [c.title[:2] for c in root.children] == [(f"{run}.t{i}", f"(turn {i})") for i in range(1, 6)]

    t1 = root.children[0]
    assert t1.title[1] == "(turn 1)" and "4 calls" in t1.labels
    # In time order: the refusals are observed before the admitted reads run.
    assert [c.name for c in t1.children] == ["admission", "read_file", "echo", "parallel"]
    parallel = child(t1, "parallel")
    assert [(n.name, n.title) for n in parallel.children] == [
        ("execute_tool", ("read_file", "t1.a")), ("execute_tool", ("read_file", "t1.b"))]
    a, b = parallel.children
    assert a.start < b.end and b.start < a.end, "the barrier made them run at the same time"
    assert parallel.to_dict()["parallel"] is True
    assert [line.strip("│├└─ ") for line in lines if line.rstrip().endswith(PARALLEL_MARK)] == [
        f"parallel  2 reads  {render_ms(parallel)}  {PARALLEL_MARK}"]
    # No execute_tool anywhere else in that batch: the reads are not loose under it.
    assert [n.attributes["call_id"] for n in t1.walk() if n.name == "execute_tool"] == ["t1.a", "t1.b"]
    assert not any(c.name == "execute_tool" for c in t1.children)
    for node in (a, b):
        [attempt] = node.children
        assert attempt.name == "attempt" and attempt.labels[0] == "ok"
        assert "ok" in node.labels and "1 attempt" in node.labels


def render_ms(node: TraceNode) -> str:
    from ringfence_server.control.tracing.tree import format_duration

    assert node.duration_ms is not None, f"{node} has no duration"
    return format_duration(node.duration_ms)


def test_admission_lists_every_verdict_and_calls_that_never_ran_say_why(incident):
    _dir, _run, events = incident
    root = trace_from_events(events)
    t1 = root.children[0]
    admission = child(t1, "admission")
    assert [(c.name, c.title, c.labels[0]) for c in admission.children] == [
        ("read_file", ("t1.a",), "allow"), ("read_file", ("t1.b",), "allow"),
        ("read_file", ("t1.bad",), "deny"), ("echo", ("t1.key",), "block")]
    assert admission.children[2].labels[1] == "(resource:deny)"
    assert admission.labels == ("2 allow · 1 deny · 1 block",)
    # Admission ends before anything runs.
    assert admission.end <= child(t1, "parallel").start
    denied = child(t1, "read_file", "t1.bad")
    assert denied.labels[0].startswith("denied (resource): path: '/etc/passwd'")
    blocked = child(t1, "echo", "t1.key")
    assert blocked.labels[0].startswith("blocked")
    assert blocked.attributes["status"] == "blocked"


def test_an_approved_ask_waits_between_admission_and_its_execution(incident):
    _dir, _run, events = incident
    root = trace_from_events(events)
    t2 = root.children[1]
    assert [c.name for c in t2.children] == ["admission", "approval wait", "batch"]
    admission, wait, resumed = t2.children
    assert admission.children[0].labels[:2] == ("ask", "(policy:rule[5]:ask)")
    assert wait.title[0].startswith("apr-")
    assert "approved by boss: within my limit" in wait.labels and "remembered for the run" in wait.labels
    assert resumed.title == ("resumed after approval",)
    [execution] = resumed.children
    assert (execution.name, execution.title) == ("execute_tool", ("credit", "t2.refund"))
    assert admission.end <= wait.start <= wait.end <= resumed.start <= execution.start
    assert execution.end <= resumed.end <= t2.end
    assert execution.attributes["mutates"] is True and execution.attributes["dispatched"] == "resumed after approval"
    # In the drawing, the same order: admission, the wait, then the execution.
    lines = render(root)
    at = {key: next(i for i, line in enumerate(lines) if key in line)
          for key in ("ask  (policy:rule[5]:ask)", "approval wait", "resumed after approval",
                      "execute_tool  credit  t2.refund")}
    assert list(at.values()) == sorted(at.values())


def test_a_declined_ask_and_a_deduplicated_repeat_are_leaves_with_why(incident):
    _dir, _run, events = incident
    root = trace_from_events(events)
    t3, t4, t5 = root.children[2:5]
    assert [c.name for c in t3.children] == ["admission", "approval wait", "credit"]
    wait = child(t3, "approval wait")
    assert "declined by boss: over my limit" in wait.labels and wait.attributes["decision"] == "declined"
    assert child(t3, "credit", "t3.goodwill").labels == ("declined by boss: over my limit",)
    assert execs(t3) == {}
    # The repeat was allowed by the remembered grant, and deduplicated: nothing ran.
    assert child(t4, "admission").children[0].labels == ("allow", "(policy:grant:session)")
    assert child(t4, "credit", "t4.again").labels == ("deduplicated: t2.refund's recorded result, nothing ran",)
    assert execs(t4) == {}
    note = execs(t5)["t5.note"]
    assert note.attributes["idempotency_key"] and "ok" in note.labels


def test_the_finished_run_and_its_totals(incident):
    _dir, _run, events = incident
    root = trace_from_events(events)
    assert root.labels[0] == "completed: finished by the agent"
    assert "5 turns" in root.labels and "8 calls (4 ran)" in root.labels
    assert root.end == events[-1].at and root.start == events[0].at
    assert root.attributes["outcome"] == "completed" and root.attributes["executed"] == 4


def test_an_unfinished_run_with_a_pending_approval(tmp_path):
    h = ticking(tmp_path)
    run = h.run(run_id="r-open")
    h.submit(run, ProposedCall("c1", "credit", {"account": "acme-9", "amount": 5}))
    events = h.events(run)
    root = trace_from_events(events)
    assert root.labels[0] == f"not finished (last event seq {events[-1].seq})"
    assert root.end == events[-1].at
    wait = child(root.children[0], "approval wait")
    assert wait.end is None and "no decision yet" in wait.labels
    # No leaf for the waiting call: the wait says it.
    assert [c.name for c in root.children[0].children] == ["admission", "approval wait"]
    h.orch.close()


def test_no_argument_and_no_tool_output_in_the_tree(incident):
    _dir, _run, events = incident
    everything = json.dumps([dict(e.data) for e in events])
    assert PLAIN_ARGUMENT in everything and TOOL_OUTPUT in everything  # the log has them...
    root = trace_from_events(events)
    shown = "\n".join(render(root)) + json.dumps(root.to_dict())
    for secret in (SECRET_ARGUMENT, PLAIN_ARGUMENT, TOOL_OUTPUT, "other file", "acme-9", "summary"):
        assert secret not in shown  # ...the tree does not


# -- the drawing, exactly ---------------------------------------------------------------------


def _small_log(path: Path) -> str:
    """A hand-made log through the real store: two reads (overlapping), a write after them with
    a retry, a denied call; the sandbox's start recorded (setup_ms) for some attempts."""
    times = iter([100.000, 100.010, 100.011, 100.012, 100.013, 100.014, 100.015, 100.020, 100.021,
                  100.300, 100.301, 100.450, 100.451, 100.452, 100.453, 100.460, 100.470, 100.900,
                  100.901, 100.902, 100.910])
    store = SqliteEventStore(path, clock=lambda: next(times))
    run = "r-small"
    add = lambda type_, **data: store.append(run, type_, data)  # noqa: E731 - a one-line helper reads better as a lambda here
    add("run_started", run_id=run, tenant="acme", goal="g", created_at=100.0, trace={})
    add("batch_started", batch_id="b1", turn=1, fingerprint="f", calls=[
        {"call_id": "c1", "tool": "read_file", "arguments": {"path": SECRET_ARGUMENT}},
        {"call_id": "c2", "tool": "echo", "arguments": {"text": "x"}},
        {"call_id": "c3", "tool": "write_note", "arguments": {"name": "n", "text": "t"}},
        {"call_id": "c4", "tool": "read_file", "arguments": {"path": "/etc/passwd"}}])
    for call_id, tool, verdict, verdict_path, reason in (
            ("c1", "read_file", "allow", ["registry:ok", "policy:rule[0]:allow", "admitted"], ""),
            ("c2", "echo", "allow", ["registry:ok", "policy:rule[1]:allow", "admitted"], ""),
            ("c3", "write_note", "allow", ["registry:ok", "policy:rule[2]:allow", "admitted"], ""),
            ("c4", "read_file", "deny", ["registry:ok", "resource:deny"], "path: outside /input")):
        add("call_decided", call_id=call_id, tool=tool, verdict=verdict, verdict_path=verdict_path, reason=reason,
            arguments={}, signature=None)
    add("observation", call_id="c4", tool="read_file", status="denied", executed=False, error="path: outside /input",
        error_class="resource", verdict_path=[])
    add("dispatch_started", call_id="c1", tool="read_file", mutates=False, idempotency_key=None,
        arguments={"path": SECRET_ARGUMENT})
    add("dispatch_started", call_id="c2", tool="echo", mutates=False, idempotency_key=None, arguments={})
    add("attempt", call_id="c1", attempt=1, outcome="ok", failure_class=None, duration_ms=120, setup_ms=150,
        message="", retry_after_s=None)
    add("call_completed", call_id="c1", tool="read_file", ok=True, attempts=1, content={"content": TOOL_OUTPUT},
        error=None, error_class=None)
    add("attempt", call_id="c2", attempt=1, outcome="ok", failure_class=None, duration_ms=200, message="")
    add("call_completed", call_id="c2", tool="echo", ok=True, attempts=1, content="hi", error=None, error_class=None)
    add("observation", call_id="c1", tool="read_file", status="executed", executed=True)
    add("observation", call_id="c2", tool="echo", status="executed", executed=True)
    add("dispatch_started", call_id="c3", tool="write_note", mutates=True, idempotency_key="k" * 64, arguments={})
    add("attempt", call_id="c3", attempt=1, outcome="tool_error", failure_class="transient", duration_ms=5,
        message=SECRET_ARGUMENT, retry_after_s=0.2)
    add("attempt", call_id="c3", attempt=2, outcome="ok", failure_class=None, duration_ms=40, setup_ms=100,
        message="", runtime="runsc", image_id="sha256:" + "7713d373" * 8)
    add("call_completed", call_id="c3", tool="write_note", ok=True, attempts=2, content={"ok": 1}, error=None,
        error_class=None)
    add("observation", call_id="c3", tool="write_note", status="executed", executed=True)
    add("run_finished", outcome="completed", reason="done")
    store.close()
    return run


def test_the_drawing_of_a_small_run_exactly(tmp_path):
    db = tmp_path / "events.sqlite3"
    run = _small_log(db)
    store = SqliteEventStore(db)
    try:
        lines = render(trace_from_events(store.read(run)))
    finally:
        store.close()
    assert lines == [
        "invoke_agent  run r-small  910 ms  completed: done  1 turn  4 calls (3 ran)",
        "└─ batch  b1  (turn 1)  892 ms  4 calls",
        "   ├─ admission  4 ms  3 allow · 1 deny",
        "   │  ├─ read_file  c1  allow  (policy:rule[0]:allow)",
        "   │  ├─ echo  c2  allow  (policy:rule[1]:allow)",
        "   │  ├─ write_note  c3  allow  (policy:rule[2]:allow)",
        "   │  └─ read_file  c4  deny  (resource:deny)",
        "   ├─ read_file  c4  denied (resource): path: outside /input",
        "   ├─ parallel  2 reads  431 ms  ∥",
        "   │  ├─ execute_tool  read_file  c1  281 ms  ok  1 attempt  result 46 B",
        "   │  │  └─ attempt  1  270 ms  ok  start 150 ms · tool 120 ms",
        "   │  └─ execute_tool  echo  c2  430 ms  ok  1 attempt  result 4 B",
        "   │     └─ attempt  1  200 ms  ok",
        "   └─ execute_tool  write_note  c3  441 ms  ok  2 attempts  result 8 B",
        "      ├─ attempt  1  5 ms  tool_error  transient  retry after 0.2 s",
        "      └─ attempt  2  140 ms  ok  start 100 ms · tool 40 ms  runtime runsc  image sha256:7713d3737713",
    ]
    assert SECRET_ARGUMENT not in "\n".join(lines) and TOOL_OUTPUT not in "\n".join(lines)


def test_a_restart_mid_batch_an_interrupted_read_and_a_write_resumed(tmp_path):
    """The log of a control plane that died while a read ran and before the admitted write
    started: recovery observed the read as interrupted and ran the write, after the restart."""
    times = iter([float(t) for t in range(1, 30)])
    store = SqliteEventStore(tmp_path / "events.sqlite3", clock=lambda: next(times))
    add = lambda type_, **data: store.append("r", type_, data)  # noqa: E731 - a one-line helper reads better as a lambda here
    add("run_started", run_id="r", tenant="acme", goal="g", created_at=1.0)
    add("batch_started", batch_id="b1", turn=1, calls=[{"call_id": "c1", "tool": "echo", "arguments": {}},
                                                       {"call_id": "c2", "tool": "write_note", "arguments": {}}])
    add("call_decided", call_id="c1", tool="echo", verdict="allow", verdict_path=["admitted"])
    add("call_decided", call_id="c2", tool="write_note", verdict="allow", verdict_path=["admitted"])
    add("dispatch_started", call_id="c1", tool="echo", mutates=False, verdict_path=["admitted"])
    # -- the restart --
    add("observation", call_id="c1", tool="echo", status="executed", executed=True,
        error="interrupted by a control-plane restart", error_class="interrupted")
    add("dispatch_started", call_id="c2", tool="write_note", mutates=True, idempotency_key="k",
        verdict_path=["admitted", "recovery:resumed"])
    add("attempt", call_id="c2", attempt=1, outcome="tool_error", failure_class="fatal", duration_ms=500)
    add("call_completed", call_id="c2", tool="write_note", ok=False, attempts=1, error_class="fatal")
    add("observation", call_id="c2", tool="write_note", status="executed", executed=True, error_class="fatal")
    events = store.read("r")
    store.close()
    assert render(trace_from_events(events)) == [
        "invoke_agent  run r  9000 ms  not finished (last event seq 10)  1 turn  2 calls (2 ran)",
        "└─ batch  b1  (turn 1)  8000 ms  2 calls",
        "   ├─ admission  2000 ms  2 allow",
        "   │  ├─ echo  c1  allow",
        "   │  └─ write_note  c2  allow",
        "   ├─ execute_tool  echo  c1  no completion in the log  interrupted",
        "   └─ batch  resumed after restart  3000 ms",
        "      └─ execute_tool  write_note  c2  2000 ms  fatal  1 attempt",
        "         └─ attempt  1  500 ms  tool_error  fatal",
    ]


def test_render_marks_only_overlapping_tools_and_keeps_given_order_on_ties():
    def tool(call_id, start, end):
        return TraceNode("execute_tool", start, end, title=("t", call_id))

    apart = TraceNode("parallel", 0.0, 2.0, children=(tool("a", 0.0, 1.0), tool("b", 1.0, 2.0)))
    together = TraceNode("parallel", 0.0, 2.0, children=(tool("b", 0.5, 2.0), tool("a", 0.0, 1.0)))
    instant = TraceNode("note", 3.0, None, labels=("x",))
    root = TraceNode("root", 0.0, 3.0, children=(apart, together, instant))
    assert render(root) == [
        "root  3000 ms",
        "├─ parallel  2000 ms",
        "│  ├─ execute_tool  t  a  1000 ms",
        "│  └─ execute_tool  t  b  1000 ms",
        "├─ parallel  2000 ms  ∥",
        "│  ├─ execute_tool  t  a  1000 ms",
        "│  └─ execute_tool  t  b  1500 ms",
        "└─ note  x",
    ]


# -- the command ------------------------------------------------------------------------------


def ringfence(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "ringfence.cli", *argv], capture_output=True, text=True,
                          encoding="utf-8", env=env, cwd=ROOT, timeout=60)


def test_the_command_prints_the_tree_and_json(incident):
    state_dir, run, events = incident
    done = ringfence("trace", run, "--state-dir", str(state_dir))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == render(trace_from_events(events))
    assert done.stdout.startswith(f"invoke_agent  run {run}  ")
    assert "parallel  2 reads" in done.stdout and PARALLEL_MARK in done.stdout
    for secret in (SECRET_ARGUMENT, PLAIN_ARGUMENT, TOOL_OUTPUT):
        assert secret not in done.stdout + done.stderr

    as_json = ringfence("trace", run, "--state-dir", str(state_dir), "--json")
    assert as_json.returncode == 0, as_json.stderr
    tree = json.loads(as_json.stdout)
    assert tree["name"] == "invoke_agent" and tree["attributes"]["outcome"] == "completed"
    [parallel] = [c for c in tree["children"][0]["children"] if c["name"] == "parallel"]
    assert parallel["parallel"] is True
    assert [c["attributes"]["call_id"] for c in parallel["children"]] == ["t1.a", "t1.b"]
    for secret in (SECRET_ARGUMENT, PLAIN_ARGUMENT, TOOL_OUTPUT):
        assert secret not in as_json.stdout


def test_the_command_on_an_unknown_run_or_a_missing_store(incident, tmp_path):
    state_dir, _run, _events = incident
    unknown = ringfence("trace", "no-such-run", "--state-dir", str(state_dir))
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert "no run 'no-such-run'" in unknown.stderr and "TENANT/RUN_ID" in unknown.stderr
    missing = ringfence("trace", "r-trace", "--state-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 1
    assert "there is no event log at" in missing.stderr and "--state-dir" in missing.stderr
    usage = ringfence("trace")
    assert usage.returncode == 2 and "RUN_ID" in usage.stderr
    both = ringfence("trace", "r-trace", "--state-dir", str(state_dir), "--database-url", "postgresql://x/y")
    assert both.returncode == 2 and "--database-url goes alone" in both.stderr
    helped = ringfence("trace", "--help")
    assert helped.returncode == 0 and "example:" in helped.stdout and "--json" in helped.stdout
