"""The red checks' one tool: a DockerBackend with exactly one protection changed.

Importable by name from every module in tests/escape (unlike conftest.py, since tests/ has one
too). Exists only in tests: production code has no switch to weaken a sandbox.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from docker.types import Mount

from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.profile import SandboxProfile

Settings = dict[str, Any]


class WeakenedBackend(DockerBackend):
    """A DockerBackend whose container settings pass through `change` (settings -> settings)."""

    def __init__(self, client, lock, change: Callable[[Settings], Settings]) -> None:
        super().__init__(client, lock=lock)
        self._change = change

    def _container_settings(self, profile: SandboxProfile) -> Settings:
        return self._change(dict(super()._container_settings(profile)))


def without_security_opt(prefix: str) -> Callable[[Settings], Settings]:
    """Drop the security_opt entries starting with `prefix` (seccomp becomes `unconfined`)."""

    def change(settings: Settings) -> Settings:
        opts = [o for o in settings["security_opt"] if not o.startswith(prefix)]
        if prefix.startswith("seccomp"):
            opts.append("seccomp=unconfined")
        return {**settings, "security_opt": opts}

    return change


def with_readable_init(settings: Settings, readable_tini: str) -> Settings:
    """tini bound over the image's execute-only one, readable: PID 1 stays dumpable (case 41)."""
    mount = Mount(target="/usr/bin/tini", source=readable_tini, type="bind", read_only=True)
    return {**settings, "mounts": [*list(settings["mounts"]), mount]}
