"""Skills behind the verification gate (ringfence.skills), against a fake client.

The fake answers each batch from a table of canned observations and records every call it
was given, so "nothing ran" and "each trial ran in its own run" are facts the tests can read.
"""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

from ringfence.errors import FailedPrecondition, NotFound, PermissionDenied, Unavailable
from ringfence.model import Observation, ObservationStatus, ProposedCall
from ringfence.skills import (
    Fixture,
    Skill,
    SkillEventKind,
    SkillLibrary,
    SkillStatus,
    SkillStep,
    SkillTrials,
)

ROOT = Path(__file__).resolve().parents[2]


class FakeClient:
    """start_run / submit_batch / finish_run; read_file answers from `files`, echo echoes,
    a path outside /input is denied (as the server's path policy would)."""

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self.files = dict(files or {})
        self.log: list[tuple] = []
        self.fail_next_submit: Exception | None = None
        self._n = 0

    def start_run(self, goal, run_id=None):
        self._n += 1
        rid = f"run-{self._n}"
        self.log.append(("start_run", rid, goal, run_id))
        return SimpleNamespace(run_id=rid)

    def submit_batch(self, run_id, calls, batch_id=None):
        self.log.append(("submit_batch", run_id, [(c.call_id, c.tool, dict(c.arguments)) for c in calls]))
        if self.fail_next_submit is not None:
            e, self.fail_next_submit = self.fail_next_submit, None
            raise e
        return [self._observe(c) for c in calls]

    def finish_run(self, run_id):
        self.log.append(("finish_run", run_id))
        return SimpleNamespace(run_id=run_id, outcome="completed")

    def _observe(self, call: ProposedCall) -> Observation:
        if call.tool == "echo":
            return Observation(call.call_id, call.tool, ObservationStatus.EXECUTED, True, dict(call.arguments))
        path = call.arguments.get("path", "")
        if not path.startswith("/input/"):
            return Observation(call.call_id, call.tool, ObservationStatus.DENIED, False,
                               error="path outside the tool's roots", error_class="policy")
        if path not in self.files:
            return Observation(call.call_id, call.tool, ObservationStatus.EXECUTED, True,
                               error=f"no such file {path}", error_class="tool_error")
        return Observation(call.call_id, call.tool, ObservationStatus.EXECUTED, True, {"content": self.files[path]})

    def runs(self) -> list[str]:
        return [e[1] for e in self.log if e[0] == "start_run"]


INCIDENT = "INC-4471  customer acme-9  severity 3\n"


def read_skill(proposer="agent-1", **kw) -> Skill:
    return Skill(name=kw.pop("name", "read-incident"), description=kw.pop("description", "read an incident report"),
                 steps=(SkillStep("read_file", {"path": "/input/{file}"}),), params=("file",),
                 proposer=proposer, **kw)


def fixtures(author="reviewer") -> list[Fixture]:
    return [Fixture("id", author, {"file": "incident.md"}, {0: "INC-4471"}),
            Fixture("customer", author, {"file": "incident.md"}, {0: "acme-9"})]


@pytest.fixture
def library(tmp_path):
    return SkillLibrary(tmp_path / "skills.db")


@pytest.fixture
def client():
    return FakeClient({"/input/incident.md": INCIDENT})


def kinds(library, skill_id):
    return [e.kind for e in library.events(skill_id)]


# -- the status flow -----------------------------------------------------------------------


