"""Server-side sessions: the cookie holds a random id, never the token.

A browser gets an anonymous session on its first page (so the sign-in form has a CSRF token
too); signing in replaces it with a fresh one (a new id: an id planted before sign-in is worth
nothing after it) that holds the person's bearer token, a gRPC client opened with it, and who
the control plane says the token is (WhoAmI: tenant, principal, role). The
token lives here, in the console's memory, and is sent only to the control plane; no page, no
cookie and no log line carries it. A session ends when it is signed out, when it has been idle
for `idle_s`, or when the store is full and it is the least recently used. Anonymous sessions
(anyone may make one by loading the sign-in page) are capped apart: a flood of them evicts only
other anonymous ones, never a signed-in reviewer's.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ringfence import AsyncClient, Identity

__all__ = ["COOKIE", "Session", "SessionStore"]

COOKIE = "ringfence_console"
"""The session cookie's name (its value: the session id, 256 random bits)."""


@dataclass
class Session:
    session_id: str
    csrf: str
    """The token every state-changing form must carry (csrf.py compares it in constant time)."""
    last_seen: float
    client: AsyncClient | None = None
    """Opened with the signed-in person's token; None: not signed in."""
    identity: Identity | None = None
    """Who the control plane said this token is at sign-in (WhoAmI); None: not signed in. Its
    `principal` is what Approval.proposer names for the calls this person proposed (four eyes:
    those are another person's to decide)."""
    flash: list[str] = field(default_factory=list)
    """Messages for the next page shown (e.g. "approved apr-…")."""

    @property
    def signed_in(self) -> bool:
        return self.client is not None

    @property
    def role(self) -> str:
        """The token's role as the control plane named it ("approver", "admin"); "" signed out."""
        return self.identity.role.value if self.identity is not None else ""


class SessionStore:
    """Sessions by id, least recently used first; bounded in number and in idle time."""

    def __init__(self, *, idle_s: float = 8 * 3600, max_sessions: int = 1000, max_anonymous: int = 1000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s = idle_s
        self.max_sessions = max_sessions
        self.max_anonymous = max_anonymous
        self._clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._closing: list[AsyncClient] = []

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id (touched), or None."""
        if not session_id:
            return None
        self._expire()
        session = self._sessions.get(session_id)
        if session is None:
            return None
        session.last_seen = self._clock()
        self._sessions.move_to_end(session_id)
        return session

    def new(self, client: AsyncClient | None = None, identity: Identity | None = None) -> Session:
        """A new session under a new random id and CSRF token."""
        self._expire()
        signed_in = client is not None
        cap = self.max_sessions if signed_in else self.max_anonymous
        while sum(1 for x in self._sessions.values() if x.signed_in == signed_in) >= cap:
            oldest = next(x for x in self._sessions.values() if x.signed_in == signed_in)
            del self._sessions[oldest.session_id]
            self._retire(oldest)
        session = Session(session_id=secrets.token_urlsafe(32), csrf=secrets.token_urlsafe(32),
                          last_seen=self._clock(), client=client, identity=identity)
        self._sessions[session.session_id] = session
        return session

    def end(self, session: Session) -> None:
        """Sign out: the id is forgotten and the client (with the token) closed."""
        if self._sessions.pop(session.session_id, None) is not None:
            self._retire(session)

    def _expire(self) -> None:
        horizon = self._clock() - self.idle_s
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if oldest.last_seen >= horizon:
                break
            self._sessions.popitem(last=False)
            self._retire(oldest)

    def _retire(self, session: Session) -> None:
        if session.client is not None:
            self._closing.append(session.client)
            session.client = None

    async def close_retired(self) -> None:
        """Close the channels of the sessions that ended (called from the event loop)."""
        closing, self._closing = self._closing, []
        for client in closing:
            await client.close()

    async def close(self) -> None:
        """Every session ends (the console is stopping)."""
        for session in list(self._sessions.values()):
            self._retire(session)
        self._sessions.clear()
        await self.close_retired()

    def __len__(self) -> int:
        return len(self._sessions)
