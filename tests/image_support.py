"""Images a test builds with `docker build` FROM the pinned tool image (no registry exists: the
engine's own image is the base), labelled so leftovers are found, and removed afterwards.

The recipes are the images `ringfence images adopt` and `ringfence conformance` must tell apart:
a clean one, one whose default user is root, one that ships a setuid-root shell."""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

from ringfence_server.sandbox import labels as L

TEST_LABELS = {L.PRODUCT_LABEL: L.PRODUCT, L.PURPOSE_LABEL: "test",
               L.TEST_SESSION_LABEL: os.environ.get(L.TEST_SESSION_ENV, "")}
RECIPES = {
    "clean": "FROM {tool}\n",
    "root-user": "FROM {tool}\nUSER root\n",
    "setuid-shell": "FROM {tool}\nADD rootsh.tar /\n",
}


def setuid_shell_tar(path: Path) -> None:
    """A tar ADD unpacks as it is: a copy of dash, owned by root, setuid."""
    data = Path("/bin/dash").read_bytes()
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("usr/local/bin/rootsh")
        info.size, info.mode, info.uid, info.gid = len(data), 0o4755, 0, 0
        tar.addfile(info, io.BytesIO(data))


def remove_image(client, image_id: str) -> None:
    import docker.errors

    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(image_id, force=True)


@contextlib.contextmanager
def docker_built(client, tool_id: str, kinds: tuple[str, ...], folders) -> Iterator[dict[str, str]]:
    """{kind: image id} for each recipe in `kinds`, built in a folder `folders(kind)` makes;
    every image made is removed on the way out, even after a failure."""
    made: dict[str, str] = {}
    try:
        for kind in kinds:
            ctx = Path(folders(kind))
            (ctx / "Dockerfile").write_text(RECIPES[kind].format(tool=tool_id))
            if kind == "setuid-shell":
                setuid_shell_tar(ctx / "rootsh.tar")
            image, _logs = client.images.build(path=str(ctx), labels=TEST_LABELS, rm=True, forcerm=True)
            made[kind] = image.id
        yield made
    finally:
        for image_id in made.values():
            remove_image(client, image_id)
