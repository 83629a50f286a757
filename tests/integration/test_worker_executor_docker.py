"""The worker's executor on the real Docker engine: a sealed envelope, signed with a real Ed25519
key pair (PEM files, as a control plane and a worker hold them), runs a built-in tool in a real
container of the pinned `tool` image, and the result decoded from its wire form is the tool's real
output; the same envelope delivered twice starts one container; a tampered, unsigned, misplaced
or unverified-image envelope starts none. Red checks switch the signature check and the image
check off to show those envelopes then do start a container.

The witnesses: a wrapper that counts every request that reached the real backend (`Counting`),
and the executor's own `runs_started`."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid

import pytest

from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.result import Outcome
from ringfence_server.sandbox.runner_protocol import read_success
from ringfence_server.worker import admission as admission_mod
from ringfence_server.worker import envelope as envelope_mod
from ringfence_server.worker.engine import EngineCapabilities, VerifiedLockImages
from ringfence_server.worker.envelope import Envelope, SandboxSpec, SealedEnvelope, seal
from ringfence_server.worker.executor import ReportKind, WorkerExecutor
from ringfence_server.worker.keys import (
    TrustedKeys,
    generate_private_key,
    load_private_key,
    save_private_key,
    save_public_key,
)
from ringfence_server.worker.results import CallState, SqliteResults
from ringfence_server.worker.wire import decode_result

pytestmark = pytest.mark.docker

WORKER = "worker-itest"
# The echo and write_note manifests' ceilings (ringfence_server/control/tools/*.json), as a
# control plane's Dispatcher.profile would put them in the envelope.
SPEC = SandboxSpec(runtime="runc", memory_bytes=64 * 1024 * 1024, cpus=0.5, pids=32, timeout_s=10.0,
                   stdout_limit=1024 * 1024, stderr_limit=64 * 1024, warm=True)


class Counting:
    """Wraps the real backend; `requests` is the witness of what reached the engine."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.requests: list[SandboxRequest] = []

    def run(self, request):
        self.requests.append(request)
        return self.backend.run(request)

    def __getattr__(self, name):
        return getattr(self.backend, name)


class Worker:
    """One worker on the real engine: its key files, its results store, its executor."""

    def __init__(self, tmp_path, docker_client, pinned_images, backend, *, worker_id: str = WORKER,
                 images=None) -> None:
        # The control plane's key pair as files: the private key 0600 on the control plane's side,
        # the public key in the worker's trust folder.
        (tmp_path / "trust").mkdir()
        save_private_key(generate_private_key(), tmp_path / "control.key")
        self.signing_key = load_private_key(tmp_path / "control.key")
        save_public_key(self.signing_key.public_key(), tmp_path / "trust" / "control.pem")
        trusted = TrustedKeys.from_folder(tmp_path / "trust")
        self.tool_digest = pinned_images.image_id("tool")
        self.counting = Counting(backend)
        self.results = SqliteResults(tmp_path / "results.sqlite3")
        self.executor = WorkerExecutor(
            worker_id=worker_id, trusted_keys=trusted, results=self.results, backend=self.counting,
            images=images if images is not None else VerifiedLockImages.from_engine(pinned_images, docker_client),
            capabilities=EngineCapabilities.from_engine(docker_client, egress_settings=None), clock=time.time)
        self.run_id = "wx-" + uuid.uuid4().hex[:10]

    def envelope(self, **changes) -> Envelope:
        fields = {"worker_id": WORKER, "run_id": self.run_id, "call_id": "call-1", "attempt": 1, "tenant": "acme",
                  "tool": "echo", "arguments": {"text": "hello from a worker"}, "image_digest": self.tool_digest,
                  "profile": SPEC, "deadline": time.time() + 300, "now": time.time(), "egress": None}
        fields.update(changes)
        return Envelope.for_call(**fields)

    def sealed(self, **changes) -> SealedEnvelope:
        return seal(self.envelope(**changes), self.signing_key)

    def assert_no_container(self) -> None:
        assert self.counting.requests == [] and self.executor.runs_started == 0


@pytest.fixture
def worker(tmp_path, docker_client, pinned_images, backend):
    w = Worker(tmp_path, docker_client, pinned_images, backend)
    yield w
    w.results.close()


def test_a_sealed_echo_runs_in_a_real_container_and_its_output_comes_back(worker):
    report = worker.executor.handle(worker.sealed())
    assert report.kind is ReportKind.RESULT, report
    result = decode_result(report.result, limits=SPEC)
    assert result.outcome is Outcome.OK, result
    assert read_success(result.stdout) == {"text": "hello from a worker"}  # the tool's real answer
    # It ran on this engine, in the pinned image, with the sandbox's hardening read back.
    assert result.image_id == worker.tool_digest and result.runtime == "runc"
    assert result.applied["read_only"] is True and result.applied["network_mode"] == "none"
    assert result.applied["user"] == "10001:10001" and result.applied["memory"] == SPEC.memory_bytes
    assert len(worker.counting.requests) == 1 and worker.executor.runs_started == 1
    assert worker.results.entry(report.key).state is CallState.RECORDED


