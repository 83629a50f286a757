"""Listings survive objects that vanish between list and inspect (second attack review, finding 11).

The engine is shared: another process may remove a container after a listing named it and
before docker-py inspected it. Here that race is made deterministic against the real engine:
the `vanishing` fixture removes a chosen container (for real, through the engine) the moment
anything in this process first inspects it, so the inspect that follows gets the engine's own
404. What is pinned: `ringfence demo showcase` (its leftovers count), the instance reaper and
`ringfence sandbox gc` each complete, leave the vanished container out, and still report the
container that did not vanish.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
from collections.abc import Callable, Iterator

import docker
import docker.errors
import pytest

from ringfence_server.sandbox import labels as L

pytestmark = pytest.mark.docker


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def containers(docker_client, pinned_images) -> Iterator[Callable[..., str]]:
    """containers(**labels) -> name: a created (never started) container of the pinned base
    image with the test's labels and these; removed after the test whatever happens."""
    made: list[str] = []

    def make(**labels: str) -> str:
        container = docker_client.containers.create(
            pinned_images.image_id("base"), command=["true"], network_mode="none", user="10001:10001",
            read_only=True, cap_drop=["ALL"], labels={**L.base_labels("test"), **labels})
        made.append(container.id)
        return str(container.name)

    yield make
    for container_id in made:
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.api.remove_container(container_id, force=True)


@pytest.fixture
def vanishing(monkeypatch, docker_client) -> Iterator[Callable[[str], None]]:
    """vanishing(name): the first time this process inspects that container, the engine removes
    it just before, as another process's clean-up would between a listing and its inspect.
    Yields the function; asserts at the end that every container marked vanished that way."""
    real_inspect = docker.APIClient.inspect_container
    doomed: dict[str, str] = {}  # id -> name
    vanished: list[str] = []

    def inspect(self, container, *args, **kwargs):
        if container in doomed:
            vanished.append(doomed.pop(container))
            docker_client.api.remove_container(container, force=True)
        return real_inspect(self, container, *args, **kwargs)

    monkeypatch.setattr(docker.APIClient, "inspect_container", inspect)

    def mark(name: str) -> None:
        doomed[real_inspect(docker_client.api, name)["Id"]] = name

    yield mark
    assert doomed == {}, f"never inspected, so never vanished: {sorted(doomed.values())}"
    for name in vanished:
        with pytest.raises(docker.errors.NotFound):
            docker_client.api.inspect_container(name)


def orphan_labels() -> dict[str, str]:
    """Labels of an instance on this host whose process is gone: the reaper's to remove."""
    return {L.PID_LABEL: str(dead_pid()), L.HOST_LABEL: socket.gethostname()}


def test_the_showcase_completes_and_counts_the_rest_when_a_container_vanishes(
        containers, vanishing, capsys, docker_client):
    from ringfence_server.control.demo import showcase

    # Left under the showcase's run label, as a showcase killed earlier would leave them.
    vanishes, stays = containers(**{L.RUN_LABEL: "demo"}), containers(**{L.RUN_LABEL: "demo"})
    vanishing(vanishes)
    assert showcase.main() == 0
    out = capsys.readouterr().out
    # Every scene ran as expected; of the two containers left under the showcase's run label,
    # the one removed meanwhile is not counted, the other is.
    assert out.rstrip().endswith("8 of 8 as expected; containers left behind: 1"), out[-400:]
    assert showcase.left_behind(docker_client) == [stays]


def test_the_reaper_completes_and_reaps_the_rest_when_an_orphan_vanishes(containers, vanishing, docker_client):
    from ringfence_server.sandbox.reaper import reap

    vanishes, stays = containers(**orphan_labels()), containers(**orphan_labels())
    vanishing(vanishes)
    reaped = {(r.kind, r.name) for r in reap(docker_client)}
    assert ("container", stays) in reaped
    assert ("container", vanishes) not in reaped


def test_sandbox_gc_completes_and_reports_the_rest_when_an_orphan_vanishes(containers, vanishing, capsys):
    from ringfence_server.sandbox.cli import gc_command

    vanishes, stays = containers(**orphan_labels()), containers(**orphan_labels())
    vanishing(vanishes)
    assert gc_command(argparse.Namespace()) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"removed container {stays}: owner process ") for line in out), out
    assert not any(vanishes in line for line in out), out
