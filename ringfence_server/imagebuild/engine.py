"""The few Docker engine questions the image code asks, with docker-py errors translated."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ringfence_server.sandbox.errors import EngineError, ImageError
from ringfence_server.sandbox.pinned_images import has_image

if TYPE_CHECKING:  # docker is imported where it is used (the image code may run without it)
    from docker import DockerClient

TAG_PREFIX = "ringfence/"


def client_from_env() -> DockerClient:
    try:
        import docker

        return docker.from_env()
    except Exception as e:  # docker.errors.DockerException, or no docker-py at all
        raise EngineError(f"cannot reach the Docker engine: {e}") from e


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


def save_image(client: DockerClient, image_id: str, layers_dir: Path) -> tuple[bytes, tuple[Path, ...]]:
    """The config bytes and the layer tars of an image the engine holds (`docker save`), the
    layers written into `layers_dir` as `<diff_id hex>.tar` (as write_layer_file names them).

    The engine gives back the bytes it was loaded with: the config must hash to `image_id` and
    each layer to its diff_id, or this refuses. Both the legacy docker-archive and the OCI
    layout of newer engines name their files in manifest.json."""
    import docker.errors

    layers_dir.mkdir(parents=True, exist_ok=True)
    try:
        image = client.images.get(image_id)
        if image.id != image_id:
            raise ImageError(f"{image_id} is not an image ID of the engine")
        with tempfile.TemporaryFile(dir=layers_dir) as tmp:
            for chunk in image.save(chunk_size=1 << 20, named=False):
                tmp.write(chunk)
            tmp.seek(0)
            with tarfile.open(fileobj=tmp) as tar:
                def member(name: str) -> IO[bytes]:
                    f = tar.extractfile(name)
                    if f is None:
                        raise ImageError(f"docker save of {image_id}: {name} is not a file")
                    return f

                (manifest,) = json.load(member("manifest.json"))
                config = member(manifest["Config"]).read()
                if "sha256:" + hashlib.sha256(config).hexdigest() != image_id:
                    raise ImageError(f"docker save of {image_id} gave a config of another image")
                diff_ids = json.loads(config)["rootfs"]["diff_ids"]
                if len(diff_ids) != len(manifest["Layers"]):
                    raise ImageError(f"docker save of {image_id}: {len(manifest['Layers'])} layers for "
                                     f"{len(diff_ids)} diff_ids")
                out = []
                for name, diff_id in zip(manifest["Layers"], diff_ids, strict=True):
                    final = layers_dir / (diff_id.split(":", 1)[1] + ".tar")
                    if not final.is_file():
                        part = final.with_name(final.name + f".tmp-{os.getpid()}")
                        h = hashlib.sha256()
                        src = member(name)
                        with open(part, "wb") as dst:
                            while block := src.read(1 << 20):
                                h.update(block)
                                dst.write(block)
                        if "sha256:" + h.hexdigest() != diff_id:
                            part.unlink()
                            raise ImageError(f"docker save of {image_id}: layer {name} is not {diff_id}")
                        os.replace(part, final)
                    out.append(final)
    except docker.errors.DockerException as e:
        raise EngineError(f"docker save of {image_id} failed: {e}") from e
    except (KeyError, ValueError, tarfile.TarError) as e:
        raise ImageError(f"docker save of {image_id} is not an image archive: {e!r}") from e
    return config, tuple(out)
