"""The server's side of the one table between errors and gRPC status codes.

The table itself is the client's (ringfence.wire.status.CODES: each ringfence.errors exception
and its code), so both sides of the wire read the same one; the server adds the few exceptions
of its own layers below and turns an exception into a `google.rpc.Status` (code, message and,
for InvalidArgument, a `google.rpc.BadRequest` listing every field violation; for a refused client
version, ringfence.errors.VersionMismatch, a `google.rpc.ErrorInfo` naming both versions). Nothing
else in the code base chooses a status code.

An exception that is not a known one is a server fault, never the caller's: a bug. It is
logged with an incident id, counted, and answered INTERNAL — never a code that invites a retry
(UNAVAILABLE would make a client repeat a deterministic failure). No known error maps to
INTERNAL, so a client or a fuzz test that sees it has found a bug.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping

import grpc
from google.rpc import status_pb2  # type: ignore[import-untyped]  # no stubs published
from grpc_status import rpc_status

from ringfence import errors as E
from ringfence.wire import status as wire
from ringfence_server.sandbox import errors as sandbox_errors

log = logging.getLogger(__name__)

__all__ = ["CODES", "UNEXPECTED_CODE", "code_for", "to_grpc_status"]

UNEXPECTED_CODE = wire.UNEXPECTED_CODE

_codes: dict[type[BaseException], grpc.StatusCode] = {exc: code for exc, code in wire.CODES.items()}
_codes.update({
    # A safety net: the core translates sandbox errors itself, but should one escape, the
    # engine being unreachable is still "try again later" and a missing or unpinned image is
    # a deployment precondition, not the caller's fault.
    sandbox_errors.EngineError: grpc.StatusCode.UNAVAILABLE,
    sandbox_errors.SandboxError: grpc.StatusCode.FAILED_PRECONDITION,
    # An archive refused by sandbox.archive is the caller's input: its message names the
    # member. control.files turns it into InvalidArgument (field tar_chunk) itself; this entry
    # keeps one that escapes from becoming FAILED_PRECONDITION.
    sandbox_errors.ArchiveError: grpc.StatusCode.INVALID_ARGUMENT,
})
CODES: Mapping[type[BaseException], grpc.StatusCode] = _codes
"""The client's table (ringfence.wire.status.CODES) and the server's own exceptions."""


def code_for(exc: BaseException) -> grpc.StatusCode | None:
    """The status code of a known exception, or None for an unexpected one."""
    for klass in type(exc).__mro__:
        code = CODES.get(klass)
        if code is not None:
            return code
    return None


def to_grpc_status(exc: BaseException, *, method: str = "") -> grpc.Status:
    """The grpc.Status to abort with for `exc`; logs unexpected exceptions with an incident id."""
    code = code_for(exc)
    if code is None:
        incident = uuid.uuid4().hex[:12]
        log.error("unexpected error in %s (incident %s)", method or "an RPC", incident, exc_info=exc)
        code = UNEXPECTED_CODE
        message = f"the server hit an unexpected error (incident {incident}); it has been logged"
    else:
        message = str(getattr(exc, "message", None) or exc) or code.name.lower()
    status = status_pb2.Status(code=code.value[0], message=wire.utf8(message))
    if isinstance(exc, E.InvalidArgument) and exc.violations:
        status.details.append(wire.bad_request(exc.violations))
    elif isinstance(exc, E.VersionMismatch):
        status.details.append(wire.mismatch_detail(exc))
    elif isinstance(exc, sandbox_errors.ArchiveError):
        status.details.append(wire.bad_request([E.FieldViolation("tar_chunk", str(exc))]))
    return rpc_status.to_status(status)
