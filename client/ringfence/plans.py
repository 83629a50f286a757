"""The values of plan, execute, verify, as the server returns them and the SDK decodes them.

Stdlib only: the client SDK imports this module without any of the server's dependencies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["REMEDIATION", "Claim", "EvidenceRecord", "Mismatch", "PlanView", "Report", "Step", "Verdict"]

REMEDIATION = "none"
"""What a verdict starts: always nothing. A verifier judges; it never acts."""


@dataclass(frozen=True)
class EvidenceRecord:
    """One revision of an evidence record; revisions are never changed, a new one supersedes."""

    store: str
    evidence_ref: str
    value: str
    revision: int
    written_by: str
    written_at: float


@dataclass(frozen=True)
class Step:
    """One step of a plan: read the evidence at `evidence_ref`; `key` names the step."""

    key: str
    evidence_ref: str


@dataclass(frozen=True)
class Claim:
    """What the executor claims for one step, with the store revision and time it read."""

    key: str
    evidence_ref: str
    claim: str
    revision: int = 0
    retrieved_at: float = 0.0
    call_id: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "evidence_ref": self.evidence_ref, "claim": self.claim,
                "revision": self.revision, "retrieved_at": self.retrieved_at, "call_id": self.call_id}


@dataclass(frozen=True)
class Report:
    plan_id: str
    run_id: str
    claims: tuple[Claim, ...]


@dataclass(frozen=True)
class Mismatch:
    """Why the verifier did not accept one claim, with both sides' revisions and retrieval times."""

    key: str
    evidence_ref: str
    claim: str
    reason: str
    verifier_value: str = ""
    verifier_revision: int = 0
    executor_revision: int = 0
    executor_retrieved_at: float = 0.0
    verifier_retrieved_at: float = 0.0


@dataclass(frozen=True)
class Verdict:
    """One assessment of a report (1, 2, ... per plan); never changed once written."""

    plan_id: str
    assessment: int
    verified: bool
    reason: str
    mismatches: tuple[Mismatch, ...]
    verifier_revisions: Mapping[str, int]
    run_id: str
    at: float
    remediation: str = REMEDIATION


@dataclass(frozen=True)
class PlanView:
    plan_id: str
    max_steps: int
    steps: tuple[Step, ...]
    report: Report | None
    verdicts: tuple[Verdict, ...]
