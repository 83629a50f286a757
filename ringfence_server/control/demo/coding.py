"""`ringfence demo coding`: an agent writes a module and its test, runs the tests (their output
live), fixes the module, runs them again, and takes the passing module out of the workspace.

The agent is the SDK's AgentLoop with a scripted model (the same turns every time, so the ending
is checkable); everything else is real: the control plane of `ringfence demo plan` (a gRPC
server on a loopback port, the embedded defaults, a temporary state directory), a fresh
hardened container per call, and the run's workspace (a capped tmpfs volume, mounted at
/workspace in each call of a tool that declares it, removed when the run ends).

    start_run(workspace=True)                   the workspace is made (workspace_created)
    turn 1  workspace_write calc.py             one batch; both declare the workspace `write`,
            workspace_write test_calc.py        so they run one after the other
    turn 2  run_tests                           fails: its lines stream as call_output events,
                                                printed here as WatchRun delivers them
    turn 3  workspace_write calc.py             the fix, read off the failure in turn 2's result
    turn 4  run_tests                           passes; reports/tests.txt is collected into the
                                                run's artifacts (artifact_collected, its sha256)
    turn 5  download_files calc.py              before the answer (the client, not a tool): from
            download_files reports/tests.txt    the live workspace, and from the artifacts
            the final answer                    finish_run: the workspace is removed

Every claim of the closing lines is checked against the run's own events (the sha256 of the
download against the write that made it and the files_downloaded event; the report against its
artifact_collected event; the live lines against the call's call_completed), and the demo exits
non-zero when any step did not happen as scripted.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from ringfence import Client
from ringfence.agent import AgentContext, AgentLoop, AgentResult, ModelTurn, ScriptedModel, ToolCall
from ringfence.model import Event, ObservationStatus, RunStatus
from ringfence.turns import TurnRecord

AGENT_TOKEN = "demo-agent-token"
GOAL = ("Write calc.py with add() and mul(), and its unittest; run the tests, fix what fails, and hand "
        "over the passing module.")
MODULE, TESTS_FILE, REPORT = "calc.py", "test_calc.py", "reports/tests.txt"
WATCH_TIMEOUT_S = 300.0
"""How long the demo follows the run's events at most (the whole run takes seconds)."""

BUGGY = '''\
"""calc: small arithmetic helpers."""


def add(a, b):
    """The sum of a and b."""
    return a - b


def mul(a, b):
    """The product of a and b."""
    return a * b
'''
FIXED = BUGGY.replace("return a - b", "return a + b")
TESTS = '''\
import unittest

from calc import add, mul


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_add_negative(self):
        self.assertEqual(add(-2, 2), 0)

    def test_mul(self):
        self.assertEqual(mul(4, 5), 20)
'''