def test_a_skill_is_proposed_then_promoted_by_two_independent_passes(library, client):
    record = library.propose(read_skill())
    assert record.status is SkillStatus.PROPOSED and record.version == 1
    assert library.retrieve("incident") == []

    report = SkillTrials(client, library).run(record.skill_id, fixtures())
    assert report.passed and report.promoted and report.status is SkillStatus.PROMOTED
    assert [(r.fixture, r.passed, r.reason) for r in report.results] == [("id", True, ""), ("customer", True, "")]
    assert [r.skill_id for r in library.retrieve("incident")] == [record.skill_id]
    assert [r.skill_id for r in library.retrieve("READ report")] == [record.skill_id]  # every word, any case
    assert library.retrieve("invoice") == []
    assert kinds(library, record.skill_id) == [SkillEventKind.PROPOSED, SkillEventKind.TRIAL_PASSED,
                                              SkillEventKind.TRIAL_PASSED, SkillEventKind.PROMOTED]
    events = library.events(record.skill_id)
    assert [e.actor for e in events] == ["agent-1", "reviewer", "reviewer", "skill-trials"]
    assert [e.data.get("run_id") for e in events[1:3]] == [r.run_id for r in report.results]
    assert all(e.reason and e.at > 0 for e in events)


def test_each_trial_is_a_fresh_run_with_the_steps_as_one_batch(library, client):
    record = library.propose(read_skill())
    report = SkillTrials(client, library).run(record.skill_id, fixtures())
    assert client.runs() == ["run-1", "run-2"] == [r.run_id for r in report.results]
    assert [e[0] for e in client.log] == ["start_run", "submit_batch", "finish_run"] * 2
    starts = [e for e in client.log if e[0] == "start_run"]
    assert [(goal, rid) for _, _, goal, rid in starts] == [
        ("skill trial read-incident / id", None), ("skill trial read-incident / customer", None)]
    batch = next(e for e in client.log if e[0] == "submit_batch")
    assert batch == ("submit_batch", "run-1", [("step-1", "read_file", {"path": "/input/incident.md"})])


def test_one_pass_is_not_enough(library, client):
    record = library.propose(read_skill())
    report = SkillTrials(client, library).run(record.skill_id, fixtures()[:1])
    assert report.passed and not report.promoted and report.status is SkillStatus.PROPOSED
    assert library.retrieve("incident") == []
    # The same fixture again is not a second independent pass.
    SkillTrials(client, library).run(record.skill_id, fixtures()[:1])
    assert library.get(record.skill_id).status is SkillStatus.PROPOSED
    # A different one is.
    assert SkillTrials(client, library).run(record.skill_id, fixtures()[1:]).promoted


def test_never_retrievable_until_promoted_whatever_the_proposer_claims(library, client):
    record = library.propose(read_skill(claims={"trials": "passed", "promoted": True, "status": "promoted"}))
    assert library.get(record.skill_id).skill.claims["trials"] == "passed"  # kept for the record
    assert library.get(record.skill_id).status is SkillStatus.PROPOSED
    assert library.retrieve("") == [] and library.retrieve("incident") == []
    assert client.log == []  # proposing and retrieving ran nothing


# -- self-attestation ----------------------------------------------------------------------


@pytest.mark.parametrize("author", ["agent-1", " Agent-1 "])
def test_a_proposal_cannot_attest_to_itself(library, client, author):
    record = library.propose(read_skill(proposer="agent-1"))
    before = library.events(record.skill_id)
    mixed = [fixtures()[0], Fixture("mine", author, {"file": "incident.md"}, {0: "INC-4471"})]
    with pytest.raises(PermissionDenied, match="cannot attest to itself"):
        SkillTrials(client, library).run(record.skill_id, mixed)
    assert library.events(record.skill_id) == before  # nothing recorded
    assert client.log == []  # nothing ran, not even the honest fixture
    assert library.get(record.skill_id).status is SkillStatus.PROPOSED


def test_self_attesting_fixtures_alone_never_promote(library, client):
    record = library.propose(read_skill(proposer="agent-1"))
    trials = SkillTrials(client, library, required_passes=1)
    with pytest.raises(PermissionDenied):
        trials.run(record.skill_id, fixtures(author="agent-1"))
    assert library.retrieve("incident") == []
    assert kinds(library, record.skill_id) == [SkillEventKind.PROPOSED]


# -- failures and demotion -----------------------------------------------------------------


