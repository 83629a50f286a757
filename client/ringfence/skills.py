"""Skills behind a verification gate: a reusable tool sequence an agent may propose, but may
only reuse after someone else's fixtures have passed it in the sandbox.

    propose(skill)            -> proposed      (never retrievable)
    SkillTrials.run(id, fixtures)
      a fixture by the proposer              -> PermissionDenied, nothing recorded, nothing run
      each fixture: a FRESH run, the steps as ONE batch, finish_run
        every step executed, no error, expected substrings present  -> trial_passed
        otherwise                                                   -> trial_failed
      proposed, >= required_passes distinct fixtures passed, never failed -> promoted
      promoted and a trial of this call failed                            -> demoted (terminal)
    retrieve(query)           -> promoted skills only

Why the gate is shaped this way:
- A proposal cannot attest to itself. Whatever results or claims the proposer attached
  (`Skill.claims`) are stored for the record and never read: evidence only counts when
  someone other than the proposer wrote the fixture and the sandbox produced the result.
- Trials run through the control plane like any other call, so the skill is judged under
  the same schema, policy and path checks it will meet when reused: a step the policy denies
  can never pass, whatever the proposer says.
- One fresh run per fixture: a trial cannot lean on state a previous trial (or the proposer's
  own run) left behind, and each has its own audit trail on the server (its run id is in the
  trial event).
- A version that ever failed a trial is never promoted, and a demoted one never comes back:
  steps are immutable per version, so a fix is a new proposal (a new version) with its own
  trials. Passing fixtures cannot outvote a failing one.
- The event log is the truth: status is derived from it, never stored beside it. SQLite
  triggers refuse UPDATE and DELETE on the events and on the skill definitions (what was
  trialled is exactly what is retrieved); each promotion names the definition's digest and
  retrieval checks it.

This module is part of the client SDK: stdlib, ringfence.errors, ringfence.model and other
ringfence modules only.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import re
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from ringfence.errors import (
    ControlError,
    FailedPrecondition,
    Internal,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from ringfence.model import Observation, ObservationStatus, ProposedCall
from ringfence.turns import canonical_json, plain

__all__ = [
    "Fixture",
    "Skill",
    "SkillEvent",
    "SkillEventKind",
    "SkillLibrary",
    "SkillRecord",
    "SkillStatus",
    "SkillStep",
    "SkillTrials",
    "TrialClient",
    "TrialReport",
    "TrialResult",
]

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _frozen(value: Any) -> Any:
    """A read-only deep copy: a caller's later mutation cannot change a proposed skill."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _placeholders(value: Any) -> set[str]:
    if isinstance(value, str):
        return set(_PLACEHOLDER.findall(value))
    if isinstance(value, Mapping):
        return set().union(*(_placeholders(v) for v in value.values())) if value else set()
    if isinstance(value, (list, tuple)):
        return set().union(*(_placeholders(v) for v in value)) if value else set()
    return set()


