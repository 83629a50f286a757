"""Uploads are all or nothing, and names that are not UTF-8 are refused or skipped, never INTERNAL
(second attack review, findings 4 and 8).

Through a real gRPC server on a loopback port, the real Orchestrator, real containers and real
workspaces: the harness is test_files_api.py's `stack` (its edge must count no unexpected error).

What is pinned: an upload holding a member named in bytes that are not UTF-8 is INVALID_ARGUMENT
naming that member (escaped), before any copy starts, and nothing of it arrives; a file a tool
named so is delivered as `skipped` by a download (the others come whole); an upload whose plan
meets a link a tool planted (`l_root -> /` plus 24 good files), a file where a directory goes or a
directory the helper may not write in is refused whole; an upload past the workspace's byte or
inode cap is RESOURCE_EXHAUSTED; after each refusal the workspace is byte for byte what it was and
no `files_uploaded` event was appended.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from module_support import load_module

from ringfence import FailedPrecondition, InvalidArgument, ResourceExhausted, WorkspaceOptions
from ringfence_server.control.state import EventType
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.profile import SandboxProfile, WorkspaceMount
from ringfence_server.sandbox.result import Outcome

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]


files_api = load_module("files_api_harness", ROOT / "tests" / "integration" / "test_files_api.py")
stack = files_api.stack  # the fixture: a real server, orchestrator, engine and workspaces
sha = files_api.sha


def raw_tar(*members: tuple[bytes, bytes]) -> bytes:
    """A tar whose member names are the given BYTES (GNU format: written as they are)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name.decode("utf-8", "surrogateescape"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def as_tool(stack, backend, run: str, script: str) -> None:
    """`script` run by a tool of the run with its workspace read-write (as any tool may)."""
    made = backend.run(SandboxRequest(profile=SandboxProfile(workspace=WorkspaceMount(stack.volume(run))),
                                      argv=("python3", "-I", "-c", script), run_id=f"acme:{run}", warm=False))
    assert made.outcome is Outcome.OK, made.stderr


def assert_refused_whole(stack, run: str, agent, before: dict[str, bytes], uploads: int) -> None:
    after = agent.download_files(run, [])
    assert dict(after) == before
    assert len(stack.events(run, EventType.FILES_UPLOADED)) == uploads
    assert stack.server.server.edge.unexpected_errors == 0


TWENTY_FOUR = [(f"f{i:02}.txt".encode(), f"file {i}\n".encode()) for i in range(24)]


def test_an_upload_with_a_name_that_is_not_utf8_is_refused_naming_it_and_nothing_arrives(stack):
    with stack.client() as agent:
        run = stack.start(agent)
        agent.upload_files(run, {"keep.txt": b"the workspace before\n"})
        before = dict(agent.download_files(run, []))
        helpers = len(stack.helpers_of(run))
        with pytest.raises(InvalidArgument) as caught:
            agent.upload_tar(run, raw_tar(*TWENTY_FOUR, (b"caf\xe9.txt", b"latin-1\n")))
        [violation] = caught.value.violations
        assert violation.field == "tar_chunk"
        assert "member 'caf\\xe9.txt'" in violation.description and "not valid UTF-8" in violation.description
        assert len(stack.helpers_of(run)) == helpers  # refused on the host: no copy even started
        assert_refused_whole(stack, run, agent, before, uploads=1)


NAMES_NOT_UTF8 = r"""
import os
os.makedirs(b"/workspace/d/sub\xff", exist_ok=True)
open(b"/workspace/d/caf\xe9.txt", "wb").write(b"latin-1\n")
open(b"/workspace/d/sub\xff/inner.txt", "wb").write(b"inner\n")
open(b"/workspace/d/ok.txt", "wb").write(b"fine\n")
os.symlink(b"/etc", b"/workspace/d/l\xfe")
"""


def test_a_file_a_tool_named_in_bytes_that_are_not_utf8_is_skipped_by_a_download(stack, backend):
    with stack.client() as agent:
        run = stack.start(agent)
        as_tool(stack, backend, run, NAMES_NOT_UTF8)
        for paths in (["d"], []):
            got = agent.download_files(run, paths)
            assert dict(got) == {"d/ok.txt": b"fine\n"}, paths
            assert set(got.skipped) == {"d/caf\\xe9.txt", "d/sub\\xff/inner.txt", "d/l\\xfe"}, paths
            assert "not valid UTF-8" in got.skipped["d/caf\\xe9.txt"]
            assert "not valid UTF-8" in got.skipped["d/sub\\xff/inner.txt"]
            assert "symlink to '/etc'" in got.skipped["d/l\\xfe"]
    downloads = stack.events(run, EventType.FILES_DOWNLOADED)
    assert [d["files"] for d in downloads] == [[{"path": "d/ok.txt", "size": 5, "sha256": sha(b"fine\n")}]] * 2
    assert stack.server.server.edge.unexpected_errors == 0


PLANTED = r"""
import os
os.symlink("/", "/workspace/l_root")
os.makedirs("/workspace/proj/sub")
os.symlink("/tmp", "/workspace/proj/sub/tmp-link")
open("/workspace/proj/notes", "w").write("a file\n")
os.makedirs("/workspace/ro")
os.chmod("/workspace/ro", 0o555)
"""


def test_an_upload_through_a_planted_link_or_into_the_wrong_kind_is_refused_whole(stack, backend):
    with stack.client() as agent:
        run = stack.start(agent)
        agent.upload_files(run, {"keep.txt": b"the workspace before\n"})
        as_tool(stack, backend, run, PLANTED)
        before = dict(agent.download_files(run, []))

        # 24 good files, then one through the planted link to the helper's root.
        with pytest.raises(InvalidArgument) as caught:
            agent.upload_tar(run, raw_tar(*TWENTY_FOUR, (b"l_root/pwned.txt", b"pwned\n")))
        [violation] = caught.value.violations
        assert violation.field == "tar_chunk"
        assert "member 'l_root/pwned.txt'" in violation.description and "'l_root' is a link" in violation.description
        # A deeper link, under a dest that exists.
        with pytest.raises(InvalidArgument) as caught:
            agent.upload_files(run, {"a.txt": b"a\n", "sub/tmp-link/x": b"x\n"}, dest="proj")
        assert "member 'sub/tmp-link/x'" in caught.value.violations[0].description
        assert "'proj/sub/tmp-link' is a link" in caught.value.violations[0].description
        # A directory where the workspace has a file, and a file where it has a directory.
        with pytest.raises(InvalidArgument) as caught:
            agent.upload_files(run, {"a.txt": b"a\n", "notes/x": b"x\n"}, dest="proj")
        assert "member 'notes/x'" in caught.value.violations[0].description
        assert "'proj/notes' is a file in the workspace" in caught.value.violations[0].description
        with pytest.raises(InvalidArgument) as caught:
            agent.upload_files(run, {"a.txt": b"a\n", "sub": b"x\n"}, dest="proj")
        assert "member 'sub'" in caught.value.violations[0].description
        # A directory the helper may not write in (a tool made it read-only).
        with pytest.raises(FailedPrecondition, match="'ro' cannot be written in"):
            agent.upload_files(run, {"a.txt": b"a\n", "ro/b.txt": b"b\n"})
        assert_refused_whole(stack, run, agent, before, uploads=1)

        # The same workspace still takes a good upload, replacing a file and adding new ones.
        agent.upload_files(run, {"keep.txt": b"v2\n", "proj/sub/new/n.txt": b"n\n", "fresh/a/b.txt": b"b\n"})
        # And a dest whose first part exists and whose rest does not (moved into place whole).
        agent.upload_files(run, {"x.txt": b"x\n"}, dest="proj/sub/brand/new")
        after = agent.download_files(run, [])
        assert dict(after) == {**before, "keep.txt": b"v2\n", "proj/sub/new/n.txt": b"n\n",
                               "fresh/a/b.txt": b"b\n", "proj/sub/brand/new/x.txt": b"x\n"}
        assert not any(".ringfence-upload" in p for p in (*after, *after.skipped))  # staging removed


def test_an_upload_over_the_workspace_byte_or_inode_cap_is_refused_whole(stack):
    with stack.client() as agent:
        # 256 KiB of data: twenty 16 KiB files fit, forty do not.
        run = stack.start(agent, workspace=WorkspaceOptions(bytes=256 * 1024, inodes=64))
        agent.upload_files(run, {"keep.txt": b"the workspace before\n"})
        before = dict(agent.download_files(run, []))
        with pytest.raises(ResourceExhausted, match="workspace is full"):
            agent.upload_files(run, {f"big/{i:02}.bin": bytes([i]) * 16 * 1024 for i in range(40)})
        assert_refused_whole(stack, run, agent, before, uploads=1)
        # 64 inodes: 80 empty files do not fit.
        with pytest.raises(ResourceExhausted, match="workspace is full"):
            agent.upload_files(run, {f"many/{i:02}": b"" for i in range(80)})
        assert_refused_whole(stack, run, agent, before, uploads=1)
        # The caps still hold what fits, staging included.
        agent.upload_files(run, {f"some/{i:02}.bin": bytes([i]) * 16 * 1024 for i in range(8)})
        assert len(agent.download_files(run, [])) == 9
