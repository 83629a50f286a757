"""How the egress proxy ends a request: refused before upstream (Deny) or cut after (Cut).

Stdlib only; runs inside the egress-proxy image as rfegress.errors.
"""

from __future__ import annotations


class Deny(Exception):
    """Refuse the request: the client gets `status` with `reason` (X-Ringfence-Reason), and the
    request's event records both (and `detail`, when there is one)."""

    def __init__(self, status: int, reason: str, detail: str = "", *, address: str | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.detail = status, reason, detail
        self.address = address
        """The resolved address that was refused (address checks only), for the event."""


class Cut(Exception):
    """A ceiling or a revocation ended a connection that had been admitted."""
