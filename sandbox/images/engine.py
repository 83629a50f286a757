"""The few Docker engine questions the image code asks, with docker-py errors translated."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from sandbox.errors import EngineError, ImageError

if TYPE_CHECKING:  # docker is imported where it is used (the image code may run without it)
    from docker import DockerClient

TAG_PREFIX = "ringfence/"


def client_from_env() -> DockerClient:
    try:
        import docker

        return docker.from_env()
    except Exception as e:  # docker.errors.DockerException, or no docker-py at all
        raise EngineError(f"cannot reach the Docker engine: {e}") from e


def has_image(client: DockerClient, image_id: str) -> bool:
    """True only if the engine holds an image whose ID is exactly `image_id`.

    `images.get` also resolves tags and ID prefixes, so the returned ID is compared: a name
    that merely resolves to something is not the pinned image.
    """
    import docker.errors

    try:
        return client.images.get(image_id).id == image_id
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.APIError as e:
        if getattr(e, "status_code", None) == 404:
            return False
        raise EngineError(f"engine failed to inspect {image_id}: {e}") from e
    except docker.errors.DockerException as e:
        raise EngineError(f"engine unreachable inspecting {image_id}: {e}") from e


def tagged_id(client: DockerClient, ref: str) -> str | None:
    """The ID a tag currently names, or None."""
    import docker.errors

    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.DockerException as e:
        raise EngineError(f"engine failed to inspect {ref}: {e}") from e


def load_archive(client: DockerClient, path: str | os.PathLike[str], expected_id: str) -> None:
    import docker.errors

    try:
        with open(path, "rb") as f:
            client.images.load(f)
    except docker.errors.DockerException as e:
        raise EngineError(f"docker load of {path} failed: {e}") from e
    if not has_image(client, expected_id):
        raise ImageError(f"docker load of {path} did not produce {expected_id}")


def tag(client: DockerClient, image_id: str, repo: str, tag_: str = "latest") -> None:
    import docker.errors

    try:
        client.images.get(image_id).tag(repo, tag_)
    except docker.errors.DockerException as e:
        raise EngineError(f"cannot tag {image_id} as {repo}:{tag_}: {e}") from e
