"""The worker's executor (ringfence_server.worker.executor) over the FakeBackend and a real SQLite
results store: every branch of `handle`, the store's state after each, the request it asks the
sandbox for (the control plane's, byte for byte), one run however often an attempt is delivered
(and a run for each attempt), an exception after the start mark leaves the call started, and the
engine module's checks of images and runtimes (ringfence_server.worker.engine) on fake clients.

The witnesses: the FakeBackend's `requests` (every call that reached the sandbox) and the
executor's own `runs_started`."""

from __future__ import annotations

import dataclasses
import json
import threading

import docker.errors
import pytest
from worker_support import CONTROL_KEY, DIGEST, NOW, OTHER_DIGEST, TRUSTED, WORKER, envelope

from ringfence_server.control.validation import canonical
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.egress.proxy import ProxySettings
from ringfence_server.sandbox.errors import EngineError, ImageError, ProfileError
from ringfence_server.sandbox.fake import FakeBackend, ok_result
from ringfence_server.sandbox.pinned_images import Lock, LockEntry
from ringfence_server.sandbox.result import Outcome, SandboxResult, ToolErrorClass
from ringfence_server.worker import envelope as envelope_mod
from ringfence_server.worker.engine import EngineCapabilities, VerifiedLockImages
from ringfence_server.worker.envelope import GrantedEgress, SandboxSpec, SealedEnvelope, seal
from ringfence_server.worker.errors import ExecutorError, WorkerError
from ringfence_server.worker.executor import Report, ReportKind, WorkerExecutor, request_body
from ringfence_server.worker.results import CallState, SqliteResults
from ringfence_server.worker.wire import decode_result

SPEC = SandboxSpec(runtime="runc", memory_bytes=64 * 1024 * 1024, cpus=0.5, pids=32, timeout_s=5.0,
                   stdout_limit=65536, stderr_limit=4096, warm=False)
"""What the executor can run today: no workspace, no input folders."""
GRANT = GrantedEgress(allow=("api.example.com",), max_bytes=1024, max_connections=4)
TOOL_OUT = b'{"ok":true,"content":{"posted":true}}\n'


def runnable(**changes) -> SealedEnvelope:
    fields = {"profile": SPEC, "egress": GRANT}
    fields.update(changes)
    return seal(envelope(**fields), CONTROL_KEY)


class Rig:
    """One worker: the executor, its store on a real SQLite file, and the fake backend."""

    def __init__(self, tmp_path, handler=None, *, capabilities=None, images=None, worker_id: str = WORKER) -> None:
        self.backend = FakeBackend(handler or (lambda request: ok_result(TOOL_OUT)))
        self.results = SqliteResults(tmp_path / "results.sqlite3")
        self.executor = WorkerExecutor(
            worker_id=worker_id, trusted_keys=TRUSTED, results=self.results, backend=self.backend,
            images=images if images is not None else VerifiedLockImages({DIGEST: "tool"}),
            capabilities=capabilities if capabilities is not None else EngineCapabilities(
                runtimes=frozenset({"runc", "gvisor"}), egress=True),
            clock=lambda: NOW)

    def handle(self, sealed: SealedEnvelope) -> Report:
        return self.executor.handle(sealed)

    def state(self, sealed: SealedEnvelope) -> CallState | None:
        entry = self.results.entry(envelope_mod.decode(sealed.payload).logical_key)
        return entry.state if entry is not None else None

    def close(self) -> None:
        self.results.close()


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    yield r
    r.close()


@pytest.fixture
def make_rig(tmp_path):
    made: list[Rig] = []

    def make(handler=None, **kwargs) -> Rig:
        r = Rig(tmp_path / str(len(made)), handler, **kwargs)
        made.append(r)
        return r

    for i in range(8):
        (tmp_path / str(i)).mkdir()
    yield make
    for r in made:
        r.close()


