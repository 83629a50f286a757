"""The MCP listener's sessions: the MCP SDK's stateful Streamable HTTP session manager, with a bound
on the sessions each token holds open at once.

The SDK binds each session id to the principal of the request that created it (`scope["user"]`,
an AuthenticatedUser: mcp_http sets its client_id to the token's digest) and answers 404 to a
request for that session with another one, exactly as for a session that does not exist. It also
ends a session after its idle timeout, at DELETE and at shutdown; FrontDoor then finishes the
session's run.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

__all__ = ["TokenBoundSessions", "TooManySessions"]


class TooManySessions(Exception):
    """A token already holds its maximum of open sessions (the request is answered 429)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"this token already holds {limit} open MCP sessions; close one (DELETE) or wait "
                         "for one to time out")
        self.limit = limit


class TokenBoundSessions(StreamableHTTPSessionManager):
    """StreamableHTTPSessionManager with at most `per_token` open sessions per principal.

    The count is kept in the manager's own admission and discard steps (mcp==2.3.0's
    `_admit_session`, called under its session-creation lock, and `_discard_session`), so two
    concurrent initialize requests of one token cannot both pass the last free place. Over the
    bound, `_admit_session` raises TooManySessions before any response is sent; mcp_http answers it."""

    def __init__(self, app: Any, *, per_token: int, **kwargs: Any) -> None:
        if per_token <= 0:
            raise ValueError("per_token must be a positive number of sessions")
        super().__init__(app, **kwargs)
        for hook in ("_admit_session", "_discard_session", "_server_instances"):
            # Private hooks of the pinned SDK: fail at startup, not by silently losing the bound.
            if not hasattr(self, hook):
                raise RuntimeError(f"the MCP SDK's session manager has no {hook} (mcp==2.3.0 expected)")
        self.per_token = per_token
        self._open: Counter[str] = Counter()
        self._owner_of: dict[str, str] = {}

    def open_sessions(self, owner: str) -> int:
        """How many sessions `owner` (a token digest) holds open now."""
        return self._open[owner]

    async def end_all(self) -> None:
        """End every open session now (shutdown): each is forgotten and its transport terminated,
        so its server task ends and FrontDoor finishes its run."""
        for session_id, transport in list(self._server_instances.items()):
            await self._discard_session(session_id, transport)

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        owner = requestor["client_id"] if requestor is not None else ""
        if self._open[owner] >= self.per_token:
            raise TooManySessions(self.per_token)
        transport = super()._admit_session(requestor)
        if transport is not None and transport.mcp_session_id is not None:
            self._open[owner] += 1
            self._owner_of[transport.mcp_session_id] = owner
        return transport

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        # Called more than once for one session (DELETE, then its server task's end): counted once.
        owner = self._owner_of.pop(session_id, None)
        if owner is not None:
            self._open[owner] -= 1
            if self._open[owner] <= 0:
                del self._open[owner]
        await super()._discard_session(session_id, transport)
