"""The reference demo's skills scene: the agent proposes a skill, and it only becomes reusable
after a reviewer's fixtures pass it in fresh sandboxes.

    the agent proposes "read-incident" (one step: read_file /input/{file}), claiming it works
    retrieve("incident")                -> nothing: a proposal is not a skill yet
    the agent's own fixture             -> refused (a proposal cannot attest to itself)
    the reviewer's two fixtures         -> two fresh runs, one container each
    promoted; retrieve("incident")      -> the skill

The scene talks to the control plane only through the client; what the library decides it
decides from what the sandbox returned, never from what the agent said.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringfence.errors import PermissionDenied
from ringfence.skills import Fixture, Skill, SkillLibrary, SkillStatus, SkillStep, SkillTrials

__all__ = ["AGENT", "REVIEWER", "read_incident_skill", "reviewer_fixtures", "run_skill_scene"]

AGENT, REVIEWER = "demo-agent", "demo-reviewer"


def read_incident_skill() -> Skill:
    return Skill(
        name="read-incident",
        description="read an incident report from the read-only input folder",
        steps=(SkillStep("read_file", {"path": "/input/{file}"}),),
        params=("file",),
        proposer=AGENT,
        claims={"tested": True, "note": "works on my machine"},  # stored, never believed
    )


def reviewer_fixtures() -> list[Fixture]:
    return [
        Fixture("finds-the-incident-id", REVIEWER, {"file": "incident.md"}, {0: "INC-4471"}),
        Fixture("finds-the-customer", REVIEWER, {"file": "incident.md"}, {0: "acme-9"}),
    ]


def run_skill_scene(client: Any, library_path: str | Path, say: Callable[[str], None]) -> bool:
    """Play the scene against a running control plane (the demo tenant's agent token); True
    when every step went as described above."""
    library = SkillLibrary(library_path)
    trials = SkillTrials(client, library, required_passes=2)
    ok = True

    def check(condition: bool, what: str) -> None:
        nonlocal ok
        if not condition:
            ok = False
            say(f"   UNEXPECTED: {what}")

    record = library.propose(read_incident_skill())
    say(f"skill proposed  {record.name} v{record.version} ({record.skill_id}) by {AGENT}: "
        f"read_file /input/{{file}}; its claim {dict(record.skill.claims)} is not evidence")
    found = [r.skill_id for r in library.retrieve("incident")]
    say(f"   retrieve('incident') -> {'nothing' if record.skill_id not in found else found}: "
        f"a proposed skill is not retrievable")
    check(record.status is SkillStatus.PROPOSED and record.skill_id not in found, "a proposal was retrievable")

    events_before = len(library.events(record.skill_id))
    try:
        trials.run(record.skill_id, [Fixture("self-check", AGENT, {"file": "incident.md"}, {0: "INC-4471"})])
    except PermissionDenied as e:
        say(f"   {AGENT}'s own fixture refused: {e}")
        check(len(library.events(record.skill_id)) == events_before, "a refused fixture left an event")
    else:
        check(False, "a self-attesting fixture was accepted")

    fixtures = reviewer_fixtures()
    say(f"   {REVIEWER} writes {len(fixtures)} fixtures: "
        + "; ".join(f"{f.name} expects {list(f.expect_contains.values())}" for f in fixtures))
    report = trials.run(record.skill_id, fixtures)
    for r in report.results:
        say(f"   trial {r.fixture:<22} {'passed' if r.passed else 'FAILED'}  fresh run {r.run_id}"
            + (f"  ({r.reason})" if r.reason else ""))
    check(report.passed and len({r.run_id for r in report.results}) == len(fixtures),
          "the trials did not all pass in runs of their own")
    check(report.promoted, f"the skill is {report.status}, not promoted")
    found = [r.skill_id for r in library.retrieve("incident")]
    say(f"   {report.status.value}; retrieve('incident') -> "
        f"{f'read-incident v{record.version}' if record.skill_id in found else 'nothing'}")
    check(record.skill_id in found, "the promoted skill was not retrievable")
    kinds = [e.kind.value for e in library.events(record.skill_id)]
    say(f"   its events: {', '.join(kinds)}")
    return ok