def test_a_failed_trial_keeps_the_skill_proposed_and_blocks_promotion(library, client):
    record = library.propose(read_skill())
    wrong = Fixture("wrong", "reviewer", {"file": "incident.md"}, {0: "INC-9999"})
    report = SkillTrials(client, library).run(record.skill_id, [*fixtures(), wrong])
    assert not report.passed and not report.promoted and report.status is SkillStatus.PROPOSED
    assert [r.passed for r in report.results] == [True, True, False]
    assert "does not contain 'INC-9999'" in report.results[2].reason
    assert kinds(library, record.skill_id)[-1] is SkillEventKind.TRIAL_FAILED
    assert library.retrieve("incident") == []
    # A version that failed is never promoted by later passes: a fix is a new version.
    SkillTrials(client, library).run(record.skill_id, [Fixture("more", "reviewer-2", {"file": "incident.md"})])
    assert library.get(record.skill_id).status is SkillStatus.PROPOSED
    again = library.propose(read_skill())
    assert again.version == 2 and again.skill_id != record.skill_id
    assert SkillTrials(client, library).run(again.skill_id, fixtures()).promoted
    assert [r.skill_id for r in library.retrieve("incident")] == [again.skill_id]


@pytest.mark.parametrize("path, reason", [
    ("/etc/{file}", "was denied, not executed"),
    ("/input/missing-{file}", "failed: tool_error"),
])
def test_a_step_that_is_not_executed_cleanly_fails(library, client, path, reason):
    skill = Skill("leaky", "reads a file", (SkillStep("read_file", {"path": path}),), ("file",), "agent-1")
    record = library.propose(skill)
    report = SkillTrials(client, library).run(record.skill_id, [Fixture("f", "reviewer", {"file": "passwd"})])
    assert not report.passed and reason in report.results[0].reason
    assert report.status is SkillStatus.PROPOSED and library.retrieve("") == []
    assert client.log[-1] == ("finish_run", report.results[0].run_id)  # the trial's run is ended


def test_a_promoted_skill_that_fails_later_is_demoted_and_no_longer_retrievable(library, client):
    record = library.propose(read_skill())
    trials = SkillTrials(client, library)
    assert trials.run(record.skill_id, fixtures()).promoted
    client.files["/input/incident.md"] = "rewritten: nothing useful here"  # the world changed
    report = trials.run(record.skill_id, [Fixture("later", "reviewer-2", {"file": "incident.md"}, {0: "INC-4471"})])
    assert report.demoted and report.status is SkillStatus.DEMOTED
    assert library.retrieve("incident") == []
    assert kinds(library, record.skill_id)[-2:] == [SkillEventKind.TRIAL_FAILED, SkillEventKind.DEMOTED]
    with pytest.raises(FailedPrecondition, match="demoted"):  # terminal: propose a new version
        trials.run(record.skill_id, fixtures())


def test_an_infrastructure_fault_is_not_a_verdict(library, client):
    record = library.propose(read_skill())
    client.fail_next_submit = Unavailable("server gone")
    with pytest.raises(Unavailable):
        SkillTrials(client, library).run(record.skill_id, fixtures())
    assert kinds(library, record.skill_id) == [SkillEventKind.PROPOSED]
    assert client.log[-1][0] == "finish_run"  # the run it started is still ended


# -- the event log -------------------------------------------------------------------------


