"""Second attack review, finding 1, across instances: two `ringfence serve` processes on ONE
real PostgreSQL, StartRun of one fresh run id through both at the same moment, many rounds.

- Two tenants (one through each instance): each gets a run of its own (its tenant and goal in
  StartRun, GetRun and WatchRun; one run_started in each log, under a store key of its own),
  and FinishRun works for both. Before the fix the second start folded the first tenant's
  run_started into its own run (5 of 5 rounds in the review).
- One tenant through both instances: exactly one run_started, and both answers carry the
  winner's goal (StartRun returns the existing run; before: two run_started, two goals).

The processes use the real engine for nothing but their start-up checks: no call is dispatched.
"""

from __future__ import annotations

import pytest
from run_race_support import one_tenant_round, start_at_once, started_events
from serve_support import Served

from ringfence import Client
from ringfence.model import RunOutcome, RunView
from ringfence_server.control.config import token_digest
from ringfence_server.control.store import open_store

pytestmark = pytest.mark.docker

ROUNDS = 8
TOKENS = {"acme": "race-acme-agent-token", "globex": "race-globex-agent-token"}


def write_config(path) -> None:
    path.write_text("".join(
        f"[tenants.{tenant}]\n"
        f'tokens = [{{ sha256 = "{token_digest(token)}", role = "agent", subject = "{tenant}-agent" }}]\n'
        for tenant, token in TOKENS.items()))


@pytest.fixture(scope="module")
def two_instances(pg_cluster, docker_client, tmp_path_factory):
    """Two serve processes on one fresh database: (their addresses, the database's URL)."""
    root = tmp_path_factory.mktemp("run-race")
    config = root / "ringfence.toml"
    write_config(config)
    database = pg_cluster.create_database()
    url = pg_cluster.url(database)
    served: list[Served] = []
    try:
        for n in (1, 2):
            served.append(Served(config, root / f"state-{n}", "--database-url", url))
        yield [s.address for s in served], url
    finally:
        for s in served:
            s.stop()
        pg_cluster.drop_database(database)


@pytest.fixture
def log(two_instances):
    """The shared database, read directly (what either instance wrote)."""
    store = open_store(two_instances[1])
    try:
        yield store
    finally:
        store.close()


def clients_for(pairs):
    clients = [Client(address, TOKENS[tenant]) for address, tenant in pairs]
    for client in clients:
        client.list_runs()  # connected before the race: the barrier is the only start signal
    return clients


def test_two_tenants_through_two_instances_each_get_a_run_of_their_own(two_instances, log):
    (one, two), _ = two_instances
    tenants = ("acme", "globex")
    clients = clients_for([(one, "acme"), (two, "globex")])
    try:
        for i in range(ROUNDS):
            run_id = f"across-{i}"
            goals = {t: f"{t}'s goal in round {i}" for t in tenants}
            answers = start_at_once(run_id, [(c, goals[t]) for c, t in zip(clients, tenants, strict=True)])
            for tenant, answer in zip(tenants, answers, strict=True):
                assert isinstance(answer, RunView), f"round {i}: {tenant}'s StartRun failed: {answer!r}"
                assert (answer.tenant, answer.goal) == (tenant, goals[tenant]), i
            # Each tenant reads its run through the OTHER instance too: the store decided it.
            for tenant, client in zip(tenants, clients_for([(two, "acme"), (one, "globex")]), strict=True):
                with client:
                    view = client.get_run(run_id)
                    assert (view.run_id, view.tenant, view.goal) == (run_id, tenant, goals[tenant]), i
                    assert [r.goal for r in client.list_runs() if r.run_id == run_id] == [goals[tenant]], i
            for tenant, client in zip(tenants, clients, strict=True):
                assert client.finish_run(run_id).outcome is RunOutcome.COMPLETED, (i, tenant)
                watched = list(client.watch_run(run_id, 0))  # ends after run_finished
                assert started_events(watched) == [(tenant, goals[tenant])], (i, tenant)
                assert {e.run_id for e in watched} == {run_id} and watched[-1].type == "run_finished"
            keys = {t: [k for k in log.runs(t) if k in (run_id, f"{t}/{run_id}")] for t in tenants}
            assert sorted(len(k) for k in keys.values()) == [1, 1], keys
            assert {k for [k] in keys.values()} in [{run_id, f"{t}/{run_id}"} for t in tenants], keys
            for tenant, [key] in keys.items():
                assert started_events(log.read(key)) == [(tenant, goals[tenant])], (i, key)
    finally:
        for client in clients:
            client.close()


def test_one_tenant_through_two_instances_gets_one_run_with_the_winners_goal(two_instances, log):
    addresses, _ = two_instances
    clients = clients_for([(address, "acme") for address in addresses])
    try:
        for i in range(ROUNDS):
            one_tenant_round(clients, log, i)
    finally:
        for client in clients:
            client.close()
