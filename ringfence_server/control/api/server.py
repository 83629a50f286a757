"""`create_server(address, orchestrator, config) -> (server, port)`: the gRPC server.

Beside the ringfence.v1 services it serves grpc.health.v1 (for "" and each service: SERVING
while the sandbox engine and the event store answer, NOT_SERVING otherwise, ringfence_server.control.api.health)
and server reflection, both without a token, so generic clients (grpcurl, load balancers,
grpc_health_probe) work. Requests above `limits.max_message_bytes` are refused by grpc itself
with RESOURCE_EXHAUSTED before any of our code sees them. TLS, and mTLS with a client CA, are
optional; without them the server should listen on loopback only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace

from ringfence_server.control.api.auth import Authenticator
from ringfence_server.control.api.core import Core
from ringfence_server.control.api.health import HealthMonitor, HealthReporter, Probe
from ringfence_server.control.api.servicer import SERVICE_NAMES, Edge, EdgeOptions
from ringfence_server.control.config import Config

if TYPE_CHECKING:
    from ringfence_server.control.workers.hub import WorkerHub

__all__ = ["ApiServer", "TlsOptions", "create_server"]


@dataclass(frozen=True)
class TlsOptions:
    cert_chain: Path
    """PEM certificate chain of the server."""
    private_key: Path
    """PEM private key of the server."""
    client_ca: Path | None = None
    """With a CA, clients must present a certificate it signed (mTLS). Bearer tokens are still
    required: the certificate says which machine, the token which tenant and role."""

    def credentials(self) -> grpc.ServerCredentials:
        ca = self.client_ca.read_bytes() if self.client_ca else None
        return grpc.ssl_server_credentials(
            [(self.private_key.read_bytes(), self.cert_chain.read_bytes())],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )


class ApiServer:
    """A grpc.aio server with the edge it serves; `edge.unexpected_errors` counts server faults."""

    def __init__(self, server: grpc.aio.Server, edge: Edge, health_servicer: HealthReporter, port: int,
                 monitor: HealthMonitor) -> None:
        self.grpc_server = server
        self.edge = edge
        self.health = health_servicer
        self.monitor = monitor
        self.port = port

    async def start(self) -> None:
        await self.monitor.start()
        await self.grpc_server.start()

    async def stop(self, grace: float | None = 5.0) -> None:
        """Report NOT_SERVING, let in-flight calls finish for `grace` seconds, then cancel
        them; then wait for core calls still running on worker threads (their clients are
        gone, but their effects must be recorded before the caller closes the core)."""
        await self.monitor.stop()
        await self.health.enter_graceful_shutdown()
        try:
            await self.grpc_server.stop(grace)
        finally:
            await asyncio.to_thread(self.edge.close, True)

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        return await self.grpc_server.wait_for_termination(timeout)


async def create_server(
    address: str,
    orchestrator: Core,
    config: Config,
    *,
    tls: TlsOptions | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    options: EdgeOptions | None = None,
    health_interval_s: float | None = None,
    worker_hub: WorkerHub | None = None,
) -> tuple[ApiServer, int]:
    """Build and bind (not start) the server; `address` "127.0.0.1:0" picks a free port.
    `health_interval_s`: seconds between health rounds (default: limits.health_interval_s).
    `worker_hub`: sandbox workers attach here too (ringfence.v1.WorkerHub, its own
    authentication: worker tokens, never a tenant's).

    Must be awaited on the event loop that will run the server.
    """
    options = options or EdgeOptions.from_config(config)
    edge = Edge(orchestrator, Authenticator.from_tenants(config.tenants), options, tracer_provider)
    server = grpc.aio.server(
        handlers=edge.handlers(),
        options=[
            ("grpc.max_receive_message_length", options.max_message_bytes),
            # Two servers on one port would split traffic silently; refuse instead.
            ("grpc.so_reuseport", 0),
        ],
        # No maximum_concurrent_rpcs: that ceiling is server-wide, so one tenant's burst filled it
        # and grpc refused every other tenant too. The edge bounds each tenant (and role) instead
        # (EdgeOptions: max_in_flight, max_watch_streams, the batch and transfer limits); a
        # request without a valid token is refused before it holds anything.
    )
    # grpc_health's stubs describe only the synchronous servicer; health.aio exists at runtime.
    health_servicer: HealthReporter = health.aio.HealthServicer()  # type: ignore[attr-defined]  # see above
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if worker_hub is not None:
        from ringfence.v1 import workers_pb2_grpc

        workers_pb2_grpc.add_WorkerHubServicer_to_server(worker_hub, server)  # type: ignore[arg-type]
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    try:
        if tls is not None:
            port = server.add_secure_port(address, tls.credentials())
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as e:
        edge.close()
        raise OSError(f"cannot listen on {address}: {e}") from e
    if not port:
        edge.close()
        raise OSError(f"cannot listen on {address}")
    # A test double may leave health checks out: then the server is SERVING while it runs.
    probes = [Probe(name, check) for name, check in getattr(orchestrator, "health_checks", lambda: [])()]
    interval_s = config.limits.health_interval_s if health_interval_s is None else health_interval_s
    monitor = HealthMonitor(health_servicer, ("", *SERVICE_NAMES), probes, interval_s=interval_s)
    return ApiServer(server, edge, health_servicer, port, monitor), port