class LiveEvents:
    """The run's events as WatchRun delivers them, followed on a thread of its own from seq 1
    while the agent works: each call_output line is printed as it arrives (the agent's thread
    is then inside submit_batch, waiting for the call). It stops once the run has finished and
    its workspace is removed."""

    def __init__(self, client: Client, run_id: str, out: TextIO) -> None:
        self.client = client
        self.run_id = run_id
        self.out = out
        self.events: list[Event] = []
        self.error: BaseException | None = None
        self.ended = False
        self._cond = threading.Condition()
        self._stream = client.watch_run(run_id, 0, timeout=WATCH_TIMEOUT_S)
        self._thread = threading.Thread(target=self._follow, name="coding-demo-watch", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        finished = removed = False
        try:
            for event in self._stream:
                if event.type == "call_output" and event.data.get("stream") == "stderr":
                    # stderr is the tool's progress (stdout events would be a tool's own prints;
                    # the runner's result line never is output: it is the call's observation).
                    for line in str(event.data.get("text", "")).splitlines():
                        print(f"      │ {line}", file=self.out, flush=True)
                with self._cond:
                    self.events.append(event)
                    self._cond.notify_all()
                finished = finished or event.type == "run_finished"
                removed = removed or event.type == "workspace_removed"
                if finished and removed:
                    break
        except Exception as e:  # noqa: BLE001 - a broken stream (or its deadline): reported by the demo's checks
            self.error = e
        finally:
            self._stream.cancel()
            with self._cond:
                self.ended = True
                self._cond.notify_all()

    def wait_for(self, done: Callable[[list[Event]], bool], timeout: float = 60.0) -> bool:
        """Wait until `done(events so far)` holds or the stream ended; whether it holds."""
        with self._cond:
            self._cond.wait_for(lambda: self.ended or done(self.events), timeout)
            return done(self.events)

    def close(self, timeout: float = 60.0) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._stream.cancel()
            self._thread.join(timeout)

    def of(self, kind: str, call_id: str | None = None) -> list[Event]:
        with self._cond:
            return [e for e in self.events if e.type == kind and (call_id is None or e.data.get("call_id") == call_id)]

    def live_lines(self, call_id: str) -> tuple[int, bool]:
        """(lines of the call's stderr call_output events, whether every one came before its
        call_completed): the output was streamed while the call ran, not after."""
        with self._cond:
            completed = [e.seq for e in self.events if e.type == "call_completed" and e.data.get("call_id") == call_id]
            outputs = [e for e in self.events if e.type == "call_output" and e.data.get("call_id") == call_id
                       and e.data.get("stream") == "stderr"]
        lines = sum(len(str(e.data.get("text", "")).splitlines()) for e in outputs)
        return lines, bool(outputs) and bool(completed) and all(e.seq < completed[0] for e in outputs)


class Delivery:
    """What the demo took out of the run before its final answer: the module from the live
    workspace, the test report from the run's artifacts."""

    def __init__(self, client: Client, run_id: str, out: TextIO) -> None:
        self.client = client
        self.run_id = run_id
        self.out = out
        self.module: bytes | None = None
        self.report: bytes | None = None

    def __call__(self, context: AgentContext) -> ModelTurn:
        """The script's last turn: between turn 4 and the answer (which finishes the run, and its
        workspace goes with it), the demo downloads; then the model answers."""
        # Each file arrives checked against the size and sha256 the server sent with it.
        self.module = self.client.download_files(self.run_id, [MODULE]).get(MODULE)
        self.report = self.client.download_files(self.run_id, [REPORT], artifacts=True).get(REPORT)
        print("   the demo downloads first (the answer finishes the run, and the workspace goes with it)",
              file=self.out)
        for path, what, data in ((MODULE, "workspace", self.module), (REPORT, "artifacts", self.report)):
            got = f"{len(data)} bytes, sha256 {sha256(data)[:12]}" if data is not None else "NOT delivered"
            print(f"   <- {path:<17} from the {what}: {got}", file=self.out)
        self.out.flush()
        last = context.results()[-1]
        passed = isinstance(last.get("content"), Mapping) and last["content"].get("passed") is True
        return ModelTurn.answer("calc.py passes its tests; the module and the report are downloaded." if passed
                                else "the tests still fail.")


class Narrated:
    """The scripted model, saying what it proposes each turn before the batch is sent."""

    def __init__(self, model: ScriptedModel, out: TextIO) -> None:
        self.model = model
        self.out = out

    def next_turn(self, context: AgentContext) -> ModelTurn:
        print(f"turn {context.turn}", file=self.out, flush=True)
        turn = self.model.next_turn(context)
        if turn.final_answer is not None:
            print(f"   final answer: {turn.final_answer}", file=self.out)
        for call in turn.tool_calls:
            args = dict(call.arguments)
            what = args.get("path", args.get("pattern", ""))
            size = f" ({len(str(args['content']).encode())} bytes)" if "content" in args else ""
            print(f"   proposes {call.name} {what}{size}".rstrip(), file=self.out)
        self.out.flush()
        return turn


def coding_model(deliver: Callable[[AgentContext], ModelTurn], out: TextIO) -> ScriptedModel:
    def fix(context: AgentContext) -> ModelTurn:
        """Turn 3: turn 2's result names the failing assertions; add subtracts: write it again."""
        result = context.results()[-1].get("content") or {}
        failed = [line.strip() for line in result.get("tail", ()) if line.startswith("AssertionError")]
        print(f"   reads turn 2's result: {'; '.join(failed) or 'no assertion failed'} -> add subtracts",
              file=out)
        return ModelTurn.calls(ToolCall("workspace_write", {"path": MODULE, "content": FIXED}, "fix"))

    return ScriptedModel([
        ModelTurn.calls(ToolCall("workspace_write", {"path": MODULE, "content": BUGGY}, "module"),
                        ToolCall("workspace_write", {"path": TESTS_FILE, "content": TESTS}, "tests")),
        ModelTurn.calls(ToolCall("run_tests", {}, "run")),
        fix,
        ModelTurn.calls(ToolCall("run_tests", {}, "rerun")),
        deliver,
    ])


def _show_turn(record: TurnRecord, live: LiveEvents, out: TextIO) -> None:
    # The live lines of the turn's calls come before their observations in the log: wait for
    # those, so the turn's printout follows its lines.
    ids = {o.call_id for o in record.observations}
    live.wait_for(lambda events: ids <= {e.data.get("call_id") for e in events if e.type == "observation"})
    for o in record.observations:
        content = o.content if isinstance(o.content, Mapping) else {}
        if o.status is not ObservationStatus.EXECUTED:
            detail = o.error or ""
        elif o.tool == "workspace_write":
            detail = f"{content.get('path')}: {content.get('bytes')} bytes, sha256 {str(content.get('sha256'))[:12]}"
        elif o.tool == "run_tests":
            lines, before = live.live_lines(o.call_id)
            detail = (f"passed={str(content.get('passed')).lower()} ran={content.get('ran')} "
                      f"failures={content.get('failures')} errors={content.get('errors')}; {lines} line(s) "
                      f"streamed {'before it completed' if before else 'NOT before it completed'}")
        else:
            detail = json.dumps(content, sort_keys=True)[:80]
        print(f"   -> {o.call_id:<10} {o.tool:<16} {o.status.value:<9} {detail}", file=out)
    out.flush()


def _content(result: AgentResult, call_id: str) -> Mapping[str, Any]:
    found = [o.content for o in result.trajectory if o.call_id == call_id]
    return found[0] if found and isinstance(found[0], Mapping) else {}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files(event: Event) -> dict[str, Mapping[str, Any]]:
    return {str(f["path"]): f for f in event.data.get("files", ())}


def check(result: AgentResult, live: LiveEvents, delivery: Delivery, workspace_removed: bool) -> list[str]:
    """Every way the run can differ from the script, in words (empty: as scripted)."""
    problems = []
    if result.outcome.value != "completed" or result.turns != 5:
        problems.append(f"the run ended {result.outcome.value} after {result.turns} turns: {result.reason}")
    statuses = {o.call_id: o.status.value for o in result.trajectory}
    if statuses != dict.fromkeys(("t1.module", "t1.tests", "t2.run", "t3.fix", "t4.rerun"), "executed"):
        problems.append(f"the calls ended {statuses}")
    first, second = _content(result, "t2.run"), _content(result, "t4.rerun")
    if first.get("passed") is not False or not first.get("failures"):
        problems.append(f"turn 2's tests did not fail: {dict(first)}")
    if second.get("passed") is not True:
        problems.append(f"turn 4's tests did not pass: {dict(second)}")
    for call_id in ("t2.run", "t4.rerun"):
        lines, before = live.live_lines(call_id)
        if not lines or not before:
            problems.append(f"{call_id}'s output was not streamed before it completed ({lines} line(s))")
    # The module: the bytes turn 3 wrote, by the download's own hash, the write's and the log's.
    module, wrote = delivery.module, _content(result, "t3.fix")
    expected = sha256(FIXED.encode())
    downloads = [_files(e).get(MODULE) for e in live.of("files_downloaded") if not e.data.get("artifacts")]
    if module != FIXED.encode():
        problems.append("the downloaded calc.py is not what turn 3 wrote")
    elif wrote.get("sha256") != expected:
        problems.append(f"calc.py's sha256 differs: download {expected}, turn 3's write {wrote.get('sha256')}")
    elif [d["sha256"] if d else None for d in downloads] != [expected]:
        problems.append(f"the files_downloaded events say {downloads}")
    # The report: the artifact of the passing run, as its artifact_collected event says.
    report = delivery.report
    collected = [_files(e).get(REPORT) for e in live.of("artifact_collected")]
    if report is None or not collected or collected[-1] is None:
        problems.append(f"no report artifact (artifact_collected: {collected})")
    elif sha256(report) != collected[-1]["sha256"]:
        problems.append(f"the report's sha256 {sha256(report)} is not its artifact_collected {collected[-1]}")
    elif not report.decode("utf-8", "replace").rstrip().endswith("OK"):
        problems.append("the report artifact is not the passing run's")
    created, removed = live.of("workspace_created"), live.of("workspace_removed")
    if len(created) != 1 or len(removed) != 1 or created[0].data.get("volume") != removed[0].data.get("volume"):
        problems.append(f"workspace events: created {len(created)}, removed {len(removed)}")
    if not workspace_removed:
        problems.append("the run's view does not say its workspace is removed")
    if live.error is not None:
        problems.append(f"watching the run failed: {live.error!r}")
    return problems


def run(workdir: Path | None = None, out: TextIO = sys.stdout) -> int:
    from ringfence_server.control.demo.features import _server

    with _server(workdir) as address, Client(address, AGENT_TOKEN) as agent:
        print("ringfence coding demo: an agent writes a module and its test, runs them (output live), "
              "fixes, runs again\n", file=out)
        run_id = f"coding-{uuid.uuid4().hex[:12]}"
        # The run is started here, with its workspace; the loop then takes it up by its id
        # (start_run is idempotent on the id).
        view = agent.start_run(GOAL, run_id, workspace=True)
        assert view.workspace is not None, "the run was started without a workspace"
        print(f"control plane   {address}", file=out)
        print(f"run             {run_id}, workspace of {view.workspace.bytes // 2**20} MiB and "
              f"{view.workspace.inodes} files at /workspace (noexec; removed when the run ends)\n",
              file=out, flush=True)
        live = LiveEvents(agent, run_id, out)
        delivery = Delivery(agent, run_id, out)
        try:
            loop = AgentLoop(agent, Narrated(coding_model(delivery, out), out), goal=GOAL, run_id=run_id, max_turns=8,
                             max_cost=1.0, cost_per_input_token=3e-6, cost_per_output_token=1.5e-5,
                             on_turn=lambda record: _show_turn(record, live, out))
            result = loop.run()
        finally:
            if agent.get_run(run_id).status is not RunStatus.FINISHED:
                agent.cancel_run(run_id)  # a failed step: the workspace goes with the run all the same
            live.wait_for(lambda events: {"run_finished", "workspace_removed"} <= {e.type for e in events})
            live.close()
        final = agent.get_run(run_id)
        workspace_removed = final.workspace is not None and final.workspace.removed
        problems = check(result, live, delivery, workspace_removed)
    if workdir is not None and delivery.module is not None and delivery.report is not None:
        # Kept for a look (and for tests/e2e/test_coding_demo.py).
        (Path(workdir) / MODULE).write_bytes(delivery.module)
        (Path(workdir) / "tests.txt").write_bytes(delivery.report)
    print(file=out)
    _summary(result, live, delivery, out)
    for p in problems:
        print(f"UNEXPECTED: {p}", file=sys.stderr)
    if problems or delivery.module is None:
        print(f"coding: did not go as scripted ({len(problems)} problem(s))", file=out, flush=True)
        return 1
    print(f"coding: tests failed then passed; downloaded {MODULE} (sha256 {sha256(delivery.module)[:12]})",
          file=out, flush=True)
    return 0


def _summary(result: AgentResult, live: LiveEvents, delivery: Delivery, out: TextIO) -> None:
    created, removed = live.of("workspace_created"), live.of("workspace_removed")
    print(f"{'run':<12}{result.run_id}: {result.outcome.value} after {result.turns} turns", file=out)
    if created:
        data = created[0].data
        gone = f"removed ({removed[0].data.get('reason')})" if removed else "NOT removed"
        print(f"{'workspace':<12}{data.get('volume')}: {int(data.get('bytes', 0)) // 2**20} MiB, "
              f"{data.get('inodes')} files; {gone}", file=out)
    for turn, call_id in ((2, "t2.run"), (4, "t4.rerun")):
        c = _content(result, call_id)
        lines, _ = live.live_lines(call_id)
        verdict = "passed" if c.get("passed") else f"{c.get('failures')} failed, {c.get('errors')} error(s)"
        print(f"{'tests':<12}turn {turn}: {c.get('ran')} ran, {verdict}; {lines} line(s) live", file=out)
    if delivery.module is not None:
        print(f"{MODULE:<12}{len(delivery.module)} bytes, sha256 {sha256(delivery.module)[:12]}: turn 3's write, "
              "as the download and its files_downloaded event say", file=out)
    if delivery.report is not None:
        print(f"{'report':<12}{REPORT} (an artifact), sha256 {sha256(delivery.report)[:12]}, as its "
              "artifact_collected event says", file=out)
    kinds: dict[str, int] = {}
    for e in live.events:
        kinds[e.type] = kinds.get(e.type, 0) + 1
    print(f"{'events':<12}{len(live.events)} in the run's log ({kinds.get('call_output', 0)} call_output, "
          f"{kinds.get('artifact_collected', 0)} artifact_collected)", file=out)
