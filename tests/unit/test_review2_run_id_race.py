"""Second attack review, finding 1: StartRun of one fresh run id by several callers at once.

Through real servers (a real gRPC port on loopback, the real Orchestrator, a real SQLite file,
a FakeBackend: no call here reaches a sandbox), many rounds, each caller released by one
barrier:

- two tenants start the same id on one server: each gets a run of its own (its own tenant and
  goal in StartRun, GetRun and WatchRun, one run_started in each log, under a store key of its
  own) and FinishRun works for both. Before the fix the second start folded the first tenant's
  run_started into its run: one tenant's GetRun showed the other's goal, both logs held two
  run_started, FinishRun said "belongs to another tenant".
- one tenant starts the same id through two instances on one SQLite file: exactly one
  run_started, and both answers carry the winner's goal (StartRun returns the existing run).
- with a workspace asked for (beside the real-part tests: the core called directly, the engine's
  workspaces faked, the SQLite log real): whichever start wins, each run's workspace is made
  once (one workspace_created in its log), for each tenant under its own run.

The same races on PostgreSQL with two `ringfence serve` processes:
tests/e2e/test_review2_run_id_race_instances.py.
"""

from __future__ import annotations

import pytest
from api_support import TOKENS, RealCore, fake_backend, make_config
from control_support import AGENT, STRANGER, Harness
from run_race_support import one_tenant_round, start_at_once, started_events

from ringfence import Client
from ringfence.model import Principal, Role, RunOutcome, RunView, WorkspaceRequest
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.store import SqliteEventStore
from ringfence_server.sandbox.labels import instance_id

ROUNDS = 12
TENANTS = ("acme", "globex")


@pytest.fixture
def config(tmp_path):
    return make_config(tmp_path / "state")


def test_two_tenants_racing_one_run_id_each_get_a_run_of_their_own(config):
    with RealCore(config, fake_backend()) as core, BackgroundServer(core.orchestrator, config) as server:
        clients = {t: Client(server.address, TOKENS[(t, Role.AGENT)]) for t in TENANTS}
        try:
            for client in clients.values():
                client.list_runs()  # connected before the race: the barrier is the only start signal
            for i in range(ROUNDS):
                run_id = f"shared-{i}"
                goals = {t: f"{t}'s goal in round {i}" for t in TENANTS}
                answers = start_at_once(run_id, [(clients[t], goals[t]) for t in TENANTS])
                for tenant, answer in zip(TENANTS, answers, strict=True):
                    assert isinstance(answer, RunView), f"round {i}: {tenant}'s StartRun failed: {answer!r}"
                    assert (answer.run_id, answer.tenant, answer.goal) == (run_id, tenant, goals[tenant]), i
                for tenant, client in clients.items():
                    view = client.get_run(run_id)
                    assert (view.run_id, view.tenant, view.goal) == (run_id, tenant, goals[tenant]), i
                    assert [r.goal for r in client.list_runs() if r.run_id == run_id] == [goals[tenant]], i
                for tenant, client in clients.items():
                    assert client.finish_run(run_id).outcome is RunOutcome.COMPLETED, (i, tenant)
                for tenant, client in clients.items():
                    watched = list(client.watch_run(run_id, 0))  # ends after run_finished
                    assert started_events(watched) == [(tenant, goals[tenant])], (i, tenant)
                    assert {e.run_id for e in watched} == {run_id} and watched[-1].type == "run_finished"
                # The log: one key per tenant, the bare id for whoever came first and the
                # tenant's own namespace for the other, each with one run_started of its own.
                keys = {t: [k for k in core.store.runs(t) if k in (run_id, f"{t}/{run_id}")] for t in TENANTS}
                assert sorted(len(k) for k in keys.values()) == [1, 1], keys
                assert {k for [k] in keys.values()} in [{run_id, f"{t}/{run_id}"} for t in TENANTS], keys
                for tenant, [key] in keys.items():
                    assert started_events(core.store.read(key)) == [(tenant, goals[tenant])], (i, key)
        finally:
            for client in clients.values():
                client.close()


def test_one_tenant_racing_one_run_id_through_two_instances_gets_one_run(config):
    token = TOKENS[("acme", Role.AGENT)]
    with RealCore(config, fake_backend()) as one, RealCore(config, fake_backend()) as two, \
            BackgroundServer(one.orchestrator, config) as server_one, \
            BackgroundServer(two.orchestrator, config) as server_two:
        # Two processes have two instance ids; in one process the second must be told its own,
        # or its leases would count as the first's.
        two.orchestrator.runs.owner = f"{instance_id()}-second"
        clients = [Client(s.address, token) for s in (server_one, server_two)]
        try:
            for client in clients:
                client.list_runs()
            for i in range(ROUNDS):
                one_tenant_round(clients, one.store, i)
        finally:
            for client in clients:
                client.close()


class WithWorkspace:
    """StartRun with the server's default workspace, straight to one instance's core."""

    def __init__(self, core: Orchestrator, principal: Principal) -> None:
        self.core = core
        self.principal = principal

    def start_run(self, goal: str, run_id: str) -> RunView:
        return self.core.start_run(self.principal, goal, run_id, workspace=WorkspaceRequest())


@pytest.mark.parametrize("principals", [(AGENT, AGENT), (AGENT, STRANGER)], ids=["one tenant", "two tenants"])
def test_a_raced_start_makes_each_runs_workspace_once(tmp_path, principals):
    h = Harness(tmp_path)
    second_store = SqliteEventStore(h.db, clock=h.clock)
    second = h.new_orchestrator(store=second_store)  # the same engine's workspaces, as two instances share
    second.runs.owner = f"{instance_id()}-second"
    try:
        starters = [WithWorkspace(core, p) for core, p in zip((h.orch, second), principals, strict=True)]
        for i in range(ROUNDS):
            run_id = f"with-workspace-{i}"
            goals = [f"{p.tenant} through instance {n} in round {i}" for n, p in enumerate(principals, 1)]
            answers = start_at_once(run_id, list(zip(starters, goals, strict=True)))
            assert all(isinstance(a, RunView) and a.workspace is not None for a in answers), f"round {i}: {answers!r}"
            one_tenant = principals[0] == principals[1]
            assert [a.goal for a in answers] == ([answers[0].goal] * 2 if one_tenant else goals), i
            for principal in {p.tenant: p for p in principals}.values():
                state = h.orch.runs.get(principal.tenant, run_id)
                types = [e.type for e in h.store.read(state.key)]
                assert (types.count("run_started"), types.count("workspace_created")) == (1, 1), (i, types)
                assert h.workspaces.created.count(state.key) == 1, i
    finally:
        second.close()
        second_store.close()
        h.orch.close()
        h.store.close()
