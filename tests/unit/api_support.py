"""Shared by the tests/unit/test_api_*.py files: tenants, tokens, a config, and a stub core.

The stub stands in for the Orchestrator only where a test is about the edge itself (a method
that raises something unexpected, a call that blocks until released); the API's behaviour with
the real core is tested against the real Orchestrator (test_api_server.py, tests/e2e).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringfence.errors import NotFound
from ringfence.model import (
    Approval,
    ApprovalStatus,
    AuditReport,
    Event,
    EventPage,
    Observation,
    ObservationStatus,
    Role,
    RunPage,
    RunStatus,
    RunView,
    ToolView,
    Usage,
)
from ringfence_server.control.config import load_config, token_digest

if TYPE_CHECKING:
    from ringfence_server.sandbox.result import SandboxResult

TOKENS = {
    ("acme", Role.AGENT): "acme-agent-token",
    ("acme", Role.APPROVER): "acme-approver-token",
    ("acme", Role.ADMIN): "acme-admin-token",
    ("globex", Role.AGENT): "globex-agent-token",
    ("globex", Role.APPROVER): "globex-approver-token",
}


def tenants_table() -> dict[str, Any]:
    table: dict[str, Any] = {}
    for (tenant, role), token in TOKENS.items():
        table.setdefault(tenant, {"tokens": []})["tokens"].append(
            {"sha256": token_digest(token), "role": role.value, "subject": f"{tenant}-{role.value}"}
        )
    return table


def make_config(state_dir: Path, limits: dict[str, Any] | None = None, **overrides: Any):
    raw = {"tenants": tenants_table(), "state_dir": str(state_dir), **overrides}
    if limits:
        raw["limits"] = limits
    return load_config(overrides=raw)


class StubOrchestrator:
    """A minimal in-memory core with hooks: `raise_in[method] = exc` makes that method raise;
    `gate` (when set) makes submit_batch block until released."""

    def __init__(self) -> None:
        self.runs: dict[str, RunView] = {}
        self.raise_in: dict[str, BaseException] = {}
        self.calls: list[tuple[str, Any]] = []
        self.entered = threading.Semaphore(0)
        self.gate: threading.Event | None = None
        self._lock = threading.Lock()

    def _hook(self, name: str, p: Any) -> None:
        with self._lock:
            self.calls.append((name, p))
        if name in self.raise_in:
            raise self.raise_in[name]

    def list_tools(self, p, query: str = ""):
        self._hook("list_tools", p)
        return [ToolView("echo", "Echo.", {"type": "object", "properties": {"text": {"type": "string"}}})]

    def start_run(self, p, goal, run_id=None):
        self._hook("start_run", p)
        run_id = run_id or f"run-{len(self.runs) + 1}"
        run = RunView(run_id, p.tenant, goal, RunStatus.RUNNING, None, 0, (), Usage())
        self.runs.setdefault(run_id, run)
        return self.runs[run_id]

    def get_run(self, p, run_id):
        self._hook("get_run", p)
        run = self.runs.get(run_id)
        if run is None or run.tenant != p.tenant:
            raise NotFound(f"no run {run_id!r}")
        return run

    def list_runs(self, p):
        self._hook("list_runs", p)
        return [r for r in self.runs.values() if r.tenant == p.tenant]

    def list_runs_page(self, p, status, outcome, page_size, page_token):
        # Hooked as "list_runs": the edge's ListRuns, whichever method serves it.
        self._hook("list_runs", p)
        runs = [r for r in self.runs.values() if r.tenant == p.tenant and status in (None, r.status)
                and outcome in (None, r.outcome)]
        return RunPage(tuple(reversed(runs))[:page_size])

    def list_events(self, p, run_id, from_seq, page_size):
        self._hook("list_events", p)
        self.get_run(p, run_id)
        return EventPage((Event(run_id, 1, "run_started", {}, 1, time.time()),)[max(0, from_seq - 1):][:page_size])

    def verify_run(self, p, run_id):
        self._hook("verify_run", p)
        self.get_run(p, run_id)
        return AuditReport(True, events=1, head_hash="0" * 64)

    def finish_run(self, p, run_id):
        return self.get_run(p, run_id)

    def cancel_run(self, p, run_id):
        return self.get_run(p, run_id)

    def submit_batch(self, p, run_id, calls, batch_id=None):
        self._hook("submit_batch", p)
        self.entered.release()
        if self.gate is not None:
            self.gate.wait(timeout=60)
        return [
            Observation(c.call_id, c.tool, ObservationStatus.EXECUTED, True, content=dict(c.arguments))
            for c in calls
        ]

    def validate_plan(self, p, steps, max_steps):
        self._hook("validate_plan", p)

    def execute_plan(self, p, run_id, steps, max_steps):
        self._hook("execute_plan", p)
        for i, step in enumerate(steps, 1):
            yield Event(run_id, i, "step", {"key": step.key}, 1, time.time())

    def watch_run(self, p, run_id, from_seq, stop):
        self._hook("watch_run", p)
        yield Event(run_id, 1, "run_started", {}, 1, time.time())
        stop.wait(timeout=60)

    def list_approvals(self, p, run_id=None):
        self._hook("list_approvals", p)
        return []

    def watch_approvals(self, p, stop):
        self._hook("watch_approvals", p)
        yield self.decide_approval(p, "ap-1", True, "")
        stop.wait(timeout=60)

    def decide_approval(self, p, approval_id, approve, reason, remember=False, digest=None):
        self._hook("decide_approval", p)
        now = time.time()
        status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DECLINED
        return Approval(approval_id, p.tenant, "run-1", "c1", "credit", {}, "d", status, now, now + 60, p.subject,
                        reason)

    def close(self) -> None:
        pass


# --- the real core with an in-memory sandbox ------------------------------------------------


def runner_result(request) -> SandboxResult:
    """What the tool runner in the `tool` image answers, for the FakeBackend: echo returns its
    arguments, any other tool returns what it was asked to do and the idempotency key it saw."""
    import json as _json

    from ringfence_server.sandbox.fake import ok_result

    body = _json.loads(request.stdin or b"{}")
    if body.get("tool") == "fail":  # the runner's structured tool error (exit 3)
        from dataclasses import replace

        from ringfence_server.sandbox.result import Outcome, ToolErrorClass

        klass = ToolErrorClass((body.get("arguments") or {}).get("class", "fatal"))
        return replace(ok_result(exit_code=3), outcome=Outcome.TOOL_ERROR, error_class=klass, message="asked to fail")
    content = {"tool": body.get("tool"), "arguments": body.get("arguments")}
    if body.get("tool") == "echo":
        content = body.get("arguments")
    elif body.get("idempotency_key"):
        content["idempotency_key"] = body["idempotency_key"]
    return ok_result(_json.dumps({"ok": True, "content": content}).encode())


def fake_backend():
    from ringfence_server.sandbox.fake import FakeBackend

    return FakeBackend(runner_result)


class RealCore:
    """The real Orchestrator over a SQLite store in a temporary directory."""

    def __init__(self, config, backend) -> None:
        from ringfence_server.control.orchestration import Orchestrator
        from ringfence_server.control.store import SqliteEventStore

        self.config = config
        self.backend = backend
        self.store = SqliteEventStore(config.db_path)
        self.orchestrator = Orchestrator.from_config(config, backend, self.store)

    def close(self) -> None:
        self.orchestrator.close()
        self.store.close()

    def __enter__(self) -> RealCore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
