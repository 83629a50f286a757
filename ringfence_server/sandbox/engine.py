"""The Docker engine as the sandbox uses it: what counts as the engine's failure, and the few
container operations every part of the backend shares (create with our extra settings, kill,
remove)."""

from __future__ import annotations

import contextlib
from typing import Any

import docker
import docker.errors
import requests
import urllib3.exceptions

# _create_container_args: containers.create's own mapping of its arguments; private to
# docker-py, so its stubs do not have it.
from docker.models.containers import Container, _create_container_args  # type: ignore[attr-defined]  # private, so not in the stubs

# What docker-py raises, and what it lets through unwrapped when the engine's connection
# breaks (requests' and urllib3's errors, socket errors): all of it is the engine's failure.
ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException,
                 urllib3.exceptions.HTTPError, OSError)


def container_id(container: Container) -> str:
    """docker-py types Model.id as optional (it reads attrs["Id"]); a container the engine
    created and inspected always has one."""
    found = container.id
    assert found is not None, "the engine described a container without an Id"
    return found


def create_container(client: docker.DockerClient, image_id: str, **kwargs: Any) -> Container:
    """containers.create, plus the settings docker-py has no argument for (MaskedPaths)."""
    masked_paths = kwargs.pop("masked_paths", None)
    kwargs.update(image=image_id, version=client.api.api_version)
    create_kwargs = _create_container_args(kwargs)
    if masked_paths is not None:
        create_kwargs["host_config"]["MaskedPaths"] = list(masked_paths)
    created = client.api.create_container(**create_kwargs)
    try:
        return client.containers.get(created["Id"])
    except BaseException:
        # Created but not ours to hold: never left behind because its inspect failed.
        with contextlib.suppress(*ENGINE_ERRORS):  # the reaper removes it by label
            client.api.remove_container(created["Id"], force=True)
        raise


def kill(container: Container) -> None:
    """SIGKILL through the engine (its whole process tree); nothing when it exited already."""
    with contextlib.suppress(docker.errors.APIError):  # already exited
        container.kill()


def remove(container: Container) -> None:
    """Force-remove; what the engine refuses is left to the reaper, which finds it by label."""
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except ENGINE_ERRORS:
        pass  # the reaper removes it later by label
