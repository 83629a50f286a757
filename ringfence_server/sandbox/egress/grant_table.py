"""The egress proxy's per-call grants: who may use it, with which credential, on which socket.

    Grant        one call's right, from dispatch until completion: credential (hashed), allowlist,
                 ceilings and what it has used, its socket and open connections, its events
    GrantTable   the live grants by username; `prepare` checks a grant request from the host

Revocation and ceilings end a call's connections through `Grant.cut_all`. The table does no
socket I/O itself: the server starts and stops each grant's listener.

Stdlib only; runs inside the egress-proxy image as rfegress.grant_table.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .allowlist import HostPattern, parse_patterns
from .events import JSONObject, RequestEvent

if TYPE_CHECKING:  # annotations only: the table itself opens nothing
    import asyncio

SOCKET_NAME = "proxy.sock"
# A call's socket directory, as the host names it in a grant: one path component, no dots.
SOCKET_DIR = re.compile(r"[A-Za-z0-9_-]{8,64}")


class Abortable(Protocol):
    """An open connection's transport, as far as cutting it goes."""

    def abort(self) -> None: ...


class Closable(Protocol):
    """A grant's listening server, as far as stopping it goes."""

    def close(self) -> None: ...


def password_digest(password: str) -> bytes:
    """How a grant keeps its password (and how a presented one is compared)."""
    return hashlib.sha256(password.encode()).digest()


@dataclass(eq=False)
class Grant:
    """One call's right to use the proxy, from dispatch until completion."""

    call_id: str
    username: str
    password_sha256: bytes
    patterns: tuple[HostPattern, ...]
    max_bytes: int
    max_connections: int
    bytes_used: int = 0
    connections: int = 0
    revoked: bool = False
    cut_reason: str | None = None
    events: list[JSONObject] = field(default_factory=list)
    events_dropped: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    transports: dict[Abortable, RequestEvent] = field(default_factory=dict)
    """Open transport -> the event of its request."""
    socket_path: str | None = None
    """This call's own listening socket: every connection it accepts is this call's."""
    listener: Closable | None = field(default=None, repr=False)
    """The asyncio server on socket_path."""

    def cut_all(self, reason: str) -> None:
        self.cut_reason = self.cut_reason or reason
        for transport, ev in list(self.transports.items()):
            ev.cut = ev.cut or reason
            transport.abort()

    def close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self.socket_path:
            with contextlib.suppress(OSError):  # a later connect() finds nothing rather than a dead socket
                os.unlink(self.socket_path)

    def summary(self) -> JSONObject:
        return {"call_id": self.call_id, "events": list(self.events), "events_dropped": self.events_dropped,
                "bytes": self.bytes_used, "connections": self.connections}


class GrantTable:
    """The live grants, by username."""

    def __init__(self, calls_dir: str) -> None:
        self.calls_dir = calls_dir
        self._grants: dict[str, Grant] = {}

    def prepare(self, *, call_id: str, username: str, password: str, allow: list[str],
                max_bytes: int, max_connections: int, socket_dir: str) -> Grant:
        """A Grant for the host's request, checked (ValueError), not yet in the table.

        `socket_dir` names a directory the host made for this call under `calls_dir`; the
        proxy never creates directories, so a grant cannot make it write anywhere else."""
        if not username or not password or ":" in username:
            raise ValueError("username and password are required; ':' is not allowed in a username")
        if username in self._grants:
            raise ValueError(f"username {username!r} is already granted")
        if max_bytes < 0 or max_connections < 0:
            raise ValueError("ceilings must not be negative")
        if not isinstance(socket_dir, str) or not SOCKET_DIR.fullmatch(socket_dir):
            raise ValueError("socket_dir must be one name of 8-64 characters [A-Za-z0-9_-]")
        patterns = parse_patterns(allow)
        directory = os.path.join(self.calls_dir, socket_dir)
        if not os.path.isdir(directory) or os.path.islink(directory):
            raise ValueError(f"no call directory {socket_dir!r} under {self.calls_dir}")
        path = os.path.join(directory, SOCKET_NAME)
        if os.path.lexists(path) or any(g.socket_path == path for g in self._grants.values()):
            raise ValueError(f"call directory {socket_dir!r} is already in use")
        return Grant(call_id=str(call_id), username=username, password_sha256=password_digest(password),
                     patterns=patterns, max_bytes=int(max_bytes), max_connections=int(max_connections),
                     socket_path=path)

    def add(self, grant: Grant) -> None:
        if grant.username in self._grants:
            raise ValueError(f"username {grant.username!r} is already granted")
        self._grants[grant.username] = grant

    def get(self, username: str) -> Grant | None:
        return self._grants.get(username)

    def pop(self, username: str) -> Grant | None:
        return self._grants.pop(username, None)

    def by_username(self) -> Mapping[str, Grant]:
        """The live grants, read-only, for credential checks."""
        return self._grants

    def __len__(self) -> int:
        return len(self._grants)

    def __iter__(self) -> Iterator[Grant]:
        return iter(list(self._grants.values()))

    def listening(self) -> int:
        return sum(1 for g in self._grants.values() if g.listener is not None)
