"""The workspace tools (workspace_write, workspace_read, run_tests) in real sandboxes.

Each call runs through the DockerBackend the control plane uses, in a fresh container of the
pinned tool image, with a real workspace (a capped tmpfs volume held by its keeper) mounted at
/workspace: read-write for workspace_write and run_tests, read-only for workspace_read, as
their manifests declare. What one call leaves, the next one finds; what the tools refuse
(links, `..`, a full workspace, a read-only mount) they refuse with the right class and leave
nothing behind.

run_tests' output is live: the tests in the workspace below wait, inside their sandbox, for a
file that the host writes only after it has SEEN their first line through the backend's
`on_output`. Were the output buffered until the end, the host would never see that line, the
file would never come, and the test would fail (not hang: it gives up after a bounded wait).
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ringfence_server.control.registry import Registry
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.profile import KiB, MiB, SandboxProfile, WorkspaceMount
from ringfence_server.sandbox.result import Outcome, SandboxResult, ToolErrorClass
from ringfence_server.sandbox.workspace import DockerWorkspaces, WorkspaceSpec

pytestmark = pytest.mark.docker

MANIFESTS = Path(__file__).resolve().parents[2] / "ringfence_server" / "control" / "tools"
ROOMY = WorkspaceSpec(bytes=4 * MiB, inodes=256)

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = """\
import unittest

from calc import add


class AddTest(unittest.TestCase):
    def test_adds(self):
        self.assertEqual(add(2, 3), 5)

    def test_zero(self):
        self.assertEqual(add(0, 0), 0)
"""
# Prints a line, then waits (bounded) for the host to answer it by creating /workspace/go.
WAITS_FOR_THE_HOST = """\
import os
import time
import unittest


class LiveTest(unittest.TestCase):
    def test_the_host_saw_my_first_line(self):
        print("waiting for the host", flush=True)
        for _ in range(600):
            if os.path.exists("/workspace/go"):
                return
            time.sleep(0.1)
        self.fail("the host never answered: the output was not streamed while the call ran")
"""


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.from_dir(MANIFESTS)


@pytest.fixture(scope="module")
def workspaces(docker_client, pinned_images) -> DockerWorkspaces:
    return DockerWorkspaces(docker_client, lock=pinned_images)


class Workspace:
    """One workspace of a test (its own run key), and how to call a tool in it."""

    def __init__(self, backend, workspaces: DockerWorkspaces, registry: Registry, docker_client, spec: WorkspaceSpec):
        self.backend = backend
        self.registry = registry
        self.docker = docker_client
        self.run_key = f"wstools-{uuid.uuid4().hex[:12]}"
        self.volume = workspaces.create(self.run_key, "test", spec)

    def call(self, tool: str, arguments: dict, *, mount: bool = True,
             on_output: Callable[[str, bytes], None] | None = None) -> tuple[SandboxResult, dict]:
        """Run `tool` as the control plane would: its manifest's limits, the workspace mounted as
        the manifest says (or not at all). Returns the result and the runner's JSON document."""
        manifest = self.registry.get(tool)
        assert manifest is not None, f"no tool {tool!r}"
        limits = manifest.limits
        workspace = WorkspaceMount(self.volume, read_only=manifest.workspace == "read") if mount else None
        profile = SandboxProfile(memory_bytes=limits.memory_bytes, cpus=limits.cpus, pids=limits.pids,
                                 timeout_s=limits.timeout_s, stdout_limit=limits.stdout_limit,
                                 stderr_limit=limits.stderr_limit, workspace=workspace)
        body = {"tool": tool, "arguments": arguments, "call_id": "c1", "idempotency_key": None}
        result = self.backend.run(SandboxRequest(profile=profile, stdin=json.dumps(body).encode(),
                                                 run_id="wstools", warm=False, on_output=on_output))
        return result, json.loads(result.stdout)

    def content(self, tool: str, arguments: dict, **kw) -> dict:
        result, doc = self.call(tool, arguments, **kw)
        assert result.outcome is Outcome.OK and doc["ok"] is True, (doc, result.stderr[-2000:])
        return doc["content"]

    def refused(self, tool: str, arguments: dict, **kw) -> tuple[ToolErrorClass | None, str]:
        result, doc = self.call(tool, arguments, **kw)
        assert result.outcome is Outcome.TOOL_ERROR and doc["ok"] is False, doc
        return result.error_class, doc["error"]["message"]

    def shell(self, script: str) -> str:
        """Run `script` as the sandbox user in a plain sandbox with the workspace read-write (what
        an earlier call of another tool could have left: links, hardlinks); its stdout."""
        profile = SandboxProfile(workspace=WorkspaceMount(self.volume))
        result = self.backend.run(SandboxRequest(profile=profile, argv=("sh", "-c", script), run_id="wstools",
                                                 warm=False))
        assert result.outcome is Outcome.OK, result.stderr
        return result.stdout.decode()


