"""`ringfence mcp-servers add` end to end, offline: mcp-server-time from the flat wheelhouse
`make mcp-wheels` filled (PIP_NO_INDEX=1, PIP_FIND_LINKS=images/.build/mcp-wheelhouse; the index
and proxies pointed nowhere, and as root in a network namespace of its own), into a fresh images
dir outside the checkout layered over the built-in one (its parent, base, is read from the
built-in build cache or the engine, never rebuilt). The user's lock then pins mcp-time on the
built-in base, and the image, run as the sandbox runs (read-only root, uid 10001, no network,
tmpfs /tmp), answers MCP's initialize and tools/list over stdio with get_current_time.

The command runs as the CLI (`python -m ringfence.cli`, this checkout's code) in a subprocess.
The container is started with --rm and this session's label, and removed by name even on a
failure. An image this test made that was not in the engine before is removed at the end (the
same spec as examples/mcp/images' gives the same image ID: that one is left alone), and the
tag ringfence/mcp-time is put back where it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest
from image_support import TEST_LABELS, remove_image

from ringfence_server.imagebuild import engine
from ringfence_server.sandbox.pinned_images import lock_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / "images" / ".build" / "mcp-wheelhouse"
PACKAGE = "mcp-server-time==2026.10.19"
TAG = engine.TAG_PREFIX + "mcp-time"
COMMAND = ["python3", "-I", "-S", "-B", "/opt/ringfence/mcp_entry.py", "mcp-server-time", "--local-timezone", "UTC"]
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE), "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_EXTRA_INDEX_URL": "", "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "no_proxy": "", "NO_PROXY": ""}


def _image_ids(client) -> set[str]:
    return {image.id for image in client.images.list(all=True)}


def _tagged(client, tag: str) -> str | None:
    import docker.errors

    try:
        image_id: str = client.images.get(tag).id
    except docker.errors.ImageNotFound:
        return None
    return image_id


@pytest.fixture(scope="module")
def added(docker_client, pinned_images, tmp_path_factory):
    if not any(WHEELHOUSE.glob("mcp_server_time-2026.10.19-*.whl")):
        pytest.skip(f"no offline wheelhouse at {WHEELHOUSE}: run `make mcp-wheels`")
    root = tmp_path_factory.mktemp("mcp-project")
    assert REPO not in root.parents
    images, servers = root / "images", root / "servers"
    before, tag_before = _image_ids(docker_client), _tagged(docker_client, TAG)
    # Its own network namespace (root only): nothing to reach but the engine's unix socket.
    netns = (os.geteuid() == 0 and shutil.which("unshare") is not None
             and not os.environ.get("DOCKER_HOST", "unix://").startswith(("tcp:", "ssh:")))
    cmd = [sys.executable, "-m", "ringfence.cli", "mcp-servers", "add", "time", "--package", PACKAGE,
           "--images-dir", str(images), "--servers-dir", str(servers), "--arg=--local-timezone", "--arg=UTC"]
    made: str | None = None
    try:
        run = subprocess.run(["unshare", "--net", "--", *cmd] if netns else cmd, cwd=root, capture_output=True,
                             text=True, timeout=600, env={**os.environ, **OFFLINE})
        lock = lock_for(images, missing_ok=True)
        made = lock.get("mcp-time").id if lock.owns("mcp-time") else None  # type: ignore[union-attr]
        yield {"run": run, "images": images, "servers": servers, "netns": netns, "id": made}
    finally:
        if made is not None and made not in before:
            remove_image(docker_client, made)
        if tag_before is not None and _tagged(docker_client, TAG) != tag_before and tag_before in _image_ids(
                docker_client):
            docker_client.images.get(tag_before).tag(TAG)


def test_add_runs_offline_and_pins_the_image_on_the_built_in_base(added, pinned_images):
    run = added["run"]
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    # Resolved from the wheelhouse; `images fetch` found every wheel already in the cache.
    assert "wheel(s) pinned by sha256" in run.stderr and "console script: mcp-server-time" in run.stderr
    assert "mcp-time: 0 package file(s) and" in run.stderr and "in the cache, checked" in run.stderr
    lock = lock_for(added["images"])
    assert lock.names == ("mcp-time",)  # the user's lock holds the user's image only
    entry = lock.entry("mcp-time")
    assert (entry.parent, entry.parent_id) == ("base", pinned_images.image_id("base"))
    assert entry.id == added["id"] and f"mcp-time\t{entry.id}\tpinned in" in run.stdout
    wheels = {w.name: w for w in entry.wheels}
    assert wheels["mcp-server-time"].version == "2026.10.19" and {"mcp", "pydantic", "tzdata"} <= set(wheels)
    spec = json.loads((added["images"] / "mcp-time" / "image.json").read_text())
    assert {(w["name"], w["version"], w["sha256"]) for w in spec["wheels"]} == {
        (w.name, w.version, w.sha256) for w in entry.wheels}
    declaration = tomllib.loads((added["servers"] / "time" / "server.toml").read_text())
    assert declaration == {"name": "time", "image": "mcp-time", "command": COMMAND, "egress_hosts": [],
                           "workspace": "", "limits": {"memory_bytes": 268435456, "cpus": 0.5, "pids": 64,
                                                       "timeout_s": 30, "stdout_limit": 1048576}}
    verify = subprocess.run([sys.executable, "-m", "ringfence.cli", "images", "verify", "--images-dir",
                             str(added["images"])], capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stderr
    print(f"\nadd in its own network namespace: {added['netns']}")


def _rpc(proc: subprocess.Popen[str], message: dict[str, object]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(message) + "\n")
    proc.stdin.flush()


def _answer(proc: subprocess.Popen[str], request_id: int) -> dict[str, object]:
    assert proc.stdout is not None
    for line in proc.stdout:
        doc = json.loads(line)
        if doc.get("id") == request_id:
            return doc  # type: ignore[no-any-return]
    raise AssertionError(f"the server closed its stdout before answering request {request_id}")


def test_the_image_answers_tools_list_over_stdio(added):
    assert added["run"].returncode == 0, added["run"].stderr
    name = f"rftest-mcp-time-{uuid.uuid4().hex[:8]}"
    labels = [arg for k, v in TEST_LABELS.items() for arg in ("--label", f"{k}={v}")]
    cmd = ["docker", "run", "--rm", "-i", "--name", name, *labels, "--read-only", "--user", "10001:10001",
           "--network", "none", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
           added["id"]]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}})
        init = _answer(proc, 1)
        assert init["result"]["serverInfo"]["name"] == "mcp-time"  # type: ignore[index]
        _rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        # stdin stays open until the answer: the server may drop a request it has not read when
        # its input ends.
        _rpc(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        tools = {t["name"]: t for t in _answer(proc, 2)["result"]["tools"]}  # type: ignore[index]
        assert {"get_current_time", "convert_time"} <= set(tools)
        assert tools["get_current_time"]["inputSchema"]["required"] == ["timezone"]
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)