def assert_nothing_ran(r: Rig, sealed: SealedEnvelope) -> None:
    assert r.executor.runs_started == 0 and r.backend.requests == []
    assert r.state(sealed) is None  # nothing claimed


# -- running ------------------------------------------------------------------------------------


def test_an_admitted_envelope_runs_once_and_its_result_is_recorded(rig):
    s = runnable()
    report = rig.handle(s)
    env = envelope_mod.decode(s.payload)
    assert (report.kind, report.envelope_id, report.key) == (ReportKind.RESULT, env.envelope_id, env.logical_key)
    assert report.recorded_by == env.envelope_id and report.reason is None
    assert decode_result(report.result, limits=SPEC) == ok_result(TOOL_OUT)
    assert rig.executor.runs_started == 1 and len(rig.backend.requests) == 1
    entry = rig.results.entry(env.logical_key)
    assert (entry.state, entry.result, entry.envelope_id) == (CallState.RECORDED, report.result, env.envelope_id)


def test_the_request_is_the_control_planes(rig):
    s = runnable(attempt=3, arguments={"b": 2.0, "a": ["é", 1.5]})
    rig.handle(s)
    [request] = rig.backend.requests
    p = request.profile
    assert (p.image, p.runtime, p.memory_bytes, p.cpus, p.pids, p.timeout_s, p.stdout_limit, p.stderr_limit) == \
        ("tool", "runc", 64 * 1024 * 1024, 0.5, 32, 5.0, 65536, 4096)
    assert p.egress == GRANT.to_grant() and p.workspace is None and p.inputs == ()
    # The control plane's labels: the run's sandbox id, and the attempt's call id.
    assert (request.run_id, request.call_id, request.warm, request.argv) == ("acme:run-1", "call-1.a3", False, ())
    assert request.mcp is None and request.on_output is None
    # The tool sees the LOGICAL call id, whichever attempt this is, and the key: the body built
    # exactly as dispatch builds it (json.dumps, compact separators, ASCII escapes) from the
    # arguments as its validation hands them on (control.validation's normal form).
    validated = canonical({"b": 2.0, "a": ["é", 1.5]})
    assert list(validated) == ["a", "b"] and validated["b"] == 2
    expected = json.dumps({"tool": "post_invoice", "arguments": validated, "call_id": "call-1",
                           "idempotency_key": "k" * 64}, separators=(",", ":")).encode()
    assert request.stdin == expected == request_body(envelope_mod.decode(s.payload))
    assert b'"call_id":"call-1",' in request.stdin and b"\\u00e9" in request.stdin


def test_a_call_without_egress_or_key_and_warm(rig):
    rig.handle(runnable(egress=None, idempotency_key=None, profile=dataclasses.replace(SPEC, warm=True)))
    [request] = rig.backend.requests
    assert request.profile.egress is None and request.warm is True
    assert json.loads(request.stdin)["idempotency_key"] is None


def test_the_start_mark_is_written_before_the_engine_is_asked(make_rig):
    seen = []

    def handler(request: SandboxRequest) -> SandboxResult:
        seen.append(r.state(s))
        return ok_result(TOOL_OUT)

    r, s = make_rig(handler), runnable()
    r.handle(s)
    assert seen == [CallState.STARTED]
    assert r.state(s) is CallState.RECORDED


def test_the_same_envelope_delivered_twice_runs_once_and_answers_with_the_first_bytes(rig):
    s = runnable()
    first, second = rig.handle(s), rig.handle(s)
    assert second.kind is ReportKind.RESULT and second.result == first.result
    assert second.recorded_by == first.envelope_id == second.envelope_id
    assert rig.executor.runs_started == 1 and len(rig.backend.requests) == 1


def test_a_reissue_of_the_same_attempt_runs_nothing(rig):
    first = rig.handle(runnable())
    again = rig.handle(runnable(deadline=NOW + 300, traceparent=""))  # another envelope id
    assert again.envelope_id != first.envelope_id and again.result == first.result
    assert again.recorded_by == first.envelope_id
    assert rig.executor.runs_started == 1