@pytest.fixture
def make_workspace(backend, workspaces, registry, docker_client) -> Iterator[Callable[..., Workspace]]:
    made: list[Workspace] = []

    def make(spec: WorkspaceSpec = ROOMY) -> Workspace:
        made.append(Workspace(backend, workspaces, registry, docker_client, spec))
        return made[-1]

    yield make
    for ws in made:
        workspaces.remove(ws.run_key)
    for ws in made:
        assert docker_client.volumes.list(filters={"name": ws.volume}) == []


@pytest.fixture
def ws(make_workspace) -> Workspace:
    return make_workspace()


def test_the_manifests_declare_their_workspace_use_and_outputs(registry):
    assert registry.get("workspace_write").workspace == "write"
    assert registry.get("workspace_read").workspace == "read"
    run_tests = registry.get("run_tests")
    assert run_tests.workspace == "write" and run_tests.outputs == ("reports/tests.txt",)
    # None of them is a mutation (idempotency, approvals); the two writers are ordered like one.
    assert [registry.get(t).mutates for t in ("workspace_write", "workspace_read", "run_tests")] == [False] * 3
    assert [registry.get(t).serial for t in ("workspace_write", "workspace_read", "run_tests")] == [True, False, True]


def test_a_file_written_by_one_call_is_read_by_the_next(ws):
    content = "# café\n" + BUGGY
    written = ws.content("workspace_write", {"path": "./pkg//calc.py", "content": content})
    data = content.encode()
    assert written == {"path": "pkg/calc.py", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    # Another container, the workspace read-only: the same text, found by its absolute name too.
    assert ws.content("workspace_read", {"path": "/workspace/pkg/calc.py"}) == {
        "path": "pkg/calc.py", "content": content, "size": len(data), "truncated": False}
    # Overwritten in place: one file, no temporary left beside it.
    ws.content("workspace_write", {"path": "pkg/calc.py", "content": FIXED})
    assert ws.shell("cd /workspace/pkg && ls -A && cat calc.py") == "calc.py\n" + FIXED


@pytest.mark.parametrize("path", ["../calc.py", "pkg/../../calc.py", "/etc/calc.py", "/workspace", "pkg/",
                                  "a\x00b", "a\\b", "x" * 256, ""])
def test_unsafe_paths_are_refused_before_anything_is_written(ws, path):
    cls, _ = ws.refused("workspace_write", {"path": path, "content": "x"})
    assert cls is ToolErrorClass.INVALID
    assert ws.shell("ls -A /workspace") == ""


def test_a_link_left_in_the_workspace_is_replaced_never_written_or_read_through(ws):
    ws.shell("cd /workspace && echo original > victim.txt && ln -s victim.txt link.txt && "
             "ln victim.txt hard.txt && ln -s /tmp out && ln -s /etc/passwd passwd")
    # Reading: a link is refused, whether it is the file or a directory on the way.
    for path in ("link.txt", "passwd", "out/x"):
        cls, message = ws.refused("workspace_read", {"path": path})
        assert cls is ToolErrorClass.INVALID and "links are never followed" in message, message
    # Writing through a directory link is refused; writing to a link or a hardlink replaces the
    # name itself: the file they pointed at keeps its content.
    cls, _ = ws.refused("workspace_write", {"path": "out/x.txt", "content": "x"})
    assert cls is ToolErrorClass.INVALID
    ws.content("workspace_write", {"path": "link.txt", "content": "new\n"})
    ws.content("workspace_write", {"path": "hard.txt", "content": "new\n"})
    listing = ws.shell("cd /workspace && cat victim.txt && stat -c '%n %F %h' hard.txt link.txt victim.txt")
    assert listing == ("original\n"
                       "hard.txt regular file 1\nlink.txt regular file 1\nvictim.txt regular file 1\n")


def test_a_directory_or_a_missing_file_is_refused_by_workspace_read(ws):
    ws.shell("mkdir /workspace/d")
    assert ws.refused("workspace_read", {"path": "d"})[1] == "d: not a regular file"
    assert ws.refused("workspace_read", {"path": "nope.py"})[1] == "nope.py: no such file in the workspace"


def test_workspace_read_refuses_bytes_that_are_not_text(ws):
    ws.shell("printf '\\377\\376' > /workspace/blob")
    cls, message = ws.refused("workspace_read", {"path": "blob"})
    assert cls is ToolErrorClass.INVALID and message == "blob: not UTF-8 text (2 bytes)"


def test_a_full_workspace_stops_the_write_and_leaves_no_partial_file(make_workspace):
    ws = make_workspace(WorkspaceSpec(bytes=256 * KiB, inodes=64))
    chunk = "x" * 60_000
    written = 0
    while True:
        result, doc = ws.call("workspace_write", {"path": f"big/{written}.txt", "content": chunk})
        if not doc["ok"]:
            break
        written += 1
        assert written < 10, "a 256 KiB workspace took more than 10 files of 60 KB"
    assert result.error_class is ToolErrorClass.FATAL
    assert doc["error"]["message"] == f"big/{written}.txt: the workspace is full (its byte or file cap is reached)"
    # Every complete file is there, whole; the refused one left nothing (not even its temporary).
    names = ws.shell("ls -A /workspace/big | sort -n").split()
    assert names == [f"{i}.txt" for i in range(written)] and written >= 3
    assert ws.shell(f"wc -c < /workspace/big/{written - 1}.txt").strip() == "60000"


def test_the_write_tool_with_a_read_only_workspace_changes_nothing(ws, registry):
    # A tool declaring `read` gets the mount read-only: a write through it fails in the kernel.
    ws.content("workspace_write", {"path": "calc.py", "content": BUGGY})
    manifest = registry.get("workspace_write")
    profile = SandboxProfile(memory_bytes=manifest.limits.memory_bytes, workspace=WorkspaceMount(ws.volume, True))
    body = {"tool": "workspace_write", "arguments": {"path": "calc.py", "content": FIXED}, "call_id": "c1"}
    result = ws.backend.run(SandboxRequest(profile=profile, stdin=json.dumps(body).encode(), run_id="wstools",
                                           warm=False))
    assert result.error_class is ToolErrorClass.FATAL
    assert json.loads(result.stdout)["error"]["message"] == "calc.py: this tool has the workspace read-only"
    assert ws.shell("cat /workspace/calc.py") == BUGGY


def test_without_a_workspace_the_tools_say_so(ws):
    for tool, arguments in (("workspace_write", {"path": "a.py", "content": ""}), ("workspace_read", {"path": "a.py"}),
                            ("run_tests", {})):
        cls, message = ws.refused(tool, arguments, mount=False)
        assert cls is ToolErrorClass.FATAL and message.startswith("no workspace is mounted at /workspace"), message


def test_run_tests_fails_then_passes_and_its_report_is_its_output(ws):
    ws.content("workspace_write", {"path": "calc.py", "content": BUGGY})
    ws.content("workspace_write", {"path": "test_calc.py", "content": TESTS})
    streamed: list[tuple[str, bytes]] = []
    failed = ws.content("run_tests", {}, on_output=lambda stream, data: streamed.append((stream, data)))
    assert (failed["passed"], failed["ran"], failed["failures"], failed["errors"]) == (False, 2, 1, 0)
    assert failed["exit_code"] == 1 and failed["report"] == "reports/tests.txt" and failed["report_error"] is None
    assert failed["tail"][-1] == "FAILED (failures=1)"
    assert "AssertionError: -1 != 5" in failed["tail"]
    # What went to stderr as it ran is, byte for byte, the saved report (stdout is the runner's
    # one result line).
    report = ws.content("workspace_read", {"path": "reports/tests.txt"})["content"]
    assert b"".join(d for s, d in streamed if s == "stderr").decode() == report
    assert json.loads(b"".join(d for s, d in streamed if s == "stdout"))["content"] == failed
    assert report.startswith("test_adds (test_calc.AddTest.test_adds) ... FAIL\n")

    ws.content("workspace_write", {"path": "calc.py", "content": FIXED})
    passed = ws.content("run_tests", {})
    assert (passed["passed"], passed["ran"], passed["failures"], passed["errors"]) == (True, 2, 0, 0)
    assert passed["tail"][-1] == "OK"
    # No bytecode and nothing else: the module, its test and the report.
    assert ws.shell("cd /workspace && find . -mindepth 1 | sort") == (
        "./calc.py\n./reports\n./reports/tests.txt\n./test_calc.py\n")


def test_run_tests_output_reaches_the_host_while_the_tests_still_run(ws):
    ws.content("workspace_write", {"path": "test_live.py", "content": WAITS_FOR_THE_HOST})
    seen = threading.Event()
    answered: list[str] = []

    def answer() -> None:
        # Only once the first line came out of the running call: the host writes the file the
        # test in the sandbox waits for (a plain sandbox with the same workspace).
        if seen.wait(120):
            answered.append(ws.shell("touch /workspace/go && echo answered"))

    helper = threading.Thread(target=answer)
    helper.start()

    def on_output(stream: str, data: bytes) -> None:
        if b"waiting for the host" in data:
            seen.set()

    try:
        result = ws.content("run_tests", {"pattern": "test_live.py"}, on_output=on_output)
    finally:
        seen.set()
        helper.join()
    assert answered == ["answered\n"]
    assert (result["passed"], result["ran"]) == (True, 1), result["tail"]


def test_run_tests_with_no_tests_has_not_passed(ws):
    result = ws.content("run_tests", {})
    assert (result["passed"], result["ran"], result["exit_code"]) == (False, 0, 0)


def test_run_tests_refuses_a_pattern_with_a_path(ws):
    cls, _ = ws.refused("run_tests", {"pattern": "../test*.py"})
    assert cls is ToolErrorClass.INVALID

