"""The example MCP servers (examples/mcp/servers: time, fetch, git), real ones from PyPI in their
pinned images (examples/mcp/images, `make mcp-images`), through the whole control plane: the real
gRPC server, the real Orchestrator with the three declared, the real DockerBackend with the real
egress proxy and its decoys on the test's own networks, the real workspace store, and the MCP
SDK's own stdio client launching `ringfence mcp` as a host would.

What is asserted is meaning: the server's own answers (the time as its JSON, the commit the git
server reports), the exact statuses and verdict paths, and effects counted at the receiver: the
connections the decoys saw, and the commits of the workspace's repository read by the host's own
`git` from a download of its .git.

Red checks (each done by hand): `url_arguments` taken out of fetch's table -> the fetch of
denied.test is admitted and reaches the server (the proxy refuses it: executed, failed), and the
fetch test fails; `paths` taken out of git_status's table -> a repo_path of /etc reaches the
server, and the admission test fails for each path.
"""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_sandbox_support import (
    EXAMPLE_IMAGES,
    EXAMPLE_SERVERS,
    product_containers,
    served_mcp_servers,
    session_containers,
)
from mcp_support import client_name, run_events, session_run_id, stdio_session, text_of

from ringfence import Client
from ringfence.model import ApprovalStatus, ObservationStatus, RunStatus, RunView
from ringfence.models._common import clean_schema
from ringfence_server.control.mcp_servers.declaration import read_listing

pytestmark = pytest.mark.docker

AGENT, APPROVER = "mcp-real-agent", "mcp-real-approver"
GIT_READS = ("git_status", "git_diff_unstaged", "git_diff_staged", "git_diff", "git_log", "git_show", "git_branch")
GIT_MUTATIONS = ("git_add", "git_reset", "git_create_branch", "git_checkout", "git_commit")
# The repository's first commit, made on this host with a fixed author and date.
AUTHOR = {"GIT_AUTHOR_NAME": "Ada Example", "GIT_AUTHOR_EMAIL": "ada@example.test",
          "GIT_AUTHOR_DATE": "2024-01-15T12:00:00+00:00", "GIT_COMMITTER_NAME": "Ada Example",
          "GIT_COMMITTER_EMAIL": "ada@example.test", "GIT_COMMITTER_DATE": "2024-01-15T12:00:00+00:00"}
ALLOWED = ("registry:ok", "validation:ok", "guardrail:pass", "resource:ok")
"""The admission steps before policy of every call admitted here."""


@pytest.fixture(scope="module")
def nothing_left(docker_client):
    """Set up before the stack and the decoys, so torn down after them: then no container with
    the product label that this module made is left (sessions, workspaces, proxy, decoys).
    What another module of the session holds for the whole session (a warm pool) is not ours."""
    before = {c.id for c in product_containers(docker_client)}
    yield
    left = [c.name for c in product_containers(docker_client) if c.id not in before]
    assert left == [], f"containers left behind: {left}"


@pytest.fixture(scope="module")
def stack(nothing_left, docker_client, example_mcp_images, testbed, tmp_path_factory):
    # `autonomous`: the git server's reversible mutations that a rule allows run unasked.
    # The most restrictive matching rule wins: time.convert_time is asked, the rest allowed.
    policy = {"autonomy": "autonomous",
              "rules": [{"tool": "time.*", "verdict": "allow"},
                        {"tool": "time.convert_time", "verdict": "ask"},
                        {"tool": "fetch.*", "verdict": "allow"},
                        {"tool": "git.*", "verdict": "allow"}],
              "egress": {"fetch.*": ["allowed.test"]}}
    with served_mcp_servers(docker_client, example_mcp_images, testbed,
                            tmp_path_factory.mktemp("mcp-real-servers") / "state", images=EXAMPLE_IMAGES,
                            servers=EXAMPLE_SERVERS, policy=policy, agent=AGENT, approver=APPROVER) as (server, _b):
        yield server, testbed


@contextmanager
def started(agent: Client, docker_client, goal: str, *, workspace: bool = False) -> Iterator[RunView]:
    """A run, finished at the end whatever happened; when the body passed, none of its session
    sandboxes is left (they go with the run)."""
    run = agent.start_run(goal, workspace=workspace)
    try:
        yield run
    finally:
        agent.finish_run(run.run_id)
    assert session_containers(docker_client, f"acme:{run.run_id}") == []