def test_attempt_2_of_the_same_call_runs(rig):
    first = rig.handle(runnable())
    retry = rig.handle(runnable(attempt=2))
    assert first.key.attempt == 1 and retry.key.attempt == 2 and retry.recorded_by == retry.envelope_id
    assert rig.executor.runs_started == 2
    assert [r.call_id for r in rig.backend.requests] == ["call-1.a1", "call-1.a2"]
    assert [json.loads(r.stdin)["call_id"] for r in rig.backend.requests] == ["call-1", "call-1"]
    assert rig.handle(runnable(attempt=2)).result == retry.result and rig.executor.runs_started == 2


@pytest.mark.parametrize("outcome", [o for o in Outcome if o is not Outcome.START_FAILED])
def test_every_result_but_a_failed_start_is_recorded(make_rig, outcome):
    # A tool error, a timeout, an engine failure after the start (uncertain): each ran (or may
    # have), so it is the call's result for good.
    out = SandboxResult(outcome=outcome, exit_code=None, stdout=b"partial", stderr=b"err", stdout_truncated=False,
                        stderr_truncated=False, duration_ms=5, image_id=DIGEST, runtime="runc",
                        error_class=ToolErrorClass.TRANSIENT if outcome is Outcome.TOOL_ERROR else None,
                        message=outcome.value)
    r, s = make_rig(lambda request: out), runnable()
    report = r.handle(s)
    assert report.kind is ReportKind.RESULT and decode_result(report.result, limits=SPEC) == out
    assert r.state(s) is CallState.RECORDED and report.recorded_by == report.envelope_id
    assert r.handle(s).result == report.result and r.executor.runs_started == 1


# -- a start that failed: nothing ran, the claim goes back ------------------------------------------


def _start_failed(request: SandboxRequest) -> SandboxResult:
    return SandboxResult(outcome=Outcome.START_FAILED, exit_code=None, stdout=b"", stderr=b"",
                         stdout_truncated=False, stderr_truncated=False, duration_ms=0, image_id=DIGEST,
                         runtime="runc", message="the engine refused the container")


@pytest.mark.parametrize(("fail", "message"), [
    (_start_failed, "the engine refused the container"),
    (EngineError("the engine does not answer"), "sandbox engine: the engine does not answer"),
    (ImageError("pinned image vanished"), "image refused: pinned image vanished"),
])
def test_a_start_that_failed_is_released_reported_and_run_by_the_retry(make_rig, fail, message):
    calls = []

    def handler(request: SandboxRequest) -> SandboxResult:
        calls.append(request)
        if len(calls) == 1:
            if isinstance(fail, Exception):
                raise fail
            return fail(request)
        return ok_result(TOOL_OUT)

    r, s = make_rig(handler), runnable()
    report = r.handle(s)
    failed = decode_result(report.result, limits=SPEC)
    assert report.kind is ReportKind.RESULT and failed.outcome is Outcome.START_FAILED
    assert failed.message == message and report.recorded_by is None
    entry = r.results.entry(report.key)
    assert (entry.state, entry.release_reason) == (CallState.RELEASED, message)
    # The control plane's retry (here: a redelivery) runs it, and this time it is recorded.
    again = r.handle(s)
    assert decode_result(again.result, limits=SPEC).outcome is Outcome.OK and again.recorded_by == again.envelope_id
    assert r.state(s) is CallState.RECORDED and r.executor.runs_started == 2


def test_a_request_the_sandbox_refuses_is_released_and_never_started(rig):
    # The envelope allows a call id the sandbox's labels do not (a space): nothing starts.
    s = runnable(call_id="call 1")
    report = rig.handle(s)
    failed = decode_result(report.result, limits=SPEC)
    assert failed.outcome is Outcome.START_FAILED and "call_id" in failed.message
    assert rig.state(s) is CallState.RELEASED
    assert rig.executor.runs_started == 0 and rig.backend.requests == []


