"""The reaper against the real engine: orphans of a dead instance go, a live instance's calls stay."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time

import docker.errors
import pytest
from testcontainers.core.container import DockerContainer

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.reaper import reap

pytestmark = pytest.mark.docker


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def labelled_sleeper(image_id: str, **overrides: str) -> DockerContainer:
    labels = {**L.base_labels("test", deadline_s=3600), **overrides}
    return (
        DockerContainer(image_id, command="sleep 300")
        .with_kwargs(labels=labels, network_mode="none", user="10001:10001", read_only=True, cap_drop=["ALL"])
    )


@contextlib.contextmanager
def started(*containers: DockerContainer):
    """Start the containers; remove whatever the reaper left, even when the test fails."""
    try:
        for c in containers:
            c.start()
        yield
    finally:
        for c in containers:
            with contextlib.suppress(docker.errors.NotFound, AttributeError):
                c.stop()


def exists(client, container_id: str) -> bool:
    return bool(client.containers.list(all=True, filters={"id": container_id}))


def test_reaps_a_dead_instances_container_and_keeps_a_live_ones(docker_client, pinned_images):
    base = pinned_images.image_id("base")
    orphan = labelled_sleeper(base, **{L.PID_LABEL: str(dead_pid()), L.HOST_LABEL: socket.gethostname()})
    live = labelled_sleeper(base)  # this test process's own pid: alive
    expired = labelled_sleeper(base, **{L.DEADLINE_LABEL: str(int(time.time()) - 10)})
    with started(orphan, live, expired):
        ids = {name: c.get_wrapped_container().id
               for name, c in (("orphan", orphan), ("live", live), ("expired", expired))}
        reaped = reap(docker_client)
        names = {r.name for r in reaped}
        assert orphan.get_wrapped_container().name in names
        assert expired.get_wrapped_container().name in names
        assert not exists(docker_client, ids["orphan"]) and not exists(docker_client, ids["expired"])
        assert exists(docker_client, ids["live"])
        assert live.get_wrapped_container().name not in names


def test_cli_gc_reports_what_it_removed(docker_client, pinned_images):
    import sys
    from pathlib import Path

    base = pinned_images.image_id("base")
    orphan = labelled_sleeper(base, **{L.PID_LABEL: str(dead_pid()), L.HOST_LABEL: socket.gethostname()})
    with started(orphan):
        name = orphan.get_wrapped_container().name
        proc = subprocess.run(
            [str(Path(sys.executable).with_name("ringfence")), "sandbox", "gc"],
            capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert f"removed container {name}: owner process" in proc.stdout
