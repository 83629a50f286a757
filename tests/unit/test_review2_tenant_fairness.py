"""One tenant's burst must not refuse or stall another tenant, nor its own approvers (second
attack review, finding 3).

A real server on a real loopback port over the real Orchestrator and SQLite store (the sandbox
is the FakeBackend: nothing here reaches a container). Tenant acme's StartRuns are held at the
door of the core until the test releases them, so a burst stays in flight, deterministically,
while the test looks: no timing assertions, only counts and codes.
"""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest
from api_support import TOKENS, RealCore, fake_backend, make_config

from ringfence import Client
from ringfence.errors import ConfigError, ResourceExhausted
from ringfence.model import ApprovalStatus, Role
from ringfence.v1 import approvals_pb2, runs_pb2, types_pb2
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.config import load_config

A_AGENT = TOKENS[("acme", Role.AGENT)]
A_APPROVER = TOKENS[("acme", Role.APPROVER)]
B_AGENT = TOKENS[("globex", Role.AGENT)]
B_APPROVER = TOKENS[("globex", Role.APPROVER)]
# Past the 512 RPCs the server used to admit from all tenants together, so on the old server
# the burst itself shows the fault: grpc refused everyone, not only the tenant that burst.
BURST = 600


class Held:
    """The real Orchestrator, except that one tenant's calls of the `held` methods wait at its
    door until `release` is set: a burst's admitted calls stay in flight while the test looks."""

    def __init__(self, core: Any, tenant: str, held: tuple[str, ...]) -> None:
        self._core = core
        self._tenant = tenant
        self._held = held
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.inside = 0
        self.entered = threading.Semaphore(0)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._core, name)
        if name not in self._held:
            return method

        def held(p: Any, *args: Any, **kwargs: Any) -> Any:
            if p.tenant == self._tenant:
                with self._lock:
                    self.inside += 1
                self.entered.release()
                assert self.release.wait(60), "the test never released the held calls"
            return method(p, *args, **kwargs)

        return held


@pytest.fixture
def held(tmp_path):
    """(server, held core, config): acme's `held` calls wait in the core; [edge] and [limits]
    as given (the defaults when empty)."""

    def make(edge: dict[str, int] | None = None, limits: dict[str, int] | None = None,
             methods: tuple[str, ...] = ("start_run",)):
        config = make_config(tmp_path / "state", limits, **({"edge": edge} if edge else {}))
        core = RealCore(config, fake_backend())
        gate = Held(core.orchestrator, "acme", methods)
        server = BackgroundServer(gate, config).start()
        made.append((server, gate, core))
        return server, gate, config

    made: list[tuple[BackgroundServer, Held, RealCore]] = []
    yield make
    for server, gate, core in made:
        gate.release.set()
        server.stop()
        core.close()


def fire_burst(client: Client, count: int) -> list[grpc.Future]:
    md = client.metadata()
    return [client.stubs.runs.StartRun.future(runs_pb2.StartRunRequest(goal="burst", run_id=f"a-{i}"), metadata=md,
                                        timeout=60) for i in range(count)]


def wait_entered(gate: Held, n: int) -> None:
    for _ in range(n):
        assert gate.entered.acquire(timeout=30), "the held calls never reached the core"


def outcome(future: grpc.Future) -> str:
    error = future.exception()
    if error is None:
        return "OK"
    assert isinstance(error, grpc.Call), error  # a failed call's future raises the call itself
    return error.code().name


