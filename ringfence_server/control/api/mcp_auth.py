"""The MCP listener's bearer tokens: read from the Authorization header, and checked against the
control plane itself (one authenticated RPC on its own gRPC listener), so the tenants' token
digests stay the single source of truth and the listener has no authority of its own.

A token is never logged nor kept: the cache is keyed by its SHA-256 digest, which is also the
identity a session is bound to (`token_digest`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ringfence.aio import AsyncClient
from ringfence.errors import PermissionDenied, Unauthenticated
from ringfence_server.control import config

__all__ = ["BearerError", "TokenCheck", "bearer_token", "token_digest"]

CACHE_TTL_S = 10.0  # a revoked token still opens requests this long: the price of not asking on each one
CACHE_MAX = 1024  # distinct digests remembered; beyond, the oldest go (a flood of made-up tokens)


class BearerError(ValueError):
    """The Authorization header is missing or is not `Bearer TOKEN`."""


def bearer_token(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer TOKEN` header value; BearerError otherwise."""
    if not authorization:
        raise BearerError("an Authorization: Bearer header is required")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token) or not token.isprintable():
        raise BearerError("the Authorization header must be 'Bearer TOKEN'")
    return token


def token_digest(token: str) -> str:
    """The identity of a token in this process (sessions, cache, logs): never the token itself."""
    return "sha256:" + config.token_digest(token)


@dataclass(frozen=True)
class _Verdict:
    known: bool
    at: float


class TokenCheck:
    """Whether the control plane knows a token, asked with a cheap authenticated RPC (ListTools) on
    its own listener and remembered for CACHE_TTL_S per token digest. `client(token)` makes the
    AsyncClient for one check (closed after it). A control plane that cannot answer raises
    (ringfence.errors.Unavailable, ...): a request is then refused as unavailable, not as
    unauthenticated, and the failure is not remembered."""

    def __init__(self, client: Callable[[str], AsyncClient], *, ttl_s: float = CACHE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._ttl_s = ttl_s
        self._clock = clock
        self._verdicts: dict[str, _Verdict] = {}

    async def known(self, token: str) -> bool:
        """True when the control plane authenticates `token` (whatever its role may do)."""
        digest = token_digest(token)
        now = self._clock()
        cached = self._verdicts.get(digest)
        if cached is not None and now - cached.at < self._ttl_s:
            return cached.known
        known = await self._ask(token)
        if len(self._verdicts) >= CACHE_MAX:
            # Dicts keep insertion order: the first entries are the oldest.
            for old in list(self._verdicts)[: CACHE_MAX // 4]:
                del self._verdicts[old]
        self._verdicts[digest] = _Verdict(known, now)
        return known

    async def _ask(self, token: str) -> bool:
        client = self._client(token)
        try:
            await client.list_tools()
        except Unauthenticated:
            return False
        except PermissionDenied:
            return True  # authenticated, only not allowed to list: its calls are refused by the server itself
        finally:
            await client.close()
        return True