def test_the_same_envelope_delivered_twice_starts_one_container(worker):
    sealed = worker.sealed(arguments={"text": "once"})
    first = worker.executor.handle(sealed)
    second = worker.executor.handle(SealedEnvelope.from_bytes(sealed.to_bytes()))  # as it came off the wire
    assert first.kind is second.kind is ReportKind.RESULT
    assert second.result == first.result and second.recorded_by == first.envelope_id
    assert len(worker.counting.requests) == 1 and worker.executor.runs_started == 1
    assert read_success(decode_result(second.result, limits=SPEC).stdout) == {"text": "once"}


def test_a_retry_is_a_new_container_and_the_tool_sees_the_logical_call_and_its_key(worker):
    # write_note (mutating, writes only under the container's /tmp) returns the idempotency key it
    # was given: the tool's request is the control plane's, attempt 2 or not.
    key = "k" * 64
    first = worker.executor.handle(worker.sealed(tool="write_note", arguments={"name": "n1", "text": "hi"},
                                                 idempotency_key=key))
    retry = worker.executor.handle(worker.sealed(tool="write_note", arguments={"name": "n1", "text": "hi"},
                                                 idempotency_key=key, attempt=2))
    assert worker.executor.runs_started == 2
    for report in (first, retry):
        content = read_success(decode_result(report.result, limits=SPEC).stdout)
        assert content["idempotency_key"] == key
    assert [r.call_id for r in worker.counting.requests] == ["call-1.a1", "call-1.a2"]
    assert {json.loads(r.stdin)["call_id"] for r in worker.counting.requests} == {"call-1"}


# -- refusals: no container ------------------------------------------------------------------------


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]


def _tampered_payload(sealed: SealedEnvelope) -> SealedEnvelope:
    """One byte of the payload changed, still a canonical envelope: the text the tool echoes."""
    at = sealed.payload.index(b"hello from a worker")
    return dataclasses.replace(sealed, payload=sealed.payload[:at] + b"j" + sealed.payload[at + 1:])


@pytest.mark.parametrize(("tamper", "reason"), [
    (lambda s: dataclasses.replace(s, signature=_flip(s.signature, 17)), "bad_signature"),
    (_tampered_payload, "bad_signature"),
    (lambda s: dataclasses.replace(s, signature=b""), "unsigned"),
])
def test_a_tampered_or_unsigned_envelope_starts_no_container(worker, tamper, reason):
    sealed = tamper(worker.sealed())
    # Through the wire form too: what a worker receives is bytes.
    for delivery in (sealed, SealedEnvelope.from_bytes(sealed.to_bytes())):
        report = worker.executor.handle(delivery)
        assert (report.kind, report.reason) == (ReportKind.REFUSED, reason)
        assert report.envelope_id is None and report.key is None
    worker.assert_no_container()


def test_an_envelope_for_an_image_the_worker_has_not_verified_starts_no_container(worker):
    # A digest of no image this worker checked on its engine: in no lock entry, on no engine.
    report = worker.executor.handle(worker.sealed(image_digest="sha256:" + "0" * 64))
    assert (report.kind, report.reason) == (ReportKind.REFUSED, "image_unverified")
    worker.assert_no_container()
    assert worker.results.entry(report.key) is None


def test_an_envelope_placed_on_another_worker_starts_no_container(worker):
    report = worker.executor.handle(worker.sealed(worker_id="worker-other"))
    assert (report.kind, report.reason) == (ReportKind.REFUSED, "wrong_worker")
    assert "worker-other" in report.detail
    worker.assert_no_container()
    assert worker.results.entry(report.key) is None


# -- red checks: a protection switched off, the container starts -------------------------------------


def test_red_check_without_signature_verification_a_tampered_envelope_starts_a_container(worker, monkeypatch):
    tampered = _tampered_payload(worker.sealed())
    assert worker.executor.handle(tampered).reason == "bad_signature"
    worker.assert_no_container()
    monkeypatch.setattr(envelope_mod, "_verify", lambda *_: None)  # the protection, removed
    report = worker.executor.handle(tampered)
    assert report.kind is ReportKind.RESULT
    assert len(worker.counting.requests) == 1 and worker.executor.runs_started == 1
    # The attacker's one byte reached the tool.
    assert read_success(decode_result(report.result, limits=SPEC).stdout) == {"text": "jello from a worker"}


class NotVerified:
    """This worker's verified images less one it holds but did not verify for work: the backend
    could run it by name, so only admission's image check stands between the envelope and a
    container."""

    def __init__(self, images: VerifiedLockImages, digest: str) -> None:
        self.images, self.digest = images, digest

    def has(self, digest: str) -> bool:
        return digest != self.digest and self.images.has(digest)

    def name_for(self, digest: str) -> str:
        return self.images.name_for(digest)


def test_red_check_without_the_image_check_an_unverified_image_starts_a_container(
        tmp_path, docker_client, pinned_images, backend, monkeypatch):
    images = NotVerified(VerifiedLockImages.from_engine(pinned_images, docker_client), pinned_images.image_id("tool"))
    w = Worker(tmp_path, docker_client, pinned_images, backend, images=images)
    try:
        sealed = w.sealed()
        assert w.executor.handle(sealed).reason == "image_unverified"
        w.assert_no_container()
        monkeypatch.setattr(admission_mod, "_check_image", lambda *_: None)  # the protection, removed
        report = w.executor.handle(sealed)
        assert report.kind is ReportKind.RESULT and decode_result(report.result, limits=SPEC).ok
        assert len(w.counting.requests) == 1 and w.executor.runs_started == 1  # the unverified image ran
    finally:
        w.results.close()
