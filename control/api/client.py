"""A small typed client for ringfence.v1 (tests, the demo and the CLI use it).

Synchronous, over one channel; it speaks the control plane's own values (control.model) and
raises the control plane's own exceptions (control.errors, via the table in
control/api/status.py), so `except InvalidArgument as e: e.violations` works on both sides of
the wire. Errors with no ControlError counterpart stay grpc.RpcError.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import grpc

from control.api import convert
from control.api.gen.ringfence.v1 import (
    approvals_pb2,
    approvals_pb2_grpc,
    files_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)
from control.api.status import from_rpc_error
from control.client import _wire as files_wire
from control.client.options import DownloadedFiles, UploadResult, WorkspaceOptions
from control.model import Approval, Event, Observation, PlanStep, ProposedCall, RunView, ToolView

__all__ = ["RingfenceClient", "Stream"]

T = TypeVar("T")


def _translate(error: grpc.RpcError) -> Exception:
    translated = from_rpc_error(error)
    if translated is not error:
        translated.__cause__ = error
    return translated


class Stream(Generic[T]):
    """A server stream as an iterator of model values; `cancel()` ends it from the client."""

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
            raise _translate(e) from e

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> Stream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class RingfenceClient:
    def __init__(
        self,
        target: str,
        token: str | None = None,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float | None = 120.0,
        options: Sequence[tuple[str, Any]] = (),
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        """`target` is host:port; `token` the bearer token; `credentials` for TLS/mTLS.

        `metadata` is sent with every call (e.g. a W3C `traceparent`).
        """
        if credentials is not None:
            self.channel = grpc.secure_channel(target, credentials, options=list(options))
        else:
            self.channel = grpc.insecure_channel(target, options=list(options))
        self.token = token
        self.timeout = timeout
        self.extra_metadata = tuple(metadata)
        self.tools = tools_pb2_grpc.ToolServiceStub(self.channel)
        self.runs = runs_pb2_grpc.RunServiceStub(self.channel)
        self.approvals = approvals_pb2_grpc.ApprovalServiceStub(self.channel)
        self.files = files_pb2_grpc.FileServiceStub(self.channel)

    # -- plumbing -------------------------------------------------------------------------

    def metadata(self) -> tuple[tuple[str, str], ...]:
        auth = (("authorization", f"Bearer {self.token}"),) if self.token is not None else ()
        return auth + self.extra_metadata

    def _unary(self, method: Callable[..., Any], request: Any) -> Any:
        try:
            return method(request, metadata=self.metadata(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise _translate(e) from e

    def _stream(self, method: Callable[..., Any], request: Any, decode: Callable[[Any], T]) -> Stream[T]:
        return Stream(method(request, metadata=self.metadata()), decode)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> RingfenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- ToolService ------------------------------------------------------------------------

    def list_tools(self, query: str = "") -> list[ToolView]:
        response = self._unary(self.tools.ListTools, tools_pb2.ListToolsRequest(query=query))
        return [convert.tool_from_proto(t) for t in response.tools]

    # -- RunService -------------------------------------------------------------------------

    def start_run(self, goal: str, run_id: str | None = None, *,
                  workspace: bool | WorkspaceOptions = False) -> RunView:
        request = runs_pb2.StartRunRequest(goal=goal, run_id=run_id or "")
        wanted = files_wire.workspace_request(workspace)
        if wanted is not None:
            request.workspace.CopyFrom(convert.workspace_to_proto(wanted))
        return convert.run_from_proto(self._unary(self.runs.StartRun, request))

    def get_run(self, run_id: str) -> RunView:
        return convert.run_from_proto(self._unary(self.runs.GetRun, runs_pb2.GetRunRequest(run_id=run_id)))

    def list_runs(self) -> list[RunView]:
        response = self._unary(self.runs.ListRuns, runs_pb2.ListRunsRequest())
        return [convert.run_from_proto(r) for r in response.runs]

    def finish_run(self, run_id: str) -> RunView:
        return convert.run_from_proto(self._unary(self.runs.FinishRun, runs_pb2.FinishRunRequest(run_id=run_id)))

    def cancel_run(self, run_id: str) -> RunView:
        return convert.run_from_proto(self._unary(self.runs.CancelRun, runs_pb2.CancelRunRequest(run_id=run_id)))

    def submit_batch(self, run_id: str, calls: Sequence[ProposedCall | Mapping[str, Any]],
                     batch_id: str | None = None) -> list[Observation]:
        """One turn's batch. `batch_id` (default: a fresh one) makes a resend safe: the same id
        and calls again return the recorded observations instead of running anything twice."""
        request = runs_pb2.SubmitBatchRequest(run_id=run_id, calls=[convert.call_to_proto(c) for c in calls],
                                              batch_id=batch_id or "b-" + uuid.uuid4().hex[:20])
        response = self._unary(self.runs.SubmitBatch, request)
        return [convert.observation_from_proto(o) for o in response.observations]

    def execute_plan(
        self, run_id: str, steps: Sequence[PlanStep | Mapping[str, Any]], max_steps: int | None = None
    ) -> Stream[Event]:
        request = runs_pb2.ExecutePlanRequest(
            run_id=run_id, steps=[convert.step_to_proto(s) for s in steps], max_steps=max_steps or 0
        )
        return self._stream(self.runs.ExecutePlan, request, convert.event_from_proto)

    def watch_run(self, run_id: str, from_seq: int = 0) -> Stream[Event]:
        request = runs_pb2.WatchRunRequest(run_id=run_id, from_seq=from_seq)
        return self._stream(self.runs.WatchRun, request, convert.event_from_proto)

    # -- FileService (the same checks as the SDK's: control.client._wire) ---------------------

    def upload_tar(self, run_id: str, tar_bytes: bytes, dest: str = "") -> UploadResult:
        upload = files_wire.Upload(run_id, dest, bytes(tar_bytes))
        response = self._unary(self.files.UploadFiles, upload.messages())  # the stream as the request
        return upload.decode(response)

    def download_files(self, run_id: str, paths: Sequence[str] = (), *, artifacts: bool = False) -> DownloadedFiles:
        request = files_wire.download_files(run_id, paths, artifacts)
        # grpc's stream call is also its future (cancel()); its stubs type it as an iterator only.
        call: Any = self.files.DownloadFiles(request, metadata=self.metadata(), timeout=self.timeout)
        assembler = files_wire.Assembler()
        try:
            for chunk in call:
                assembler.feed(chunk)
        except grpc.RpcError as e:
            raise _translate(e) from e
        except BaseException:
            call.cancel()
            raise
        return assembler.result()

    # -- ApprovalService --------------------------------------------------------------------

    def list_approvals(self, run_id: str | None = None) -> list[Approval]:
        request = approvals_pb2.ListApprovalsRequest(run_id=run_id or "")
        response = self._unary(self.approvals.ListApprovals, request)
        return [convert.approval_from_proto(a) for a in response.approvals]

    def watch_approvals(self) -> Stream[Approval]:
        return self._stream(
            self.approvals.WatchApprovals, approvals_pb2.WatchApprovalsRequest(), convert.approval_from_proto
        )

    def decide_approval(self, approval_id: str, approve: bool, reason: str = "", *, remember: bool = False,
                        digest: str | None = None) -> Approval:
        """`remember`: approve this exact call for the rest of the run. `digest`: the one you saw
        (Approval.digest); the decision is refused if the pending call no longer has it."""
        decision = approvals_pb2.DECISION_APPROVE if approve else approvals_pb2.DECISION_DECLINE
        request = approvals_pb2.DecideApprovalRequest(approval_id=approval_id, decision=decision, reason=reason,
                                                      remember=remember, digest=digest or "")
        return convert.approval_from_proto(self._unary(self.approvals.DecideApproval, request))
