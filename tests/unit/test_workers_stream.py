"""Calls on sandbox workers, end to end through the control flow: the real orchestrator on a
RemoteBackend, the hub on a real gRPC server on a loopback port, workers attached over real
streams with their real executors and results stores, and a FakeBackend where the engine would
be (the same flows run on real engines in tests/e2e/test_workers_*.py).

What is counted is what reached each worker's sandbox (its FakeBackend's requests: the witness
that a tool ran), never the absence of an error."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest
from control_support import Harness, ToolEmulator
from relay_support import Relay
from workers_support import (
    HubServer,
    InProcessWorker,
    hub_store,
    remote_backend,
    token_for,
    workers_config,
)

from ringfence.model import ObservationStatus as S
from ringfence_server.control.workers.registry import WorkerRegistry
from ringfence_server.sandbox.fake import FakeBackend


def wait_until(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Plane:
    """A control plane (orchestrator + hub) with workers attached to it."""

    def __init__(self, tmp_path, worker_ids=("w1", "w2"), **config_kw) -> None:
        self.tmp_path = tmp_path
        self.config = workers_config(("w1", "w2", "w3", "shared"), tmp=tmp_path, **config_kw)
        self.registry = WorkerRegistry()
        self.store = hub_store(tmp_path)
        self.server = HubServer(self.registry, self.store, self.config)
        self.h = Harness(tmp_path)
        self.h.orch.close()
        self.remote = remote_backend(self.registry, self.config)
        self.h.backend = self.remote  # type: ignore[assignment]
        self.h.orch = self.h.new_orchestrator()
        self.workers: dict[str, InProcessWorker] = {}
        for w in worker_ids:
            self.attach(w)

    def attach(self, worker_id: str, backend: FakeBackend | None = None, address: str | None = None,
               **kw) -> InProcessWorker:
        worker = InProcessWorker(worker_id, address or self.server.address, self.tmp_path,
                                 backend or FakeBackend(ToolEmulator()), **kw)
        self.workers[worker_id] = worker
        wait_until(lambda: worker_id in self.registry.attached() and worker.attacher.attached.is_set(),
                   what=f"{worker_id} attached")
        return worker

    def attach_gated(self, worker_id: str, tool: str, **kw) -> tuple[InProcessWorker, Gate]:
        """Attach `worker_id` with `tool` blocking in its sandbox until the returned gate opens."""
        gate = Gate()
        emulator = ToolEmulator()
        emulator.overrides[tool] = gate
        return self.attach(worker_id, FakeBackend(emulator), **kw), gate

    def ran(self, worker_id: str) -> list[dict]:
        """The tool runner requests that reached worker_id's sandbox."""
        return [json.loads(r.stdin) for r in self.workers[worker_id].backend.requests]

    def close(self) -> None:
        for w in self.workers.values():
            w.stop()
        self.h.close()
        self.server.close()
        self.store.close()
        assert self.server.hub.unexpected_errors == 0


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path)
    yield p
    p.close()


def test_calls_run_on_the_workers_and_the_tool_sees_what_dispatch_sent(plane):
    run = plane.h.run()
    for batch in range(3):
        obs = plane.h.submit(run, *[("echo", {"text": f"b{batch}-{i}"}) for i in range(4)])
        assert [o.status for o in obs] == [S.EXECUTED] * 4
        assert [o.content for o in obs] == [{"text": f"b{batch}-{i}"} for i in range(4)]
    ran = plane.ran("w1") + plane.ran("w2")
    assert sorted(r["arguments"]["text"] for r in ran) == sorted(f"b{b}-{i}" for b in range(3) for i in range(4))
    # Spread over both workers, each call once; the runner saw the logical call id, no attempt suffix.
    assert plane.ran("w1") and plane.ran("w2")
    assert all(r["call_id"].startswith("c") and ".a" not in r["call_id"] for r in ran)
    requests = plane.workers["w1"].backend.requests + plane.workers["w2"].backend.requests
    assert {r.run_id for r in requests} == {f"acme:{run}"}


def test_a_mutation_reaches_its_worker_once_with_its_idempotency_key(plane):
    run = plane.h.run()
    (obs,) = plane.h.submit(run, ("write_note", {"name": "n1", "text": "hello"}))
    assert obs.status is S.EXECUTED
    ran = [r for w in ("w1", "w2") for r in plane.ran(w) if r["tool"] == "write_note"]
    assert len(ran) == 1 and ran[0]["idempotency_key"]
    (again,) = plane.h.submit(run, ("write_note", {"name": "n1", "text": "hello"}))
    assert again.status is S.DEDUPLICATED
    assert len([r for w in ("w1", "w2") for r in plane.ran(w) if r["tool"] == "write_note"]) == 1


