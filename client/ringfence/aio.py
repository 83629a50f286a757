"""`AsyncClient`: the same API as `Client` on grpc.aio, for callers on an asyncio loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import grpc
from tenacity import AsyncRetrying

from ringfence import _wire as W
from ringfence.model import (
    Approval,
    AuditReport,
    Event,
    EventPage,
    Identity,
    Observation,
    PlanStep,
    ProposedCall,
    RunOutcome,
    RunPage,
    RunStatus,
    RunView,
    ToolView,
)
from ringfence.options import (
    DEFAULT_RETRY,
    DownloadedFiles,
    RetryPolicy,
    TlsConfig,
    UploadResult,
    WorkspaceOptions,
)
from ringfence.plans import Claim, EvidenceRecord, PlanView, Report, Verdict
from ringfence.routing import Decision

__all__ = ["AsyncClient", "AsyncStream"]

T = TypeVar("T")


class AsyncStream(Generic[T]):
    """A server stream as an async iterator of model values; `cancel()` ends it."""

    def __init__(self, call: Any, decode: Callable[[Any], T]) -> None:
        self._call = call
        self._decode = decode
        self._cancelled = False

    async def __aiter__(self) -> AsyncIterator[T]:
        try:
            async for message in self._call:
                yield self._decode(message)
        except asyncio.CancelledError:
            if self._cancelled:  # grpc.aio ends a cancelled call this way
                return
            raise
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise W.translate(e) from e

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    async def __aenter__(self) -> AsyncStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


class AsyncClient:
    """`Client`'s methods as coroutines (streams as async iterators), with the same deadlines,
    trace context, retries and exceptions. Create it on the loop that will use it:
    `async with AsyncClient(target, token) as c: ...`."""

    def __init__(
        self,
        target: str,
        token: str | None = None,
        *,
        tls: TlsConfig | None = None,
        timeout: float = 30.0,
        stream_timeout: float | None = 600.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        options: Sequence[tuple[str, Any]] = (),
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        if timeout <= 0 or (stream_timeout is not None and stream_timeout <= 0):
            raise ValueError("deadlines must be positive (stream_timeout=None: streams without one)")
        channel_options = [*options, *(tls.channel_options() if tls else [])]
        if tls is not None:
            self.channel = grpc.aio.secure_channel(target, tls.credentials(), options=channel_options)
        else:
            self.channel = grpc.aio.insecure_channel(target, options=channel_options)
        self.token = token
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self.retry_policy = retry
        self.extra_metadata = tuple(metadata)
        self.stubs = W.make_stubs(self.channel)
        """The generated stubs, for raw calls (W.Stubs)."""

    # -- plumbing -------------------------------------------------------------------------

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return W.call_metadata(self.token, self.extra_metadata)

    async def _send(self, rpc: W.Unary[T], timeout: float | None) -> T:
        method = getattr(getattr(self.stubs, rpc.service), rpc.method)
        deadline = W.Deadline(timeout or self.timeout)

        async def attempt() -> T:
            try:
                response = await method(rpc.request, metadata=self.metadata(), timeout=deadline.attempt_timeout())
            except grpc.RpcError as e:
                raise W.translate(e) from e
            return rpc.decode(response)

        if not rpc.retryable or self.retry_policy.attempts == 1:
            return await attempt()
        return await AsyncRetrying(**W.retry_kwargs(self.retry_policy, deadline, rpc.method))(attempt)

    def _open(self, rpc: W.ServerStream[T], timeout: float | None) -> AsyncStream[T]:
        method = getattr(getattr(self.stubs, rpc.service), rpc.method)
        return AsyncStream(method(rpc.request, metadata=self.metadata(), timeout=timeout or self.stream_timeout),
                           rpc.decode)

    async def close(self) -> None:
        await self.channel.close(None)  # grace=None: cancel the calls still in flight at once

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- IdentityService ---------------------------------------------------------------------

    async def whoami(self, *, timeout: float | None = None) -> Identity:
        """Who the server takes this client's token to be: tenant, principal (the subject that
        `Approval.proposer` names for the calls you propose) and role. Any role may ask."""
        return await self._send(W.whoami(), timeout)

    # -- ToolService ------------------------------------------------------------------------

    async def list_tools(self, query: str = "", *, timeout: float | None = None) -> list[ToolView]:
        return await self._send(W.list_tools(query), timeout)

    # -- RunService -------------------------------------------------------------------------

    async def start_run(self, goal: str, run_id: str | None = None, *, workspace: bool | WorkspaceOptions = False,
                        timeout: float | None = None) -> RunView:
        return await self._send(W.start_run(goal, run_id, workspace), timeout)

    async def get_run(self, run_id: str, *, timeout: float | None = None) -> RunView:
        return await self._send(W.get_run(run_id), timeout)

    async def list_runs(self, *, status: RunStatus | str | None = None, outcome: RunOutcome | str | None = None,
                  timeout: float | None = None) -> list[RunView]:
        """Every run of the tenant (of that status / outcome; None: any), newest first: every
        page of list_runs_page, followed here. A run started meanwhile may be missing; none
        appears twice. For a console, or many runs, ask for pages instead."""
        runs: list[RunView] = []
        token = ""
        while True:
            page = await self.list_runs_page(status=status, outcome=outcome, page_size=W.RUNS_PAGE_MAX,
                                         page_token=token, timeout=timeout)
            runs.extend(page.runs)
            if not page.next_page_token:
                return runs
            token = page.next_page_token

    async def list_runs_page(self, *, status: RunStatus | str | None = None, outcome: RunOutcome | str | None = None,
                       page_size: int = 0, page_token: str = "", timeout: float | None = None) -> RunPage:
        """One page of the tenant's runs, newest first (ListRuns). `page_size` 0: the server's
        default (50), at most 500; `page_token`: "" for the first page, else the previous page's
        `next_page_token`, with the same filters ("" in a reply: that was the last page)."""
        return await self._send(W.list_runs_page(status, outcome, page_size, page_token), timeout)

    async def list_events(self, run_id: str, from_seq: int = 0, page_size: int = 0, *,
                    timeout: float | None = None) -> EventPage:
        """A page of the run's events with seq >= from_seq, in order (ListEvents; `page_size` 0:
        500, at most 1000). `next_seq`: where the next page starts, 0 once the page reached the
        log's current end."""
        return await self._send(W.list_events(run_id, from_seq, page_size), timeout)

    async def verify_run(self, run_id: str, *, timeout: float | None = None) -> AuditReport:
        """The server's check of the run's stored audit hash chain (as `ringfence runs verify`)."""
        return await self._send(W.verify_run(run_id), timeout)

    async def finish_run(self, run_id: str, *, timeout: float | None = None) -> RunView:
        return await self._send(W.finish_run(run_id), timeout)

    async def cancel_run(self, run_id: str, *, timeout: float | None = None) -> RunView:
        return await self._send(W.cancel_run(run_id), timeout)

    async def submit_batch(self, run_id: str, calls: Sequence[ProposedCall | Mapping[str, Any]],
                           batch_id: str | None = None, *, timeout: float | None = None) -> list[Observation]:
        return await self._send(W.submit_batch(run_id, calls, batch_id), timeout)

    def execute_plan(self, run_id: str, steps: Sequence[PlanStep | Mapping[str, Any]],
                     max_steps: int | None = None, *, timeout: float | None = None) -> AsyncStream[Event]:
        return self._open(W.execute_plan(run_id, steps, max_steps), timeout)

    def watch_run(self, run_id: str, from_seq: int = 0, *, timeout: float | None = None) -> AsyncStream[Event]:
        return self._open(W.watch_run(run_id, from_seq), timeout)

    async def withdraw_approval(self, run_id: str, approval_id: str, reason: str = "", *,
                                timeout: float | None = None) -> Observation:
        """Take back a pending call of run `run_id` before anyone decides its approval (you must
        have proposed it, or be an admin): it never runs. Returns its observation, DECLINED with
        error_class "approval_withdrawn". Not pending any more (decided, expired, withdrawn), a
        reconciliation task or a finished run: FailedPrecondition; another's call: PermissionDenied."""
        return await self._send(W.withdraw_approval(run_id, approval_id, reason), timeout)

    # -- FileService ------------------------------------------------------------------------

    async def upload_files(self, run_id: str, files: Mapping[str, bytes], dest: str = "", *,
                           timeout: float | None = None) -> UploadResult:
        """As Client.upload_files."""
        return await self.upload_tar(run_id, W.pack_files(files), dest, timeout=timeout)

    async def upload_tar(self, run_id: str, tar_bytes: bytes, dest: str = "", *,
                         timeout: float | None = None) -> UploadResult:
        """As Client.upload_tar."""
        upload = W.Upload(run_id, dest, bytes(tar_bytes))
        try:
            response = await self.stubs.files.UploadFiles(upload.messages(), metadata=self.metadata(),
                                                              timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            raise W.translate(e) from e
        return upload.decode(response)

    async def download_files(self, run_id: str, paths: Sequence[str] = (), *, artifacts: bool = False,
                             timeout: float | None = None) -> DownloadedFiles:
        """As Client.download_files."""
        request = W.download_files(run_id, paths, artifacts)
        call = self.stubs.files.DownloadFiles(request, metadata=self.metadata(), timeout=timeout or self.timeout)
        assembler = W.Assembler()
        try:
            async for chunk in call:
                assembler.feed(chunk)
        except grpc.RpcError as e:
            raise W.translate(e) from e
        except BaseException:
            call.cancel()
            raise
        return assembler.result()

    # -- ApprovalService --------------------------------------------------------------------

    async def list_approvals(self, run_id: str | None = None, *, timeout: float | None = None) -> list[Approval]:
        return await self._send(W.list_approvals(run_id), timeout)

    async def get_approval(self, approval_id: str, *, timeout: float | None = None) -> Approval:
        """One approval of your tenant by its id, whatever its state and whether or not its run has
        finished (with its tool's risk); another tenant's, or an unknown id, is NotFound."""
        return await self._send(W.get_approval(approval_id), timeout)

    def watch_approvals(self, *, timeout: float | None = None) -> AsyncStream[Approval]:
        return self._open(W.watch_approvals(), timeout)

    async def decide_approval(self, approval_id: str, approve: bool, reason: str = "", *, remember: bool = False,
                              digest: str | None = None, timeout: float | None = None) -> Approval:
        """`remember` (approve only): the exact call is approved for the rest of the run.
        `digest`: the Approval.digest you judged; the server refuses the decision
        (FailedPrecondition) if the pending call no longer has it."""
        return await self._send(W.decide_approval(approval_id, approve, reason, remember, digest), timeout)

    # -- PlanService and EvidenceService ----------------------------------------------------

    async def run_evidence_plan(self, steps: Sequence[tuple[str, str]], max_steps: int, plan_id: str | None = None, *,
                          timeout: float | None = None) -> Report:
        """Run a plan of (key, evidence_ref) steps as the executor; the report keeps each step's
        key and reference beside its claim. Resending `plan_id` returns the same report."""
        return await self._send(W.run_evidence_plan(steps, max_steps, plan_id), timeout)

    async def verify_report(self, plan_id: str, claims: Sequence[Claim], *, timeout: float | None = None) -> Verdict:
        """As the verifier (role verifier): a new assessment of `claims` against the verifier's own evidence."""
        return await self._send(W.verify_report(plan_id, claims), timeout)

    async def get_plan(self, plan_id: str, *, timeout: float | None = None) -> PlanView:
        return await self._send(W.get_plan(plan_id), timeout)

    async def put_evidence(self, store: str, ref: str, value: str, *, timeout: float | None = None) -> EvidenceRecord:
        """The next revision of `ref` in `store` ("executor": agents; "verifier": verifiers)."""
        return await self._send(W.put_evidence(store, ref, value), timeout)

    async def get_evidence(self, store: str, ref: str, *, timeout: float | None = None) -> list[EvidenceRecord]:
        return await self._send(W.get_evidence(store, ref), timeout)

    # -- RoutingService ---------------------------------------------------------------------

    async def route_ticket(self, ticket_id: str, incident: str, service: str, symptom: str, *,
                     correlation_id: str | None = None, reclassify: bool = False,
                     timeout: float | None = None) -> Decision:
        """Route a ticket to one specialist; a resent ticket id returns its recorded decision
        (`replayed`) unless `reclassify`."""
        return await self._send(W.route_ticket(ticket_id, incident, service, symptom, correlation_id, reclassify),
                                 timeout)

    async def get_routing(self, ticket_id: str, *, timeout: float | None = None) -> list[Decision]:
        return await self._send(W.get_routing(ticket_id), timeout)