def test_a_tenants_burst_is_refused_past_its_own_limit_and_never_refuses_or_stalls_another(held):
    server, gate, config = held()
    with Client(server.address, A_AGENT) as a, Client(server.address, B_AGENT) as b, \
            Client(server.address, A_APPROVER) as a_approver:
        b_run = b.start_run("b's own work", "b-run")
        burst = fire_burst(a, BURST)
        wait_entered(gate, 1)  # the burst is in the core

        # B, during A's burst: 20 concurrent GetRuns and a SubmitBatch, all answered while every
        # one of A's admitted StartRuns is still held in the core.
        md = b.metadata()
        gets = [b.stubs.runs.GetRun.future(runs_pb2.GetRunRequest(run_id=b_run.run_id), metadata=md, timeout=20)
                for _ in range(20)]
        batch = b.stubs.runs.SubmitBatch.future(
            runs_pb2.SubmitBatchRequest(run_id=b_run.run_id, calls=[
                types_pb2.ProposedCall(call_id="c1", tool="echo", arguments_json='{"text": "hi"}')]),
            metadata=md, timeout=20)
        b_codes = [outcome(f) for f in (*gets, batch)]
        assert b_codes == ["OK"] * 21, f"B refused or stalled during A's burst: {b_codes}"
        assert all(g.result().run_id == b_run.run_id for g in gets)
        assert [o.status for o in batch.result().observations] == [types_pb2.OBSERVATION_STATUS_EXECUTED]
        # A's approver is not refused either: the agent's burst counts against the agent's budget.
        assert a_approver.stubs.approvals.ListApprovals(approvals_pb2.ListApprovalsRequest(),
                                                  metadata=a_approver.metadata(), timeout=20).approvals == []

        limit, share = config.edge.max_in_flight, config.edge.worker_share
        wait_entered(gate, share - 1)  # the burst holds its share of the workers, and no more
        # Every one of A's StartRuns past its limit came back refused while the rest were held.
        refused = [f for f in burst if f.done()]
        assert len(refused) == BURST - limit
        assert gate.inside == share, "a StartRun beyond the tenant's worker share reached the core"
        for f in refused:
            assert f.exception().code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"limit {limit} per tenant and role" in f.exception().details()
            assert "retry later" in f.exception().details()
        with pytest.raises(ResourceExhausted) as e:
            a.start_run("one more", "a-extra")
        assert "tenant 'acme' as agent" in str(e.value)

        gate.release.set()
        admitted = [f for f in burst if f not in refused]
        assert [outcome(f) for f in admitted] == ["OK"] * limit
        assert len([r for r in a.list_runs() if r.run_id.startswith("a-")]) == limit
        assert [r.run_id for r in b.list_runs()] == [b_run.run_id]
    assert server.server.edge.unexpected_errors == 0


def test_an_agent_holding_all_its_watch_streams_does_not_stop_its_approver(held):
    server, gate, _config = held()
    gate.release.set()
    streams = []
    with Client(server.address, A_AGENT) as agent, Client(server.address, A_APPROVER) as approver:
        run = agent.start_run("watched", "w-1")
        try:
            for _ in range(16):  # the agent holds every watch stream it may
                stream = agent.watch_run(run.run_id)
                streams.append(stream)
                assert next(iter(stream)).type == "run_started"
            received: list[Any] = []
            failed: list[BaseException] = []
            answered = threading.Event()
            watch = approver.watch_approvals()
            streams.append(watch)

            def read() -> None:
                try:
                    for approval in watch:
                        received.append(approval)
                        answered.set()
                except Exception as exc:  # noqa: BLE001 - the assertion below reports it
                    failed.append(exc)
                    answered.set()

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            agent.submit_batch(run.run_id,
                               [{"call_id": "c1", "tool": "credit", "arguments": {"account": "acme-1", "amount": 5}}])
            assert answered.wait(30)
            assert failed == [], f"the approver's WatchApprovals was refused: {failed}"
            assert received[0].tool == "credit" and received[0].status is ApprovalStatus.PENDING
            # The agent's own budget is still exact: a 17th stream is refused, naming the role.
            with pytest.raises(ResourceExhausted) as e:
                next(iter(agent.watch_run(run.run_id)))
            assert "tenant 'acme' as agent already has 16 watch streams" in str(e.value)
            assert "limit 16 per tenant and role" in str(e.value)
        finally:
            for stream in streams:
                stream.cancel()
    assert server.server.edge.unexpected_errors == 0


