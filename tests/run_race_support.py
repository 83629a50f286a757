"""StartRun races for the tests of the second attack review, finding 1 (one run id, at once).

`start_at_once` releases several clients through one barrier, so that their StartRuns of one
run id reach the servers at the same moment; `started_events` is what a run's log says was
started in it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

from ringfence.model import Event, RunOutcome, RunStatus, RunView

HANG_GUARD_S = 60.0  # only so that a broken server fails instead of hanging; never a time assertion


class RunLog(Protocol):
    """What the tests read a run's log through: an event store."""

    def read(self, key: str) -> Iterable[Event]: ...

    def runs(self, tenant: str) -> Iterable[str]: ...


class Starter(Protocol):
    """What starts a run: a Client, or a test's adapter over the core."""

    def start_run(self, goal: str, run_id: str) -> RunView: ...


def start_at_once(run_id: str, starts: Sequence[tuple[Starter, str]]) -> list[RunView | BaseException]:
    """StartRun(goal, run_id) by every (client, goal) at once, each on a thread of its own; each
    one's answer, or the exception it raised."""
    barrier = threading.Barrier(len(starts))
    answers: list[RunView | BaseException] = [RuntimeError("never answered")] * len(starts)

    def run(i: int) -> None:
        client, goal = starts[i]
        try:
            barrier.wait(HANG_GUARD_S)
            answers[i] = client.start_run(goal, run_id)
        except BaseException as e:  # noqa: BLE001 - the test asserts on it
            answers[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(starts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD_S)
    assert not any(t.is_alive() for t in threads), "a StartRun never answered"
    return answers


def started_events(events: Iterable[Event]) -> list[tuple[str, str]]:
    """(tenant, goal) of every run_started among `events`: a run has exactly one."""
    return [(e.data["tenant"], e.data["goal"]) for e in events if e.type == "run_started"]


def one_tenant_round(clients: Sequence, log: RunLog, round_: int) -> None:
    """One round of one tenant starting one fresh run id through two servers at once: exactly
    one run_started, both answers the winner's run (its goal), one store key, and the run
    finished through one server is finished through the other."""
    run_id = f"same-tenant-{round_}"
    goals = [f"goal through instance {n} in round {round_}" for n in (1, 2)]
    outcomes = start_at_once(run_id, list(zip(clients, goals, strict=True)))
    answers = [a for a in outcomes if isinstance(a, RunView)]
    assert len(answers) == len(outcomes), f"round {round_}: {outcomes!r}"
    winner = answers[0].goal
    assert [a.goal for a in answers] == [winner, winner], f"round {round_}: two runs answered"
    assert winner in goals and {a.tenant for a in answers} == {"acme"}, round_
    assert started_events(log.read(run_id)) == [("acme", winner)], round_
    assert [k for k in log.runs("acme") if k.endswith(run_id)] == [run_id], round_
    assert clients[1].finish_run(run_id).outcome is RunOutcome.COMPLETED, round_
    view = clients[0].get_run(run_id)
    assert (view.goal, view.status) == (winner, RunStatus.FINISHED), round_
