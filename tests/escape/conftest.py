"""Fixtures for the escape and ceiling battery (../shared/ESCAPE-BATTERY.md).

`attack(argv, runtime=..., **limits)` runs an attack inside a real sandbox, through the same
DockerBackend the control plane uses, with the pinned tool image.

`weakened(change)` returns a backend whose container settings have been changed by `change`
(a function from the settings dict to a new dict): it is how each test proves that its
protection matters, by removing exactly that protection and showing the attack then succeeds.
"""

from __future__ import annotations

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
