"""The values of supervisor routing, as the server returns them and the SDK decodes them.

Stdlib only: the client SDK imports this module without any of the server's dependencies.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

__all__ = ["Decision", "Ticket"]


@dataclass(frozen=True)
class Ticket:
    """What is routed. The router sees only `symptom`; the specialist only `incident` and `service`."""

    id: str
    incident: str
    service: str
    symptom: str

    def digest(self) -> str:
        return hashlib.sha256(json.dumps([self.id, self.incident, self.service, self.symptom]).encode()).hexdigest()


@dataclass(frozen=True)
class Decision:
    """One routing decision: a revision of the ticket's routing record, never changed."""

    ticket_id: str
    correlation_id: str
    status: str
    route: str
    evidence: str
    reason: str
    version: int
    scope_digest: str
    taxonomy_version: str
    router_version: str
    specialist_version: str
    run_id: str
    decided_at: float
    replayed: bool = False
