"""Listing Docker objects by label while other processes create and remove them.

Every listing of containers, networks or volumes in ringfence goes through here. The engine is
shared (several instances, other deployments, test runs, the reaper of each): an object listed
a moment ago may be gone by the time it is looked at. docker-py's `containers.list()` inspects
each listed container in turn and, by default, raises `docker.errors.NotFound` for one removed
in between, which ended whole commands (the showcase, the reaper, `sandbox gc`) over another
process's clean-up. A container removed between list and inspect is simply not in the answer:
it is gone, so there is nothing to report or remove. Networks and volumes are listed from the
list response alone (no inspect per object, `greedy` never set), so they cannot race that way;
what a caller then does to one (reload, remove) must still expect NotFound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Imported for types only: the control plane's config imports sandbox modules that must not
    # load the engine's client library.
    import docker
    from docker.models.containers import Container
    from docker.models.networks import Network
    from docker.models.volumes import Volume


def containers(client: docker.DockerClient, filters: Mapping[str, Any], *, stopped: bool = True) -> list[Container]:
    """The containers matching the engine's `filters` (e.g. {"label": [...]}), each inspected;
    with `stopped` also those not running. One removed before it could be inspected is left out."""
    return client.containers.list(all=stopped, filters=dict(filters), ignore_removed=True)


def networks(client: docker.DockerClient, filters: Mapping[str, Any]) -> list[Network]:
    """The networks matching `filters`, from the list response (not inspected one by one)."""
    return client.networks.list(filters=dict(filters))


def volumes(client: docker.DockerClient, filters: Mapping[str, Any]) -> list[Volume]:
    """The volumes matching `filters`, from the list response (not inspected one by one)."""
    return client.volumes.list(filters=dict(filters))
