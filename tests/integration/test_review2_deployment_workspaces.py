"""Two deployments on one Docker engine never share a workspace (second attack review, finding 2).

Two control planes with different state directories (so different event stores) run on the one
engine, each behind a real gRPC server on a loopback port, each with the real Orchestrator, the
shared DockerBackend and its workspaces as `ringfence serve` makes them
(`ringfence_server.control.api.serve.workspaces`: scoped by the store's address). Both have a tenant `acme` and
both start run X with a workspace, so the run's store key is the same in both. What is pinned:
deployment 2's workspace is another volume and keeper; its DownloadFiles does not see
deployment 1's file; its FinishRun removes only its own workspace (deployment 1's volume, view and
keeper are still on the engine, and deployment 1 still downloads its file); and deployment 2's
workspace reaper, which knows run X as finished, leaves deployment 1's workspace alone. A second
instance on deployment 1's store finds deployment 1's workspace (one store, one scope).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import docker.errors
import pytest

from ringfence import Client, NotFound
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.api.serve import workspaces as served_workspaces
from ringfence_server.control.config import load_config, token_digest
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.state import EventType
from ringfence_server.control.store import SqliteEventStore
from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.workspace import (
    PURPOSE_KEEPER,
    SCOPE_LABEL,
    WORKSPACE_LABEL,
    WORKSPACE_VIEW_SUFFIX,
    DockerWorkspaces,
)

pytestmark = pytest.mark.docker

TOKEN = "review2-deployments-token"
TENANT = "acme"


@dataclass
class Deployment:
    """One control plane: its store, its Orchestrator, its server on a loopback port."""

    db_path: Path
    store: SqliteEventStore
    orchestrator: Orchestrator
    workspaces: DockerWorkspaces
    server: BackgroundServer

    def client(self) -> Client:
        return Client(self.server.address, TOKEN, timeout=120)

    def key(self, run_id: str) -> str:
        return self.orchestrator.runs.get(TENANT, run_id).key

    def volume(self, run_id: str) -> str:
        volume = self.orchestrator.runs.get(TENANT, run_id).live_volume
        assert volume is not None
        return volume

    def events(self, run_id: str) -> list[tuple[str, dict]]:
        return [(e.type, dict(e.data)) for e in self.store.read(self.key(run_id))]


class Deployments:
    def __init__(self) -> None:
        self.all: list[Deployment] = []
        self.run_keys: list[tuple[DockerWorkspaces, str]] = []

    def started(self, d: Deployment, run_id: str) -> None:
        """`run_id` has a workspace in `d`: removed after the test whatever happens."""
        self.run_keys.append((d.workspaces, d.key(run_id)))

    def remove_workspaces(self) -> None:
        for workspaces, key in self.run_keys:
            workspaces.remove(key)


@pytest.fixture
def deployments(tmp_path, backend, pinned_images) -> Iterator[Deployments]:
    """Two deployments, each with a state directory of its own; everything goes with the test
    (the servers, the stores, and the workspaces either made)."""
    made = Deployments()
    with ExitStack() as stack:
        stack.callback(made.remove_workspaces)  # the last thing: after the servers stopped
        for name in ("one", "two"):
            config = load_config(overrides={
                "state_dir": str(tmp_path / name / "state"),
                "tenants": {TENANT: {"tokens": [{"sha256": token_digest(TOKEN), "role": "agent",
                                                 "subject": f"agent-{name}"}]}},
            })
            store = SqliteEventStore(config.db_path)
            stack.callback(store.close)
            workspaces = served_workspaces(backend, pinned_images, str(config.db_path))
            orchestrator = Orchestrator.from_config(config, backend, store, workspaces=workspaces)
            stack.callback(orchestrator.close)
            server = stack.enter_context(BackgroundServer(orchestrator, config))
            made.all.append(Deployment(config.db_path, store, orchestrator, workspaces, server))
        yield made
        for d in made.all:
            api = d.server.server
            assert api is not None, "the server is not running"
            assert api.edge.unexpected_errors == 0, "the edge answered INTERNAL to something"


def test_a_second_deployment_neither_sees_nor_removes_nor_reaps_the_first_ones_workspace(
        deployments, docker_client, pinned_images, backend):
    one, two = deployments.all
    run_id = f"review2-ws-{uuid.uuid4().hex[:10]}"
    with one.client() as agent_one, two.client() as agent_two:
        agent_one.start_run("keep my files", run_id, workspace=True)
        deployments.started(one, run_id)
        agent_one.upload_files(run_id, {"secret.txt": b"deployment one's file\n"})
        key, volume_one = one.key(run_id), one.volume(run_id)
        keeper_one = keeper_of(docker_client, key, volume_one)

        agent_two.start_run("the same run id elsewhere", run_id, workspace=True)
        deployments.started(two, run_id)
        assert two.key(run_id) == key, "the test needs the same store key in both"

        # Deployment 2's workspace is its own, empty: deployment 1's file is not in it.
        with pytest.raises(NotFound, match=r"secret\.txt"):
            agent_two.download_files(run_id, ["secret.txt"])
        volume_two = two.volume(run_id)
        assert volume_two != volume_one
        assert keeper_of(docker_client, key, volume_two) != keeper_one
        agent_two.upload_files(run_id, {"secret.txt": b"deployment two's file\n"})
        assert dict(agent_two.download_files(run_id)) == {"secret.txt": b"deployment two's file\n"}
        assert dict(agent_one.download_files(run_id)) == {"secret.txt": b"deployment one's file\n"}

        # Deployment 2's FinishRun removes its own workspace, and only that.
        agent_two.finish_run(run_id)
        assert (EventType.WORKSPACE_REMOVED, {"volume": volume_two, "reason": "completed"}) in two.events(run_id)
        assert docker_client.volumes.list(filters={"name": volume_two}) == []
        for volume in (volume_one, volume_one + WORKSPACE_VIEW_SUFFIX):
            assert docker_client.volumes.get(volume).name == volume  # `docker volume inspect`
        assert docker_client.containers.get(keeper_one).status == "running"
        assert dict(agent_one.download_files(run_id)) == {"secret.txt": b"deployment one's file\n"}

        # Deployment 2's reaper knows run X as finished: it still leaves deployment 1's alone.
        assert two.orchestrator.reap_workspaces() == 0
        assert docker_client.volumes.get(volume_one).name == volume_one
        assert docker_client.containers.get(keeper_one).status == "running"
        assert dict(agent_one.download_files(run_id)) == {"secret.txt": b"deployment one's file\n"}

        # Another instance on deployment 1's store is the same deployment: it finds the workspace.
        found = served_workspaces(backend, pinned_images, str(one.db_path)).find(key)
        assert found is not None and (found.volume, found.tenant, found.keeper_running) == (volume_one, TENANT, True)

        # Deployment 1's run ends as usual and takes its own workspace with it.
        agent_one.finish_run(run_id)
    assert (EventType.WORKSPACE_REMOVED, {"volume": volume_one, "reason": "completed"}) in one.events(run_id)
    assert docker_client.volumes.list(filters={"name": volume_one}) == []


def keeper_of(docker_client, key: str, volume: str) -> str:
    """The id of the one running keeper of the workspace `volume` (run `key`, in the scope the
    volume is labelled with)."""
    scope = docker_client.volumes.get(volume).attrs["Labels"][SCOPE_LABEL]
    keepers = docker_client.containers.list(filters={"label": [
        f"{L.PURPOSE_LABEL}={PURPOSE_KEEPER}", f"{WORKSPACE_LABEL}={key}", f"{SCOPE_LABEL}={scope}"]})
    assert len(keepers) == 1, keepers
    return keepers[0].id


def test_every_lookup_and_removal_checks_the_scope_on_the_object_itself(docker_client, pinned_images):
    """A name is only a digest: an object under a deployment's name that is labelled with another
    scope (or none) is never found, adopted or removed. And what an earlier version named by the
    run key alone, labelled with this scope, is removed with the run's workspace."""
    from ringfence_server.sandbox.errors import ProfileError
    from ringfence_server.sandbox.workspace import TENANT_LABEL, WorkspaceSpec, volume_name

    scope = f"review2-{uuid.uuid4().hex[:8]}"
    store = DockerWorkspaces(docker_client, pinned_images, scope=scope)
    key = f"{TENANT}:review2-forged-{uuid.uuid4().hex[:8]}"
    labels = {**L.base_labels("workspace"), WORKSPACE_LABEL: key, TENANT_LABEL: TENANT}
    forged = docker_client.volumes.create(name=volume_name(key, scope), labels={**labels, SCOPE_LABEL: "another"})
    legacy = docker_client.volumes.create(name=volume_name(key), labels={**labels, SCOPE_LABEL: scope})
    try:
        assert store.find(key) is None
        assert [(i.volume, i.tenant) for i in store.list() if i.run_key == key] == [(legacy.name, TENANT)]
        with pytest.raises(ProfileError, match="in this deployment"):
            store.create(key, TENANT, WorkspaceSpec())
        assert store.remove(key) is True  # the legacy volume: this scope's
        assert docker_client.volumes.list(filters={"name": legacy.name}) == []
        assert docker_client.volumes.get(forged.name).attrs["Labels"][SCOPE_LABEL] == "another"
        assert store.remove(key) is False
    finally:
        for volume in (forged, legacy):
            with contextlib.suppress(docker.errors.NotFound):
                volume.remove(force=True)
