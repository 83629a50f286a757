"""The worker process: its engine, its durable record of calls, the images it verified, the
executor around them, and its attachment to the control planes (`ringfence worker run`).

Start order, each step before the next: the engine's orphans are reaped (a killed predecessor's
containers: their calls are settled by the step after); the results store's restart recovery
(claimed-but-never-started calls released, started-but-never-recorded ones made uncertain, so a
redelivery never runs them again); the images its engine holds by ID; and only then the hello.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

__all__ = ["WorkerOptions", "run_worker"]

log = logging.getLogger("ringfence.worker")


@dataclass(frozen=True)
class WorkerOptions:
    """Everything `ringfence worker run` was told (ringfence_server.worker.cli documents each flag)."""

    worker_id: str
    token: str = field(repr=False)
    addresses: tuple[str, ...]
    trusted_keys: Path
    state_dir: Path
    slots: int
    labels: Mapping[str, str] = field(default_factory=dict)
    images_dir: Path | None = None
    pool_size: int = 2
    pool_max: int = 8
    egress_services: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    egress_networks: tuple[str, ...] = ()
    reap_every_s: float = 30.0
    prune_after_s: float = 86400.0
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials | None:
        if self.tls_ca is None:
            if self.tls_cert is not None or self.tls_key is not None:
                raise ValueError("--tls-cert and --tls-key need --tls-ca")
            return None
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        return grpc.ssl_channel_credentials(
            root_certificates=self.tls_ca.read_bytes(),
            private_key=self.tls_key.read_bytes() if self.tls_key else None,
            certificate_chain=self.tls_cert.read_bytes() if self.tls_cert else None)


def run_worker(options: WorkerOptions, stop: threading.Event) -> int:
    """Run until `stop` is set; the exit code (2: refused by the control plane or bad setup)."""
    from ringfence._version import __version__
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.errors import SandboxError
    from ringfence_server.sandbox.pinned_images import load_lock, lock_for
    from ringfence_server.worker.attach import Attacher, Capacity
    from ringfence_server.worker.engine import EngineCapabilities, VerifiedLockImages
    from ringfence_server.worker.errors import WorkerError
    from ringfence_server.worker.executor import WorkerExecutor
    from ringfence_server.worker.keys import TrustedKeys
    from ringfence_server.worker.results import SqliteResults

    try:
        credentials = options.credentials()
        trusted = TrustedKeys.from_folder(options.trusted_keys)
        lock = lock_for(options.images_dir) if options.images_dir is not None else load_lock()
    except (WorkerError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        egress = _egress(options)
        backend = DockerBackend(lock=lock, egress_settings=egress, pool=_pool(options))
    except SandboxError as e:
        print(f"error: the sandbox engine is not usable: {e}", file=sys.stderr)
        return 1
    results = None
    attacher = None
    try:
        backend.start_reaper(options.reap_every_s)
        options.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        results = SqliteResults(options.state_dir / "results.sqlite3")
        recovery = results.recover()
        images = VerifiedLockImages.from_engine(lock, backend.client)
        capabilities = EngineCapabilities.from_engine(backend.client, egress_settings=egress)
        executor = WorkerExecutor(worker_id=options.worker_id, trusted_keys=trusted, results=results,
                                  backend=backend, images=images, capabilities=capabilities)
        runtimes = tuple(r for r in ("runc", "gvisor") if capabilities.has_runtime(r))
        capacity = Capacity(slots=options.slots, cpus=float(os.cpu_count() or 1), runtimes=runtimes,
                            image_digests=tuple(sorted(images.names)), egress=capabilities.has_egress(),
                            labels=dict(options.labels))
        attacher = Attacher(worker_id=options.worker_id, token=options.token, addresses=options.addresses,
                            capacity=capacity, handler=executor, kill_run=backend.kill_run,
                            on_fenced=backend.kill_running, version=__version__, credentials=credentials)
        print(f"ringfence worker {options.worker_id}: {options.slots} slots, runtimes {', '.join(runtimes)}, "
              f"{len(capacity.image_digests)} images; recovered {len(recovery.released)} released, "
              f"{len(recovery.uncertain)} uncertain; attaching to {', '.join(options.addresses)}", flush=True)
        pruner = threading.Thread(target=_prune, args=(results, options.prune_after_s, stop), daemon=True,
                                  name="rf-worker-prune")
        pruner.start()
        try:
            attacher.run(stop)
        except grpc.RpcError as e:
            print(f"error: the control plane refused this worker: {e.details()}", file=sys.stderr)
            return 2
        return 0
    finally:
        stop.set()
        killed = backend.kill_all("the worker is stopping")
        if killed:
            log.info("worker %s: killed %d running sandboxes on the way out", options.worker_id, killed)
        if attacher is not None:
            attacher.drain()  # their results recorded before the store closes
        backend.close()
        if results is not None:
            results.close()
        print(f"ringfence worker {options.worker_id}: stopped", flush=True)


def _prune(results: object, older_than_s: float, stop: threading.Event) -> None:
    """Forget settled calls now and then (the store refuses a horizon shorter than an envelope
    may live)."""
    while not stop.wait(3600.0):
        try:
            removed = results.prune(older_than_s)  # type: ignore[attr-defined]
            if removed:
                log.info("pruned %d settled calls", removed)
        except Exception:
            log.warning("pruning the results store failed", exc_info=True)


def _egress(options: WorkerOptions):  # type: ignore[no-untyped-def]
    if not options.egress_services and not options.egress_networks:
        return None
    from ringfence_server.sandbox.egress.proxy import ProxySettings

    return ProxySettings(services=dict(options.egress_services), service_networks=options.egress_networks)


def _pool(options: WorkerOptions):  # type: ignore[no-untyped-def]
    if options.pool_size == 0:
        return None
    from ringfence_server.sandbox.pool import PoolSettings

    return PoolSettings(size=options.pool_size, max_size=max(options.pool_size, options.pool_max))
