"""The orchestrator: the public API the servicer calls, over the orchestration modules.

    admission.py   steps 1-6, a pure function from a batch to typed verdicts
    batches.py     one turn: admit all, log all, then dispatch the admitted subset; a
                   tenant's concurrent batches; a plan's checks
    execution.py   the admitted calls handed to dispatch, the run ended when that fails
    approvals.py   the approval lifecycle (request, decide, expire, resume)
    dispatch.py    steps 8-11: runs each admitted call in its sandbox
    stops.py       cancel and the run deadline: kills a run's running sandboxes
    streams.py     live event and approval streams
    recovery.py    a restart's consistent point
    runs.py        the run repository: the one writer of run logs
    workspaces.py  a run's workspace: made at its start, removed at its end, reaped when orphaned
    spans.py       the run's trace: its root span, and each piece's spans under it
    live_output.py a call's output as events while it runs

This module is wiring: it builds those pieces (each given exactly the collaborators it names)
and routes each public method to them. What it does itself: what every method shares (check the
caller's role, find the run in the caller's tenant, hold the run for writing, which first
recovers a run a crash interrupted), the checks of an RPC's own arguments, and the two events
only the API writes (run_started, grant_added).

Methods are synchronous; the gRPC edge calls them from worker threads. Every method takes the
caller's Principal and scopes everything to its tenant: another tenant's run or approval is
NotFound, so ids do not leak.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from ringfence.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from ringfence.model import (
    Approval,
    AuditReport,
    Event,
    EventPage,
    Observation,
    PlanStep,
    Principal,
    ProposedCall,
    Role,
    RunOutcome,
    RunPage,
    RunStatus,
    RunView,
    ToolView,
    WorkspaceRequest,
)
from ringfence_server.control.config import Config
from ringfence_server.control.events import GrantAdded, RunStarted
from ringfence_server.control.files import DownloadedFile, FileDesk, FileInfo
from ringfence_server.control.orchestration import spans, streams
from ringfence_server.control.orchestration.admission import AdmissionRules
from ringfence_server.control.orchestration.approvals import ApprovalDesk, locked_image_ids
from ringfence_server.control.orchestration.batches import BatchRunner, TenantBatchSlots
from ringfence_server.control.orchestration.dispatch import Dispatcher
from ringfence_server.control.orchestration.execution import Execution
from ringfence_server.control.orchestration.recovery import needs_recovery, recover_run
from ringfence_server.control.orchestration.run_pages import RunPages
from ringfence_server.control.orchestration.runs import RUN_ID, BusyElsewhere, RunRepository
from ringfence_server.control.orchestration.stops import RunStops
from ringfence_server.control.orchestration.workspaces import RunWorkspaces
from ringfence_server.control.plans.service import PlanVerification
from ringfence_server.control.policy import PolicyEngine
from ringfence_server.control.registry import Registry, ToolManifest
from ringfence_server.control.routing.service import TicketRouter
from ringfence_server.control.state import RunState, sandbox_run_id
from ringfence_server.control.store import audit
from ringfence_server.control.store.base import EventStore
from ringfence_server.control.toolpkg.packages import registry_from_config
from ringfence_server.control.validation import signature, validate_arguments
from ringfence_server.sandbox.backend import SandboxBackend
from ringfence_server.sandbox.errors import EngineError
from ringfence_server.sandbox.workspace import WorkspaceStore

log = logging.getLogger(__name__)

_READ_ROLES = (Role.AGENT, Role.APPROVER, Role.VERIFIER, Role.ADMIN)
_CANCEL_ROLES = (Role.AGENT, Role.APPROVER, Role.ADMIN)  # a verifier judges; it never acts on a run
_AGENT_ROLES = (Role.AGENT, Role.ADMIN)
_DOWNLOAD_ROLES = (Role.AGENT, Role.APPROVER, Role.ADMIN)  # an approver: the artifacts only
_APPROVER_ROLES = (Role.APPROVER, Role.ADMIN)


def hinted_view(manifest: ToolManifest) -> ToolView:
    """What a caller sees of a tool: its view, with the only two hints of its risk metadata
    that cross (an MCP front door annotates with them): read-only when it does not mutate,
    destructive when it mutates and cannot be undone."""
    return replace(manifest.view(), read_only_hint=not manifest.mutates,
                   destructive_hint=manifest.mutates and manifest.irreversible)


class Orchestrator:
    def __init__(
        self,
        *,
        config: Config,
        registry: Registry,
        backend: SandboxBackend,
        store: EventStore,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        image_digest: Callable[[str], str] | None = None,
        recover: bool = True,
        workspaces: WorkspaceStore | None = None,
    ) -> None:
        image_digest = image_digest or locked_image_ids(config.images_dir)
        self._image_digest = image_digest  # a tool's risk, as approvers see it, names its pinned image
        self.config = config
        self.limits = config.limits
        self.registry = registry
        self.backend = backend
        self.store = store
        self.policy = PolicyEngine(config.policy)
        self._clock = clock
        self._tenant_slots = TenantBatchSlots(self.limits.max_concurrent_batches)
        # Set by close(): the adopter stops, and the live streams end.
        self._stopping = threading.Event()
        self.runs = RunRepository(store, lease_ttl_s=self.limits.lease_ttl_s)
        # Runs' workspaces (None: this server keeps none, and refuses a StartRun that asks for
        # one); whatever ends a run removes its workspace just before run_finished.
        self.workspace_store = workspaces
        self.run_workspaces = RunWorkspaces(repo=self.runs, store=workspaces, config=config.workspace)
        self.runs.before_finish = self._before_finish
        # Files in and out of workspaces, and the outputs tools declare (ringfence_server.control.files).
        self.files = FileDesk(repo=self.runs, backend=backend, config=config)
        # Cancel and the run deadline: nothing more is dispatched, and what runs is killed.
        self.stops = RunStops(backend, clock)
        self.dispatcher = Dispatcher(repo=self.runs, backend=backend, config=config, sleep=sleep,
                                     rng=rng or random.Random(), clock=clock, stops=self.stops, files=self.files)
        # Built on dispatch, shared by a new batch, an approved call and recovery: the desk and
        # the batch runner both stand on it, and neither on the other.
        self.execution = Execution(repo=self.runs, dispatcher=self.dispatcher, stops=self.stops, limits=self.limits,
                                   clock=clock)
        self.desk = ApprovalDesk(repo=self.runs, dispatcher=self.dispatcher, registry=registry, policy=self.policy,
                                 limits=self.limits, clock=clock,
                                 image_digest=image_digest, execution=self.execution)
        self.run_pages = RunPages(repo=self.runs, desk=self.desk)
        self.batches = BatchRunner(repo=self.runs, desk=self.desk, execution=self.execution, limits=self.limits,
                                   admission=AdmissionRules(registry=registry, config=config, policy=self.policy))
        # Two features over runs and the store, with boundaries of their own (ringfence_server.control.plans,
        # ringfence_server.control.routing); the edge calls them as `core.plans` and `core.routing`.
        self.plans = PlanVerification(self, store, clock)
        self.routing = TicketRouter(self, store, config.routing)
        self.runs.load_unfinished()
        if recover:
            self.recover()
            # After recovery (which may end runs): workspaces of ended or unknown runs go.
            try:
                self.reap_workspaces()
            except EngineError as e:
                log.warning("reaping workspaces at start-up: %s (the next sweep retries)", e)

    def _before_finish(self, state: RunState, outcome: RunOutcome) -> None:
        """Whatever ends a run releases what it held, just before run_finished: its MCP
        servers' session sandboxes first (they may mount the workspace), then its workspace."""
        try:
            self.backend.end_run(sandbox_run_id(state))
        except EngineError as e:
            log.warning("ending the MCP sessions of run %s: %s (the reaper removes them)", state.run_id, e)
        self.run_workspaces.remove(state, outcome)

    @classmethod
    def from_config(cls, config: Config, backend: SandboxBackend, store: EventStore,
                    clock: Callable[[], float] = time.time, *, registry: Registry | None = None,
                    sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None,
                    image_digest: Callable[[str], str] | None = None, recover: bool = True,
                    workspaces: WorkspaceStore | None = None) -> Orchestrator:
        """The orchestrator for a config. `registry` None: the built-in tools and the config's tool
        packages (`[tools] packages`), each within the config's caps; a name defined twice is a
        ConfigError naming both. The other arguments are the constructor's."""
        return cls(config=config, registry=registry or registry_from_config(config), backend=backend, store=store,
                   clock=clock, sleep=sleep, rng=rng, image_digest=image_digest, recover=recover,
                   workspaces=workspaces)

    @property
    def on_event(self) -> Callable[[RunState, Event], None] | None:
        return self.runs.on_event

    @on_event.setter
    def on_event(self, callback: Callable[[RunState, Event], None] | None) -> None:
        self.runs.on_event = callback

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    def _require(p: Principal, roles: Sequence[Role]) -> None:
        if p.role not in roles:
            raise PermissionDenied(f"role {p.role} may not do this")

    # ------------------------------------------------------------------ runs

    def list_tools(self, p: Principal, query: str = "") -> list[ToolView]:
        """The registry's tools (narrowed by `query`), each with the two hints derived from its
        manifest (`hinted_view`). Its risk metadata goes only to those who judge calls
        (approvers, admins): an agent that saw it could shape its calls to slip under policy."""
        self._require(p, _READ_ROLES)
        manifests = [self.registry.get(view.name) for view in self.registry.list(query)]
        views = [(m, hinted_view(m)) for m in manifests if m is not None]
        if p.role not in _APPROVER_ROLES:
            return [view for _, view in views]
        return [replace(view, risk=m.risk(self._image_digest(m.image))) for m, view in views]

    def _with_risk(self, approval: Approval) -> Approval:
        """An approval as an approver is shown it: with its tool's risk as the registry knows it
        now (None for a tool no longer registered)."""
        manifest = self.registry.get(approval.tool)
        if manifest is None:
            return approval
        return replace(approval, tool_risk=manifest.risk(self._image_digest(manifest.image)))

    def start_run(self, p: Principal, goal: str, run_id: str | None = None, *,
                  workspace: WorkspaceRequest | None = None) -> RunView:
        """Start a run (or return the existing one with that id: StartRun is idempotent).

        `workspace`: the run gets a workspace with these caps (0 = the server's default; past
        its maximum InvalidArgument naming workspace.bytes / workspace.inodes; a server without
        a workspace store refuses with FailedPrecondition), made before this returns
        (`workspace_created`). The engine failing to make it is Unavailable: the run exists,
        and sending the same StartRun again makes its workspace. An existing run keeps the
        workspace it has (a different ask is not applied)."""
        self._require(p, _AGENT_ROLES)
        if not isinstance(goal, str) or len(goal.encode()) > self.limits.max_argument_bytes:
            raise InvalidArgument("goal is too long", [FieldViolation("goal", "at most max_argument_bytes")])
        run_id = run_id or "run-" + uuid.uuid4().hex[:20]
        if not RUN_ID.fullmatch(run_id):
            raise InvalidArgument("bad run id", [FieldViolation("run_id", "1-100 characters of [A-Za-z0-9_.:-]")])
        spec = self.run_workspaces.spec_for(workspace) if workspace is not None else None
        if spec is not None:
            self.run_workspaces.require_store()
        # No local lock around the store: the store decides which start creates the run (one
        # insert-if-absent), and a lock held across its calls made every StartRun of one id
        # wait out the one before it while the store was unreachable.
        try:
            existing = self.runs.get(p.tenant, run_id)
        except NotFound:
            pass  # a new run
        else:
            return self._existing_run(existing)
        now = self._clock()
        trace_ids = spans.start_run_trace(run_id, p.tenant)
        # The ask is recorded first: a StartRun sent again finds it and makes a workspace
        # the engine (or a crash) did not. The workspace itself is made after run_started,
        # so a reaper never finds it without its run.
        state = self.runs.start(p.tenant, run_id, RunStarted(
            run_id=run_id, tenant=p.tenant, goal=goal, created_at=now,
            deadline_at=now + self.limits.run_deadline_s, policy_version=self.policy.version,
            trace=trace_ids, by=p.subject,
            workspace=None if spec is None else {"bytes": spec.bytes, "inodes": spec.inodes}))
        if state is None:
            # This tenant started the same run a moment ago (another thread or instance):
            # that run, with its goal, is the answer.
            state = self.runs.get(p.tenant, run_id)
        # Winner or not, the workspace is made by whoever holds the run first and finds it
        # missing: never twice, even when another instance answers the same StartRun.
        return self._existing_run(state)

    def _existing_run(self, state: RunState) -> RunView:
        """StartRun's answer for a run that exists (just started, or found): as it is, with the
        workspace it asked for at its start made now if it never was (and this server can)."""
        if self.workspace_store is not None and self.run_workspaces.missing(state) is not None:
            with self._write(state):
                self.run_workspaces.make_missing(state)
        return self.runs.view(state)

    def get_run(self, p: Principal, run_id: str) -> RunView:
        self._require(p, _READ_ROLES)
        state = self.runs.get(p.tenant, run_id)
        self.desk.try_sweep(state)
        return self.runs.view(state)

    def list_runs(self, p: Principal) -> list[RunView]:
        self._require(p, _READ_ROLES)
        for state in self.runs.unfinished(p.tenant):
            self.desk.try_sweep(state)
        return self.runs.views(p.tenant)

    def list_runs_page(self, p: Principal, status: RunStatus | None, outcome: RunOutcome | None, page_size: int,
                       page_token: str) -> RunPage:
        """A page of the tenant's runs, newest first (run_pages.RunPages); `page_token` from the
        previous page with the same filters, else InvalidArgument naming it."""
        self._require(p, _READ_ROLES)
        return self.run_pages.page(p.tenant, status, outcome, page_size, page_token)

    def list_events(self, p: Principal, run_id: str, from_seq: int, page_size: int) -> EventPage:
        """At most `page_size` events of the tenant's run from `from_seq`; `next_seq` where the
        next page starts, 0 when this one reached the log's current end."""
        self._require(p, _READ_ROLES)
        state = self.runs.get(p.tenant, run_id)
        # One more than asked: whether it exists says whether the log goes on past the page.
        events = self.store.read(state.key, max(1, from_seq), limit=page_size + 1)
        if len(events) > page_size:
            return EventPage(tuple(events[:page_size]), events[page_size].seq)
        return EventPage(tuple(events), 0)

    def verify_run(self, p: Principal, run_id: str) -> AuditReport:
        """The tenant's run's stored hash chain, checked as `ringfence runs verify` does
        (store/audit.py), with the head hash a caller may record to detect a cut-off tail."""
        self._require(p, _READ_ROLES)
        state = self.runs.get(p.tenant, run_id)
        events = self.store.read(state.key)
        report = audit.verify(events)
        return AuditReport(ok=report.ok, first_bad_seq=report.first_bad_seq or 0, problem=report.problem,
                           events=report.events, head_hash=events[-1].hash if events else "")

    def finish_run(self, p: Principal, run_id: str) -> RunView:
        self._require(p, _AGENT_ROLES)
        state = self.runs.get(p.tenant, run_id)
        with self._write(state):
            if not state.finished:
                self.runs.finish(state, RunOutcome.COMPLETED, "finished by the agent")
            return self.runs.view(state)

    def cancel_run(self, p: Principal, run_id: str) -> RunView:
        """The kill switch: no call of the run is dispatched after this, and the sandboxes it
        has running are killed at once (their calls end `killed`, with this reason)."""
        self._require(p, _CANCEL_ROLES)
        state = self.runs.get(p.tenant, run_id)
        if not state.finished:
            self.stops.stop(state, RunOutcome.CANCELLED, f"cancelled by {p.subject}")
        with self._write(state):
            if not state.finished:
                self.runs.finish(state, RunOutcome.CANCELLED, f"cancelled by {p.subject}")
            return self.runs.view(state)

    # ------------------------------------------------------------------ files

    def upload_files(self, p: Principal, run_id: str, dest: str, tar_bytes: bytes) -> tuple[list[FileInfo], int]:
        """Copy an uncompressed tar's files into the run's workspace under `dest` (ringfence_server.control.files);
        returns them and the seq of `files_uploaded`. FailedPrecondition when the run has no
        workspace, or it is gone (the run ended)."""
        self._require(p, _AGENT_ROLES)
        state = self.runs.get(p.tenant, run_id)
        with self._write(state):
            self.run_workspaces.require_live(state)
            return self.files.upload(state, dest, tar_bytes, p.subject)

    def download_files(self, p: Principal, run_id: str, paths: Sequence[str],
                       artifacts: bool) -> list[DownloadedFile]:
        """The workspace's files under `paths` (all of it when empty; FailedPrecondition without a
        live workspace), or with `artifacts` the run's collected artifacts (all of them when
        `paths` is empty), finished run or not. An approver may download the artifacts (what
        the run's tools declared as outputs, which it may be asked to judge), never the
        workspace's working files."""
        self._require(p, _DOWNLOAD_ROLES)
        if p.role is Role.APPROVER and not artifacts:
            raise PermissionDenied("an approver may download a run's artifacts only (artifacts=true), never "
                                   "its workspace's files: those are the run's actors'")
        state = self.runs.get(p.tenant, run_id)
        with self._write(state):
            if artifacts:
                return self.files.download_artifacts(state, list(paths), p.subject)
            self.run_workspaces.require_live(state)
            return self.files.download(state, list(paths), p.subject)

    # ------------------------------------------------------------------ batches and plans

    def submit_batch(self, p: Principal, run_id: str, calls: Sequence[ProposedCall],
                     batch_id: str | None = None) -> list[Observation]:
        self._require(p, _AGENT_ROLES)
        state = self.runs.get(p.tenant, run_id)
        calls = list(calls)
        if batch_id:
            self.batches.check_batch_id(batch_id)
        with self._tenant_slots.hold(p.tenant), self._write(state):
            if batch_id:
                # Under the run's lease and after recovery: a first send that a crash interrupted
                # is finished (or reported) before its observations are returned.
                recorded = self.batches.recorded(state, batch_id, calls)
                if recorded is not None:
                    return recorded
            if state.finished:
                raise FailedPrecondition(f"run {run_id} is finished ({state.outcome})")
            self.batches.check_shape(state, calls)  # again under the lock: ids may have been used meanwhile
            return self.batches.run(state, calls, proposed_by=p.subject, batch_id=batch_id)

    def validate_plan(self, p: Principal, steps: Sequence[PlanStep], max_steps: int | None) -> None:
        self._require(p, _AGENT_ROLES)
        self.batches.check_plan(steps, max_steps)

    def execute_plan(self, p: Principal, run_id: str, steps: Sequence[PlanStep],
                     max_steps: int | None) -> Iterator[Event]:
        """Validate the whole plan now (raising InvalidArgument), then return an iterator that
        runs it as ONE batch (total admission of every step before any runs) and yields the
        run's events as they are appended."""
        self.validate_plan(p, steps, max_steps)
        state = self.runs.get(p.tenant, run_id)
        if state.finished:
            raise FailedPrecondition(f"run {run_id} is finished ({state.outcome})")
        calls = [ProposedCall(s.key, s.tool, s.arguments) for s in steps]
        self.batches.check_shape(state, calls)
        return streams.stream_batch(self.runs, state, lambda: self.submit_batch(p, state.run_id, calls))

    def watch_run(self, p: Principal, run_id: str, from_seq: int, stop: threading.Event) -> Iterator[Event]:
        self._require(p, _READ_ROLES)
        state = self.runs.get(p.tenant, run_id)
        # Clamp: SQLite integers are 64-bit signed, and no run has 2**62 events.
        return streams.watch_run(self.runs, state, min(max(int(from_seq or 0), 1), 2**62), stop,
                                 self._stopping.is_set)

    # ------------------------------------------------------------------ approvals

    def list_approvals(self, p: Principal, run_id: str | None = None) -> list[Approval]:
        self._require(p, _READ_ROLES)
        states = [self.runs.get(p.tenant, run_id)] if run_id is not None else self.runs.unfinished(p.tenant)
        out: list[Approval] = []
        for state in states:
            self.desk.try_sweep(state)
            out.extend(self.runs.approvals_of(state))
        if p.role in _APPROVER_ROLES:
            out = [self._with_risk(a) for a in out]
        return sorted(out, key=lambda a: (a.created_at, a.approval_id))

    def get_approval(self, p: Principal, approval_id: str) -> Approval:
        """One approval of the caller's tenant (approver/admin), whatever its state, of a live or a
        finished run: found by the desk (this process's index, else the store's key claimed when
        it was asked, so after a restart too). Another tenant's, or an unknown id, is NotFound."""
        self._require(p, _APPROVER_ROLES)
        state = self.desk.find(p, approval_id)
        self.desk.try_sweep(state)  # one whose time is up reads expired, as ListApprovals shows it
        return self._with_risk(self.runs.approval_of(state, approval_id))

    def watch_approvals(self, p: Principal, stop: threading.Event) -> Iterator[Approval]:
        self._require(p, _APPROVER_ROLES)
        return streams.watch_approvals(lambda: self.list_approvals(p), self.store.version, self.store.wait,
                                       stop, self._stopping.is_set)

    def add_grant(self, p: Principal, run_id: str, tool: str, arguments: Mapping[str, Any]) -> None:
        """An exact-call session grant for this run (approver/admin). Policy DENY still wins."""
        self._require(p, _APPROVER_ROLES)
        state = self.runs.get(p.tenant, run_id)
        manifest = self.registry.get(tool)
        if manifest is None:
            raise InvalidArgument("unknown tool", [FieldViolation("tool", f"unknown tool {tool!r}")])
        canon, errs = validate_arguments(manifest, arguments, max_bytes=self.limits.max_argument_bytes)
        if canon is None:
            raise InvalidArgument("invalid arguments", errs)
        with self._write(state):
            self.runs.append(state, GrantAdded(tool=tool, arguments=canon, signature=signature(tool, canon),
                                               by=p.subject))

    def decide_approval(self, p: Principal, approval_id: str, approve: bool, reason: str,
                        remember: bool = False, digest: str | None = None) -> Approval:
        """Decide a pending approval. `remember` (approve only): the exact call is granted for
        the rest of the run. `digest`: the one the approver saw; a different one is refused.
        An expired, used, decided or no-longer-matching approval is FailedPrecondition."""
        self._require(p, _APPROVER_ROLES)
        if not isinstance(reason, str) or len(reason.encode()) > 4096:
            raise InvalidArgument("reason is too long", [FieldViolation("reason", "at most 4096 bytes")])
        if remember and not approve:
            raise InvalidArgument("only an approval can be remembered",
                                  [FieldViolation("remember", "only an approval can be remembered")])
        state = self.desk.find(p, approval_id)
        with self._write(state):
            decided = self.desk.decide(p, state, approval_id, approve, reason, remember=remember, digest=digest)
        return self._with_risk(decided)

    def withdraw_approval(self, p: Principal, run_id: str, approval_id: str, reason: str = "") -> Observation:
        """Withdraw a pending approval of a call in run `run_id` (its proposer or an admin): the
        call never runs; its observation, declined ("approval:withdrawn"), is returned. Another
        tenant's run, or an approval not of this run, is NotFound; see ApprovalDesk.withdraw
        for the rest."""
        self._require(p, _AGENT_ROLES)
        violations = [FieldViolation(name, "required") for name, value in (("run_id", run_id),
                                                                          ("approval_id", approval_id)) if not value]
        if violations:
            raise InvalidArgument("nothing to withdraw", violations)
        if not isinstance(reason, str) or len(reason.encode()) > 4096:
            raise InvalidArgument("reason is too long", [FieldViolation("reason", "at most 4096 bytes")])
        state = self.runs.get(p.tenant, run_id)
        if approval_id not in state.approvals:
            raise NotFound(f"approval {approval_id!r} not found in run {run_id!r}")
        with self._write(state):
            return self.desk.withdraw(p, state, approval_id, reason)

    # ------------------------------------------------------------------ lifecycle

    def recover(self) -> None:
        """Bring every unfinished run to a consistent point after a restart (recovery.py): the
        runs no other live instance is writing (those it recovers itself, or hands over when
        its lease expires and someone touches the run)."""
        for state in self.runs.live():
            try:
                with self._write(state, wait=False):
                    pass  # _write recovers what needs it
            except BusyElsewhere:
                continue

    def adopt_orphans(self) -> int:
        """Recover the unfinished runs whose writer died mid-way (its lease expired) and that no
        client has touched since; returns how many were recovered. Runs another live instance
        is writing are left alone (its lease is held)."""
        adopted = 0
        for tenant, key in self.store.unfinished():
            state = self.runs.by_key(tenant, key)
            if state is None or state.finished or not needs_recovery(state):
                continue
            try:
                with self._write(state, wait=False):
                    adopted += 1
            except BusyElsewhere:
                continue
        return adopted

    def reap_workspaces(self) -> int:
        """Remove every workspace whose run is finished or unknown to the store (left behind by a
        crash, an engine failure at the run's end, or a pruned run); returns how many. Done at
        start-up (after recovery); serve repeats it every workspace.reap_interval_s. EngineError
        when the engine cannot be reached."""
        return self.run_workspaces.reap()

    def start_adopting(self, interval_s: float) -> None:
        """adopt_orphans() every `interval_s` on a daemon thread, until close() (serve)."""
        def loop() -> None:
            while not self._stopping.wait(interval_s):
                try:
                    self.adopt_orphans()
                except Exception as e:  # noqa: BLE001 - the store may be down now; next round
                    log.warning("adopting orphaned runs: %s", e)

        threading.Thread(target=loop, name="rf-adopt", daemon=True).start()

    @contextmanager
    def _write(self, state: RunState, *, wait: bool = True) -> Iterator[RunState]:
        """Hold the run for writing (RunRepository.writing). The outermost writer first brings
        the run to a consistent point: if the log shows work interrupted mid-way (a crash, or
        another instance that died holding it), recovery runs before anything else."""
        with self.runs.writing(state, wait=wait) as current:
            if self.runs.outermost(current) and not current.finished and needs_recovery(current):
                recover_run(current, repo=self.runs, desk=self.desk, execution=self.execution,
                            registry=self.registry)
            yield current

    def health_checks(self) -> list[tuple[str, Callable[[], None]]]:
        """What must answer for this server to take work (ringfence_server.control.api.health)."""
        # Looked up at each probe, not bound now: a backend or store whose ping is replaced
        # while serving (tests break the store this way) is the one probed.
        return [("sandbox engine", lambda: self.backend.ping()), ("event store", lambda: self.store.ping())]

    def close(self) -> None:
        self._stopping.set()
        self.runs.close()
        self.dispatcher.close()
