"""The one table between control.errors and gRPC status codes, both directions.

The server turns a ControlError into a `google.rpc.Status` (code, message and, for
InvalidArgument, a `google.rpc.BadRequest` listing every field violation) carried in the
`grpc-status-details-bin` trailer; the client turns that back into the same ControlError
subclass. Nothing else in the code base chooses a status code.

An exception that is not a ControlError is a server fault, never the caller's: a bug. It is
logged with an incident id, counted, and answered INTERNAL — never a code that invites a retry
(UNAVAILABLE would make a client repeat a deterministic failure). No known error maps to
INTERNAL, so a client or a fuzz test that sees it has found a bug.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import cast

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]  # no stubs published
from grpc_status import rpc_status

from control import errors as E
from sandbox import errors as sandbox_errors

log = logging.getLogger(__name__)

__all__ = ["CODES", "UNEXPECTED_CODE", "bad_request", "code_for", "from_rpc_error", "to_grpc_status"]

# Most specific first is not needed: the lookup walks the exception's MRO.
CODES: Mapping[type[BaseException], grpc.StatusCode] = {
    E.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    E.NotFound: grpc.StatusCode.NOT_FOUND,
    E.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    E.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    E.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    E.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    E.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    E.Unavailable: grpc.StatusCode.UNAVAILABLE,
    # A safety net: the core translates sandbox errors itself, but should one escape, the
    # engine being unreachable is still "try again later" and a missing or unpinned image is
    # a deployment precondition, not the caller's fault.
    sandbox_errors.EngineError: grpc.StatusCode.UNAVAILABLE,
    sandbox_errors.SandboxError: grpc.StatusCode.FAILED_PRECONDITION,
    # An archive refused by sandbox.archive is the caller's input: its message names the
    # member. control.files turns it into InvalidArgument (field tar_chunk) itself; this entry
    # keeps one that escapes from becoming FAILED_PRECONDITION.
    sandbox_errors.ArchiveError: grpc.StatusCode.INVALID_ARGUMENT,
}

UNEXPECTED_CODE = grpc.StatusCode.INTERNAL

# Client side: the exception each code becomes; INTERNAL is a server fault (E.Internal). Codes
# the server never sends (UNKNOWN, DEADLINE_EXCEEDED, CANCELLED ...) stay grpc.RpcError.
_EXCEPTIONS: Mapping[grpc.StatusCode, type[E.ControlError]] = {
    **{code: exc for exc, code in CODES.items() if issubclass(exc, E.ControlError)},
    UNEXPECTED_CODE: E.Internal,
}


def code_for(exc: BaseException) -> grpc.StatusCode | None:
    """The status code of a known exception, or None for an unexpected one."""
    for klass in type(exc).__mro__:
        code = CODES.get(klass)
        if code is not None:
            return code
    return None


def _utf8(text: str) -> str:
    # Messages can quote what a client sent; a proto string (and grpc's details) must be UTF-8.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def bad_request(violations: Iterable[E.FieldViolation]) -> any_pb2.Any:
    detail = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=_utf8(v.field), description=_utf8(v.description))
            for v in violations
        ]
    )
    packed = any_pb2.Any()
    packed.Pack(detail)
    return packed


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
    status = status_pb2.Status(code=code.value[0], message=_utf8(message))
    if isinstance(exc, E.InvalidArgument) and exc.violations:
        status.details.append(bad_request(exc.violations))
    elif isinstance(exc, sandbox_errors.ArchiveError):
        status.details.append(bad_request([E.FieldViolation("tar_chunk", str(exc))]))
    return rpc_status.to_status(status)


def violations_of(status: status_pb2.Status) -> tuple[E.FieldViolation, ...]:
    found: list[E.FieldViolation] = []
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            detail.Unpack(br)
            found.extend(E.FieldViolation(v.field, v.description) for v in br.field_violations)
    return tuple(found)


def from_rpc_error(error: grpc.RpcError) -> Exception:
    """Client side: the ControlError a failed call stands for (or `error` itself if none)."""
    code: grpc.StatusCode | None = error.code() if hasattr(error, "code") else None
    if code is None:
        return error
    klass = _EXCEPTIONS.get(code)
    if klass is None:
        return error
    try:
        # grpc's errors are calls too (sync: a grpc.Call; aio: the same code/details/trailers).
        status = rpc_status.from_call(cast(grpc.Call, error))
    except ValueError:  # a details trailer that does not match the code/message
        status = None
    message = error.details() or code.name.lower()
    if klass is E.InvalidArgument:
        return E.InvalidArgument(message, violations_of(status) if status is not None else ())
    return klass(message)


