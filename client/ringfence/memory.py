"""Agent memory: what an agent keeps between turns and runs, behind a protocol, with SQLite.

Four kinds of memory (MemoryKind), because they age and are trusted differently:

    working     the current run's scratch: notes the agent takes while it works
    episodic    what happened in past runs: "run r-17 tried X and it failed"
    semantic    facts about the world: "the billing API is at /v2"
    procedural  how to do things: "to deploy, run the tests first, then tag"

Provenance. Every fact says where it came from: the run, the tool call (if any), a free-text
source, and whether that call EXECUTED in a sandbox. A denied, declined or deduplicated call
has a "result" that is not evidence of anything, so a fact built on it is marked
executed=False and recall(executed_only=True) leaves it out. Memory that forgets where it came
from is how an agent talks itself into believing its own guesses.

Corrections. correct() never overwrites: it stores a NEW fact that `supersedes` the old one
and stamps the old one `superseded_by`. Recall hides superseded facts by default (the agent
sees the corrected text only) but they stay in the store, so the history of what the agent
believed, and when, is auditable (include_superseded=True, facts()). Only the current head of
a chain can be corrected: correcting a superseded fact is refused (FailedPrecondition), since
it would fork the history into two "current" truths.

Deletion. forget() really deletes: the row is gone and, with `PRAGMA secure_delete=ON`, SQLite
overwrites the freed bytes, so the text cannot be read back out of the database file (the
rollback journal is kept in DELETE mode so no WAL holds a stale copy either). Ids of other
facts that pointed at the forgotten one (supersedes / superseded_by) are kept as they are: an
id is not content, and forgetting a correction must not silently revive the fact it retracted.

Tenancy. Every query is filtered by tenant in SQL; another tenant's fact id behaves exactly as
an unknown id (get: None, correct: NotFound, forget: False), so ids do not leak across tenants.
A Retriever only ever sees one tenant's candidates, and anything it returns that was not among
them is dropped. The agent loop is handed a TenantMemory (for_tenant), which cannot name any
other tenant at all.

This module is part of the client SDK: stdlib + ringfence.errors only.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from ringfence.errors import FailedPrecondition, FieldViolation, InvalidArgument, NotFound

__all__ = [
    "MAX_TEXT_CHARS",
    "Fact",
    "KeywordRetriever",
    "MemoryKind",
    "MemoryStore",
    "Provenance",
    "Retriever",
    "SqliteMemoryStore",
    "TenantMemory",
]

MAX_TEXT_CHARS = 8000
"""A fact is a note, not a document: longer text is refused rather than truncated."""


class MemoryKind(StrEnum):
    WORKING = "working"
    EPISODIC = "episodic"
    SEMANTIC = "semantic"
    PROCEDURAL = "procedural"


@dataclass(frozen=True)
class Provenance:
    """Where a fact came from."""

    run_id: str
    """The run that produced the fact."""
    call_id: str | None
    """The tool call whose result it is; None for a fact not tied to a call (e.g. the user's)."""
    executed: bool
    """Whether that call actually ran in a sandbox. False: the "result" is not evidence."""
    source: str = ""
    """Free text, e.g. "tool:read_file" or "user"."""


@dataclass(frozen=True)
class Fact:
    """One remembered fact, as stored."""

    id: str
    tenant: str
    kind: MemoryKind
    text: str
    provenance: Provenance
    created_at: float
    supersedes: str | None
    """The id of the fact this one corrects."""
    superseded_by: str | None
    """The id of the fact that corrected this one; set: not recalled by default."""


class Retriever(Protocol):
    """The seam for an index: rank one tenant's candidate facts for a query.

    Candidates come newest first. Return at most `limit` facts, best first; return only facts
    that are among the candidates (anything else is dropped by the store)."""

    def rank(self, query: str, facts: Sequence[Fact], limit: int) -> list[Fact]: ...


_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


class KeywordRetriever:
    """The default ranking: the number of distinct query words present in the fact's text.

    Ties go to the newest fact; a fact sharing no word with the query is never returned (a
    memory that answers every question with something answers none)."""

    def rank(self, query: str, facts: Sequence[Fact], limit: int) -> list[Fact]:
        wanted = _words(query)
        if not wanted or limit <= 0:
            return []
        scored = [(len(wanted & _words(f.text)), i, f) for i, f in enumerate(facts)]
        # Higher score, then newer, then earlier in the (newest-first) candidate order.
        scored = [s for s in scored if s[0] > 0]
        scored.sort(key=lambda s: (-s[0], -s[2].created_at, s[1]))
        return [f for _, _, f in scored[:limit]]


class MemoryStore(Protocol):
    """Agent memory, per tenant. See the module docstring for the semantics."""

    def remember(self, tenant: str, kind: MemoryKind | str, text: str, provenance: Provenance) -> Fact: ...

    def recall(
        self,
        tenant: str,
        query: str,
        *,
        kinds: Iterable[MemoryKind | str] | None = None,
        limit: int = 5,
        include_superseded: bool = False,
        executed_only: bool = False,
    ) -> list[Fact]: ...

    def correct(self, tenant: str, fact_id: str, text: str, provenance: Provenance) -> Fact: ...

    def forget(self, tenant: str, fact_id: str) -> bool: ...

    def get(self, tenant: str, fact_id: str) -> Fact | None: ...

    def facts(self, tenant: str, *, kinds: Iterable[MemoryKind | str] | None = None) -> list[Fact]: ...


# --- validation -------------------------------------------------------------------------------


def _check_tenant(tenant: Any, violations: list[FieldViolation]) -> None:
    if not isinstance(tenant, str) or not tenant:
        violations.append(FieldViolation("tenant", "a non-empty tenant is required"))


def _check_text(text: Any, violations: list[FieldViolation]) -> None:
    if not isinstance(text, str) or not text.strip():
        violations.append(FieldViolation("text", "a fact needs non-empty text"))
    elif len(text) > MAX_TEXT_CHARS:
        violations.append(FieldViolation("text", f"at most {MAX_TEXT_CHARS} characters, got {len(text)}"))


def _check_provenance(provenance: Any, violations: list[FieldViolation]) -> None:
    if not isinstance(provenance, Provenance):
        violations.append(FieldViolation("provenance", "a Provenance is required"))
        return
    # Read as `object`: a Provenance is a plain dataclass, and a caller that is not type-checked
    # can put anything in its fields; this is where that is caught.
    run_id: object = provenance.run_id
    call_id: object = provenance.call_id
    executed: object = provenance.executed
    source: object = provenance.source
    if not isinstance(run_id, str):
        violations.append(FieldViolation("provenance.run_id", "must be a string"))
    if call_id is not None and not isinstance(call_id, str):
        violations.append(FieldViolation("provenance.call_id", "must be a string or None"))
    if not isinstance(executed, bool):
        violations.append(FieldViolation("provenance.executed", "must be a bool"))
    if not isinstance(source, str):
        violations.append(FieldViolation("provenance.source", "must be a string"))


def _kind(value: Any, field: str, violations: list[FieldViolation]) -> MemoryKind | None:
    try:
        return MemoryKind(value)
    except ValueError:
        allowed = ", ".join(k.value for k in MemoryKind)
        violations.append(FieldViolation(field, f"unknown memory kind {value!r} (one of: {allowed})"))
        return None


def _kinds(values: Iterable[Any] | None, violations: list[FieldViolation]) -> list[MemoryKind] | None:
    if values is None:
        return None
    if isinstance(values, str):  # a bare "semantic" means one kind, not its letters
        values = [values]
    found = [_kind(v, f"kinds[{i}]", violations) for i, v in enumerate(values)]
    return [k for k in found if k is not None]


def _raise(violations: list[FieldViolation]) -> None:
    if violations:
        raise InvalidArgument("invalid memory request", violations)


# --- SQLite -----------------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memory_facts (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id             TEXT NOT NULL UNIQUE,
    tenant         TEXT NOT NULL,
    kind           TEXT NOT NULL,
    text           TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    call_id        TEXT,
    executed       INTEGER NOT NULL,
    source         TEXT NOT NULL,
    created_at     REAL NOT NULL,
    supersedes     TEXT,
    superseded_by  TEXT
);
CREATE INDEX IF NOT EXISTS memory_facts_tenant_kind ON memory_facts (tenant, kind);
"""

_COLUMNS = "id, tenant, kind, text, run_id, call_id, executed, source, created_at, supersedes, superseded_by"


def _fact(row: sqlite3.Row | tuple[Any, ...]) -> Fact:
    (id_, tenant, kind, text, run_id, call_id, executed, source, created_at, supersedes, superseded_by) = row
    return Fact(
        id=id_,
        tenant=tenant,
        kind=MemoryKind(kind),
        text=text,
        provenance=Provenance(run_id=run_id, call_id=call_id, executed=bool(executed), source=source),
        created_at=created_at,
        supersedes=supersedes,
        superseded_by=superseded_by,
    )


class SqliteMemoryStore:
    """MemoryStore on one SQLite file: one connection, one lock, safe to share between threads."""

    def __init__(
        self,
        path: str | Path,
        *,
        retriever: Retriever | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._retriever: Retriever = retriever if retriever is not None else KeywordRetriever()
        self._clock = clock
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = sqlite3.connect(str(path), check_same_thread=False)
        with self._lock:
            # secure_delete: freed bytes are zeroed, so forget() leaves no readable text behind.
            self._conn.execute("PRAGMA secure_delete=ON")
            # No WAL: a WAL file would hold a copy of deleted rows until a checkpoint.
            self._conn.execute("PRAGMA journal_mode=DELETE")
            with self._conn:
                self._conn.executescript(_SCHEMA)

    # -- lifecycle --

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> SqliteMemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise FailedPrecondition("the memory store is closed")
        return self._conn

    def for_tenant(self, tenant: str) -> TenantMemory:
        """A view bound to one tenant: what the agent loop is handed."""
        violations: list[FieldViolation] = []
        _check_tenant(tenant, violations)
        _raise(violations)
        return TenantMemory(self, tenant)

    # -- MemoryStore --

    def remember(self, tenant: str, kind: MemoryKind | str, text: str, provenance: Provenance) -> Fact:
        violations: list[FieldViolation] = []
        _check_tenant(tenant, violations)
        checked = _kind(kind, "kind", violations)
        _check_text(text, violations)
        _check_provenance(provenance, violations)
        _raise(violations)
        assert checked is not None
        with self._lock:
            db = self._db()
            with db:
                return self._insert(db, tenant, checked, text, provenance, supersedes=None)

    def recall(
        self,
        tenant: str,
        query: str,
        *,
        kinds: Iterable[MemoryKind | str] | None = None,
        limit: int = 5,
        include_superseded: bool = False,
        executed_only: bool = False,
    ) -> list[Fact]:
        violations: list[FieldViolation] = []
        _check_tenant(tenant, violations)
        wanted = _kinds(kinds, violations)
        query_value: object = query  # as object: checked for callers that are not type-checked
        if not isinstance(query_value, str):
            violations.append(FieldViolation("query", "must be a string"))
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            violations.append(FieldViolation("limit", "must be a positive integer"))
        _raise(violations)
        if wanted == []:  # kinds given, but empty: nothing can match
            return []
        sql = f"SELECT {_COLUMNS} FROM memory_facts WHERE tenant = ?"
        params: list[Any] = [tenant]
        if wanted is not None:
            sql += f" AND kind IN ({', '.join('?' * len(wanted))})"
            params.extend(k.value for k in wanted)
        if not include_superseded:
            sql += " AND superseded_by IS NULL"
        if executed_only:
            sql += " AND executed = 1"
        sql += " ORDER BY created_at DESC, seq DESC"
        with self._lock:
            candidates = [_fact(r) for r in self._db().execute(sql, params)]
        ranked = self._retriever.rank(query, candidates, limit)
        # The retriever is a seam, not a trust boundary: it cannot widen the candidate set.
        allowed: dict[object, Fact] = {f.id: f for f in candidates}  # object: looked up by whatever id came back
        out: list[Fact] = []
        for fact in ranked:
            known = allowed.pop(getattr(fact, "id", None), None)  # pop: each fact at most once
            if known is not None and known == fact:
                out.append(known)
        return out[:limit]

    def correct(self, tenant: str, fact_id: str, text: str, provenance: Provenance) -> Fact:
        violations: list[FieldViolation] = []
        _check_tenant(tenant, violations)
        _check_text(text, violations)
        _check_provenance(provenance, violations)
        _raise(violations)
        with self._lock:
            db = self._db()
            old = self._get(db, tenant, fact_id)
            if old is None:
                raise NotFound(f"no fact {fact_id!r}")
            if old.superseded_by is not None:
                raise FailedPrecondition(
                    f"fact {fact_id!r} was already corrected by {old.superseded_by!r}; correct that one"
                )
            with db:
                new = self._insert(db, tenant, old.kind, text, provenance, supersedes=old.id)
                cur = db.execute(
                    "UPDATE memory_facts SET superseded_by = ? "
                    "WHERE tenant = ? AND id = ? AND superseded_by IS NULL",
                    (new.id, tenant, old.id),
                )
                if cur.rowcount != 1:  # cannot happen under the lock; never fork a chain silently
                    raise FailedPrecondition(f"fact {fact_id!r} changed while being corrected")
            return new

    def forget(self, tenant: str, fact_id: str) -> bool:
        violations: list[FieldViolation] = []
        _check_tenant(tenant, violations)
        _raise(violations)
        with self._lock:
            db = self._db()
            with db:
                cur = db.execute("DELETE FROM memory_facts WHERE tenant = ? AND id = ?", (tenant, fact_id))
            return cur.rowcount == 1

    def get(self, tenant: str, fact_id: str) -> Fact | None:
        violations: list[FieldViolation] = []
        _check_tenant(tenant, violations)
        _raise(violations)
        with self._lock:
            return self._get(self._db(), tenant, fact_id)

    def facts(self, tenant: str, *, kinds: Iterable[MemoryKind | str] | None = None) -> list[Fact]:
        """Every fact of the tenant, superseded ones included, oldest first: the audit view."""
        violations: list[FieldViolation] = []
        _check_tenant(tenant, violations)
        wanted = _kinds(kinds, violations)
        _raise(violations)
        if wanted == []:
            return []
        sql = f"SELECT {_COLUMNS} FROM memory_facts WHERE tenant = ?"
        params: list[Any] = [tenant]
        if wanted is not None:
            sql += f" AND kind IN ({', '.join('?' * len(wanted))})"
            params.extend(k.value for k in wanted)
        sql += " ORDER BY created_at ASC, seq ASC"
        with self._lock:
            return [_fact(r) for r in self._db().execute(sql, params)]

    # -- internals (caller holds the lock) --

    def _get(self, db: sqlite3.Connection, tenant: str, fact_id: Any) -> Fact | None:
        if not isinstance(fact_id, str) or not fact_id:
            return None
        row = db.execute(
            f"SELECT {_COLUMNS} FROM memory_facts WHERE tenant = ? AND id = ?", (tenant, fact_id)
        ).fetchone()
        return _fact(row) if row is not None else None

    def _insert(
        self,
        db: sqlite3.Connection,
        tenant: str,
        kind: MemoryKind,
        text: str,
        provenance: Provenance,
        *,
        supersedes: str | None,
    ) -> Fact:
        fact = Fact(
            id=f"fact-{uuid.uuid4().hex}",
            tenant=tenant,
            kind=kind,
            text=text,
            provenance=provenance,
            created_at=float(self._clock()),
            supersedes=supersedes,
            superseded_by=None,
        )
        db.execute(
            f"INSERT INTO memory_facts ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                fact.id,
                tenant,
                kind.value,
                text,
                provenance.run_id,
                provenance.call_id,
                1 if provenance.executed else 0,
                provenance.source,
                fact.created_at,
                supersedes,
                None,
            ),
        )
        return fact


@dataclass(frozen=True)
class TenantMemory:
    """One tenant's memory: the MemoryStore methods with the tenant already bound.

    The agent loop gets this, not the store, so no tool result or model output can steer it
    into another tenant's memory."""

    store: MemoryStore
    tenant: str

    def remember(self, kind: MemoryKind | str, text: str, provenance: Provenance) -> Fact:
        return self.store.remember(self.tenant, kind, text, provenance)

    def recall(
        self,
        query: str,
        *,
        kinds: Iterable[MemoryKind | str] | None = None,
        limit: int = 5,
        include_superseded: bool = False,
        executed_only: bool = False,
    ) -> list[Fact]:
        return self.store.recall(
            self.tenant,
            query,
            kinds=kinds,
            limit=limit,
            include_superseded=include_superseded,
            executed_only=executed_only,
        )

    def correct(self, fact_id: str, text: str, provenance: Provenance) -> Fact:
        return self.store.correct(self.tenant, fact_id, text, provenance)

    def forget(self, fact_id: str) -> bool:
        return self.store.forget(self.tenant, fact_id)

    def get(self, fact_id: str) -> Fact | None:
        return self.store.get(self.tenant, fact_id)

    def facts(self, *, kinds: Iterable[MemoryKind | str] | None = None) -> list[Fact]:
        return self.store.facts(self.tenant, kinds=kinds)