def test_events_are_append_only(library, client, tmp_path):
    record = library.propose(read_skill())
    SkillTrials(client, library).run(record.skill_id, fixtures())
    db = sqlite3.connect(tmp_path / "skills.db")
    try:
        for sql in ("UPDATE skill_events SET kind = 'proposed' WHERE kind = 'promoted'",
                    "DELETE FROM skill_events WHERE kind = 'trial_passed'",
                    "DELETE FROM skill_events"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                db.execute(sql)
        # The definition that was trialled is the one that is retrieved.
        with pytest.raises(sqlite3.IntegrityError, match="immutable"):
            db.execute("UPDATE skills SET definition = replace(definition, '/input/', '/etc/')")
        with pytest.raises(sqlite3.IntegrityError, match="immutable"):
            db.execute("DELETE FROM skills")
        db.rollback()
    finally:
        db.close()
    assert kinds(library, record.skill_id)[-1] is SkillEventKind.PROMOTED
    assert [e.seq for e in library.events(record.skill_id)] == sorted(e.seq for e in library.events(record.skill_id))


def test_status_is_derived_from_the_log_across_reopen(tmp_path, client):
    path = tmp_path / "skills.db"
    record = SkillLibrary(path).propose(read_skill())
    SkillTrials(client, SkillLibrary(path)).run(record.skill_id, fixtures())
    reopened = SkillLibrary(path)
    assert reopened.get(record.skill_id).status is SkillStatus.PROMOTED
    assert [r.skill_id for r in reopened.retrieve("incident")] == [record.skill_id]
    db = sqlite3.connect(path)
    cols = [r[1] for r in db.execute("PRAGMA table_info(skills)")]
    db.close()
    assert "status" not in cols  # no second truth beside the log


def test_unknown_skill(library):
    with pytest.raises(NotFound):
        library.get("skill-nope")
    with pytest.raises(NotFound):
        library.events("skill-nope")


# -- instantiate and validation ------------------------------------------------------------


def test_instantiate_fills_placeholders_once_and_verbatim():
    skill = Skill("two", "echo then read",
                  (SkillStep("echo", {"text": "about {who} and {who}", "n": 3, "nested": {"list": ["{who}"]}}),
                   SkillStep("read_file", {"path": "/input/{file}"})),
                  ("who", "file"), "agent-1")
    calls = skill.instantiate({"who": "{file}", "file": "a.md"})
    assert calls == [
        ProposedCall("step-1", "echo", {"text": "about {file} and {file}", "n": 3, "nested": {"list": ["{file}"]}}),
        ProposedCall("step-2", "read_file", {"path": "/input/a.md"}),
    ]
    with pytest.raises(ValueError, match="needs inputs"):
        skill.instantiate({"who": "x"})
    with pytest.raises(ValueError, match="not params"):
        skill.instantiate({"who": "x", "file": "y", "extra": "z"})


def test_a_skill_declares_exactly_the_placeholders_it_uses():
    with pytest.raises(ValueError, match="placeholders"):
        Skill("s", "d", (SkillStep("read_file", {"path": "/input/{file}"}),), (), "agent-1")
    with pytest.raises(ValueError, match="placeholders"):
        Skill("s", "d", (SkillStep("echo", {"text": "hi"}),), ("unused",), "agent-1")
    with pytest.raises(ValueError, match="proposer"):
        Skill("s", "d", (SkillStep("echo", {"text": "hi"}),), (), "")


def test_a_skill_is_a_copy_of_what_was_given():
    args = {"text": "hi"}
    skill = Skill("s", "d", (SkillStep("echo", args),), (), "agent-1")
    args["text"] = "changed"
    assert skill.instantiate({})[0].arguments["text"] == "hi"


def test_bad_fixtures_are_refused_before_anything_runs(library, client):
    record = library.propose(read_skill())
    trials = SkillTrials(client, library)
    with pytest.raises(ValueError, match="needs inputs"):
        trials.run(record.skill_id, [Fixture("a", "reviewer", {}), *fixtures()])
    with pytest.raises(ValueError, match="expects steps"):
        trials.run(record.skill_id, [Fixture("a", "reviewer", {"file": "x"}, {3: "y"})])
    with pytest.raises(ValueError, match="distinct"):
        trials.run(record.skill_id, [fixtures()[0], fixtures()[0]])
    assert client.log == [] and kinds(library, record.skill_id) == [SkillEventKind.PROPOSED]


def test_skills_module_keeps_the_sdk_import_boundary():
    tree = ast.parse((ROOT / "client/ringfence/skills.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    # The store of skills is local (SQLite): no grpc, nothing of the server, only the client's values.
    ours = {n for n in names if n.split(".")[0] in ("ringfence", "ringfence_server", "docker", "grpc")}
    assert ours <= {"ringfence.errors", "ringfence.model", "ringfence.turns"}, ours
