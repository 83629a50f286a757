"""Skills behind the verification gate, judged by the real server in real containers.

The witness of what ran is the sandbox backend itself (every request it was handed): proposing
and retrieving a skill hands it nothing, each trial is one request in a run of its own, and a
step the path policy denies never reaches it.
"""

from __future__ import annotations

import pytest
from recording_backend import RecordingBackend

from ringfence import Client
from ringfence.skills import Fixture, Skill, SkillEventKind, SkillLibrary, SkillStatus, SkillStep, SkillTrials
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.config import load_config
from ringfence_server.control.demo.skills_scene import run_skill_scene
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.store import SqliteEventStore

pytestmark = pytest.mark.docker

INCIDENT = """\
INC-4471  customer acme-9  severity 3

acme-9 was charged twice for order 7731 ($50 each) after a payment timeout.
"""


@pytest.fixture
def stack(tmp_path, backend):
    inputs = tmp_path / "input"
    inputs.mkdir()
    inputs.chmod(0o755)  # the sandbox user (10001) reads it through a read-only bind mount
    (inputs / "incident.md").write_text(INCIDENT)
    (inputs / "incident.md").chmod(0o644)
    config = load_config(overrides={"state_dir": str(tmp_path / "state"), "pool": {"size": 0},
                                    "inputs": {"/input": str(inputs)}})
    recording = RecordingBackend(backend)
    store = SqliteEventStore(config.db_path)
    orchestrator = Orchestrator.from_config(config, recording, store)
    try:
        with BackgroundServer(orchestrator, config) as server, Client(server.address, "demo-agent-token") as client:
            yield client, recording
    finally:
        orchestrator.close()
        store.close()


def read_skill() -> Skill:
    return Skill("read-incident", "read an incident report", (SkillStep("read_file", {"path": "/input/{file}"}),),
                 ("file",), "demo-agent", claims={"tested": True})


REVIEWED = [
    Fixture("incident-id", "demo-reviewer", {"file": "incident.md"}, {0: "INC-4471"}),
    Fixture("customer", "demo-reviewer", {"file": "incident.md"}, {0: "acme-9"}),
]


def test_a_skill_is_unretrievable_until_its_sandboxed_trials_pass(stack, tmp_path):
    client, recording = stack
    library = SkillLibrary(tmp_path / "skills.db")
    record = library.propose(read_skill())
    assert library.retrieve("incident") == []
    assert recording.count() == 0  # proposing and retrieving ran nothing

    report = SkillTrials(client, library).run(record.skill_id, REVIEWED)
    assert [(r.passed, r.reason) for r in report.results] == [(True, ""), (True, "")], report
    assert report.promoted and report.status is SkillStatus.PROMOTED
    assert [r.skill_id for r in library.retrieve("incident")] == [record.skill_id]

    # Fresh: one container per trial, each in a run of its own, the runs the events name.
    requests = recording.since(0)
    assert len(requests) == 2
    run_ids = [r.run_id for r in report.results]
    assert len(set(run_ids)) == 2
    assert [(sandbox_run.split(":", 1)[1], tool) for sandbox_run, _, tool in requests] == [
        (run_ids[0], "read_file"), (run_ids[1], "read_file")]
    trial_events = [e for e in library.events(record.skill_id) if e.kind is SkillEventKind.TRIAL_PASSED]
    assert [e.data["run_id"] for e in trial_events] == run_ids
    assert recording.sent("step-1") == [{"path": "/input/incident.md"}] * 2
    for run_id in run_ids:
        assert client.get_run(run_id).outcome.value == "completed"

    # Retrieving the promoted skill still runs nothing.
    library.retrieve("incident")
    assert recording.count() == 2


def test_a_step_outside_input_is_denied_never_runs_and_the_skill_stays_unretrievable(stack, tmp_path):
    client, recording = stack
    library = SkillLibrary(tmp_path / "skills.db")
    leaky = Skill("read-anything", "read any incident file", (SkillStep("read_file", {"path": "/etc/{file}"}),),
                  ("file",), "demo-agent", claims={"tested": True, "passes": 2})
    record = library.propose(leaky)
    report = SkillTrials(client, library).run(record.skill_id, [
        Fixture("passwd", "demo-reviewer", {"file": "passwd"}, {0: "root"}),
        Fixture("hosts", "demo-reviewer", {"file": "hosts"}),
    ])
    assert [r.passed for r in report.results] == [False, False]
    assert all("denied" in r.reason for r in report.results), report
    assert report.status is SkillStatus.PROPOSED and not report.promoted
    assert library.retrieve("incident") == [] and library.retrieve("") == []
    assert recording.count() == 0  # denied by path policy: nothing reached a container
    assert [e.kind for e in library.events(record.skill_id)] == [
        SkillEventKind.PROPOSED, SkillEventKind.TRIAL_FAILED, SkillEventKind.TRIAL_FAILED]


def test_the_skills_scene_plays_against_the_real_server(stack, tmp_path):
    client, recording = stack
    lines: list[str] = []
    assert run_skill_scene(client, tmp_path / "scene-skills.db", lines.append), "\n".join(lines)
    text = "\n".join(lines)
    assert "retrieve('incident') -> nothing" in text
    assert "own fixture refused" in text
    assert "promoted; retrieve('incident') -> read-incident v1" in text
    assert "UNEXPECTED" not in text
    assert recording.count() == 2  # two fresh trials; the refused fixture ran nothing
    assert len({sandbox_run for sandbox_run, _, _ in recording.since(0)}) == 2
