"""Helpers for the control-plane unit tests: a FakeBackend that speaks the runner protocol,
a fake clock, and an Orchestrator on a real SQLite file in tmp_path (with an in-memory
FakeWorkspaces as its workspace store).

`ToolEmulator` answers like the tools of the `tool` image (echo, read_file, fail, sleep,
write_note, credit); a test can replace any tool with its own function. The FakeBackend's
`requests` (and the emulator's `log`) are the witnesses of what reached the sandbox.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringfence.model import ObservationStatus as S
from ringfence.model import Principal, ProposedCall, Role, WorkspaceRequest
from ringfence_server.control.config import load_config
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.registry import Registry
from ringfence_server.control.state import fold
from ringfence_server.control.store.sqlite import SqliteEventStore
from ringfence_server.control.tools import BUILTIN_DIR
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.fake import FakeBackend, FakeWorkspaces, ok_result
from ringfence_server.sandbox.result import Outcome, SandboxResult, ToolErrorClass

AGENT = Principal("acme", Role.AGENT, "agent-1")
APPROVER = Principal("acme", Role.APPROVER, "boss")
ADMIN = Principal("acme", Role.ADMIN, "root-ish")
STRANGER = Principal("globex", Role.AGENT, "intruder")
STRANGER_APPROVER = Principal("globex", Role.APPROVER, "other-boss")


def content_result(content: Any) -> SandboxResult:
    return ok_result((json.dumps({"ok": True, "content": content}) + "\n").encode())


def error_result(cls: str, message: str = "boom", retry_after_s: float | None = None) -> SandboxResult:
    doc = {"ok": False, "error": {"class": cls, "message": message, "retry_after_s": retry_after_s}}
    return SandboxResult(outcome=Outcome.TOOL_ERROR, exit_code=3, stdout=(json.dumps(doc) + "\n").encode(),
                         stderr=b"", stdout_truncated=False, stderr_truncated=False, duration_ms=1,
                         image_id="sha256:fake", runtime="fake", error_class=ToolErrorClass(cls),
                         message=message, retry_after_s=retry_after_s)


def outcome_result(outcome: Outcome) -> SandboxResult:
    return SandboxResult(outcome=outcome, exit_code=137 if outcome is Outcome.OOM else None, stdout=b"",
                         stderr=b"", stdout_truncated=outcome is Outcome.OUTPUT_LIMIT, stderr_truncated=False,
                         duration_ms=1, image_id="sha256:fake", runtime="fake", message=str(outcome))


@dataclass
class Call:
    tool: str
    arguments: dict[str, Any]
    call_id: str
    idempotency_key: str | None
    request: SandboxRequest


class ToolEmulator:
    """handler(request) for FakeBackend: parses the runner request and answers like the tool."""

    def __init__(self) -> None:
        self.log: list[Call] = []
        self._lock = threading.Lock()
        self.overrides: dict[str, Callable[[Call], Any]] = {}

    def __call__(self, request: SandboxRequest) -> SandboxResult:
        assert request.argv == (), "the orchestrator always runs the image's runner"
        doc = json.loads(request.stdin)
        call = Call(doc["tool"], doc["arguments"], doc["call_id"], doc["idempotency_key"], request)
        with self._lock:
            self.log.append(call)
        if call.tool in self.overrides:
            answer = self.overrides[call.tool](call)
            return answer if isinstance(answer, SandboxResult) else content_result(answer)
        return getattr(self, "tool_" + call.tool)(call)

    def tools(self) -> list[str]:
        return [c.tool for c in self.log]

    @staticmethod
    def tool_echo(call: Call) -> SandboxResult:
        return content_result(call.arguments)

    @staticmethod
    def tool_read_file(call: Call) -> SandboxResult:
        return content_result({"path": call.arguments["path"], "content": "file data", "truncated": False})

    @staticmethod
    def tool_fail(call: Call) -> SandboxResult:
        cls = call.arguments["class"]
        if cls == "crash":
            return error_result("fatal", "RuntimeError: crash")
        return error_result(cls, call.arguments.get("message", "requested"), call.arguments.get("retry_after_s"))

    @staticmethod
    def tool_sleep(call: Call) -> SandboxResult:
        return content_result({"slept": call.arguments["seconds"]})

    @staticmethod
    def tool_write_note(call: Call) -> SandboxResult:
        return content_result({"path": f"/tmp/notes/{call.arguments['name']}",
                               "bytes": len(call.arguments["text"]), "idempotency_key": call.idempotency_key})

    @staticmethod
    def tool_credit(call: Call) -> SandboxResult:
        return content_result({"account": call.arguments["account"], "credited": call.arguments["amount"],
                               "idempotency_key": call.idempotency_key})


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


DEMO_RULES = [
    {"tool": "echo", "verdict": "allow"},
    {"tool": "read_file", "verdict": "allow"},
    {"tool": "fail", "verdict": "allow"},
    {"tool": "sleep", "verdict": "allow"},
    {"tool": "write_note", "verdict": "allow"},
    {"tool": "credit", "verdict": "ask", "when": {"amount": {"lte": 100}}},
    {"tool": "credit", "verdict": "deny", "when": {"amount": {"gt": 100}}},
]


@dataclass
class Harness:
    tmp_path: Path
    rules: list[dict] | None = None
    autonomy: str = "autonomous"
    limits: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    egress: dict[str, list[str]] = field(default_factory=dict)
    registry: Registry | None = None
    image_digest: str = "sha256:" + "ab" * 32
    store_url: str | None = None
    """A postgresql:// URL to run on PostgreSQL instead of the SQLite file in tmp_path."""

    def __post_init__(self) -> None:
        self.clock = FakeClock()
        self.emulator = ToolEmulator()
        self.backend = FakeBackend(self.emulator)
        self.workspaces = FakeWorkspaces()
        self.db = self.tmp_path / "events.sqlite3"
        self.store = self.open_store()
        self.config = load_config(overrides={
            "state_dir": str(self.tmp_path),
            "policy": {"autonomy": self.autonomy, "rules": self.rules if self.rules is not None else DEMO_RULES,
                       "egress": self.egress},
            "limits": self.limits, "inputs": self.inputs})
        self.orch = self.new_orchestrator()

    def new_orchestrator(self, **kwargs: Any) -> Orchestrator:
        return Orchestrator.from_config(
            self.config, self.backend, kwargs.pop("store", self.store), clock=self.clock, sleep=self.clock.sleep,
            image_digest=lambda name: self.image_digest,
            registry=self.registry or Registry.from_dir(BUILTIN_DIR),
            workspaces=kwargs.pop("workspaces", self.workspaces), **kwargs)

    def restart(self, **kwargs: Any) -> Orchestrator:
        """A new Orchestrator on a freshly opened store over the same SQLite file."""
        self.orch.close()
        self.store.close()
        self.store = self.open_store()
        self.orch = self.new_orchestrator(**kwargs)
        return self.orch

    def close(self) -> None:
        """The orchestrator, then its store: a PostgreSQL store's listener thread ends here, not
        on a dropped database after the test."""
        self.orch.close()
        self.store.close()

    def open_store(self):
        if self.store_url:
            from ringfence_server.control.store import open_store

            return open_store(self.store_url, clock=self.clock)
        return SqliteEventStore(self.db, clock=self.clock)

    def run(self, goal: str = "test", run_id: str | None = None, workspace: WorkspaceRequest | None = None) -> str:
        return self.orch.start_run(AGENT, goal, run_id, workspace=workspace).run_id

    def submit(self, run_id: str, *calls: tuple[str, dict] | ProposedCall, who: Principal = AGENT):
        proposed = []
        for i, c in enumerate(calls):
            if isinstance(c, ProposedCall):
                proposed.append(c)
            else:
                n = len(self.orch.runs.get(who.tenant, run_id).call_ids) + i + 1
                proposed.append(ProposedCall(f"c{n}", c[0], c[1]))
        return self.orch.submit_batch(who, run_id, proposed)

    def events(self, run_id: str):
        return self.store.read(run_id)

    def event_types(self, run_id: str) -> list[str]:
        return [e.type for e in self.store.read(run_id)]


