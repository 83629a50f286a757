"""Second attack review, finding 1, in the store: creating a run (append with expected_seq=1) is
an insert-if-absent decided in the append's transaction, on both real stores (a SQLite file and
a PostgreSQL database; `target` of test_store_contract.py).

- A run id with events refuses a creating append with RunExists naming the holder's tenant,
  whoever creates (the same tenant, another one) and even while another instance holds the
  run's lease (a run being written reads as "exists", never as "busy"); nothing is appended.
- Of many creators of one run id at once, on two store objects (two instances), exactly one
  wins and every other one is told the winner's tenant.
"""

from __future__ import annotations

import threading

import pytest
from store_targets import HANG_GUARD_S

from ringfence_server.control.store import RunExists

CREATORS = 8
ROUNDS = 5


def create(store, run_id, tenant, goal="g"):
    return store.append(run_id, "run_started", {"tenant": tenant, "goal": goal}, expected_seq=1)


def test_creating_a_run_that_exists_is_refused_naming_its_tenant(target):
    s, other = target.open(), target.open()
    first = create(s, "r1", "acme", "the first")
    lease = other.acquire_lease("r1", "another-instance", 30)
    assert lease is not None
    for tenant in ("acme", "globex"):
        for store in (s, other):
            with pytest.raises(RunExists) as refused:
                create(store, "r1", tenant, "a second")
            assert refused.value.tenant == "acme" and "acme" not in str(refused.value)
    assert s.read("r1") == [first] and s.runs("globex") == []
    # A key nobody holds is created as before, and the winner's lease still writes it.
    assert create(s, "globex/r1", "globex").seq == 1
    assert other.append("r1", "note", {}, expected_seq=2, lease=lease).seq == 2


def contest(stores, run_id):
    """CREATORS creators of `run_id` at once, alternating between the stores and two tenants:
    what each one got (its event, or the exception)."""
    barrier = threading.Barrier(CREATORS)
    outcomes: list[object] = [None] * CREATORS

    def creator(i: int) -> None:
        try:
            barrier.wait(HANG_GUARD_S)
            outcomes[i] = create(stores[i % 2], run_id, ("acme", "globex")[i % 2], f"creator {i}")
        except BaseException as e:  # noqa: BLE001 - asserted by the test
            outcomes[i] = e

    threads = [threading.Thread(target=creator, args=(i,)) for i in range(CREATORS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD_S)
    return outcomes


def test_of_many_creators_of_one_run_id_exactly_one_wins(target):
    stores = [target.open(), target.open()]  # two instances
    for round_ in range(ROUNDS):
        run_id = f"contested-{round_}"
        outcomes = contest(stores, run_id)
        won = [o for o in outcomes if not isinstance(o, BaseException)]
        assert len(won) == 1, outcomes
        [event] = stores[0].read(run_id)
        assert event == won[0]
        refusals = [o for o in outcomes if isinstance(o, BaseException)]
        assert all(isinstance(o, RunExists) and o.tenant == event.data["tenant"] for o in refusals), refusals