def _fill(value: Any, inputs: Mapping[str, str]) -> Any:
    """One pass of placeholder substitution in string values (never in keys). A regex, not
    str.format: an input is inserted verbatim, is never itself expanded, and cannot reach
    attributes (`{0.__class__}`)."""
    if isinstance(value, str):
        def one(m: re.Match[str]) -> str:
            if m.group(1) not in inputs:
                raise ValueError(f"no input for parameter {m.group(1)!r}")
            return str(inputs[m.group(1)])
        return _PLACEHOLDER.sub(one, value)
    if isinstance(value, Mapping):
        return {k: _fill(v, inputs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_fill(v, inputs) for v in value]
    return value


def _same_principal(a: str, b: str) -> bool:
    """Names compared as people would: "Demo-Agent " is demo-agent."""
    return a.strip().casefold() == b.strip().casefold()


def _refuse_self_attestation(proposer: str, author: str, fixture: str) -> None:
    """The one self-attestation rule, checked before any trial runs and again when a trial is
    recorded: a fixture is evidence only when its author is not the skill's proposer."""
    if _same_principal(proposer, author):
        raise PermissionDenied(
            f"fixture {fixture!r} is by {author!r}, the skill's proposer: a proposal cannot attest to itself")


# -- the skill -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SkillStep:
    """One tool call of a skill. String values of `arguments` (at any depth) may hold
    `{param}` placeholders, filled from a fixture's or a user's inputs."""

    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.tool:
            raise ValueError("a skill step needs a tool")
        object.__setattr__(self, "arguments", _frozen(self.arguments))

    def as_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": plain(self.arguments)}


@dataclass(frozen=True)
class Skill:
    """A reusable tool sequence, as its proposer describes it."""

    name: str
    description: str
    steps: tuple[SkillStep, ...]
    params: tuple[str, ...] = ()
    """Every placeholder the steps use, and nothing else."""
    proposer: str = ""
    """Who proposed it (the agent's subject); its fixtures never count."""
    claims: Mapping[str, Any] = field(default_factory=dict)
    """Whatever the proposer says about the skill ("tested", results, ...): kept for the
    record, NEVER read by the gate."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "claims", _frozen(self.claims))
        if not self.name.strip():
            raise ValueError("a skill needs a name")
        if not self.proposer.strip():
            raise ValueError("a skill needs a proposer")
        if not self.steps:
            raise ValueError("a skill needs at least one step")
        if len(set(self.params)) != len(self.params):
            raise ValueError("a skill's params are distinct")
        used = _placeholders([s.arguments for s in self.steps])
        if used != set(self.params):
            raise ValueError(f"the steps use placeholders {sorted(used)}; params declare {sorted(self.params)}")

    def instantiate(self, inputs: Mapping[str, str]) -> list[ProposedCall]:
        """The steps as calls, placeholders filled; call ids step-1, step-2, ... A missing or
        unknown input is a ValueError."""
        unknown = set(inputs) - set(self.params)
        if unknown:
            raise ValueError(f"inputs {sorted(unknown)} are not params of skill {self.name!r}")
        missing = set(self.params) - set(inputs)
        if missing:
            raise ValueError(f"skill {self.name!r} needs inputs {sorted(missing)}")
        return [ProposedCall(f"step-{i}", s.tool, _fill(plain(s.arguments), inputs))
                for i, s in enumerate(self.steps, 1)]

    def definition(self) -> dict[str, Any]:
        """What is trialled and reused (claims are not part of it)."""
        return {"name": self.name, "description": self.description, "params": list(self.params),
                "proposer": self.proposer, "steps": [s.as_json() for s in self.steps]}

    def digest(self) -> str:
        return hashlib.sha256(canonical_json(self.definition()).encode()).hexdigest()


# -- the library ---------------------------------------------------------------------------


class SkillStatus(enum.StrEnum):
    PROPOSED = "proposed"
    PROMOTED = "promoted"
    DEMOTED = "demoted"


class SkillEventKind(enum.StrEnum):
    PROPOSED = "proposed"
    TRIAL_PASSED = "trial_passed"
    TRIAL_FAILED = "trial_failed"
    PROMOTED = "promoted"
    DEMOTED = "demoted"


# The status an event leaves the skill in (None: unchanged), and the statuses it may follow.
_EFFECT: dict[SkillEventKind, SkillStatus | None] = {
    SkillEventKind.PROPOSED: SkillStatus.PROPOSED,
    SkillEventKind.TRIAL_PASSED: None,
    SkillEventKind.TRIAL_FAILED: None,
    SkillEventKind.PROMOTED: SkillStatus.PROMOTED,
    SkillEventKind.DEMOTED: SkillStatus.DEMOTED,
}
_ALLOWED_FROM: dict[SkillEventKind, frozenset[SkillStatus | None]] = {
    SkillEventKind.PROPOSED: frozenset({None}),
    SkillEventKind.TRIAL_PASSED: frozenset({SkillStatus.PROPOSED, SkillStatus.PROMOTED}),
    SkillEventKind.TRIAL_FAILED: frozenset({SkillStatus.PROPOSED, SkillStatus.PROMOTED}),
    SkillEventKind.PROMOTED: frozenset({SkillStatus.PROPOSED}),
    SkillEventKind.DEMOTED: frozenset({SkillStatus.PROMOTED}),
}


@dataclass(frozen=True)
class SkillEvent:
    """One status fact: never updated, never deleted."""

    seq: int
    """Monotonic over the whole library."""
    skill_id: str
    kind: SkillEventKind
    actor: str
    """Who: the proposer, a fixture's author, or the trials' actor for promotion/demotion."""
    at: float
    reason: str
    data: Mapping[str, Any] = field(default_factory=dict)
    """Details: the fixture, its trial's run id, the definition's digest."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", SkillEventKind(self.kind))
        object.__setattr__(self, "data", _frozen(self.data))


