"""Fixtures for the escape and ceiling battery (docs/escape-battery.md).

`attack(argv, runtime=..., **limits)` runs an attack inside a real sandbox, through the same
DockerBackend the control plane uses, with the pinned tool image. It is parametrized: `[cold]`
runs the attack in a container created for the call; `[warm]` runs it in a container of a warm
pool (ringfence_server.sandbox.pool), created and started before the call, and proves that it did (the pool's
claim count grew by exactly one, else the test fails): everything a cold call guarantees must
hold for a pooled one.

`weakened(change)` returns a backend whose container settings have been changed by `change`
(a function from the settings dict to a new dict): it is how each test proves that its
protection matters, by removing exactly that protection and showing the attack then succeeds.

`cold` runs like `attack[cold]` only (the red checks' second calls); `in_workspace` is `attack`
for calls with a workspace: `[warm]` claims a container made ahead for that workspace's shape
(the mount is part of it) and then ends the run for the pool (end_run), as the control plane
does when a run ends, so that nothing of the pool mounts the volume when the test removes it;
`make_workspace` makes a real run workspace (ringfence_server.sandbox.workspace), optionally with
its volume options changed, and removes it after the test (cases 48-53, test_workspace.py).
"""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from collections.abc import Callable

import pytest
from weaken import Settings, WeakenedBackend

from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.pool import PoolSettings
from ringfence_server.sandbox.profile import SandboxProfile
from ringfence_server.sandbox.result import SandboxResult

pytestmark = pytest.mark.docker


def _runner(backend: DockerBackend):
    def run(argv, *, runtime: str = "runc", stdin: bytes = b"", **limits) -> SandboxResult:
        profile = SandboxProfile(runtime=runtime, **limits)
        return backend.run(SandboxRequest(profile=profile, argv=tuple(argv), stdin=stdin, run_id="escape"))

    return run


def _pooled_runner(backend: DockerBackend):
    """Like _runner, but each call must be served by a warm container of `backend`'s pool: its
    shape is warmed first, and a call the pool did not serve fails the test."""
    pool = backend.pool
    assert pool is not None

    def run(argv, *, runtime: str = "runc", stdin: bytes = b"", **limits) -> SandboxResult:
        profile = SandboxProfile(runtime=runtime, **limits)
        request = SandboxRequest(profile=profile, argv=tuple(argv), stdin=stdin, run_id="escape")
        if not pool.prewarm(request):
            pytest.fail(f"the call cannot be pooled: {request.profile}", pytrace=False)
        if not pool.wait_filled(60):
            pytest.fail(f"the pool did not fill within 60 s: {pool.stats()}", pytrace=False)
        before = pool.stats()
        result = backend.run(request)
        after = pool.stats()
        if after["claims"] != before["claims"] + 1:
            pytest.fail(f"the call was not pooled: pool stats {before} -> {after}", pytrace=False)
        return result

    return run


@pytest.fixture(scope="session")
def pooled_backend(docker_client, pinned_images):
    """A DockerBackend with a warm pool (one ready container per shape), for the whole session.
    Its own engine client: close() closes the backend's client, and the session's must outlive
    it (it removes the session's leftovers after every other fixture is gone). Depends on
    docker_client so that it is closed, and its pool drained, before that check runs."""
    import docker

    client = docker.from_env(timeout=120)
    b = DockerBackend(client, lock=pinned_images, pool=PoolSettings(size=1, max_size=1, idle_s=600))
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(params=["cold", "warm"])
def attack(request, backend):
    """Run argv in the real, fully hardened sandbox: a fresh container (`cold`) or a warm one
    claimed from a pool (`warm`)."""
    if request.param == "cold":
        return _runner(backend)
    return _pooled_runner(request.getfixturevalue("pooled_backend"))


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
    from ringfence_server.sandbox import labels as L
    from ringfence_server.sandbox.pinned_images import resolve_pinned

    container = docker_client.containers.create(resolve_pinned(docker_client, "tool", pinned_images),
                                                command=["true"], labels=L.base_labels("test"))
    try:
        stream, _ = container.get_archive("/usr/bin/tini")
        data = b"".join(stream)
    finally:
        container.remove(force=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.extractfile(tar.getmember("tini"))
        assert member is not None, "tini in the image is not a regular file"
        body = member.read()
    path = tmp_path_factory.mktemp("tini") / "tini"
    path.write_bytes(body)
    os.chmod(path, 0o755)
    return str(path)


@pytest.fixture
def cold(backend):
    """Run argv in the real sandbox, always in a container created for the call."""
    return _runner(backend)


@pytest.fixture(params=["cold", "warm"])
def in_workspace(request, backend):
    """`attack` for calls with a workspace (see the module's docstring)."""
    if request.param == "cold":
        return _runner(backend)
    pooled = request.getfixturevalue("pooled_backend")
    run = _pooled_runner(pooled)

    def run_then_end(argv, **kwargs) -> SandboxResult:
        try:
            return run(argv, **kwargs)
        finally:
            pooled.end_run("escape")  # the run's workspace shapes go, their containers with them

    return run_then_end


@pytest.fixture
def make_workspace(docker_client, pinned_images):
    """make_workspace(spec, options=None) -> (run_key, volume): a real workspace (ringfence_server.sandbox.workspace),
    removed after the test whatever happens. `options` changes the volume's driver options (a
    function from the options dict to a new dict): the red checks' way to remove one of them."""
    from ringfence_server.sandbox.workspace import DockerWorkspaces, WorkspaceSpec

    class Weakened(DockerWorkspaces):
        def __init__(self, change: Callable[[dict[str, str]], dict[str, str]]) -> None:
            super().__init__(docker_client, pinned_images)
            self._change = change

        def _volume_options(self, spec: WorkspaceSpec) -> dict[str, str]:
            return self._change(dict(super()._volume_options(spec)))

    made = []

    def make(spec: WorkspaceSpec, options: Callable[[dict[str, str]], dict[str, str]] | None = None):
        store = DockerWorkspaces(docker_client, pinned_images) if options is None else Weakened(options)
        run_key = f"escape-ws-{uuid.uuid4().hex[:12]}"
        made.append((store, run_key))
        return run_key, store.create(run_key, "escape", spec)

    yield make
    errors = []
    for store, run_key in made:
        try:
            store.remove(run_key)
        except Exception as e:  # noqa: BLE001 - remove the others, then fail with this
            errors.append(e)
    if errors:
        raise errors[0]
