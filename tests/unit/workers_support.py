"""Sandbox workers in one process, for fast tests of the control flow: the control plane's hub
on a real gRPC server on a real loopback port, and workers that attach to it over real streams,
each with its real executor and results store (SQLite files) in front of a FakeBackend (no
Docker: tests/integration and tests/e2e run the same on real engines)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path
from typing import Any

import grpc

from ringfence.v1 import workers_pb2_grpc
from ringfence_server.control.config import load_config
from ringfence_server.control.store.sqlite import SqliteEventStore
from ringfence_server.control.workers.hub import WorkerHub
from ringfence_server.control.workers.registry import WorkerRegistry
from ringfence_server.control.workers.remote import RemoteBackend
from ringfence_server.control.workers.sealing import Sealer
from ringfence_server.sandbox.fake import FakeBackend
from ringfence_server.sandbox.pinned_images import load_lock
from ringfence_server.worker.attach import Attacher, Capacity
from ringfence_server.worker.engine import EngineCapabilities, VerifiedLockImages
from ringfence_server.worker.executor import WorkerExecutor
from ringfence_server.worker.keys import TrustedKeys, generate_private_key
from ringfence_server.worker.results import SqliteResults

LOCK = load_lock()
KEY = generate_private_key()
TRUSTED = TrustedKeys.of([KEY.public_key()])


def token_for(worker_id: str) -> str:
    return f"token-of-{worker_id}"


def workers_config(worker_ids: tuple[str, ...], *, lease_s: float = 3.0, heartbeat_s: float = 0.2,
                   place_timeout_s: float = 5.0, tenant_labels: dict[str, dict[str, str]] | None = None,
                   tmp: Path) -> Any:
    key = tmp / "signing-key.pem"
    if not key.exists():
        from ringfence_server.worker.keys import save_private_key

        save_private_key(KEY, key)
    return load_config(overrides={"workers": {
        "enabled": True, "signing_key": str(key), "lease_s": lease_s, "heartbeat_s": heartbeat_s,
        "place_timeout_s": place_timeout_s, "tenant_labels": tenant_labels or {},
        "tokens": {w: hashlib.sha256(token_for(w).encode()).hexdigest() for w in worker_ids}}}).workers


class HubServer:
    """The hub on a grpc.aio server of its own event loop thread, on 127.0.0.1:0."""

    def __init__(self, registry: WorkerRegistry, store: Any, config: Any, holder: str = "cp-test",
                 max_message_bytes: int = 1024 * 1024) -> None:
        # As `ringfence serve` sets it (limits.max_message_bytes): the hub shares the API's server.
        self._options = [("grpc.max_receive_message_length", max_message_bytes)]
        self.hub = WorkerHub(registry, store, config, holder)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="hub-loop")
        self._thread.start()
        self._server: grpc.aio.Server | None = None
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        self.address = f"127.0.0.1:{self.port}"

    async def _start(self) -> int:
        self._server = grpc.aio.server(options=self._options)
        workers_pb2_grpc.add_WorkerHubServicer_to_server(self.hub, self._server)  # type: ignore[arg-type]
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return port

    def close(self) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(0), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


class InProcessWorker:
    """A worker's executor, results store and attachment, over `backend`, on its own thread."""

    def __init__(self, worker_id: str, address: str, tmp: Path, backend: FakeBackend, *, slots: int = 4,
                 token: str | None = None, labels: dict[str, str] | None = None) -> None:
        self.worker_id = worker_id
        self.backend = backend
        self.results = SqliteResults(tmp / f"{worker_id}-results.sqlite3")
        self.recovery = self.results.recover()
        images = VerifiedLockImages({LOCK.image_id(n): n for n in LOCK.names})
        self.executor = WorkerExecutor(worker_id=worker_id, trusted_keys=TRUSTED, results=self.results,
                                       backend=backend, images=images,
                                       capabilities=EngineCapabilities(runtimes=frozenset({"runc", "gvisor"}),
                                                                       egress=True))
        capacity = Capacity(slots=slots, cpus=2.0, runtimes=("runc", "gvisor"),
                            image_digests=tuple(sorted(images.names)), egress=True, labels=labels or {})
        self.stop_event = threading.Event()
        self.attacher = Attacher(worker_id=worker_id, token=token or token_for(worker_id), addresses=(address,),
                                 capacity=capacity, handler=self.executor, kill_run=backend.kill_run,
                                 on_fenced=backend.kill_all, redial_s=0.2)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"worker-{worker_id}")
        self._thread.start()

    def _run(self) -> None:
        try:
            self.attacher.run(self.stop_event)
        except BaseException as e:  # noqa: BLE001 - kept for the test to assert on
            self.error = e

    def stop(self) -> None:
        """Detach (the stream ends) and, once the calls it still runs have ended, close."""
        self.detach()
        self.attacher.drain()
        self.results.close()

    def detach(self) -> None:
        """Only end the attachment: calls already running go on (as on a worker whose process
        is being stopped, or whose stream broke)."""
        self.stop_event.set()
        self._thread.join(20)
        assert not self._thread.is_alive(), f"worker {self.worker_id} did not detach"


def remote_backend(registry: WorkerRegistry, config: Any, local: Any = None) -> RemoteBackend:
    import time

    return RemoteBackend(registry, Sealer(KEY, clock=time.time), LOCK, place_timeout_s=config.place_timeout_s,
                         start_allowance_s=config.start_allowance_s, local=local,
                         tenant_labels=config.tenant_labels)


def hub_store(tmp: Path) -> SqliteEventStore:
    return SqliteEventStore(tmp / "hub.sqlite3")