def _status_of(events: Sequence[SkillEvent]) -> SkillStatus | None:
    status: SkillStatus | None = None
    for e in events:
        status = _EFFECT[e.kind] or status
    return status


@dataclass(frozen=True)
class SkillRecord:
    """A stored skill version and its status, as of when it was read."""

    skill_id: str
    version: int
    """1 for a name's first proposal; each re-proposal of the name is the next version."""
    skill: Skill
    status: SkillStatus
    digest: str
    proposed_at: float

    @property
    def name(self) -> str:
        return self.skill.name

    @property
    def description(self) -> str:
        return self.skill.description


_SCHEMA = """
CREATE TABLE IF NOT EXISTS skills (
    skill_id    TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    version     INTEGER NOT NULL,
    definition  TEXT NOT NULL,
    claims      TEXT NOT NULL,
    digest      TEXT NOT NULL,
    proposed_at REAL NOT NULL,
    UNIQUE (name, version)
);
CREATE TABLE IF NOT EXISTS skill_events (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    skill_id TEXT NOT NULL REFERENCES skills(skill_id),
    kind     TEXT NOT NULL CHECK (kind IN ('proposed','trial_passed','trial_failed','promoted','demoted')),
    actor    TEXT NOT NULL,
    at       REAL NOT NULL,
    reason   TEXT NOT NULL,
    data     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS skill_events_by_skill ON skill_events (skill_id, seq);
CREATE TRIGGER IF NOT EXISTS skill_events_no_update BEFORE UPDATE ON skill_events
BEGIN SELECT RAISE(ABORT, 'skill events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS skill_events_no_delete BEFORE DELETE ON skill_events
BEGIN SELECT RAISE(ABORT, 'skill events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS skills_no_update BEFORE UPDATE ON skills
BEGIN SELECT RAISE(ABORT, 'a proposed skill is immutable: propose a new version'); END;
CREATE TRIGGER IF NOT EXISTS skills_no_delete BEFORE DELETE ON skills
BEGIN SELECT RAISE(ABORT, 'a proposed skill is immutable: propose a new version'); END;
"""


