"""Fixtures for the escape and ceiling battery (../shared/ESCAPE-BATTERY.md).

`attack(argv, runtime=..., **limits)` runs an attack inside a real sandbox, through the same
DockerBackend the control plane uses, with the pinned tool image.

`weakened(change)` returns a backend whose container settings have been changed by `change`
(a function from the settings dict to a new dict): it is how each test proves that its
protection matters, by removing exactly that protection and showing the attack then succeeds.
"""

from __future__ import annotations

import io
import os
import tarfile
from typing import Callable

import pytest

from sandbox.backend import SandboxRequest
from sandbox.docker_backend import DockerBackend
from sandbox.profile import SandboxProfile
from sandbox.result import SandboxResult
from weaken import Settings, WeakenedBackend

pytestmark = pytest.mark.docker


def _runner(backend: DockerBackend):
    def run(argv, *, runtime: str = "runc", stdin: bytes = b"", **limits) -> SandboxResult:
        profile = SandboxProfile(runtime=runtime, **limits)
        return backend.run(SandboxRequest(profile=profile, argv=tuple(argv), stdin=stdin, run_id="escape"))

    return run


@pytest.fixture
def attack(backend):
    """Run argv in the real, fully hardened sandbox."""
    return _runner(backend)


@pytest.fixture
def weakened(docker_client, pinned_images):
    """weakened(change) -> a run function like `attack`, with `change` applied to the settings."""

    def make(change: Callable[[Settings], Settings]):
        return _runner(WeakenedBackend(docker_client, pinned_images, change))

    return make


@pytest.fixture(scope="session")
def readable_tini(docker_client, pinned_images, tmp_path_factory) -> str:
    """/usr/bin/tini of the pinned tool image, copied to the host with mode 0755 (the image
    ships it execute-only): the red checks of cases 19 and 41 bind it over the image's."""
    from sandbox import labels as L
    from sandbox.images import resolve_pinned

    container = docker_client.containers.create(resolve_pinned(docker_client, "tool", pinned_images),
                                                command=["true"], labels=L.base_labels("test"))
    try:
        stream, _ = container.get_archive("/usr/bin/tini")
        data = b"".join(stream)
    finally:
        container.remove(force=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        body = tar.extractfile(tar.getmember("tini")).read()
    path = tmp_path_factory.mktemp("tini") / "tini"
    path.write_bytes(body)
    os.chmod(path, 0o755)
    return str(path)
