"""Worker admission (ringfence_server.worker.admission): what a worker checks before it runs
anything, in its documented order; that a refused envelope runs nothing, claims nothing and reads
no recorded result; that a logical call runs once however often it is delivered; and red checks
that switch the signature and the image checks off to show these tests would fail without them.

The witness is a counting runner: `Worker.runner.runs` lists every call that reached it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from worker_support import CONTROL_KEY, DIGEST, NOW, OTHER_DIGEST, TRUSTED, WORKER, envelope

from ringfence_server.control.validation import canonical_json
from ringfence_server.worker import admission as admission_mod
from ringfence_server.worker import envelope as envelope_mod
from ringfence_server.worker.admission import (
    InProgress,
    RecordedResult,
    Refuse,
    ReturnRecorded,
    Run,
    WorkRefusal,
    admit,
)
from ringfence_server.worker.envelope import (
    FORMAT_VERSION,
    Envelope,
    LogicalKey,
    Refusal,
    SandboxSpec,
    SealedEnvelope,
    seal,
)
from ringfence_server.worker.errors import CallConflict
from ringfence_server.worker.keys import TrustedKeys

# -- fakes for what admission reads ------------------------------------------------------------


class Images:
    def __init__(self, *digests: str) -> None:
        self.digests = set(digests)

    def has(self, digest: str) -> bool:
        return digest in self.digests


@dataclasses.dataclass(frozen=True)
class Caps:
    runtimes: tuple[str, ...] = ("runc", "gvisor")
    egress: bool = True
    workspace: bool = True
    inputs: bool = True

    def has_runtime(self, runtime: str) -> bool:
        return runtime in self.runtimes

    def has_egress(self) -> bool:
        return self.egress

    def has_workspace(self) -> bool:
        return self.workspace

    def has_inputs(self) -> bool:
        return self.inputs


class Results:
    """In memory, with an atomic claim held for one call digest; counts its reads so a test can
    say none happened. (ringfence_server.worker.results is the durable one: test_worker_results.py
    runs admission over it too.)"""

    def __init__(self) -> None:
        self.recorded: dict[LogicalKey, RecordedResult] = {}
        self.claims: dict[LogicalKey, tuple[str, str]] = {}
        self.gets = 0
        self._lock = threading.Lock()

    def get(self, key: LogicalKey) -> RecordedResult | None:
        self.gets += 1
        return self.recorded.get(key)

    def claim(self, key: LogicalKey, envelope_id: str, call_digest: str) -> bool:
        with self._lock:
            if key in self.claims:
                if self.claims[key][1] != call_digest:
                    raise CallConflict(key, self.claims[key][1], call_digest)
                return False
            self.claims[key] = (envelope_id, call_digest)
            return True


class CountingRunner:
    def __init__(self) -> None:
        self.runs: list[Envelope] = []
        self._lock = threading.Lock()

    def run(self, env: Envelope) -> bytes:
        with self._lock:
            self.runs.append(env)
        return json.dumps({"ran": env.tool, "arguments": env.arguments()}).encode()


class Worker:
    """The loop a worker runs around admission (the real one is for a later session): admit,
    then run only on Run and record the result under the logical key."""

    def __init__(self, *, worker_id: str = WORKER, trusted: TrustedKeys = TRUSTED, images=None, caps=None,
                 results=None) -> None:
        self.worker_id = worker_id
        self.trusted = trusted
        self.images = images if images is not None else Images(DIGEST)
        self.caps = caps if caps is not None else Caps()
        self.results = results if results is not None else Results()
        self.runner = CountingRunner()

    def decide(self, sealed: SealedEnvelope, now: float = NOW):
        return admit(sealed, worker_id=self.worker_id, trusted_keys=self.trusted, images=self.images,
                     capabilities=self.caps, results=self.results, now=now)

    def deliver(self, sealed: SealedEnvelope, now: float = NOW):
        decision = self.decide(sealed, now)
        if isinstance(decision, Run):
            env = decision.envelope
            out = self.runner.run(env)
            self.results.recorded[env.logical_key] = RecordedResult(env.envelope_id, env.call_digest, out)
        return decision


def sealed(**changes) -> SealedEnvelope:
    return seal(envelope(**changes), CONTROL_KEY)


# -- running once ------------------------------------------------------------------------------


def test_an_authentic_runnable_envelope_runs_once():
    w = Worker()
    d = w.deliver(sealed())
    assert isinstance(d, Run) and len(w.runner.runs) == 1
    assert d.envelope.logical_key in w.results.recorded


def test_the_same_envelope_delivered_twice_runs_the_tool_once():
    w, s = Worker(), sealed()
    first, second = w.deliver(s), w.deliver(s)
    assert isinstance(first, Run) and isinstance(second, ReturnRecorded)
    assert len(w.runner.runs) == 1
    assert second.recorded.result == w.results.recorded[first.envelope.logical_key].result
    assert second.recorded.envelope_id == first.envelope.envelope_id


def test_a_reissued_envelope_of_the_same_call_returns_the_recorded_result():
    # Another delivery of the logical call (a new envelope id and deadline: another control plane
    # after a failover): still one run.
    w = Worker()
    first = w.deliver(sealed())
    again = w.deliver(sealed(deadline=NOW + 300, traceparent=""))
    assert isinstance(first, Run) and isinstance(again, ReturnRecorded)
    assert again.envelope.envelope_id != first.envelope.envelope_id
    assert len(w.runner.runs) == 1


def test_the_same_call_ids_with_other_content_are_refused_not_answered():
    w = Worker()
    w.deliver(sealed(arguments={"amount": 1}))
    d = w.deliver(sealed(arguments={"amount": 1_000_000}))
    assert d == Refuse(WorkRefusal.CALL_CONFLICT, d.detail)
    assert len(w.runner.runs) == 1


def test_a_second_delivery_while_the_first_runs_is_in_progress():
    w, s = Worker(), sealed()
    first = w.decide(s)  # claimed, not yet recorded: the first delivery is still running
    second = w.decide(s)
    assert isinstance(first, Run) and isinstance(second, InProgress)
    assert w.runner.runs == []


def test_a_second_delivery_of_other_content_while_the_first_runs_is_a_conflict():
    # The claim is held (not yet recorded) for one content; the same ids with other content are
    # refused, not told "in progress" (they would wait for another call's result).
    w = Worker()
    first = w.decide(sealed(arguments={"amount": 1}))
    second = w.decide(sealed(arguments={"amount": 1_000_000}))
    assert isinstance(first, Run)
    assert isinstance(second, Refuse) and second.reason is WorkRefusal.CALL_CONFLICT
    assert w.runner.runs == []


def test_a_result_recorded_between_the_look_up_and_the_claim_is_returned():
    class Racing(Results):
        def claim(self, key, envelope_id, call_digest):
            # The first delivery finishes just as this one looks.
            self.recorded[key] = RecordedResult("env-first", env.call_digest, b"{}")
            return False

    env = envelope()
    w = Worker(results=Racing())
    d = w.deliver(seal(env, CONTROL_KEY))
    assert isinstance(d, ReturnRecorded) and d.recorded.envelope_id == "env-first"
    assert w.runner.runs == []


def test_concurrent_deliveries_of_one_call_run_it_once():
    w, s = Worker(), sealed()
    barrier = threading.Barrier(8)
    decisions = []

    def go():
        barrier.wait()
        decisions.append(w.deliver(s))

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(w.runner.runs) == 1
    assert sum(isinstance(d, Run) for d in decisions) == 1
    assert all(isinstance(d, (Run, InProgress, ReturnRecorded)) for d in decisions)


@settings(max_examples=100, deadline=None)
@given(deliveries=st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=30))
def test_any_sequence_of_deliveries_runs_each_logical_call_at_most_once(deliveries):
    # Four logical calls, each delivered any number of times, as the same envelope again or as a
    # re-issue (a new envelope id): every call runs once, every later delivery gets its result.
    w = Worker()
    originals = {i: sealed(call_id=f"call-{i}") for i in range(4)}
    for i, reissue in deliveries:
        s = sealed(call_id=f"call-{i}", deadline=NOW + 61) if reissue else originals[i]
        d = w.deliver(s)
        assert isinstance(d, (Run, ReturnRecorded))
    ran = [e.call_id for e in w.runner.runs]
    assert sorted(ran) == sorted({f"call-{i}" for i, _ in deliveries})


# -- refusals: nothing runs, nothing is claimed, nothing recorded is read -----------------------


def assert_nothing_happened(w: Worker) -> None:
    assert w.runner.runs == []
    assert w.results.claims == {} and w.results.gets == 0


def test_an_envelope_placed_on_another_worker_is_refused_and_nothing_runs():
    w = Worker(worker_id="worker-2")
    d = w.deliver(sealed())  # placed on worker-1
    assert isinstance(d, Refuse) and d.reason is WorkRefusal.WRONG_WORKER
    assert "worker-1" in d.detail and "worker-2" in d.detail
    assert_nothing_happened(w)
    # The one it was placed on runs it.
    assert isinstance(Worker(worker_id="worker-1").deliver(sealed()), Run)


def test_a_captured_envelope_runs_at_most_on_the_worker_it_was_placed_on():
    # An envelope that named no worker, replayed to every worker that trusts the key, would run
    # once on each: the signed worker id confines it to the worker it was placed on.
    s = sealed()
    workers = [Worker(worker_id=f"worker-{i}") for i in range(1, 5)]
    decisions = [w.deliver(s) for w in workers]
    assert [type(d).__name__ for d in decisions] == ["Run", "Refuse", "Refuse", "Refuse"]
    assert sum(len(w.runner.runs) for w in workers) == 1


def test_an_image_this_worker_has_not_verified_is_refused_and_nothing_runs():
    w = Worker(images=Images(OTHER_DIGEST))
    d = w.deliver(sealed())
    assert isinstance(d, Refuse) and d.reason is WorkRefusal.IMAGE_UNVERIFIED
    assert DIGEST in d.detail
    assert_nothing_happened(w)


def test_a_runtime_this_worker_lacks_is_refused():
    w = Worker(caps=Caps(runtimes=("runc",)))
    d = w.deliver(sealed(profile=SandboxSpec(runtime="gvisor"), egress=None))
    assert isinstance(d, Refuse) and d.reason is WorkRefusal.RUNTIME_UNAVAILABLE
    assert_nothing_happened(w)


def test_an_egress_call_on_a_worker_without_a_proxy_is_refused():
    w = Worker(caps=Caps(egress=False))
    d = w.deliver(sealed())
    assert isinstance(d, Refuse) and d.reason is WorkRefusal.EGRESS_UNAVAILABLE
    assert_nothing_happened(w)
    assert isinstance(Worker(caps=Caps(egress=False)).deliver(sealed(egress=None)), Run)


def test_a_workspace_call_on_a_worker_without_workspaces_is_refused():
    w = Worker(caps=Caps(workspace=False))
    d = w.deliver(sealed())  # the tests' envelope reads the run's workspace
    assert isinstance(d, Refuse) and d.reason is WorkRefusal.WORKSPACE_UNAVAILABLE
    assert "workspace" in d.detail
    assert_nothing_happened(w)
    no_workspace = SandboxSpec(input_roots=("/data",))
    assert isinstance(Worker(caps=Caps(workspace=False)).deliver(sealed(profile=no_workspace)), Run)


def test_a_call_with_input_roots_on_a_worker_without_input_folders_is_refused():
    w = Worker(caps=Caps(inputs=False))
    d = w.deliver(sealed())  # the tests' envelope reads /data
    assert isinstance(d, Refuse) and d.reason is WorkRefusal.INPUTS_UNAVAILABLE
    assert "/data" in d.detail
    assert_nothing_happened(w)
    no_inputs = SandboxSpec(workspace="read")
    assert isinstance(Worker(caps=Caps(inputs=False)).deliver(sealed(profile=no_inputs)), Run)


def test_a_refusal_names_the_envelope_only_when_it_opened():
    s = sealed()
    d = Worker(worker_id="worker-2").deliver(s)
    assert isinstance(d, Refuse) and d.envelope is not None and d.envelope.envelope_id == envelope_mod.decode(
        s.payload).envelope_id
    unsigned = Worker().deliver(dataclasses.replace(s, signature=b""))
    assert isinstance(unsigned, Refuse) and unsigned.envelope is None


def test_a_retry_is_another_attempt_and_runs():
    # The control plane retries a read that failed as attempt 2: another logical key, so it runs
    # even though attempt 1 was recorded; a redelivery of attempt 2 then does not.
    w = Worker()
    first = w.deliver(sealed())
    retry = w.deliver(sealed(attempt=2))
    again = w.deliver(sealed(attempt=2, deadline=NOW + 90))
    assert isinstance(first, Run) and isinstance(retry, Run) and isinstance(again, ReturnRecorded)
    assert [e.attempt for e in w.runner.runs] == [1, 2]


def _forged() -> SealedEnvelope:
    s = sealed(arguments={"amount": 1})
    doc = json.loads(s.payload)
    doc["arguments_json"] = canonical_json({"amount": 1_000_000})
    return dataclasses.replace(s, payload=json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


@pytest.mark.parametrize(("make", "reason"), [
    (lambda: dataclasses.replace(sealed(), signature=b""), Refusal.UNSIGNED),
    (_forged, Refusal.BAD_SIGNATURE),
    (lambda: dataclasses.replace(sealed(), key_id="0" * 16), Refusal.UNKNOWN_KEY),
    (lambda: dataclasses.replace(sealed(), version=FORMAT_VERSION + 1), Refusal.WRONG_VERSION),
    (lambda: dataclasses.replace(sealed(), version=1), Refusal.WRONG_VERSION),
    (lambda: sealed(deadline=NOW - 1, now=NOW - 10), Refusal.EXPIRED),
])
def test_an_envelope_that_does_not_open_runs_nothing_and_touches_no_result(make, reason):
    w = Worker()
    d = w.deliver(make())
    assert d == Refuse(reason, d.detail)
    assert_nothing_happened(w)


def test_a_forged_envelope_cannot_fetch_a_recorded_result():
    # The real call ran; a forgery of it is refused before the results are looked at.
    w = Worker()
    w.deliver(sealed(arguments={"amount": 1}))
    gets = w.results.gets
    d = w.deliver(_forged())
    assert isinstance(d, Refuse) and d.reason is Refusal.BAD_SIGNATURE
    assert w.results.gets == gets and len(w.runner.runs) == 1


@dataclasses.dataclass
class Setup:
    """What the order test varies of a worker."""

    images: Images
    caps: Caps
    worker_id: str = WORKER


def _caps(setup: Setup, **changes) -> Setup:
    return dataclasses.replace(setup, caps=dataclasses.replace(setup.caps, **changes))


def test_the_refusal_order_is_the_documented_one():
    # One fault per check, in the docstring's order; with the faults from the i-th on, the
    # decision names the i-th.
    faults = [
        ("unsigned", lambda w, s: (w, dataclasses.replace(s, signature=b""))),
        ("wrong_worker", lambda w, s: (dataclasses.replace(w, worker_id="worker-other"), s)),
        ("image_unverified", lambda w, s: (dataclasses.replace(w, images=Images()), s)),
        ("runtime_unavailable", lambda w, s: (_caps(w, runtimes=()), s)),
        ("workspace_unavailable", lambda w, s: (_caps(w, workspace=False), s)),
        ("inputs_unavailable", lambda w, s: (_caps(w, inputs=False), s)),
    ]
    base = sealed()
    for i, (expected, _) in enumerate(faults):
        setup, s = Setup(Images(DIGEST), Caps()), base
        for _, apply in faults[i:]:
            setup, s = apply(setup, s)
        results = Results()
        results.recorded[envelope().logical_key] = RecordedResult("env-x", "0" * 64, b"{}")  # the last check's answer
        d = Worker(worker_id=setup.worker_id, images=setup.images, caps=setup.caps, results=results).deliver(s)
        assert isinstance(d, Refuse) and d.reason.value == expected
    # No fault before it: the delivery check answers (the recorded result is for other content).
    results = Results()
    results.recorded[envelope().logical_key] = RecordedResult("env-x", "0" * 64, b"{}")
    assert Worker(results=results).deliver(base).reason is WorkRefusal.CALL_CONFLICT
    doc = admission_mod.__doc__ or ""
    steps = [line.split()[1] for line in doc.splitlines() if line[:2] in {f"{n}." for n in range(1, 10)}]
    assert steps == ["envelope", "worker", "image", "runtime", "mounts", "delivery"]


def test_admission_loads_no_engine_client_database_or_control_plane_state():
    # Pure: importing the worker's foundation pulls in no Docker client, no database driver, and
    # nothing of the control plane but its canonical JSON (and what that module imports).
    code = ("import sys, ringfence_server.worker.admission, ringfence_server.worker.keys; "
            "print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                text=True).stdout.split())
    assert not loaded & {"docker", "psycopg", "psycopg_pool", "sqlite3", "urllib3", "requests"}
    control = {m for m in loaded if m.startswith("ringfence_server.control.")}
    assert control <= {"ringfence_server.control.validation", "ringfence_server.control.registry"}, control


# -- red checks: a protection switched off, the attack goes through ------------------------------


def test_red_check_without_the_image_check_an_unverified_image_runs(monkeypatch):
    w = Worker(images=Images(OTHER_DIGEST))
    assert isinstance(w.deliver(sealed()), Refuse) and w.runner.runs == []
    monkeypatch.setattr(admission_mod, "_check_image", lambda *_: None)  # the protection, removed
    d = w.deliver(sealed())
    assert isinstance(d, Run) and len(w.runner.runs) == 1  # the unverified image ran
    assert w.runner.runs[0].image_digest == DIGEST


def test_red_check_without_the_worker_check_an_envelope_for_another_worker_runs(monkeypatch):
    w = Worker(worker_id="worker-2")
    assert isinstance(w.deliver(sealed()), Refuse) and w.runner.runs == []
    monkeypatch.setattr(admission_mod, "_check_worker", lambda *_: None)  # the protection, removed
    d = w.deliver(sealed())
    assert isinstance(d, Run) and [e.worker_id for e in w.runner.runs] == ["worker-1"]  # ran on worker-2


def test_red_check_without_signature_verification_a_forged_call_runs(monkeypatch):
    w = Worker()
    assert isinstance(w.deliver(_forged()), Refuse) and w.runner.runs == []
    monkeypatch.setattr(envelope_mod, "_verify", lambda *_: None)  # the protection, removed
    d = w.deliver(_forged())
    assert isinstance(d, Run)
    assert [e.arguments() for e in w.runner.runs] == [{"amount": 1_000_000}]  # the forger's arguments ran