class SkillLibrary:
    """Skills and their event log in one SQLite file. Each method opens its own connection,
    so a library may be shared by threads and processes; status decisions are taken inside
    an IMMEDIATE transaction with the event that records them."""

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = str(path)
        self._clock = clock
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:  # executescript commits on its own: the schema is one script, in one transaction
            db.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        finally:
            db.close()

    @contextlib.contextmanager
    def _tx(self, immediate: bool = False) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA foreign_keys = ON")
            db.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    # -- writing ---------------------------------------------------------------------------

    def propose(self, skill: Skill) -> SkillRecord:
        """Store a new version of `skill` as proposed. Its claims are kept, never trusted."""
        skill_id = "skill-" + uuid.uuid4().hex[:16]
        now = self._clock()
        definition = skill.definition()
        digest = skill.digest()
        with self._tx(immediate=True) as db:
            (last,) = db.execute("SELECT COALESCE(MAX(version), 0) FROM skills WHERE name = ?",
                                 (skill.name,)).fetchone()
            db.execute("INSERT INTO skills VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (skill_id, skill.name, last + 1, canonical_json(definition),
                        canonical_json(plain(skill.claims)), digest, now))
            self._append(db, skill_id, SkillEventKind.PROPOSED, skill.proposer,
                         f"proposed by {skill.proposer}", {"digest": digest, "version": last + 1})
        return self.get(skill_id)

    def _append(self, db: sqlite3.Connection, skill_id: str, kind: SkillEventKind, actor: str,
                reason: str, data: Mapping[str, Any]) -> None:
        """Append one event after checking it may follow the current status (inside the
        caller's transaction, so the check and the append are one step)."""
        status = _status_of(self._events(db, skill_id))
        if status not in _ALLOWED_FROM[kind]:
            raise FailedPrecondition(f"skill {skill_id} is {status}: {kind.value} cannot follow")
        db.execute("INSERT INTO skill_events (skill_id, kind, actor, at, reason, data) VALUES (?, ?, ?, ?, ?, ?)",
                   (skill_id, kind.value, actor, self._clock(), reason, canonical_json(plain(data))))

    def _record_trials(self, skill_id: str, results: Sequence[TrialResult], *, actor: str,
                       required_passes: int) -> None:
        """Record finished trials and the decision they lead to, in one transaction: promote a
        proposed version that has `required_passes` distinct passing fixtures and no failure
        ever; demote a promoted one that failed any of these trials."""
        with self._tx(immediate=True) as db:
            record = self._record(db, skill_id)
            for r in results:
                _refuse_self_attestation(record.skill.proposer, r.author, r.fixture)
                kind = SkillEventKind.TRIAL_PASSED if r.passed else SkillEventKind.TRIAL_FAILED
                reason = "every step executed as expected" if r.passed else r.reason
                self._append(db, skill_id, kind, r.author, reason,
                             {"fixture": r.fixture, "run_id": r.run_id, "digest": record.digest})
            events = self._events(db, skill_id)
            status = _status_of(events)
            failed_now = [r.fixture for r in results if not r.passed]
            if status is SkillStatus.PROMOTED and failed_now:
                self._append(db, skill_id, SkillEventKind.DEMOTED, actor,
                             f"a promoted skill failed trial(s) {failed_now}", {"digest": record.digest})
            elif status is SkillStatus.PROPOSED:
                if any(e.kind is SkillEventKind.TRIAL_FAILED for e in events):
                    return
                passed = sorted({e.data["fixture"] for e in events if e.kind is SkillEventKind.TRIAL_PASSED})
                if len(passed) >= required_passes:
                    self._append(db, skill_id, SkillEventKind.PROMOTED, actor,
                                 f"{len(passed)} independent fixtures passed in the sandbox: {passed}",
                                 {"fixtures": passed, "digest": record.digest})

    # -- reading ---------------------------------------------------------------------------

    @staticmethod
    def _events(db: sqlite3.Connection, skill_id: str) -> list[SkillEvent]:
        rows = db.execute("SELECT seq, skill_id, kind, actor, at, reason, data FROM skill_events "
                          "WHERE skill_id = ? ORDER BY seq", (skill_id,)).fetchall()
        return [SkillEvent(seq, sid, kind, actor, at, reason, json.loads(data))
                for seq, sid, kind, actor, at, reason, data in rows]

    def _record(self, db: sqlite3.Connection, skill_id: str) -> SkillRecord:
        row = db.execute("SELECT skill_id, version, definition, claims, digest, proposed_at FROM skills "
                         "WHERE skill_id = ?", (skill_id,)).fetchone()
        if row is None:
            raise NotFound(f"no skill {skill_id}")
        sid, version, definition, claims, digest, proposed_at = row
        d = json.loads(definition)
        skill = Skill(name=d["name"], description=d["description"],
                      steps=tuple(SkillStep(s["tool"], s["arguments"]) for s in d["steps"]),
                      params=tuple(d["params"]), proposer=d["proposer"], claims=json.loads(claims))
        if skill.digest() != digest:
            raise Internal(f"skill {skill_id}: its stored definition does not match its digest")
        status = _status_of(self._events(db, skill_id))
        assert status is not None, "every stored skill has its proposed event (same transaction)"
        return SkillRecord(sid, version, skill, status, digest, proposed_at)

    def get(self, skill_id: str) -> SkillRecord:
        """Any version, whatever its status (NotFound if there is none)."""
        with self._tx() as db:
            return self._record(db, skill_id)

    def events(self, skill_id: str) -> list[SkillEvent]:
        """The skill's event log, oldest first."""
        with self._tx() as db:
            self._record(db, skill_id)
            return self._events(db, skill_id)

    def retrieve(self, query: str) -> list[SkillRecord]:
        """PROMOTED skills whose name or description holds every word of `query` (case
        insensitive), newest version first. Proposed and demoted skills are never returned,
        nor one whose promotion names another definition than the one stored."""
        words = [w.casefold() for w in query.split()]
        found: list[SkillRecord] = []
        with self._tx() as db:
            ids = [r[0] for r in db.execute("SELECT skill_id FROM skills ORDER BY name, version DESC")]
            for skill_id in ids:
                record = self._record(db, skill_id)
                if record.status is not SkillStatus.PROMOTED:
                    continue
                promoted = [e for e in self._events(db, skill_id) if e.kind is SkillEventKind.PROMOTED][-1]
                if promoted.data.get("digest") != record.digest:
                    continue
                text = f"{record.skill.name} {record.skill.description}".casefold()
                if all(w in text for w in words):
                    found.append(record)
        return found