def test_a_mount_the_worker_cannot_make_is_never_started_even_past_admission(make_rig):
    # Capabilities that claim workspaces (a misconfigured worker): admission lets the call through,
    # the executor still does not run it without its workspace.
    @dataclasses.dataclass(frozen=True)
    class Claiming(EngineCapabilities):
        def has_workspace(self) -> bool:
            return True

        def has_inputs(self) -> bool:
            return True

    r = make_rig(capabilities=Claiming(runtimes=frozenset({"runc"}), egress=True))
    s = runnable(profile=dataclasses.replace(SPEC, workspace="read"))
    report = r.handle(s)
    message = decode_result(report.result, limits=SPEC).message
    assert message == "the worker cannot run it: this worker mounts no workspace"
    assert r.state(s) is CallState.RELEASED and r.executor.runs_started == 0 and r.backend.requests == []
    with pytest.raises(ExecutorError):
        r.executor.sandbox_request(envelope(profile=dataclasses.replace(SPEC, input_roots=("/data",))))


# -- an unexpected exception after the start mark: the call stays started, the error propagates ----


@pytest.mark.parametrize("error", [RuntimeError("a bug"), ProfileError("runtime", "no runsc"), KeyboardInterrupt()])
def test_an_unexpected_exception_after_the_start_mark_leaves_the_call_started(make_rig, error):
    def handler(request: SandboxRequest) -> SandboxResult:
        raise error

    r, s = make_rig(handler), runnable()
    with pytest.raises(type(error)):
        r.handle(s)
    assert r.state(s) is CallState.STARTED and r.executor.runs_started == 1
    # It may have run: a redelivery is told it is in progress, never runs it again.
    assert r.handle(s).kind is ReportKind.IN_PROGRESS and r.executor.runs_started == 1


def test_a_failure_to_record_leaves_the_call_started(rig, monkeypatch):
    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(rig.results, "record", broken)
    s = runnable()
    with pytest.raises(OSError):
        rig.handle(s)
    assert rig.state(s) is CallState.STARTED


def test_after_a_crash_while_the_tool_ran_a_redelivery_is_answered_uncertain(tmp_path):
    path = tmp_path / "results.sqlite3"

    def crash(request: SandboxRequest) -> SandboxResult:
        raise RuntimeError("the worker dies while the tool runs")

    s = runnable()
    r = Rig(tmp_path, crash)
    with pytest.raises(RuntimeError):
        r.handle(s)
    r.close()
    with SqliteResults(path) as store:  # the worker's restart
        assert len(store.recover().uncertain) == 1
    again = Rig(tmp_path)
    try:
        report = again.handle(runnable(deadline=NOW + 300))
        assert report.kind is ReportKind.UNCERTAIN and report.result is None
        assert report.recorded_by == envelope_mod.decode(s.payload).envelope_id
        assert again.executor.runs_started == 0
    finally:
        again.close()


# -- in progress ----------------------------------------------------------------------------------


def test_a_delivery_while_the_first_runs_is_in_progress(make_rig):
    during = []

    def handler(request: SandboxRequest) -> SandboxResult:
        during.append(r.handle(s))  # the control plane redelivers while the tool runs
        return ok_result(TOOL_OUT)

    r, s = make_rig(handler), runnable()
    first = r.handle(s)
    [second] = during
    assert first.kind is ReportKind.RESULT
    assert (second.kind, second.result, second.recorded_by) == (ReportKind.IN_PROGRESS, None, None)
    assert second.key == first.key and r.executor.runs_started == 1


