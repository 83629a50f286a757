"""Bearer-token authentication and the role each RPC needs.

Tokens are configured per tenant as sha256 hex (config.tenants); the plaintext is never stored.
A request's token is hashed and compared with every configured digest using
`hmac.compare_digest`, without stopping at the first match, so neither the comparison nor the
position of a token in the table shows in the response time.

Only `/ringfence.v1.*` methods pass through here: the health and reflection services are
registered beside them and answer without a token, so generic tooling (load balancers,
grpcurl) works. A ringfence method missing from METHOD_ROLES is refused (fail closed); a unit
test checks that every method in the protos has an entry.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ringfence.errors import PermissionDenied, Unauthenticated
from ringfence.model import Principal, Role

if TYPE_CHECKING:
    from ringfence_server.control.config import TenantConfig

__all__ = ["METHOD_ROLES", "Authenticator", "TokenEntry", "bearer_digest", "find_by_digest"]

_ANY = frozenset(Role)
_AGENT = frozenset({Role.AGENT, Role.ADMIN})
_APPROVER = frozenset({Role.APPROVER, Role.ADMIN})
_VERIFIER = frozenset({Role.VERIFIER, Role.ADMIN})
_ACTORS = frozenset({Role.AGENT, Role.APPROVER, Role.ADMIN})

# Who may call what. Approvers can read runs (to judge a request in context) and cancel them, but not act in
# them; agents act but can never see or decide approvals, so an agent cannot approve itself.
# Verifiers read runs and verify reports but never act in a run (no remediation, no cancel).
# Evidence writes are open to agents and verifiers at the edge; which store each may write is
# the core's check (ringfence_server.control.plans.evidence.STORES), answered PERMISSION_DENIED all the same.
METHOD_ROLES: Mapping[str, frozenset[Role]] = {
    "/ringfence.v1.ToolService/ListTools": _ANY,
    "/ringfence.v1.RunService/StartRun": _AGENT,
    "/ringfence.v1.RunService/GetRun": _ANY,
    "/ringfence.v1.RunService/ListRuns": _ANY,
    "/ringfence.v1.RunService/FinishRun": _AGENT,
    "/ringfence.v1.RunService/CancelRun": _ACTORS,  # an approver may stop a run it distrusts
    "/ringfence.v1.RunService/SubmitBatch": _AGENT,
    "/ringfence.v1.RunService/ExecutePlan": _AGENT,
    "/ringfence.v1.RunService/WatchRun": _ANY,
    # Reads of a run's log and of its chain's integrity, like GetRun: anyone of the run's tenant.
    "/ringfence.v1.RunService/ListEvents": _ANY,
    "/ringfence.v1.RunService/VerifyRun": _ANY,
    # Who may submit may take back its own pending call (the core checks it is the proposer's).
    "/ringfence.v1.RunService/WithdrawApproval": _AGENT,
    "/ringfence.v1.ApprovalService/ListApprovals": _APPROVER,
    "/ringfence.v1.ApprovalService/GetApproval": _APPROVER,
    "/ringfence.v1.ApprovalService/WatchApprovals": _APPROVER,
    "/ringfence.v1.ApprovalService/DecideApproval": _APPROVER,
    "/ringfence.v1.PlanService/RunEvidencePlan": _AGENT,
    "/ringfence.v1.PlanService/VerifyReport": _VERIFIER,
    "/ringfence.v1.PlanService/GetPlan": _ANY,
    "/ringfence.v1.EvidenceService/PutEvidence": _ANY,
    "/ringfence.v1.EvidenceService/GetEvidence": _ANY,
    "/ringfence.v1.RoutingService/RouteTicket": _AGENT,
    "/ringfence.v1.RoutingService/GetRouting": _ANY,
    # A run's files are the run's: those who act in it (as StartRun and SubmitBatch). An approver
    # may also download, but only a run's declared artifacts (what it is asked to judge came
    # from them), never the workspace's working files: the core refuses that (PERMISSION_DENIED).
    "/ringfence.v1.FileService/UploadFiles": _AGENT,
    "/ringfence.v1.FileService/DownloadFiles": _ACTORS,
    # The caller's own tenant, subject and role: nothing its token does not already say.
    "/ringfence.v1.IdentityService/WhoAmI": _ANY,
}

T = TypeVar("T")

# Bearer tokens are opaque; this only bounds the work an absurd header can cause.
_MAX_TOKEN_CHARS = 4096


def bearer_digest(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The sha256 hex of the request's one `authorization: Bearer <token>` header (Unauthenticated
    without exactly one well-formed header). Also the workers' stream's (control.workers.hub)."""
    values = [v for k, v in (metadata or ()) if k.lower() == "authorization"]
    if not values:
        raise Unauthenticated("missing bearer token (metadata 'authorization: Bearer <token>')")
    if len(values) > 1:
        raise Unauthenticated("more than one authorization header")
    value = values[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > _MAX_TOKEN_CHARS:
        raise Unauthenticated("the authorization header must be 'Bearer <token>'")
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def find_by_digest(digest: str, table: Iterable[tuple[str, T]]) -> T | None:
    """What `table` (sha256 hex, value) holds for `digest`, compared with every entry whatever
    matches (no early exit: constant work whichever entry it is, or none)."""
    found: T | None = None
    for expected, value in table:
        if hmac.compare_digest(expected, digest):
            found = value
    return found


@dataclass(frozen=True)
class TokenEntry:
    sha256: str
    principal: Principal


class Authenticator:
    def __init__(self, entries: Iterable[TokenEntry]) -> None:
        self._entries: tuple[TokenEntry, ...] = tuple(entries)

    @classmethod
    def from_tenants(cls, tenants: Mapping[str, TenantConfig]) -> Authenticator:
        """From ringfence_server.control.config's `Config.tenants` (name -> TenantConfig(tokens=...))."""
        entries = []
        for name, tenant in tenants.items():
            for token in tenant.tokens:
                entries.append(TokenEntry(token.sha256, Principal(name, Role(token.role), token.subject)))
        return cls(entries)

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Principal:
        """The principal of the request's `authorization: Bearer <token>` header."""
        found = find_by_digest(bearer_digest(metadata), ((e.sha256, e.principal) for e in self._entries))
        if found is None:
            raise Unauthenticated("unknown bearer token")
        return found

    @staticmethod
    def authorize(principal: Principal, method: str) -> None:
        allowed = METHOD_ROLES.get(method)
        if allowed is None:
            raise PermissionDenied(f"{method} is not open to any role")
        if principal.role not in allowed:
            names = ", ".join(sorted(r.value for r in allowed))
            raise PermissionDenied(
                f"{method.rsplit('/', 1)[-1]} needs the role {names}; this token is {principal.role.value}")
