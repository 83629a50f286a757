"""The ringfence client SDK: importable without the server's dependencies (no docker, no
orchestration, no servicer), so a light client install needs only grpc, protobuf, tenacity
and opentelemetry-api.

    Client          sync, one channel: typed control.model values in and out   (sync.py)
    AsyncClient     the same methods on grpc.aio                                (aio.py)
    Stream / AsyncStream   server streams as (async) iterators with cancel()
    TlsConfig       TLS, or mTLS with a client certificate                      (options.py)
    RetryPolicy     UNAVAILABLE retries of reads and of submit_batch (which carries its batch id)
    WorkspaceOptions   start_run(..., workspace=...): the caps of a run's workspace (options.py);
                    upload_files / upload_tar / download_files move files in and out of it
                    (UploadResult; DownloadedFiles: path -> bytes, sha256-checked, .skipped)
    Approver        a thread deciding a tenant's pending approvals through a callable
    ApprovalDecision   what that callable answers: approve?, reason, remember for the run
    control.client.agent   the agent loop: ModelClient, ScriptedModel, AgentLoop, AgentResult

Errors are control.errors' one hierarchy, translated by control/api/status.py's table (they
are re-exported here):

    ControlError
    ├── InvalidArgument (.violations: every FieldViolation)
    ├── NotFound, AlreadyExists, FailedPrecondition
    ├── Unauthenticated, PermissionDenied, ResourceExhausted
    ├── Unavailable       retried for reads and submit_batch, never for other mutations
    └── Internal          a server fault (incident id in the message); never retried

DEADLINE_EXCEEDED and CANCELLED have no counterpart there and stay grpc.RpcError.
"""

from control.client.aio import AsyncClient, AsyncStream
from control.client.approver import ApprovalDecision, Approver
from control.client.options import (
    DownloadedFiles,
    RetryPolicy,
    TlsConfig,
    UploadedFile,
    UploadResult,
    WorkspaceOptions,
)
from control.client.sync import Client, Stream
from control.errors import (
    AlreadyExists,
    ControlError,
    FailedPrecondition,
    FieldViolation,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "AlreadyExists",
    "ApprovalDecision",
    "Approver",
    "AsyncClient",
    "AsyncStream",
    "Client",
    "ControlError",
    "DownloadedFiles",
    "FailedPrecondition",
    "FieldViolation",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "RetryPolicy",
    "Stream",
    "TlsConfig",
    "Unauthenticated",
    "Unavailable",
    "UploadResult",
    "UploadedFile",
    "WorkspaceOptions",
]