def test_concurrent_deliveries_of_one_attempt_run_it_once(make_rig):
    gate = threading.Event()
    done = threading.Condition()
    reports: list[Report] = []

    def handler(request: SandboxRequest) -> SandboxResult:
        gate.wait(60)  # held until every other delivery has answered
        return ok_result(TOOL_OUT)

    r, s = make_rig(handler), runnable()

    def deliver() -> None:
        report = r.handle(s)
        with done:
            reports.append(report)
            done.notify_all()

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for t in threads:
        t.start()
    with done:
        assert done.wait_for(lambda: len(reports) == 7, 60)
    gate.set()
    for t in threads:
        t.join()
    kinds = sorted(report.kind.value for report in reports)
    assert kinds == ["in_progress"] * 7 + ["result"]
    assert r.executor.runs_started == 1 and len(r.backend.requests) == 1


# -- refusals: nothing claimed, nothing run ----------------------------------------------------------


def _forged() -> SealedEnvelope:
    s = runnable(arguments={"amount": 1})
    doc = json.loads(s.payload)
    doc["arguments_json"] = json.dumps({"amount": 1000000}, separators=(",", ":"))
    return dataclasses.replace(s, payload=json.dumps(doc, sort_keys=True, separators=(",", ":"),
                                                     ensure_ascii=False).encode())


@pytest.mark.parametrize(("make", "setup", "reason", "opened"), [
    (lambda: dataclasses.replace(runnable(), signature=b""), {}, "unsigned", False),
    (_forged, {}, "bad_signature", False),
    (lambda: runnable(deadline=NOW - 1, now=NOW - 10), {}, "expired", False),
    (runnable, {"worker_id": "worker-2"}, "wrong_worker", True),
    (runnable, {"images": VerifiedLockImages({OTHER_DIGEST: "tool"})}, "image_unverified", True),
    (lambda: runnable(profile=dataclasses.replace(SPEC, runtime="gvisor"), egress=None),
     {"capabilities": EngineCapabilities(runtimes=frozenset({"runc"}), egress=True)}, "runtime_unavailable", True),
    (runnable, {"capabilities": EngineCapabilities(runtimes=frozenset({"runc"}), egress=False)},
     "egress_unavailable", True),
    (lambda: runnable(profile=dataclasses.replace(SPEC, workspace="write")), {}, "workspace_unavailable", True),
    (lambda: runnable(profile=dataclasses.replace(SPEC, input_roots=("/data",))), {}, "inputs_unavailable", True),
])
def test_a_refused_envelope_claims_nothing_and_runs_nothing(make_rig, make, setup, reason, opened):
    r, s = make_rig(**setup), make()
    report = r.handle(s)
    assert (report.kind, report.reason, report.result, report.recorded_by) == (ReportKind.REFUSED, reason, None, None)
    assert report.detail
    if opened:  # a refusal of an envelope that opened says which; of one that did not, nothing
        assert report.envelope_id == envelope_mod.decode(s.payload).envelope_id and report.key is not None
    else:
        assert report.envelope_id is None and report.key is None
    assert_nothing_ran(r, s)


def test_a_call_conflict_is_refused_and_the_recorded_call_untouched(rig):
    first = rig.handle(runnable(arguments={"amount": 1}))
    other = rig.handle(runnable(arguments={"amount": 2}))
    assert (other.kind, other.reason) == (ReportKind.REFUSED, "call_conflict")
    assert rig.executor.runs_started == 1 and rig.results.entry(first.key).result == first.result


def test_red_check_without_signature_verification_a_forged_envelope_runs(rig, monkeypatch):
    assert rig.handle(_forged()).reason == "bad_signature" and rig.executor.runs_started == 0
    monkeypatch.setattr(envelope_mod, "_verify", lambda *_: None)  # the protection, removed
    report = rig.handle(_forged())
    assert report.kind is ReportKind.RESULT and rig.executor.runs_started == 1
    assert json.loads(rig.backend.requests[0].stdin)["arguments"] == {"amount": 1000000}  # the forger's


# -- the engine: images verified by content, runtimes registered ------------------------------------


class _Image:
    def __init__(self, image_id: str) -> None:
        self.id = image_id


