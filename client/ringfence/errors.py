"""The control plane's one exception hierarchy.

    ControlError(message)                 base; never raised itself
    ├── InvalidArgument(message, violations)   bad input, every field violation listed
    ├── NotFound                          unknown id, or one of another tenant (ids do not leak)
    ├── AlreadyExists
    ├── FailedPrecondition                e.g. a batch submitted to a finished run
    │   └── VersionMismatch               the server does not serve this client's version
    │                                     (ringfence/wire/version.py): what to upgrade, and how
    ├── Unauthenticated
    ├── PermissionDenied                  authenticated, wrong role
    ├── ResourceExhausted                 sizes, per-tenant concurrency, the event store's full disk
    ├── Unavailable                       the sandbox engine cannot be reached
    └── Internal                          a server fault (a bug), with an incident id: retrying
                                          will not help; never raised by the core on purpose
    ConfigError(key, message) < InvalidArgument   a bad config file; `key` is the dotted key

The table in ringfence/wire/status.py (extended by the server's edge) maps these to gRPC status
codes in one table; nothing in the
core knows about gRPC.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "AlreadyExists",
    "ConfigError",
    "ControlError",
    "FailedPrecondition",
    "FieldViolation",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "VersionMismatch",
]


@dataclass(frozen=True)
class FieldViolation:
    """One problem with one field; `field` is a dotted path such as `steps[2].arguments.amount`."""

    field: str
    description: str


class ControlError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(ControlError):
    def __init__(self, message: str, violations: Iterable[FieldViolation] = ()) -> None:
        super().__init__(message)
        self.violations: tuple[FieldViolation, ...] = tuple(violations)

    def __str__(self) -> str:
        if not self.violations:
            return self.message
        details = "; ".join(f"{v.field}: {v.description}" for v in self.violations)
        return f"{self.message} ({details})"


class NotFound(ControlError):
    pass


class AlreadyExists(ControlError):
    pass


class FailedPrecondition(ControlError):
    pass


class VersionMismatch(FailedPrecondition):
    """The server refused this client's version (the rule in ringfence/wire/version.py).

    `client_version` and `server_version` are the versions as the server saw them; `upgrade` says
    which side to upgrade, with the pip command. str() names both versions and the advice."""

    def __init__(self, message: str, client_version: str, server_version: str, upgrade: str) -> None:
        super().__init__(message)
        self.client_version = client_version
        self.server_version = server_version
        self.upgrade = upgrade

    def __str__(self) -> str:
        # Our server's message carries the advice; a message that does not (another server's
        # wording) still gets it, so the one line a user sees always says what to do.
        if not self.upgrade or self.upgrade in self.message:
            return self.message
        return f"{self.message}: {self.upgrade}"


class Unauthenticated(ControlError):
    pass


class PermissionDenied(ControlError):
    pass


class ResourceExhausted(ControlError):
    pass


class Unavailable(ControlError):
    pass


class Internal(ControlError):
    """What a client receives for a server fault: the message carries the incident id."""


class ConfigError(InvalidArgument):
    """A configuration value is wrong; `key` names it (`limits.max_steps`, `tenants.a.tokens[0]`)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"config {key}: {message}", (FieldViolation(key, message),))
        self.key = key

    def __str__(self) -> str:
        return self.message
