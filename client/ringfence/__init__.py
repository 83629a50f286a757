"""ringfence, the client: the SDK and the `ringfence` command (`pip install ringfence`). It needs
grpc, protobuf, tenacity, opentelemetry-api and pyyaml, never the server (`ringfence-server`,
which depends on this package and reuses its stubs, conversions and errors).

The public API is what `__all__` lists; modules whose names start with `_` are not part of it.

    Client          sync, one channel: typed ringfence.model values in and out   (sync.py)
    AsyncClient     the same methods on grpc.aio                                (aio.py)
    Stream / AsyncStream   server streams as (async) iterators with cancel()
    TlsConfig       TLS, or mTLS with a client certificate                      (options.py)
    RetryPolicy     UNAVAILABLE retries of reads and of submit_batch (which carries its batch id)
    WorkspaceOptions   start_run(..., workspace=...): the caps of a run's workspace (options.py);
                    upload_files / upload_tar / download_files move files in and out of it
                    (UploadResult; DownloadedFiles: path -> bytes, sha256-checked, .skipped)
    Approver        a thread deciding a tenant's pending approvals through a callable
    ApprovalDecision   what that callable answers: approve?, reason, remember for the run
    ProposedCall, Observation, RunView, ToolView, Approval, Event, PlanStep ...
                    the values of ringfence.model, re-exported here (RunPage, EventPage,
                    AuditReport, ToolRisk: what a console reads through list_runs_page,
                    list_events, verify_run and an approver's list_tools / approvals;
                    Identity: whoami(), who the server takes the token to be)
    ringfence.agent   the agent loop: ModelClient, ScriptedModel, AgentLoop, AgentResult
    ringfence.v1      the generated gRPC stubs (ringfence.v1.runs_pb2_grpc ...), for raw access

Errors are ringfence.errors' one hierarchy, translated by ringfence/wire/status.py's table (they
are re-exported here):

    ControlError
    ├── InvalidArgument (.violations: every FieldViolation)
    ├── NotFound, AlreadyExists, FailedPrecondition
    │   └── VersionMismatch   the server does not serve this client's version: .client_version,
    │                         .server_version, .upgrade (which side to upgrade, the pip command)
    ├── Unauthenticated, PermissionDenied, ResourceExhausted
    ├── Unavailable       retried for reads and submit_batch, never for other mutations
    └── Internal          a server fault (incident id in the message); never retried

DEADLINE_EXCEEDED and CANCELLED have no counterpart there and stay grpc.RpcError.
"""

from ringfence._version import __version__
from ringfence.aio import AsyncClient, AsyncStream
from ringfence.approver import ApprovalDecision, Approver
from ringfence.errors import (
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
    VersionMismatch,
)
from ringfence.model import (
    AdmissionVerdict,
    Approval,
    ApprovalKind,
    ApprovalStatus,
    AuditReport,
    Event,
    EventPage,
    EventType,
    Identity,
    Observation,
    ObservationStatus,
    PlanStep,
    ProposedCall,
    RunOutcome,
    RunPage,
    RunStatus,
    RunView,
    ToolRisk,
    ToolView,
    Usage,
)
from ringfence.options import (
    DownloadedFiles,
    RetryPolicy,
    TlsConfig,
    UploadedFile,
    UploadResult,
    WorkspaceOptions,
)
from ringfence.sync import Client, Stream

__all__ = [
    "AdmissionVerdict",
    "AlreadyExists",
    "Approval",
    "ApprovalDecision",
    "ApprovalKind",
    "ApprovalStatus",
    "Approver",
    "AsyncClient",
    "AsyncStream",
    "AuditReport",
    "Client",
    "ControlError",
    "DownloadedFiles",
    "Event",
    "EventPage",
    "EventType",
    "FailedPrecondition",
    "FieldViolation",
    "Identity",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "Observation",
    "ObservationStatus",
    "PermissionDenied",
    "PlanStep",
    "ProposedCall",
    "ResourceExhausted",
    "RetryPolicy",
    "RunOutcome",
    "RunPage",
    "RunStatus",
    "RunView",
    "Stream",
    "TlsConfig",
    "ToolRisk",
    "ToolView",
    "Unauthenticated",
    "Unavailable",
    "UploadResult",
    "UploadedFile",
    "Usage",
    "VersionMismatch",
    "WorkspaceOptions",
    "__version__",
]