# -- trials --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fixture:
    """A reviewer's test of a skill: inputs for its params, and what each step must show."""

    name: str
    author: str
    """Who wrote it; never the skill's proposer."""
    inputs: Mapping[str, str] = field(default_factory=dict)
    expect_contains: Mapping[int, str] = field(default_factory=dict)
    """Step index (0-based) -> a substring the canonical JSON of that step's content must hold.
    Beyond it every step must be executed without an error."""

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("a fixture needs a name")
        if not self.author.strip():
            raise ValueError("a fixture needs an author")
        object.__setattr__(self, "inputs", MappingProxyType({str(k): str(v) for k, v in self.inputs.items()}))
        object.__setattr__(self, "expect_contains",
                           MappingProxyType({int(k): str(v) for k, v in self.expect_contains.items()}))


@dataclass(frozen=True)
class TrialResult:
    fixture: str
    author: str
    passed: bool
    run_id: str
    """The fresh run the trial ran in ("" if it could not start)."""
    reason: str = ""
    """Why it failed ("" when it passed)."""


@dataclass(frozen=True)
class TrialReport:
    skill_id: str
    results: tuple[TrialResult, ...]
    status_before: SkillStatus
    status: SkillStatus
    """After the trials were recorded."""

    @property
    def promoted(self) -> bool:
        return self.status_before is not SkillStatus.PROMOTED and self.status is SkillStatus.PROMOTED

    @property
    def demoted(self) -> bool:
        return self.status_before is not SkillStatus.DEMOTED and self.status is SkillStatus.DEMOTED

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)


class TrialRun(Protocol):
    """What trials read of a started run (a RunView)."""

    @property
    def run_id(self) -> str: ...


class TrialClient(Protocol):
    """What trials need of ringfence.Client."""

    def start_run(self, goal: str, run_id: str | None = None) -> TrialRun: ...
    def submit_batch(self, run_id: str, calls: Sequence[ProposedCall],
                     batch_id: str | None = None) -> list[Observation]: ...
    def finish_run(self, run_id: str) -> object: ...  # the run's view: only an `outcome`, if any, is read


# Faults of the infrastructure, not verdicts on the skill: they propagate, nothing is recorded.
_NOT_A_VERDICT = (Unavailable, Internal)