class _Images:
    def __init__(self, held: dict[str, str]) -> None:
        self.held = held  # what images.get(ref) resolves to (a tag or prefix may resolve elsewhere)

    def get(self, ref: str) -> _Image:
        if ref not in self.held:
            raise docker.errors.ImageNotFound(ref)
        return _Image(self.held[ref])


class FakeClient:
    def __init__(self, held: dict[str, str] | None = None, runtimes=("runc",), fail: bool = False) -> None:
        self.images = _Images(held or {})
        self._runtimes, self._fail = runtimes, fail

    def info(self) -> dict:
        if self._fail:
            raise docker.errors.APIError("engine down")
        return {"Runtimes": {name: {"path": name} for name in self._runtimes}}


def _id(c: str) -> str:
    return "sha256:" + c * 64


def _entry(name: str, image_id: str) -> LockEntry:
    return LockEntry(name=name, id=image_id, inputs_sha256="0" * 64)


def test_only_lock_images_the_engine_holds_with_exactly_that_id_are_verified():
    lock = Lock((_entry("tool", _id("a")), _entry("ledger", _id("b")), _entry("runbooks", _id("c"))))
    # The engine holds tool's ID; ledger's ID resolves to another image (a prefix, a moved tag);
    # runbooks is not there at all.
    client = FakeClient({_id("a"): _id("a"), _id("b"): _id("d")})
    images = VerifiedLockImages.from_engine(lock, client)
    assert dict(images.names) == {_id("a"): "tool"}
    assert images.has(_id("a")) and not images.has(_id("b")) and not images.has(_id("c"))
    assert images.name_for(_id("a")) == "tool"
    with pytest.raises(ExecutorError):
        images.name_for(_id("b"))
    assert issubclass(ExecutorError, WorkerError)


def test_a_shadowed_builtin_entry_is_never_named_for_its_id():
    # A user's lock names "tool" for another image: the backend resolves "tool" to the user's ID,
    # so the built-in tool's ID must not be run as "tool".
    builtin = Lock((_entry("tool", _id("a")), _entry("ledger", _id("b"))))
    user = Lock((_entry("tool", _id("e")),), inherited=builtin)
    client = FakeClient({i: i for i in (_id("a"), _id("b"), _id("e"))})
    images = VerifiedLockImages.from_engine(user, client)
    assert dict(images.names) == {_id("e"): "tool", _id("b"): "ledger"}


def test_an_engine_failure_while_verifying_is_an_engine_error():
    class Broken(FakeClient):
        def __init__(self) -> None:
            super().__init__()
            self.images = self  # type: ignore[assignment]

        def get(self, ref: str) -> _Image:
            raise docker.errors.APIError("boom")

    with pytest.raises(EngineError):
        VerifiedLockImages.from_engine(Lock((_entry("tool", _id("a")),)), Broken())


def test_gvisor_only_when_the_engine_registers_runsc_and_egress_only_when_configured():
    plain = EngineCapabilities.from_engine(FakeClient(runtimes=("runc",)), egress_settings=None)
    assert plain.has_runtime("runc") and not plain.has_runtime("gvisor") and not plain.has_egress()
    both = EngineCapabilities.from_engine(FakeClient(runtimes=("runc", "runsc", "io.containerd.runc.v2")),
                                          egress_settings=ProxySettings())
    assert both.has_runtime("gvisor") and both.has_egress() and both.runtimes == {"runc", "gvisor"}
    # A runtime merely called "gvisor" in the engine is not runsc.
    assert not EngineCapabilities.from_engine(FakeClient(runtimes=("gvisor",)), egress_settings=None).has_runtime(
        "gvisor")
    assert not both.has_workspace() and not both.has_inputs()  # not built: admission refuses those calls
    with pytest.raises(EngineError):
        EngineCapabilities.from_engine(FakeClient(fail=True), egress_settings=None)
