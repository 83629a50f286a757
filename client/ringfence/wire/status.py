"""The table between ringfence.errors and gRPC status codes, and the client's way back.

The server answers a ControlError with its code, a message and, for InvalidArgument, a
`google.rpc.BadRequest` listing every field violation in the `grpc-status-details-bin` trailer
(ringfence_server.control.api.status builds that from this table, extended with its own
exceptions); a client turns it back into the same ControlError subclass here. A refused client
version (ringfence/wire/version.py) is FAILED_PRECONDITION with a `google.rpc.ErrorInfo` (reason
VERSION_MISMATCH, domain ringfence) that turns back into ringfence.errors.VersionMismatch. INTERNAL is
never a known error's code: a client that sees it has met a server fault (ringfence.errors.Internal).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]  # no stubs published
from grpc_status import rpc_status

from ringfence import errors as E
from ringfence.wire import version

__all__ = ["CODES", "UNEXPECTED_CODE", "bad_request", "from_rpc_error", "mismatch_detail", "mismatch_of", "utf8",
           "violations_of"]

# The lookup walks an exception's MRO, so subclasses need no entry of their own.
CODES: Mapping[type[E.ControlError], grpc.StatusCode] = {
    E.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    E.NotFound: grpc.StatusCode.NOT_FOUND,
    E.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    E.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    E.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    E.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    E.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    E.Unavailable: grpc.StatusCode.UNAVAILABLE,
}

UNEXPECTED_CODE = grpc.StatusCode.INTERNAL

# The exception each code becomes; INTERNAL is a server fault (E.Internal). Codes the server
# never sends (UNKNOWN, DEADLINE_EXCEEDED, CANCELLED ...) stay grpc.RpcError.
_EXCEPTIONS: Mapping[grpc.StatusCode, type[E.ControlError]] = {
    **{code: exc for exc, code in CODES.items()},
    UNEXPECTED_CODE: E.Internal,
}


def utf8(text: str) -> str:
    """`text` as valid UTF-8: messages can quote what a client sent, and a proto string (and
    grpc's details) must be UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def bad_request(violations: Iterable[E.FieldViolation]) -> any_pb2.Any:
    """The `google.rpc.BadRequest` detail listing `violations`, packed."""
    detail = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=utf8(v.field), description=utf8(v.description))
            for v in violations
        ]
    )
    packed = any_pb2.Any()
    packed.Pack(detail)
    return packed


def violations_of(status: status_pb2.Status) -> tuple[E.FieldViolation, ...]:
    found: list[E.FieldViolation] = []
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            detail.Unpack(br)
            found.extend(E.FieldViolation(v.field, v.description) for v in br.field_violations)
    return tuple(found)


def mismatch_detail(exc: E.VersionMismatch) -> any_pb2.Any:
    """The `google.rpc.ErrorInfo` detail of a refused client version, packed."""
    detail = error_details_pb2.ErrorInfo(
        reason=version.REASON, domain=version.DOMAIN,
        metadata={"client_version": utf8(exc.client_version), "server_version": utf8(exc.server_version),
                  "upgrade": utf8(exc.upgrade)})
    packed = any_pb2.Any()
    packed.Pack(detail)
    return packed


def mismatch_of(status: status_pb2.Status, message: str) -> E.VersionMismatch | None:
    """The VersionMismatch a FAILED_PRECONDITION's status carries, if its ErrorInfo says so."""
    for detail in status.details:
        if not detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            continue
        info = error_details_pb2.ErrorInfo()
        detail.Unpack(info)
        if info.reason != version.REASON or info.domain != version.DOMAIN:
            continue
        client, server = info.metadata.get("client_version", ""), info.metadata.get("server_version", "")
        upgrade = info.metadata.get("upgrade", "")
        if not upgrade:  # a server that did not say: the rule's own advice, if both versions read
            try:
                upgrade = version.advice(server, client)
            except ValueError:
                upgrade = ""
        return E.VersionMismatch(message, client, server, upgrade)
    return None


def from_rpc_error(error: grpc.RpcError) -> Exception:
    """The ControlError a failed call stands for (or `error` itself if none)."""
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
    if klass is E.FailedPrecondition and status is not None:
        mismatch = mismatch_of(status, message)
        if mismatch is not None:
            return mismatch
    return klass(message)