def workspace_objects(docker_client, run_id: str) -> list[str]:
    """The workspace store's containers and volumes of `run_id` (labelled with its key)."""
    from ringfence_server.sandbox.workspace import WORKSPACE_LABEL

    selector = {"label": WORKSPACE_LABEL}
    found = [c.name for c in product_containers(docker_client) if run_id in c.labels.get(WORKSPACE_LABEL, "")]
    found += [v.name for v in docker_client.volumes.list(filters=selector)
              if run_id in (v.attrs.get("Labels") or {}).get(WORKSPACE_LABEL, "")]
    return found


# --- the declarations, as a client sees them --------------------------------------------------------


def test_the_example_servers_tools_are_listed_with_their_pinned_schemas_and_the_operators_judgement(stack):
    server, _tb = stack
    with Client(server.address, AGENT) as agent:
        tools = {t.name: t for t in agent.list_tools()}
    expected = {"time.get_current_time", "time.convert_time", "fetch.fetch",
                *(f"git.{t}" for t in GIT_READS + GIT_MUTATIONS)}
    assert expected <= set(tools)
    for name in ("time", "fetch", "git"):
        for tool, listed in read_listing(EXAMPLE_SERVERS / name).items():
            assert dict(tools[f"{name}.{tool}"].schema) == listed["inputSchema"], tool
    reads = ["time.get_current_time", "time.convert_time", "fetch.fetch", *(f"git.{t}" for t in GIT_READS)]
    for name in reads:
        assert tools[name].read_only_hint is True, name
    for tool in GIT_MUTATIONS:
        view = tools[f"git.{tool}"]
        assert (view.read_only_hint, view.destructive_hint) == (False, False), view.name


# --- time ---------------------------------------------------------------------------------------------


def test_time_get_current_time_runs_in_the_runs_session_and_gives_the_servers_json(stack, docker_client):
    server, _tb = stack
    with Client(server.address, AGENT) as agent, started(agent, docker_client, "what time is it") as run:
        [obs] = agent.submit_batch(run.run_id, [{"call_id": "now", "tool": "time.get_current_time",
                                                 "arguments": {"timezone": "UTC"}}])
        assert obs.status is ObservationStatus.EXECUTED and obs.executed and obs.error is None, obs
        assert obs.verdict_path == (*ALLOWED, "policy:rule[0]:allow", "admitted", "result:ok")
        now = time_result(obs.content)
        assert now["timezone"] == "UTC"
        assert datetime.fromisoformat(now["datetime"]).utcoffset().total_seconds() == 0
        [session] = session_containers(docker_client, f"acme:{run.run_id}")
        assert session.labels["ringfence.mcp-server"] == "time"


def time_result(content: Any) -> dict[str, Any]:
    """The server's TimeResult: its structured content (the SDK gives it as an object)."""
    assert isinstance(content, dict), content
    return dict(content)


def test_time_convert_time_is_asked_and_runs_once_an_approver_decides(stack, docker_client):
    server, _tb = stack
    with (Client(server.address, AGENT) as agent, Client(server.address, APPROVER) as approver,
          started(agent, docker_client, "convert a time") as run):
        arguments = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
        [obs] = agent.submit_batch(run.run_id, [{"call_id": "conv", "tool": "time.convert_time",
                                                 "arguments": arguments}])
        assert obs.status is ObservationStatus.PENDING_APPROVAL and not obs.executed, obs
        assert obs.verdict_path == (*ALLOWED, "policy:rule[0]:allow", "policy:rule[1]:ask",
                                    "approval:requested")
        assert session_containers(docker_client, f"acme:{run.run_id}") == []  # asked: not sent
        [approval] = [a for a in approver.list_approvals(run.run_id) if a.status is ApprovalStatus.PENDING]
        approver.decide_approval(approval.approval_id, True, "a read", digest=approval.digest)
        done = {o.call_id: o for o in agent.get_run(run.run_id).trajectory}["conv"]
        assert done.status is ObservationStatus.EXECUTED and done.executed and done.error is None, done
        assert done.verdict_path == (*ALLOWED, "policy:rule[0]:allow", "policy:rule[1]:ask", "approval:requested",
                                     "approval:approved", "admitted", "result:ok")
        converted = time_result(done.content)
        assert converted["source"]["timezone"] == "UTC" and converted["target"]["timezone"] == "Asia/Tokyo"
        # Tokyo is UTC+9 all year (no DST): 12:00 UTC is 21:00 there, the same day.
        source = datetime.fromisoformat(converted["source"]["datetime"])
        target = datetime.fromisoformat(converted["target"]["datetime"])
        assert (source.hour, source.minute, target.hour, target.minute) == (12, 0, 21, 0)
        assert target.date() == source.date()
        assert target == source and target.utcoffset().total_seconds() == 9 * 3600
        assert converted["time_difference"] == "+9.0h"