def test_a_configured_limit_and_share_are_exact_and_cancelling_a_waiting_call_frees_its_place(held):
    """[edge] max_in_flight 3, worker_share 1 of 2 threads: 3 of acme's 10 StartRuns admitted (1
    in the core, 2 waiting for acme's one thread), 7 refused; globex's calls take the other thread."""
    server, gate, _config = held({"max_in_flight": 3, "worker_share": 1, "worker_threads": 2})
    edge = server.server.edge
    with Client(server.address, A_AGENT) as a, Client(server.address, B_AGENT) as b:
        b_run = b.start_run("b", "b-run")
        burst = fire_burst(a, 10)
        wait_entered(gate, 1)
        md = b.metadata()
        gets = [b.stubs.runs.GetRun.future(runs_pb2.GetRunRequest(run_id=b_run.run_id), metadata=md, timeout=20)
                for _ in range(3)]
        assert [outcome(f) for f in gets] == ["OK"] * 3
        refused = [f for f in burst if f.done()]
        assert len(refused) == 7
        assert all("limit 3 per tenant and role" in f.exception().details() for f in refused)
        assert edge.admitted.in_flight("acme", Role.AGENT) == 3
        # A call waiting for its tenant's thread never started: cancelling it frees its place at
        # once. The one running in the core keeps its place until its work ends.
        waiting = [f for f in burst if not f.done()]
        for f in waiting:
            f.cancel()
        deadline = threading.Event()
        for _ in range(400):
            if edge.admitted.in_flight("acme", Role.AGENT) == 1:
                break
            deadline.wait(0.025)
        assert edge.admitted.in_flight("acme", Role.AGENT) == 1
        assert gate.inside == 1
        gate.release.set()
        for _ in range(400):
            if edge.admitted.in_flight("acme", Role.AGENT) == 0:
                break
            deadline.wait(0.025)
        assert edge.admitted.in_flight("acme", Role.AGENT) == 0
        assert a.start_run("after", "a-after").run_id == "a-after"
    assert edge.unexpected_errors == 0


def test_a_tenants_long_batches_do_not_hold_the_threads_its_own_short_calls_need(held):
    """Batches wait on containers for seconds: three held batches of acme's agent (over its
    worker share of 1) all run at once, and its own GetRun and StartRun are still answered."""
    server, gate, _config = held({"worker_share": 1, "worker_threads": 2}, {"max_concurrent_batches": 3},
                                methods=("submit_batch",))
    with Client(server.address, A_AGENT) as a:
        runs = [a.start_run("batch", f"r{i}").run_id for i in range(3)]
        md = a.metadata()
        batches = [a.stubs.runs.SubmitBatch.future(runs_pb2.SubmitBatchRequest(run_id=run_id, calls=[
            types_pb2.ProposedCall(call_id="c1", tool="echo", arguments_json='{"text": "hi"}')]),
            metadata=md, timeout=60) for run_id in runs]
        wait_entered(gate, 3)  # all three in the core at once, past the share of 1
        assert a.get_run(runs[0]).run_id == runs[0]
        assert a.start_run("another", "r-other").run_id == "r-other"
        with pytest.raises(ResourceExhausted) as e:  # the batch limit still holds, per tenant
            a.submit_batch(runs[0], [{"call_id": "c2", "tool": "echo", "arguments": {"text": "x"}}])
        assert "limit 3" in str(e.value)
        gate.release.set()
        assert [[o.status for o in f.result().observations] for f in batches] == \
            [[types_pb2.OBSERVATION_STATUS_EXECUTED]] * 3
        assert gate.inside == 3
    assert server.server.edge.unexpected_errors == 0


@pytest.mark.parametrize(("edge", "key"), [
    ({"worker_share": 9, "worker_threads": 8}, "edge.worker_share"),
    ({"max_in_flight": 0}, "edge.max_in_flight"),
    ({"max_watch_streams": 1.5}, "edge.max_watch_streams"),
    ({"worker_threads": float("nan")}, "edge.worker_threads"),
    ({"worker_threads": float("inf")}, "edge.worker_threads"),
    ({"max_in_flight": True}, "edge.max_in_flight"),
    ({"max_in_flight": 10**9}, "edge.max_in_flight"),
    ({"fairness": 1}, "edge.fairness"),
])
def test_edge_limits_are_integers_in_range_refused_naming_their_key(edge, key):
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"edge": edge})
    assert e.value.key == key


def test_edge_defaults_leave_room_for_other_tenants():
    from ringfence_server.control.config import EdgeConfig

    d = load_config().edge
    assert d == EdgeConfig()
    assert d.worker_share * len(Role) * 2 <= d.worker_threads, "one tenant could hold over half the pool"
