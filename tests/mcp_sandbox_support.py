"""Test support for MCP servers in session sandboxes: requests for the rogue server
(tests/mcp_servers: a stdlib MCP server that misbehaves on demand), and the containers of a
run's sessions, found by label."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ringfence_server.control.mcp_servers.pinning import listing_request
from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox import listing
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.mcp_session import SERVER_LABEL, McpCall
from ringfence_server.sandbox.result import SandboxResult

MCP_TEST_IMAGES = Path(__file__).resolve().parent / "mcp_servers" / "images"
"""The test servers' images dir: the rogue server's image, over the built-in images."""
SERVERS = Path(__file__).resolve().parent / "mcp_servers" / "servers"
"""Their declarations: rogue, rogue_ws (the run's workspace), rogue_net (one allowed host)."""


def rogue_request(run_id: str, tool: str, arguments: dict[str, Any] | None = None, *, server: str = "rogue",
                  mutates: bool = False, key: str | None = None, **profile: Any) -> SandboxRequest:
    """A call of the rogue server's `tool` in `run_id`'s session, with its declaration's sandbox
    (`profile` overrides some of it: timeout_s, memory_bytes, ...)."""
    base = listing_request(SERVERS / server)
    return dataclasses.replace(
        base, run_id=run_id, profile=dataclasses.replace(base.profile, **profile),
        mcp=McpCall(server=server, tool=tool, arguments=arguments or {}, mutates=mutates, idempotency_key=key))


def content(result: SandboxResult) -> Any:
    """The content of an ok result (the runner's success line)."""
    assert result.ok, (result.outcome, result.message)
    return json.loads(result.stdout)["content"]


def session_containers(client, run_id: str, *, stopped: bool = True) -> list:
    """The session sandboxes of `run_id` the engine has (any server)."""
    return [c for c in listing.containers(client, {"label": f"{L.RUN_LABEL}={run_id}"}, stopped=stopped)
            if SERVER_LABEL in (c.labels or {})]


EXAMPLE_IMAGES = Path(__file__).resolve().parents[1] / "examples" / "mcp" / "images"
"""The example servers' images dir (`make mcp-images`): mcp-time, mcp-fetch, mcp-git."""
EXAMPLE_SERVERS = Path(__file__).resolve().parents[1] / "examples" / "mcp" / "servers"
"""Their declarations, pinned and judged: time, fetch (allowed.test), git (the run's workspace)."""


def product_containers(client) -> list:
    """The containers of this test session (its label) that carry the product label: what
    `docker ps -a --filter label=ringfence.product` lists of ours."""
    import os

    session = os.environ.get(L.TEST_SESSION_ENV, "")
    return listing.containers(client, {"label": [f"{L.PRODUCT_LABEL}={L.PRODUCT}",
                                                 f"{L.TEST_SESSION_LABEL}={session}"]})


@contextmanager
def served_mcp_servers(docker_client, lock, testbed, state_dir: Path, *, images: Path, servers: Path,
                       policy: Mapping[str, Any], agent: str, approver: str) -> Iterator[tuple[Any, Any]]:
    """(the real gRPC server, its DockerBackend): the Orchestrator serving the declarations of
    `servers` (images from `images`, pinned by `lock`) under `policy`, one tenant `acme` with an
    agent and an approver token, the egress proxy of `testbed`, real workspaces; all closed at
    the end."""
    from ringfence_server.control.api.background import BackgroundServer
    from ringfence_server.control.config import load_config, token_digest
    from ringfence_server.control.orchestration import Orchestrator
    from ringfence_server.control.store import SqliteEventStore
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.workspace import DockerWorkspaces

    backend = DockerBackend(docker_client, lock=lock, egress_proxy=testbed.proxy())
    config = load_config(overrides={
        "state_dir": str(state_dir),
        "tenants": {"acme": {"tokens": [
            {"sha256": token_digest(agent), "role": "agent", "subject": "agent"},
            {"sha256": token_digest(approver), "role": "approver", "subject": "alice"}]}},
        "policy": dict(policy), "mcp": {"servers": [str(servers)]}, "images": {"dir": str(images)},
    })
    store = SqliteEventStore(config.db_path)
    orchestrator = Orchestrator.from_config(config, backend, store, workspaces=DockerWorkspaces(docker_client, lock))
    try:
        with BackgroundServer(orchestrator, config) as server:
            yield server, backend
    finally:
        orchestrator.close()
        store.close()
        backend.close()