def test_time_through_the_mcp_front_door_as_a_host_calls_it(stack, docker_client):
    """The SDK's stdio client launches `ringfence mcp --server ADDR`: tools/list gives the pinned
    schema, tools/call runs the real server in the session's run."""
    server, _tb = stack
    name = client_name("time")
    pinned = read_listing(EXAMPLE_SERVERS / "time")["get_current_time"]["inputSchema"]

    async def go() -> tuple[Any, Any]:
        async with stdio_session(server.address, name, token=AGENT) as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            result = await session.call_tool("time.get_current_time", {"timezone": "UTC"})
            return tools, result

    tools, result = anyio.run(go)
    assert tools["time.get_current_time"].input_schema == clean_schema(pinned)
    assert result.is_error is False, text_of(result)
    now = time_result(result.structured_content)
    assert now["timezone"] == "UTC" and datetime.fromisoformat(now["datetime"]).utcoffset().total_seconds() == 0
    with Client(server.address, AGENT) as agent:
        run_id = session_run_id(agent, name)
        events = run_events(agent, run_id)  # read to run_finished: the session's end finished the run
        view = agent.get_run(run_id)
    assert events[-1].type == "run_finished" and view.status is RunStatus.FINISHED
    [obs] = view.trajectory
    assert obs.tool == "time.get_current_time" and obs.status is ObservationStatus.EXECUTED
    assert dict(obs.content) == result.structured_content
    assert session_containers(docker_client, f"acme:{run_id}") == []


# --- fetch, through the egress proxy ----------------------------------------------------------------


def test_fetch_reaches_the_allowed_host_through_the_proxy_and_is_denied_any_other(stack, docker_client):
    server, testbed = stack
    allowed, denied = testbed.decoys["allowed"], testbed.decoys["denied"]
    allowed_before, denied_before = len(allowed.connections()), len(denied.connections())
    with Client(server.address, AGENT) as agent, started(agent, docker_client, "fetch a page") as run:
        [obs] = agent.submit_batch(run.run_id, [{"call_id": "ok", "tool": "fetch.fetch",
                                                 "arguments": {"url": "http://allowed.test/"}}])
        assert obs.status is ObservationStatus.EXECUTED and obs.executed and obs.error is None, obs
        assert obs.verdict_path == (*ALLOWED, "policy:rule[2]:allow", "admitted", "result:ok")
        assert "Contents of http://allowed.test/" in obs.content["text"]
        assert len(allowed.connections()) == allowed_before + 1  # one GET, at the decoy itself

        [no] = agent.submit_batch(run.run_id, [{"call_id": "no", "tool": "fetch.fetch",
                                                "arguments": {"url": "http://denied.test/"}}])
        assert no.status is ObservationStatus.DENIED and not no.executed, no
        assert no.verdict_path == ("registry:ok", "validation:ok", "guardrail:pass", "resource:deny")
        assert no.error_class == "resource" and "denied.test:80 is not on the call's egress allowlist" in no.error
    # The proxy's decision is the call's egress event in the run's log (its audit trail).
    with Client(server.address, AGENT) as agent:
        egress = [e.data for e in agent.watch_run(run.run_id, timeout=30) if e.type == "egress"]
    assert [(e["call_id"], [(d["host"], d["port"], d["decision"]) for d in e["decisions"]]) for e in egress] == [
        ("ok", [("allowed.test", 80, "allowed")])]
    assert len(denied.connections()) == denied_before
    assert len(allowed.connections()) == allowed_before + 1