def test_without_a_worker_a_call_is_not_started_and_nothing_runs(tmp_path):
    p = Plane(tmp_path, worker_ids=(), place_timeout_s=0.2)
    try:
        run = p.h.run()
        (obs,) = p.h.submit(run, ("echo", {"text": "x"}))
        assert obs.status is S.DENIED and "sandbox:not_started" in obs.verdict_path
        assert "no sandbox worker could take the call" in obs.error
    finally:
        p.close()


class Gate:
    """A tool that blocks in the sandbox until opened, saying when it has started."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.open = threading.Event()

    def __call__(self, call):
        self.started.set()
        self.open.wait(30)
        return {"slept": call.arguments["seconds"]}


def test_a_read_on_a_lost_worker_runs_again_on_another(tmp_path):
    p = Plane(tmp_path, worker_ids=())
    try:
        _worker, gate = p.attach_gated("w1", "sleep")
        run = p.h.run()
        out: list = []
        t = threading.Thread(target=lambda: out.extend(p.h.submit(run, ("sleep", {"seconds": 1}))))
        t.start()
        assert gate.started.wait(20)
        p.attach("w2")
        p.workers["w1"].detach()  # its stream ends while the call is out: lost
        t.join(30)
        gate.open.set()
        (obs,) = out
        assert obs.status is S.EXECUTED and obs.content == {"slept": 1}
        assert [r["tool"] for r in p.ran("w1")] == ["sleep"] and [r["tool"] for r in p.ran("w2")] == ["sleep"]
        attempts = [e for e in p.h.events(run) if e.type == "attempt"]
        assert [a.data["outcome"] for a in attempts] == ["uncertain", "ok"]
        assert [a.data["worker"] for a in attempts] == ["w1", "w2"]  # the log says where each ran
        assert "was lost while the call was out" in attempts[0].data["message"]
    finally:
        p.close()


def test_a_mutation_on_a_lost_worker_is_in_doubt_and_never_runs_again(tmp_path):
    p = Plane(tmp_path, worker_ids=())
    try:
        _worker, gate = p.attach_gated("w1", "write_note")
        run = p.h.run()
        out: list = []
        t = threading.Thread(target=lambda: out.extend(p.h.submit(run, ("write_note", {"name": "n", "text": "t"}))))
        t.start()
        assert gate.started.wait(20)
        p.attach("w2")
        p.workers["w1"].detach()
        t.join(30)
        gate.open.set()
        (obs,) = out
        assert obs.status is S.EXECUTED and obs.error and "uncertain" in (obs.error_class or "")
        assert [r["tool"] for r in p.ran("w1")] == ["write_note"]
        assert p.ran("w2") == []  # never run a second time
    finally:
        p.close()


def _place(plane: Plane, worker_id: str, call_id: str = "c1", attempt: int = 1, tool: str = "echo",
           arguments: dict | None = None):
    """Seal one call for `worker_id` as the remote backend would (a test that drives deliveries)."""
    from ringfence_server.control.workers.placement import Need
    from ringfence_server.control.workers.sealing import worker_call
    from ringfence_server.sandbox.backend import SandboxRequest
    from ringfence_server.sandbox.profile import SandboxProfile

    body = json.dumps({"tool": tool, "arguments": arguments or {"text": "x"}, "call_id": call_id,
                       "idempotency_key": None}, separators=(",", ":")).encode()
    call = worker_call(SandboxRequest(profile=SandboxProfile(image="tool"), stdin=body, run_id="acme:r1",
                                      call_id=f"{call_id}.a{attempt}"), plane.remote._lock)
    attachment = plane.registry.reserve(Need(call.image_digest, "runc", False), 5)
    assert attachment is not None and attachment.worker_id == worker_id
    placed = plane.remote._sealer.seal(call, worker_id=worker_id, start_allowance_s=30)
    return attachment, placed


def test_the_same_envelope_delivered_twice_runs_the_tool_once(tmp_path):
    p = Plane(tmp_path, worker_ids=("w1",))
    try:
        from ringfence.v1 import workers_pb2

        attachment, placed = _place(p, "w1")
        pending = p.registry.submit(attachment, placed)
        # The same sealed bytes delivered again (a resend after a reconnect, a duplicated frame).
        attachment.send(workers_pb2.HubMessage(work=workers_pb2.Work(sealed=placed.sealed.to_bytes())))
        outcome = pending.future.result(20)
        assert outcome.kind == "result" and json.loads(outcome.result.stdout)["ok"] is True
        wait_until(lambda: p.workers["w1"].executor.runs_started >= 1)
        time.sleep(0.5)  # room for a second run, if the worker were to make one
        assert len(p.workers["w1"].backend.requests) == 1
        assert p.workers["w1"].executor.runs_started == 1
        assert p.store.late_results() == []  # the second answer is the first's, not a late one
        p.registry.finish(attachment, pending)
    finally:
        p.close()


def test_a_report_after_the_caller_gave_up_is_recorded_late_and_never_applied(tmp_path):
    p = Plane(tmp_path, worker_ids=())
    try:
        _worker, gate = p.attach_gated("w1", "sleep")
        attachment, placed = _place(p, "w1", tool="sleep", arguments={"seconds": 1})
        pending = p.registry.submit(attachment, placed)
        assert gate.started.wait(20)
        from ringfence_server.control.workers.registry import Outcome

        assert pending.settle(Outcome("lost", message="no report by the envelope's deadline"))  # what a timeout does
        p.registry.finish(attachment, pending)
        gate.open.set()
        wait_until(lambda: p.store.late_results(), what="a late result")
        (late,) = p.store.late_results()
        assert (late.worker_id, late.envelope_id, late.reason) == ("w1", placed.envelope.envelope_id, "fenced")
        assert (late.tenant, late.run_id, late.call_id, late.attempt) == ("acme", "r1", "c1", 1)
        assert pending.future.result().kind == "lost"  # the late result changed nothing
    finally:
        p.close()


def test_a_report_after_its_run_ended_is_late_for_that_reason(tmp_path):
    p = Plane(tmp_path, worker_ids=())
    try:
        _worker, gate = p.attach_gated("w1", "sleep")
        attachment, placed = _place(p, "w1", tool="sleep", arguments={"seconds": 1})
        pending = p.registry.submit(attachment, placed)
        assert gate.started.wait(20)
        p.registry.finish(attachment, pending)  # nothing waits any more (not settled: not fenced)
        p.remote.end_run("acme:r1")
        gate.open.set()
        wait_until(lambda: p.store.late_results(), what="a late result")
        assert [r.reason for r in p.store.late_results()] == ["run_ended"]
    finally:
        p.close()


def _partition(tmp_path, *, fencing: bool = True):
    """w1 attached through a relay, running a call, when the relay is cut for longer than its
    lease; returns (plane, worker, relay, gate, the call's outcome)."""
    p = Plane(tmp_path, worker_ids=(), lease_s=1.5, heartbeat_s=0.1)
    relay = Relay(("127.0.0.1", p.server.port))
    worker, gate = p.attach_gated("w1", "sleep", address=relay.address)
    if not fencing:
        worker.attacher._on_fenced = lambda reason: 0  # the red check: fencing kills nothing
    attachment, placed = _place(p, "w1", tool="sleep", arguments={"seconds": 1})
    pending = p.registry.submit(attachment, placed)
    assert gate.started.wait(20)
    relay.cut()
    return p, worker, relay, gate, pending


def test_a_partitioned_worker_fences_itself_and_its_late_result_is_not_applied(tmp_path):
    p, worker, relay, gate, pending = _partition(tmp_path)
    try:
        outcome = pending.future.result(30)  # the hub's watchdog: no heartbeat for the lease
        assert outcome.kind == "lost" and "lease lapsed" in outcome.message
        wait_until(lambda: worker.attacher.fencings == 1, what="the worker fencing itself")
        # Fenced: it killed what it ran (on a real engine the container dies here).
        assert worker.backend.kills and "not renewed" in worker.backend.kills[0][1]
        p.registry.finish(pending.attachment, pending)
        relay.restore()
        wait_until(lambda: worker.attacher.attachments == 2, what="the worker attaching again")
        assert worker.attacher.epoch == 2
        gate.open.set()  # the killed call's report comes now, on the new attachment: late
        wait_until(lambda: p.store.late_results(), what="the late result")
        assert [r.reason for r in p.store.late_results()] == ["fenced"]
        leases = {lease.worker_id: lease.epoch for lease in p.store.worker_leases()}
        assert leases == {"w1": 2}
    finally:
        gate.open.set()
        relay.close()
        p.close()


def test_red_check_without_fencing_a_partitioned_worker_kills_nothing(tmp_path):
    p, worker, relay, gate, pending = _partition(tmp_path, fencing=False)
    try:
        assert pending.future.result(30).kind == "lost"
        wait_until(lambda: worker.attacher.fencings == 1, what="the lease running out")
        assert worker.backend.kills == []  # what the real test asserts is not so: this is the protection
    finally:
        gate.open.set()
        relay.close()
        p.close()


def test_a_worker_attaching_again_fences_its_older_attachment(tmp_path):
    p = Plane(tmp_path, worker_ids=())
    try:
        _worker, gate = p.attach_gated("w1", "sleep")
        attachment, placed = _place(p, "w1", tool="sleep", arguments={"seconds": 1})
        pending = p.registry.submit(attachment, placed)
        assert gate.started.wait(20)
        # The same worker id attaches a second time (a restarted worker, or a copy of its token).
        (tmp_path / "second").mkdir()
        second = InProcessWorker("w1", p.server.address, tmp_path / "second", FakeBackend(ToolEmulator()))
        try:
            wait_until(lambda: p.registry.attached()["w1"].epoch == 2, what="epoch 2")
            outcome = pending.future.result(20)
            assert outcome.kind == "lost" and "attached again" in outcome.message
            # The first attachment's next heartbeat is not renewed: its stream ends.
            wait_until(lambda: not p.workers["w1"].attacher.attached.is_set(), what="the old stream ending")
        finally:
            gate.open.set()
            second.stop()
    finally:
        p.close()


@pytest.mark.parametrize(("token", "worker_id", "code"), [
    ("not-a-worker-token", "w1", grpc.StatusCode.UNAUTHENTICATED),
    (token_for("w2"), "w1", grpc.StatusCode.PERMISSION_DENIED),
])
def test_a_worker_must_prove_who_it_is(tmp_path, token, worker_id, code):
    p = Plane(tmp_path, worker_ids=())
    try:
        (tmp_path / "x").mkdir()
        w = InProcessWorker(worker_id, p.server.address, tmp_path / "x", FakeBackend(ToolEmulator()), token=token)
        w._thread.join(20)
        assert isinstance(w.error, grpc.RpcError) and w.error.code() == code
        assert p.registry.attached() == {} and p.store.worker_leases() == []
        w.results.close()
        p.workers.clear()
    finally:
        p.close()


def test_an_impossible_capacity_is_invalid_argument_naming_the_field(tmp_path):
    p = Plane(tmp_path, worker_ids=())
    try:
        from ringfence.v1 import workers_pb2, workers_pb2_grpc

        with grpc.insecure_channel(p.server.address) as channel:
            stub = workers_pb2_grpc.WorkerHubStub(channel)
            hello = workers_pb2.WorkerMessage(hello=workers_pb2.WorkerHello(
                worker_id="w1", capacity=workers_pb2.WorkerCapacity(slots=0, cpus=1, runtimes=["runc"])))
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Attach(iter([hello]), metadata=[("authorization", f"Bearer {token_for('w1')}")]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "hello.capacity.slots" in e.value.details()
    finally:
        p.close()


def test_a_tenant_s_placement_labels_keep_its_calls_on_its_own_workers(tmp_path):
    # The Harness's agent is tenant acme: its calls need pool=acme.
    p = Plane(tmp_path, worker_ids=(), tenant_labels={"acme": {"pool": "acme"}}, place_timeout_s=0.3)
    try:
        p.attach("shared")
        run = p.h.run()
        (refused,) = p.h.submit(run, ("echo", {"text": "x"}))
        assert refused.status is S.DENIED and "pool=acme" in refused.error
        assert p.ran("shared") == []  # never placed on a worker without the label
        p.attach("w1", labels={"pool": "acme"})
        obs = p.h.submit(run, *[("echo", {"text": str(i)}) for i in range(4)])
        assert all(o.status is S.EXECUTED for o in obs)
        assert len(p.ran("w1")) == 4 and p.ran("shared") == []
    finally:
        p.close()


def test_a_result_larger_than_one_grpc_message_arrives_whole(plane):
    # The hub shares the API's server, whose messages are capped at limits.max_message_bytes
    # (1 MiB): a tool's output up to its stdout_limit (echo's: 1 MiB) must still arrive, whole.
    big = "x" * 1_000_000
    for worker in plane.workers.values():
        worker.backend._handler.overrides["echo"] = lambda call: {"text": big}  # type: ignore[attr-defined]
    run = plane.h.run()
    (obs,) = plane.h.submit(run, ("echo", {"text": "big"}))
    assert obs.status is S.EXECUTED and obs.content == {"text": big}


def test_a_result_past_its_call_s_caps_ends_the_attachment_and_the_call_is_lost(tmp_path):
    """A worker (here a raw stream: a compromised host can send anything) that keeps sending
    pieces of one result past what the call's output caps allow is cut off: the control plane
    never buffers more than a call may return."""
    import queue as queue_mod

    from workers_support import LOCK

    from ringfence.v1 import workers_pb2, workers_pb2_grpc
    from ringfence_server.worker.envelope import SealedEnvelope

    p = Plane(tmp_path, worker_ids=())
    outgoing: queue_mod.Queue = queue_mod.Queue()
    try:
        capacity = workers_pb2.WorkerCapacity(slots=2, cpus=1, runtimes=["runc"],
                                              image_digests=[LOCK.image_id(n) for n in LOCK.names])
        outgoing.put(workers_pb2.WorkerMessage(hello=workers_pb2.WorkerHello(worker_id="w1", capacity=capacity)))

        def requests():
            while (m := outgoing.get()) is not None:
                yield m

        with grpc.insecure_channel(p.server.address) as channel:
            responses = workers_pb2_grpc.WorkerHubStub(channel).Attach(
                requests(), metadata=(("authorization", f"Bearer {token_for('w1')}"),))
            assert next(responses).WhichOneof("kind") == "welcome"
            attachment, placed = _place(p, "w1")
            pending = p.registry.submit(attachment, placed)
            work = next(responses)
            envelope_id = placed.envelope.envelope_id
            assert SealedEnvelope.from_bytes(work.work.sealed) == placed.sealed
            piece = b"x" * (256 * 1024)
            for _ in range(40):  # 10 MiB: past the 1 MiB stdout cap's ~5.4 MB on the wire
                outgoing.put(workers_pb2.WorkerMessage(report=workers_pb2.WorkReport(
                    envelope_id=envelope_id, kind="result", result=piece, more=True)))
            outcome = pending.future.result(20)
            assert outcome.kind == "lost" and "more than its call's output caps allow" in outcome.message
            p.registry.finish(attachment, pending)
            outgoing.put(None)
        assert "w1" not in p.registry.attached()
    finally:
        outgoing.put(None)
        p.close()


def test_made_up_late_results_are_kept_only_up_to_a_budget(tmp_path):
    """A worker's late reports are its own words: past a budget per window they are counted, not
    stored (a compromised worker cannot fill the control planes' database with them)."""
    import queue as queue_mod

    from workers_support import LOCK

    from ringfence.v1 import workers_pb2, workers_pb2_grpc
    from ringfence_server.control.workers import hub as hub_mod

    p = Plane(tmp_path, worker_ids=())
    p.server.hub._late_budget = hub_mod._Budget(5, 600)  # LATE_RESULTS_PER_WINDOW, made small
    outgoing: queue_mod.Queue = queue_mod.Queue()
    try:
        capacity = workers_pb2.WorkerCapacity(slots=1, cpus=1, runtimes=["runc"],
                                              image_digests=[LOCK.image_id("tool")])
        outgoing.put(workers_pb2.WorkerMessage(hello=workers_pb2.WorkerHello(worker_id="w1", capacity=capacity)))
        for n in range(20):
            outgoing.put(workers_pb2.WorkerMessage(report=workers_pb2.WorkReport(
                envelope_id=f"env-made-up-{n}", kind="result", result=b"x", tenant="acme" * 200, run_id="r",
                call_id="c", attempt=1)))

        def requests():
            while (m := outgoing.get()) is not None:
                yield m

        with grpc.insecure_channel(p.server.address) as channel:
            responses = workers_pb2_grpc.WorkerHubStub(channel).Attach(
                requests(), metadata=(("authorization", f"Bearer {token_for('w1')}"),))
            assert next(responses).WhichOneof("kind") == "welcome"
            wait_until(lambda: p.server.hub.late_results == 20, what="20 late reports read")
            outgoing.put(None)
        kept = p.store.late_results()
        assert len(kept) == 5 and p.server.hub.late_results_dropped == 15
        assert all(r.reason == "unknown_envelope" and len(r.tenant) == 256 for r in kept)
    finally:
        outgoing.put(None)
        p.close()
