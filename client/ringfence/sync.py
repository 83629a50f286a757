"""`Client`: the synchronous SDK client, one channel, typed values in and out."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import grpc
from tenacity import Retrying

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

__all__ = ["Client", "Stream"]

T = TypeVar("T")


class Stream(Generic[T]):
    """A server stream as an iterator of model values; `cancel()` ends it from the client side
    (iteration then simply stops). Errors arrive as ringfence.errors exceptions."""

    def __init__(self, call: Any, decode: Callable[[Any], T]) -> None:
        self._call = call
        self._decode = decode
        self._cancelled = False

    def __iter__(self) -> Iterator[T]:
        try:
            for message in self._call:
                yield self._decode(message)
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise W.translate(e) from e

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> Stream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class Client:
    """The ringfence.v1 API as methods on ringfence.model values.

    Every call carries the bearer token, the current W3C trace context and a deadline
    (`timeout` for unary calls, `stream_timeout` for streams, None for none; each method takes a `timeout`
    override). Reads (get_run, list_runs, list_runs_page, list_events, verify_run, list_tools,
    list_approvals, get_approval, whoami) and submit_batch, which carries its batch id, are retried on UNAVAILABLE
    within that one deadline; nothing else is.
    Failures are ringfence.errors exceptions (InvalidArgument has `.violations`; Internal is a
    server fault); DEADLINE_EXCEEDED and CANCELLED stay grpc.RpcError.
    """

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
        """`target` is host:port; `token` the bearer token; `tls` for TLS or mTLS (without it
        the channel is plaintext, fit for loopback only); `metadata` goes with every call."""
        if timeout <= 0 or (stream_timeout is not None and stream_timeout <= 0):
            raise ValueError("deadlines must be positive (stream_timeout=None: streams without one)")
        channel_options = [*options, *(tls.channel_options() if tls else [])]
        if tls is not None:
            self.channel = grpc.secure_channel(target, tls.credentials(), options=channel_options)
        else:
            self.channel = grpc.insecure_channel(target, options=channel_options)
        self.token = token
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self.retry_policy = retry
        self.extra_metadata = tuple(metadata)
        self.stubs = W.make_stubs(self.channel)
        """The generated stubs, for raw calls (W.Stubs)."""

    # -- plumbing -------------------------------------------------------------------------

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What the next call will carry: token, extra metadata, the current trace context."""
        return W.call_metadata(self.token, self.extra_metadata)

    def _send(self, rpc: W.Unary[T], timeout: float | None) -> T:
        method = getattr(getattr(self.stubs, rpc.service), rpc.method)
        deadline = W.Deadline(timeout or self.timeout)

        def attempt() -> T:
            try:
                response = method(rpc.request, metadata=self.metadata(), timeout=deadline.attempt_timeout())
            except grpc.RpcError as e:
                raise W.translate(e) from e
            return rpc.decode(response)

        if not rpc.retryable or self.retry_policy.attempts == 1:
            return attempt()
        return Retrying(**W.retry_kwargs(self.retry_policy, deadline, rpc.method))(attempt)

    def _open(self, rpc: W.ServerStream[T], timeout: float | None) -> Stream[T]:
        method = getattr(getattr(self.stubs, rpc.service), rpc.method)
        return Stream(method(rpc.request, metadata=self.metadata(), timeout=timeout or self.stream_timeout),
                      rpc.decode)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- IdentityService ---------------------------------------------------------------------

    def whoami(self, *, timeout: float | None = None) -> Identity:
        """Who the server takes this client's token to be: tenant, principal (the subject that
        `Approval.proposer` names for the calls you propose) and role. Any role may ask."""
        return self._send(W.whoami(), timeout)

    # -- ToolService ------------------------------------------------------------------------

    def list_tools(self, query: str = "", *, timeout: float | None = None) -> list[ToolView]:
        return self._send(W.list_tools(query), timeout)

    # -- RunService -------------------------------------------------------------------------

    def start_run(self, goal: str, run_id: str | None = None, *, workspace: bool | WorkspaceOptions = False,
                  timeout: float | None = None) -> RunView:
        """With `run_id` the call is idempotent on the server: the same id returns that run.
        `workspace`: True (the server's default caps) or WorkspaceOptions for a workspace at
        /workspace that every call of the run's workspace tools shares (RunView.workspace)."""
        return self._send(W.start_run(goal, run_id, workspace), timeout)

    def get_run(self, run_id: str, *, timeout: float | None = None) -> RunView:
        return self._send(W.get_run(run_id), timeout)

    def list_runs(self, *, status: RunStatus | str | None = None, outcome: RunOutcome | str | None = None,
                  timeout: float | None = None) -> list[RunView]:
        """Every run of the tenant (of that status / outcome; None: any), newest first: every
        page of list_runs_page, followed here. A run started meanwhile may be missing; none
        appears twice. For a console, or many runs, ask for pages instead."""
        runs: list[RunView] = []
        token = ""
        while True:
            page = self.list_runs_page(status=status, outcome=outcome, page_size=W.RUNS_PAGE_MAX,
                                         page_token=token, timeout=timeout)
            runs.extend(page.runs)
            if not page.next_page_token:
                return runs
            token = page.next_page_token

    def list_runs_page(self, *, status: RunStatus | str | None = None, outcome: RunOutcome | str | None = None,
                       page_size: int = 0, page_token: str = "", timeout: float | None = None) -> RunPage:
        """One page of the tenant's runs, newest first (ListRuns). `page_size` 0: the server's
        default (50), at most 500; `page_token`: "" for the first page, else the previous page's
        `next_page_token`, with the same filters ("" in a reply: that was the last page)."""
        return self._send(W.list_runs_page(status, outcome, page_size, page_token), timeout)

    def list_events(self, run_id: str, from_seq: int = 0, page_size: int = 0, *,
                    timeout: float | None = None) -> EventPage:
        """A page of the run's events with seq >= from_seq, in order (ListEvents; `page_size` 0:
        500, at most 1000). `next_seq`: where the next page starts, 0 once the page reached the
        log's current end."""
        return self._send(W.list_events(run_id, from_seq, page_size), timeout)

    def verify_run(self, run_id: str, *, timeout: float | None = None) -> AuditReport:
        """The server's check of the run's stored audit hash chain (as `ringfence runs verify`)."""
        return self._send(W.verify_run(run_id), timeout)

    def finish_run(self, run_id: str, *, timeout: float | None = None) -> RunView:
        return self._send(W.finish_run(run_id), timeout)

    def cancel_run(self, run_id: str, *, timeout: float | None = None) -> RunView:
        return self._send(W.cancel_run(run_id), timeout)

    def submit_batch(self, run_id: str, calls: Sequence[ProposedCall | Mapping[str, Any]],
                     batch_id: str | None = None, *, timeout: float | None = None) -> list[Observation]:
        """One turn's calls, vetted together before any runs. `batch_id` defaults to a fresh
        one per call of this method; its retries (and any resend with the same id and calls)
        get the recorded observations, so nothing runs twice."""
        return self._send(W.submit_batch(run_id, calls, batch_id), timeout)

    def execute_plan(self, run_id: str, steps: Sequence[PlanStep | Mapping[str, Any]],
                     max_steps: int | None = None, *, timeout: float | None = None) -> Stream[Event]:
        return self._open(W.execute_plan(run_id, steps, max_steps), timeout)

    def watch_run(self, run_id: str, from_seq: int = 0, *, timeout: float | None = None) -> Stream[Event]:
        return self._open(W.watch_run(run_id, from_seq), timeout)

    def withdraw_approval(self, run_id: str, approval_id: str, reason: str = "", *,
                          timeout: float | None = None) -> Observation:
        """Take back a pending call of run `run_id` before anyone decides its approval (you must
        have proposed it, or be an admin): it never runs. Returns its observation, DECLINED with
        error_class "approval_withdrawn". Not pending any more (decided, expired, withdrawn), a
        reconciliation task or a finished run: FailedPrecondition; another's call: PermissionDenied."""
        return self._send(W.withdraw_approval(run_id, approval_id, reason), timeout)

    # -- FileService ------------------------------------------------------------------------

    def upload_files(self, run_id: str, files: Mapping[str, bytes], dest: str = "", *,
                     timeout: float | None = None) -> UploadResult:
        """Put `files` (path relative to `dest` -> bytes) into the run's workspace under `dest`
        ("" = /workspace itself; created if missing). The archive is built here and streamed;
        the server checks it whole before anything reaches the workspace. Never retried."""
        return self.upload_tar(run_id, W.pack_files(files), dest, timeout=timeout)

    def upload_tar(self, run_id: str, tar_bytes: bytes, dest: str = "", *,
                   timeout: float | None = None) -> UploadResult:
        """Upload an uncompressed tar the caller built: regular files and directories only (a
        link, a device, a set-id bit, `..` refuse it whole: InvalidArgument naming the member)."""
        upload = W.Upload(run_id, dest, bytes(tar_bytes))
        try:
            response = self.stubs.files.UploadFiles(upload.messages(), metadata=self.metadata(),
                                                        timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            raise W.translate(e) from e
        return upload.decode(response)

    def download_files(self, run_id: str, paths: Sequence[str] = (), *, artifacts: bool = False,
                       timeout: float | None = None) -> DownloadedFiles:
        """Files of the run's workspace under `paths` (files or directories relative to
        /workspace; none: all of it), or with `artifacts` its collected artifacts (none: all).
        Path -> bytes, each checked against its sha256; `.skipped` lists what was not delivered
        (a link in the workspace, never followed). Not retried: each download is an event."""
        request = W.download_files(run_id, paths, artifacts)
        call = self.stubs.files.DownloadFiles(request, metadata=self.metadata(), timeout=timeout or self.timeout)
        assembler = W.Assembler()
        try:
            for chunk in call:
                assembler.feed(chunk)
        except grpc.RpcError as e:
            raise W.translate(e) from e
        except BaseException:
            call.cancel()  # a stream we no longer believe is not read to its end
            raise
        return assembler.result()

    # -- ApprovalService --------------------------------------------------------------------

    def list_approvals(self, run_id: str | None = None, *, timeout: float | None = None) -> list[Approval]:
        return self._send(W.list_approvals(run_id), timeout)

    def get_approval(self, approval_id: str, *, timeout: float | None = None) -> Approval:
        """One approval of your tenant by its id, whatever its state and whether or not its run has
        finished (with its tool's risk); another tenant's, or an unknown id, is NotFound."""
        return self._send(W.get_approval(approval_id), timeout)

    def watch_approvals(self, *, timeout: float | None = None) -> Stream[Approval]:
        return self._open(W.watch_approvals(), timeout)

    def decide_approval(self, approval_id: str, approve: bool, reason: str = "", *, remember: bool = False,
                        digest: str | None = None, timeout: float | None = None) -> Approval:
        """`remember` (approve only): the exact call is approved for the rest of the run.
        `digest`: the Approval.digest you judged; the server refuses the decision
        (FailedPrecondition) if the pending call no longer has it."""
        return self._send(W.decide_approval(approval_id, approve, reason, remember, digest), timeout)

    # -- PlanService and EvidenceService ----------------------------------------------------

    def run_evidence_plan(self, steps: Sequence[tuple[str, str]], max_steps: int, plan_id: str | None = None, *,
                          timeout: float | None = None) -> Report:
        """Run a plan of (key, evidence_ref) steps as the executor; the report keeps each step's
        key and reference beside its claim. Resending `plan_id` returns the same report."""
        return self._send(W.run_evidence_plan(steps, max_steps, plan_id), timeout)

    def verify_report(self, plan_id: str, claims: Sequence[Claim], *, timeout: float | None = None) -> Verdict:
        """As the verifier (role verifier): a new assessment of `claims` against the verifier's own evidence."""
        return self._send(W.verify_report(plan_id, claims), timeout)

    def get_plan(self, plan_id: str, *, timeout: float | None = None) -> PlanView:
        return self._send(W.get_plan(plan_id), timeout)

    def put_evidence(self, store: str, ref: str, value: str, *, timeout: float | None = None) -> EvidenceRecord:
        """The next revision of `ref` in `store` ("executor": agents; "verifier": verifiers)."""
        return self._send(W.put_evidence(store, ref, value), timeout)

    def get_evidence(self, store: str, ref: str, *, timeout: float | None = None) -> list[EvidenceRecord]:
        return self._send(W.get_evidence(store, ref), timeout)

    # -- RoutingService ---------------------------------------------------------------------

    def route_ticket(self, ticket_id: str, incident: str, service: str, symptom: str, *,
                     correlation_id: str | None = None, reclassify: bool = False,
                     timeout: float | None = None) -> Decision:
        """Route a ticket to one specialist; a resent ticket id returns its recorded decision
        (`replayed`) unless `reclassify`."""
        return self._send(W.route_ticket(ticket_id, incident, service, symptom, correlation_id, reclassify),
                                 timeout)

    def get_routing(self, ticket_id: str, *, timeout: float | None = None) -> list[Decision]:
        return self._send(W.get_routing(ticket_id), timeout)