def replay_equals_live_at_every_prefix(tmp_path, store_url=None):
    """A rich run (every observation status, retries, approvals, a dedup): the state after each
    live append equals the fold of the log up to it (also run on PostgreSQL)."""
    h = Harness(tmp_path, store_url=store_url, rules=[{"tool": "echo", "verdict": "allow"},
                                 {"tool": "fail", "verdict": "allow"},
                                 {"tool": "write_note", "verdict": "allow"},
                                 {"tool": "credit", "verdict": "ask", "when": {"amount": {"lte": 100}}}])
    try:
        _replay_equals_live(h)
    finally:
        h.close()


def _replay_equals_live(h: Harness) -> None:
    live: dict[int, dict] = {}
    run = "replayed"
    h.orch.on_event = lambda state, event: live.__setitem__(event.seq, state.snapshot()) \
        if event.run_id == run else None
    flaky = iter(["transient", "transient", None])

    def sometimes(call):
        cls = next(flaky)
        return error_result(cls) if cls else {"ok": 1}

    h.emulator.overrides["fail"] = sometimes
    h.orch.start_run(AGENT, "replay", run)
    h.submit(run, ("echo", {"text": "a"}), ("read_file", {"path": "../x"}), ("nope", {}),
             ("credit", {"account": "acme-9", "amount": 50}), ("credit", {"account": "acme-9", "amount": 60}),
             ("write_note", {"name": "n", "text": "t"}), ("fail", {"class": "transient"}),
             ("echo", {"text": "AKIAIOSFODNN7EXAMPLE"}), ("credit", {"account": "acme-9", "amount": 70}))
    approvals = h.orch.list_approvals(APPROVER, run)
    h.orch.decide_approval(APPROVER, approvals[0].approval_id, True, "yes")
    h.orch.decide_approval(APPROVER, approvals[1].approval_id, False, "no")
    h.orch.withdraw_approval(AGENT, run, approvals[2].approval_id, "not needed")  # its proposer takes it back
    h.submit(run, ("write_note", {"name": "n", "text": "t"}))  # deduplicated
    h.orch.finish_run(AGENT, run)

    events = h.events(run)
    types = {e.type for e in events}
    assert {"approval_used", "approval_withdrawn", "attempt", "call_completed", "run_finished"} <= types
    statuses = {o.status for o in h.orch.get_run(AGENT, run).trajectory}
    assert {S.EXECUTED, S.DENIED, S.UNKNOWN_TOOL, S.DECLINED, S.BLOCKED, S.DEDUPLICATED} <= statuses
    assert sorted(live) == [e.seq for e in events]
    for k in range(1, len(events) + 1):
        assert fold(events[:k]).snapshot() == live[k], f"prefix {k} ({events[k - 1].type}) differs"
    # And a fresh process folds the same final state.
    h.restart()
    assert h.orch.get_run(AGENT, run) == fold(events).view()