class SkillTrials:
    """Runs reviewers' fixtures against a skill in the sandbox and records what happened."""

    def __init__(self, client: TrialClient, library: SkillLibrary, *, required_passes: int = 2,
                 actor: str = "skill-trials") -> None:
        if required_passes < 1:
            raise ValueError("required_passes is at least 1")
        self.client = client
        self.library = library
        self.required_passes = required_passes
        self.actor = actor

    def run(self, skill_id: str, fixtures: Sequence[Fixture]) -> TrialReport:
        """Every fixture is checked before anything runs: a self-attesting fixture is
        PermissionDenied, a malformed one ValueError, and then nothing is run or recorded."""
        record = self.library.get(skill_id)
        if record.status is SkillStatus.DEMOTED:
            raise FailedPrecondition(f"skill {skill_id} was demoted: propose a new version")
        fixtures = list(fixtures)
        if not fixtures:
            raise ValueError("trials need at least one fixture")
        names = [f.name for f in fixtures]
        if len(set(names)) != len(names):
            raise ValueError(f"fixture names must be distinct: {names}")
        for f in fixtures:
            _refuse_self_attestation(record.skill.proposer, f.author, f.name)
        calls = {}
        for f in fixtures:
            calls[f.name] = record.skill.instantiate(f.inputs)
            bad = [i for i in f.expect_contains if not 0 <= i < len(calls[f.name])]
            if bad:
                raise ValueError(f"fixture {f.name!r} expects steps {bad}; the skill has {len(calls[f.name])}")
        results = tuple(self._trial(record, f, calls[f.name]) for f in fixtures)
        self.library._record_trials(skill_id, results, actor=self.actor, required_passes=self.required_passes)
        return TrialReport(skill_id, results, record.status, self.library.get(skill_id).status)

    def _trial(self, record: SkillRecord, fixture: Fixture, calls: list[ProposedCall]) -> TrialResult:
        def result(passed: bool, run_id: str, reason: str = "") -> TrialResult:
            return TrialResult(fixture.name, fixture.author, passed, run_id, reason)

        run = self.client.start_run(goal=f"skill trial {record.skill.name} / {fixture.name}", run_id=None)
        run_id = run.run_id
        try:
            try:
                observations = list(self.client.submit_batch(run_id, calls))
            except _NOT_A_VERDICT:
                raise
            except ControlError as e:  # the control plane refused the calls themselves
                return result(False, run_id, f"the batch was refused: {type(e).__name__}: {e}")
            reason = _judge(calls, observations, fixture)
        finally:
            finished = self._finish(run_id)
        if reason:
            return result(False, run_id, reason)
        if finished:
            return result(False, run_id, finished)
        return result(True, run_id)

    def _finish(self, run_id: str) -> str:
        """End the trial's run; a reason when it did not end as completed."""
        try:
            view = self.client.finish_run(run_id)
        except _NOT_A_VERDICT:
            raise
        except ControlError as e:
            cancel = getattr(self.client, "cancel_run", None)
            if cancel is not None:
                with contextlib.suppress(ControlError):
                    cancel(run_id)
            return f"the trial's run could not finish: {type(e).__name__}: {e}"
        outcome = getattr(view, "outcome", None)
        if outcome is not None and str(getattr(outcome, "value", outcome)) != "completed":
            return f"the trial's run ended {getattr(outcome, 'value', outcome)}"
        return ""


def _judge(calls: Sequence[ProposedCall], observations: Sequence[Observation], fixture: Fixture) -> str:
    """"" when every step ran as the fixture expects, else the first reason it did not."""
    if len(observations) != len(calls):
        return f"{len(calls)} steps, {len(observations)} observations"
    by_id = {o.call_id: o for o in observations}
    for index, call in enumerate(calls):
        o = by_id.get(call.call_id)
        if o is None:
            return f"step {index} ({call.tool}): no observation"
        if o.status is not ObservationStatus.EXECUTED or not o.executed:
            detail = f": {o.error}" if o.error else ""
            return f"step {index} ({call.tool}) was {o.status.value}, not executed{detail}"
        if o.error or o.error_class:
            return f"step {index} ({call.tool}) failed: {o.error_class or 'error'}: {o.error}"
        want = fixture.expect_contains.get(index)
        if want is not None and want not in canonical_json(o.content):
            return f"step {index} ({call.tool}): its content does not contain {want!r}"
    return ""
