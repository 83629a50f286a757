"""The core as the gRPC edge sees it: exactly what the servicer, the plan and routing methods and
the server call, with their types.

`ringfence_server.control.orchestration.Orchestrator` is the implementation; tests may serve a double. Keeping the
seam a Protocol means the edge can be read (and type-checked) without the orchestrator's
internals, and a method the edge starts calling has to be added here first, where the next
reader sees it.

Every method is synchronous and may block (containers, the store): the edge calls them on its
worker threads (ringfence_server.control.api.servicer.Call.run / Call.stream).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from ringfence.model import (
    Approval,
    AuditReport,
    Event,
    EventPage,
    Observation,
    PlanStep,
    Principal,
    ProposedCall,
    RunOutcome,
    RunPage,
    RunStatus,
    RunView,
    ToolView,
    WorkspaceRequest,
)
from ringfence.plans import Claim, EvidenceRecord, PlanView, Report, Step, Verdict
from ringfence.routing import Decision, Ticket
from ringfence_server.control.files import DownloadedFile, FileInfo

__all__ = ["Core", "EvidenceService", "HealthCheck", "PlanService", "RoutingService"]

HealthCheck = tuple[str, Callable[[], None]]
"""(what is probed, a check that returns when it answers and raises when it does not)."""


class EvidenceService(Protocol):
    """EvidenceService's calls (ringfence_server.control.plans.evidence.EvidenceStores)."""

    def put(self, p: Principal, store: str, ref: str, value: str) -> EvidenceRecord: ...

    def history(self, p: Principal, store: str, ref: str) -> list[EvidenceRecord]: ...


class PlanService(Protocol):
    """PlanService's calls (ringfence_server.control.plans.service.PlanVerification)."""

    def validate(self, max_steps: int, steps: Sequence[Step], plan_id: str = "") -> None: ...

    def run_plan(self, p: Principal, plan_id: str, max_steps: int, steps: Sequence[Step]) -> Report: ...

    def verify(self, p: Principal, plan_id: str, claims: Sequence[Claim]) -> Verdict: ...

    def get_plan(self, p: Principal, plan_id: str) -> PlanView: ...

    @property
    def evidence(self) -> EvidenceService: ...


class RoutingService(Protocol):
    """RoutingService's calls (ringfence_server.control.routing.service.TicketRouter)."""

    def route(self, p: Principal, ticket: Ticket, correlation_id: str = "", reclassify: bool = False) -> Decision: ...

    def history(self, p: Principal, ticket_id: str) -> list[Decision]: ...


class Core(Protocol):
    """What the edge calls on the core. Each method checks the principal's role and scopes
    everything to its tenant; errors are ringfence.errors exceptions, mapped by ringfence_server.control.api.status."""

    # ToolService
    def list_tools(self, p: Principal, query: str = "") -> list[ToolView]: ...

    # RunService
    def start_run(self, p: Principal, goal: str, run_id: str | None = None, *,
                  workspace: WorkspaceRequest | None = None) -> RunView:
        """`workspace` None: the run has none; else its caps (0 = the server's default), the
        workspace made before this returns (a `workspace_created` event)."""
        ...

    def get_run(self, p: Principal, run_id: str) -> RunView: ...

    def finish_run(self, p: Principal, run_id: str) -> RunView: ...

    def cancel_run(self, p: Principal, run_id: str) -> RunView: ...

    def list_runs_page(self, p: Principal, status: RunStatus | None, outcome: RunOutcome | None, page_size: int,
                       page_token: str) -> RunPage:
        """RunService.ListRuns: a page of the tenant's runs, newest first, read with a keyset
        query (never the whole history); a token that is not this tenant's for these filters is
        InvalidArgument naming page_token."""
        ...

    def list_events(self, p: Principal, run_id: str, from_seq: int, page_size: int) -> EventPage:
        """RunService.ListEvents: at most `page_size` events of the run from `from_seq`."""
        ...

    def verify_run(self, p: Principal, run_id: str) -> AuditReport:
        """RunService.VerifyRun: the run's stored hash chain checked (store/audit.py)."""
        ...

    def submit_batch(self, p: Principal, run_id: str, calls: Sequence[ProposedCall],
                     batch_id: str | None = None) -> list[Observation]: ...

    def validate_plan(self, p: Principal, steps: Sequence[PlanStep], max_steps: int | None) -> None: ...

    def execute_plan(self, p: Principal, run_id: str, steps: Sequence[PlanStep],
                     max_steps: int | None) -> Iterator[Event]: ...

    def watch_run(self, p: Principal, run_id: str, from_seq: int, stop: threading.Event) -> Iterator[Event]: ...

    def withdraw_approval(self, p: Principal, run_id: str, approval_id: str, reason: str = "") -> Observation:
        """RunService.WithdrawApproval: the proposer (or an admin) takes back a pending call;
        its observation (declined) is returned."""
        ...

    # FileService: the run is the principal's tenant's (NotFound otherwise); upload and
    # workspace downloads need a live workspace (FailedPrecondition); both hold the run's lock
    # and go through ringfence_server.control.files.FileDesk.
    def upload_files(self, p: Principal, run_id: str, dest: str, tar_bytes: bytes) -> tuple[list[FileInfo], int]:
        """Copy an uncompressed tar's files into the workspace under `dest`; returns them and the
        seq of the `files_uploaded` event."""
        ...

    def download_files(self, p: Principal, run_id: str, paths: Sequence[str],
                       artifacts: bool) -> list[DownloadedFile]:
        """The workspace's files under `paths` (all of it when empty), or with `artifacts` the
        run's collected artifacts (all when `paths` is empty; no workspace needed)."""
        ...

    # ApprovalService
    def list_approvals(self, p: Principal, run_id: str | None = None) -> list[Approval]: ...

    def get_approval(self, p: Principal, approval_id: str) -> Approval:
        """ApprovalService.GetApproval: one approval of the tenant's, in whatever state, of a
        finished run or not (found through the store after a restart), with its tool's risk;
        anyone else's, or an unknown id, NotFound."""
        ...

    def watch_approvals(self, p: Principal, stop: threading.Event) -> Iterator[Approval]: ...

    def decide_approval(self, p: Principal, approval_id: str, approve: bool, reason: str,
                        remember: bool = False, digest: str | None = None) -> Approval: ...

    # PlanService, EvidenceService, RoutingService
    @property
    def plans(self) -> PlanService: ...

    @property
    def routing(self) -> RoutingService: ...

    # grpc.health.v1 (ringfence_server.control.api.health)
    def health_checks(self) -> list[HealthCheck]: ...
