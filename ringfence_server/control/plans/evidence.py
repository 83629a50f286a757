"""The evidence stores: revisioned readings that plans are checked against.

Two stores per tenant, each a record kind in the event store (ringfence_server.control.store `records`, append-
only: a revision is never changed, a new reading is a new revision):

    executor   what the executor reads while running a plan; written by agents (and admins)
    verifier   what the verifier checks a report against; written and read only by verifiers
               (and admins), so an executor can neither plant the evidence that would confirm
               its own claims nor read it to tailor them

A store is never written by a tool: the sandboxed evidence tools get the one record they need
as data and return a judgement (see ringfence_server.control.plans.service).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ringfence.errors import FieldViolation, InvalidArgument, PermissionDenied
from ringfence.model import Principal, Role
from ringfence.plans import EvidenceRecord
from ringfence_server.control.store.base import EventStore, Record

__all__ = ["EVIDENCE_REF", "STORES", "EvidenceReading", "EvidenceStores", "check_ref"]

EXECUTOR, VERIFIER = "executor", "verifier"


@dataclass(frozen=True)
class StoreAccess:
    writers: frozenset[Role]
    readers: frozenset[Role]


STORES: Mapping[str, StoreAccess] = {
    EXECUTOR: StoreAccess(writers=frozenset({Role.AGENT, Role.ADMIN}),
                          readers=frozenset({Role.AGENT, Role.VERIFIER, Role.APPROVER, Role.ADMIN})),
    VERIFIER: StoreAccess(writers=frozenset({Role.VERIFIER, Role.ADMIN}),
                          readers=frozenset({Role.VERIFIER, Role.ADMIN})),
}

EVIDENCE_REF = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")
MAX_VALUE_CHARS = 200


def check_ref(ref: str, field: str, violations: list[FieldViolation]) -> None:
    if not ref:
        violations.append(FieldViolation(field, "is required"))
    elif not EVIDENCE_REF.fullmatch(ref):
        violations.append(FieldViolation(field, "must be 1-200 characters of [A-Za-z0-9_.:/-]"))


@dataclass(frozen=True)
class EvidenceReading:
    """One retrieval: the record found (or none) and when it was read."""

    store: str
    ref: str
    record: Record | None
    retrieved_at: float

    @property
    def value(self) -> str:
        return str(self.record.body.get("value", "")) if self.record else ""

    @property
    def revision(self) -> int:
        return self.record.revision if self.record else 0

    def as_tool_argument(self) -> dict[str, str | int] | None:
        """What the sandboxed evidence tool is given: the reading, or null when there is none."""
        return {"value": self.value, "revision": self.revision} if self.record else None


class EvidenceStores:
    def __init__(self, store: EventStore, clock: Callable[[], float]) -> None:
        self._store = store
        self._clock = clock

    @staticmethod
    def _access(p: Principal, store: str, write: bool) -> None:
        access = STORES.get(store)
        if access is None:
            raise InvalidArgument("unknown evidence store",
                                  [FieldViolation("store", f"must be one of {', '.join(sorted(STORES))}")])
        allowed = access.writers if write else access.readers
        if p.role not in allowed:
            verb = "writ" if write else "read"
            names = ", ".join(sorted(r.value for r in allowed))
            raise PermissionDenied(f"the {store} evidence store is {verb}able by {names} only; "
                                   f"this token is {p.role.value}")

    def put(self, p: Principal, store: str, ref: str, value: str) -> EvidenceRecord:
        self._access(p, store, write=True)
        v: list[FieldViolation] = []
        check_ref(ref, "evidence_ref", v)
        if not value:
            v.append(FieldViolation("value", "is required"))
        elif len(value) > MAX_VALUE_CHARS or not value.isprintable():
            v.append(FieldViolation("value", f"must be at most {MAX_VALUE_CHARS} printable characters"))
        if v:
            raise InvalidArgument("the evidence record is invalid; nothing was written", v)
        return _value(store, self._store.append_record(p.tenant, f"evidence:{store}", ref, {"value": value}, p.subject))

    def history(self, p: Principal, store: str, ref: str) -> list[EvidenceRecord]:
        self._access(p, store, write=False)
        v: list[FieldViolation] = []
        check_ref(ref, "evidence_ref", v)
        if v:
            raise InvalidArgument("bad evidence reference", v)
        return [_value(store, r) for r in self._store.read_records(p.tenant, f"evidence:{store}", ref)]

    def read(self, tenant: str, store: str, ref: str) -> EvidenceReading:
        """The latest revision now (the caller has already been authorized for the store)."""
        records = self._store.read_records(tenant, f"evidence:{store}", ref)
        return EvidenceReading(store, ref, records[-1] if records else None, float(self._clock()))

    def at_revision(self, tenant: str, store: str, ref: str, revision: int, retrieved_at: float) -> EvidenceReading:
        """A reading made earlier, rebuilt from the record's history (revisions never change)."""
        records = [r for r in self._store.read_records(tenant, f"evidence:{store}", ref) if r.revision == revision]
        return EvidenceReading(store, ref, records[0] if records else None, retrieved_at)


def _value(store: str, record: Record) -> EvidenceRecord:
    return EvidenceRecord(store, record.key, str(record.body.get("value", "")), record.revision, record.written_by,
                          record.at)
