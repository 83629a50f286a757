"""The runbooks service's container, run and queried from the host.

    with Runbooks(client, lock=lock) as runbooks:       # its own internal network, or network=...
        settings = ProxySettings(services=runbooks.services(), service_networks=(runbooks.network,))
        ... fetch_url calls reach http://runbooks.internal.corp through the egress proxy ...
        runbooks.stats()["network"]["requests"], runbooks.stats()["served"]

Beside the ledger on one network: `Runbooks(client, network=ledger.network)`, then
`services={**ledger.services(), **runbooks.services()}`.

It keeps nothing: the documents are in its image, its counters in memory. Hardening, start,
readiness (status and recent logs when it does not come up), removal and `docker exec` on its
loopback are the shared service container's (ringfence_server.demo_services.container.ServiceContainer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import docker

from ringfence_server.demo_services.container import ServiceContainer, ServiceError, ServiceSettings

if TYPE_CHECKING:
    from ringfence_server.sandbox.pinned_images import Lock

RUNBOOKS_HOST = "runbooks.internal.corp"
"""The name tools use for the service (ringfence_server/control/tools/fetch_url.json declares it as its one egress
host); the egress proxy maps it to the container's pinned address (ProxySettings.services)."""
RUNBOOKS_PORT = 80


class RunbooksError(ServiceError):
    """The runbooks container could not be started or asked (with its status and recent logs)."""


@dataclass(frozen=True)
class RunbooksSettings(ServiceSettings):
    image: str = "runbooks"
    """Image name in images/images.lock."""

    port: int = RUNBOOKS_PORT

    memory_bytes: int = 64 * 1024 * 1024
    pids: int = 32

    def command(self) -> list[str]:
        return ["python3", "-I", "-S", "-B", "/opt/ringfence/runbooks.py", "--port", str(self.port)]


class Runbooks(ServiceContainer):
    """One runbooks container on a Docker network, started on enter, removed on exit."""

    kind = "runbooks"
    host = RUNBOOKS_HOST
    error = RunbooksError

    def __init__(self, client: docker.DockerClient, *, lock: Lock | None = None, network: str | None = None,
                 settings: RunbooksSettings | None = None) -> None:
        super().__init__(client, settings or RunbooksSettings(), lock=lock, network=network)

    def __enter__(self) -> Runbooks:
        return super().__enter__()

    def services(self, name: str | None = RUNBOOKS_HOST) -> dict[str, tuple[str, ...]]:
        """The ProxySettings.services entry that makes `name` this service."""
        return super().services(name)

    def stats(self) -> dict[str, Any]:
        """{"network": {"connections", "requests"}, "served": {name: n}, "not_found": n}: what
        came over the network (see demo_services.runbooks.server); the host's own asks are not in it."""
        stats: dict[str, Any] = self._get("/stats")
        return stats

    def runbook(self, name: str) -> dict[str, Any] | None:
        """The document `name` as the service serves it, or None (asked on loopback: not counted
        in `network`, but counted in `served`)."""
        document: dict[str, Any] | None = self._get(f"/runbooks/{name}", allow_404=True)
        return document
