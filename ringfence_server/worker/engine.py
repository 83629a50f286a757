"""What a worker knows of its own Docker engine, read once when it starts: the images of the lock
that the engine holds by content (`VerifiedLockImages`, admission's VerifiedImages) and what its
sandbox can run (`EngineCapabilities`, admission's Capabilities).

A worker trusts nothing it did not check on its own engine: not the control plane's word that an
image is there, not a tag. An envelope names its image by digest (the pinned image ID); the worker
runs it only when that digest is an entry of its image lock AND its engine holds an image whose ID
is exactly that digest (`pinned_images.has_image`: compared, never resolved by tag or prefix).
The sandbox backend runs an image by its lock entry's name (it resolves the name to the same ID
again, and refuses an image that drifted: ImageError), so the worker maps each verified digest
back to that name (`name_for`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from ringfence_server.sandbox.errors import EngineError
from ringfence_server.sandbox.pinned_images import Lock, has_image
from ringfence_server.sandbox.profile import ENGINE_RUNTIME
from ringfence_server.worker.admission import VerifiedImages
from ringfence_server.worker.errors import ExecutorError

if TYPE_CHECKING:
    from docker import DockerClient

    from ringfence_server.sandbox.egress.proxy import ProxySettings

__all__ = [
    "EngineCapabilities",
    "NamedImages",
    "VerifiedLockImages",
]


class NamedImages(VerifiedImages, Protocol):
    """Admission's VerifiedImages, and the name the sandbox backend runs each of them by."""

    def name_for(self, digest: str) -> str:
        """The image lock's entry name for a verified `digest` (ExecutorError for another)."""
        ...


def _lock_names(lock: Lock) -> Iterator[str]:
    """Every name `lock` answers for: its own entries', then its inherited lock's."""
    yield from lock.names
    if lock.inherited is not None:
        yield from _lock_names(lock.inherited)


@dataclass(frozen=True)
class VerifiedLockImages:
    """The digests of the image lock's entries that this worker's engine holds with exactly that
    ID, each with the entry name the backend runs it by. Immutable: checked once, when the worker
    starts (an image ID names its content, so a verified one cannot change; one removed later is
    the backend's ImageError, reported as a start that failed)."""

    names: Mapping[str, str] = field(default_factory=dict)
    """digest ("sha256:..." image ID) -> the lock entry's name; frozen read-only on construction."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", MappingProxyType(dict(self.names)))

    @classmethod
    def from_engine(cls, lock: Lock, client: DockerClient) -> VerifiedLockImages:
        """The entries of `lock` (the lock the worker's backend runs with: the name is how the
        backend finds the image again) whose ID `client`'s engine holds exactly. A name is mapped
        only to the ID the lock gives it, so in a user's lock over the built-in one a shadowed
        built-in entry is never named for its ID. Raises EngineError if the engine fails."""
        names: dict[str, str] = {}
        for name in sorted(set(_lock_names(lock))):
            entry = lock.get(name)  # what the backend resolves the name to (a user's entry first)
            if entry is None or entry.id in names:
                continue
            if has_image(client, entry.id):
                names[entry.id] = name
        return cls(names)

    def has(self, digest: str) -> bool:
        return digest in self.names

    def name_for(self, digest: str) -> str:
        name = self.names.get(digest)
        if name is None:
            raise ExecutorError(f"{digest[:80]} is not an image this worker verified")
        return name

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class EngineCapabilities:
    """What this worker's sandbox can run (admission's Capabilities), read from its engine when
    the worker starts."""

    runtimes: frozenset[str] = frozenset({"runc"})
    """The sandbox runtimes ("runc", "gvisor") whose engine runtime (profile.ENGINE_RUNTIME: runc,
    runsc) the engine registers."""
    egress: bool = False
    """The worker's backend was given egress settings, so it runs an egress proxy for calls with
    a grant. A worker's choice, unlike the control plane's own engine (which starts a proxy with
    its defaults when the config names none): a sandbox host relays tool traffic to the network
    only when its operator configured it to."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "runtimes", frozenset(self.runtimes))

    @classmethod
    def from_engine(cls, client: DockerClient, *, egress_settings: ProxySettings | None) -> EngineCapabilities:
        """The runtimes `client`'s engine registers (gVisor only when it registers runsc), and
        egress when `egress_settings` (those the worker gives its DockerBackend) is not None.
        Raises EngineError if the engine does not answer."""
        import docker.errors

        try:
            info: dict[str, Any] = client.info()
        except docker.errors.DockerException as e:
            raise EngineError(f"cannot read the engine's runtimes: {e}") from e
        registered = set(info.get("Runtimes") or {})
        return cls(runtimes=frozenset(name for name, engine in ENGINE_RUNTIME.items() if engine in registered),
                   egress=egress_settings is not None)

    def has_runtime(self, runtime: str) -> bool:
        return runtime in self.runtimes

    def has_egress(self) -> bool:
        return self.egress

    def has_workspace(self) -> bool:
        """Never yet: the executor mounts no workspace (a run's workspace on a worker is not
        built), so admission refuses a call that needs one (workspace_unavailable)."""
        return False

    def has_inputs(self) -> bool:
        """Never yet: the executor mounts no input folders (a worker's own folders for a tool's
        input roots are not built), so admission refuses such a call (inputs_unavailable)."""
        return False