# --- git, on the run's workspace --------------------------------------------------------------------


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """The host's own git on `repo`, with no user or system config."""
    base = {"PATH": "/usr/bin:/bin", "HOME": str(repo.parent), "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**base, **(env or {})}).stdout


def small_repository(root: Path) -> Path:
    """`root`/repo: a git repository with README.md in one commit by AUTHOR, with no hooks."""
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "--quiet", "--template=", "--initial-branch=main")
    # The repository's own identity for the server's commits: the sandbox's HOME has no git
    # config, and without this GitPython signs them with the sandbox's user and host names
    # ("sandbox <sandbox@sandbox>").
    git(repo, "config", "user.name", "Sandboxed Agent")
    git(repo, "config", "user.email", "agent@example.test")
    (repo / "README.md").write_text("# A small repository\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "--quiet", "-m", "first commit", env=AUTHOR)
    return repo


def tar_of(repo: Path) -> bytes:
    """An uncompressed tar of the repository's files and folders, .git included, relative to it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(repo.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(repo)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o755 if path.is_dir() else 0o644
            if path.is_dir():
                tar.addfile(info)
            else:
                with path.open("rb") as f:
                    tar.addfile(info, f)
    return buf.getvalue()


def downloaded_repository(agent: Client, run_id: str, root: Path) -> Path:
    """The workspace's repository as downloaded (every file of it, .git included), written under
    `root`: what the receiver has, read by the host's own git."""
    files = agent.download_files(run_id)
    assert not files.skipped, files.skipped
    repo = root / "downloaded"
    for rel, data in files.items():
        target = repo / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return repo


def git_call(agent: Client, run_id: str, call_id: str, tool: str, **arguments: Any) -> Any:
    """One call of the git server's `tool` in the run; its observation."""
    [obs] = agent.submit_batch(run_id, [{"call_id": call_id, "tool": f"git.{tool}", "arguments": arguments}])
    return obs


def executed_text(obs: Any) -> str:
    """The server's answer to a call that ran and succeeded."""
    assert obs.status is ObservationStatus.EXECUTED and obs.executed and obs.error is None, obs
    assert obs.verdict_path[-1] == "result:ok", obs.verdict_path
    text: str = obs.content["text"]
    return text


def test_git_works_on_the_runs_workspace_and_its_commit_is_in_the_downloaded_repository(stack, docker_client,
                                                                                       tmp_path):
    server, _tb = stack
    repo = small_repository(tmp_path)
    first = git(repo, "rev-parse", "HEAD").strip()
    with (Client(server.address, AGENT) as agent,
          started(agent, docker_client, "commit a note", workspace=True) as run):
        assert workspace_objects(docker_client, run.run_id)  # the run has its workspace
        agent.upload_tar(run.run_id, tar_of(repo))
        status = executed_text(git_call(agent, run.run_id, "st1", "git_status", repo_path="/workspace"))
        assert "On branch main" in status and "nothing to commit, working tree clean" in status
        log = executed_text(git_call(agent, run.run_id, "log1", "git_log", repo_path="/workspace"))
        assert re.findall(r"Commit: ([0-9a-f]{40})", log) == [first]
        assert "Author: Ada Example" in log

        agent.upload_files(run.run_id, {"notes/todo.txt": b"write the tests\n"})
        status = executed_text(git_call(agent, run.run_id, "st2", "git_status", repo_path="/workspace"))
        assert "Untracked files" in status and "notes/" in status
        added = git_call(agent, run.run_id, "add", "git_add", repo_path="/workspace", files=["notes/todo.txt"])
        assert executed_text(added) == "Files staged successfully"
        assert added.verdict_path == (*ALLOWED, "workspace:write", "policy:rule[3]:allow", "admitted", "result:ok")
        committed = executed_text(git_call(agent, run.run_id, "commit", "git_commit", repo_path="/workspace",
                                       message="add a note"))
        [second] = re.findall(r"Changes committed successfully with hash ([0-9a-f]{40})", committed)
        log = executed_text(git_call(agent, run.run_id, "log2", "git_log", repo_path="/workspace"))
        assert re.findall(r"Commit: ([0-9a-f]{40})", log) == [second, first]

        # At the receiver: the workspace's .git, downloaded, read by the host's own git.
        got = downloaded_repository(agent, run.run_id, tmp_path)
        assert git(got, "log", "--format=%H %an %s").splitlines() == [
            f"{second} Sandboxed Agent add a note", f"{first} Ada Example first commit"]
        assert git(got, "show", f"{second}:notes/todo.txt") == "write the tests\n"
        assert git(got, "status", "--porcelain") == ""
    assert workspace_objects(docker_client, run.run_id) == []  # gone with the run


@pytest.mark.parametrize("repo_path", ["/etc", "/workspace/../etc", "/opt/ringfence", "relative/../../etc"])
def test_git_refuses_a_repo_path_outside_the_workspace_at_admission(stack, docker_client, repo_path):
    server, _tb = stack
    with (Client(server.address, AGENT) as agent,
          started(agent, docker_client, "look elsewhere", workspace=True) as run):
        for tool, more in (("git_status", {}), ("git_log", {}), ("git_add", {"files": ["passwd"]})):
            obs = git_call(agent, run.run_id, f"{tool}-x", tool, repo_path=repo_path, **more)
            assert obs.status is ObservationStatus.DENIED and not obs.executed, obs
            assert obs.verdict_path == ("registry:ok", "validation:ok", "guardrail:pass", "resource:deny")
            assert obs.error_class == "resource" and "outside /workspace" in obs.error
        # Never sent: no session was started for the run.
        assert session_containers(docker_client, f"acme:{run.run_id}") == []
