"""UploadFiles / DownloadFiles through a real gRPC server on a loopback port, the real
Orchestrator, real containers (DockerBackend) and real workspaces (DockerWorkspaces: a capped
tmpfs volume held by its keeper).

What is pinned: files round-trip byte-identical (binary, nested, empty, non-ASCII names, more
than one chunk each way); every unsafe archive the archive battery knows (cases 38-39: the
builders of tests/unit/test_archive.py and the tool-made archives of
tests/escape/test_file_transfer.py) is refused with INVALID_ARGUMENT naming the member, before any
container exists, and the workspace is unchanged afterwards; an upload over the cap is
RESOURCE_EXHAUSTED, counted as it arrives; a run without a workspace is FAILED_PRECONDITION and
another tenant's run NOT_FOUND; links a tool made in the workspace come back `skipped`, never
followed; `files_uploaded` / `files_downloaded` hold every file's sha256; the CLI's `files put|get`
move the same bytes and refuse links locally; and the edge never counted an unexpected error.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import grpc
import pytest
from module_support import load_module
from recording_backend import RecordingBackend

from ringfence import AsyncClient, Client, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from ringfence.v1 import files_pb2, files_pb2_grpc
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.config import load_config, token_digest
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.state import EventType
from ringfence_server.control.store import SqliteEventStore
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.profile import SandboxProfile, WorkspaceMount
from ringfence_server.sandbox.result import Outcome
from ringfence_server.sandbox.workspace import DockerWorkspaces

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
AGENT, STRANGER, APPROVER = "files-agent-token", "files-stranger-token", "files-approver-token"
CAP = 1024 * 1024  # files.max_upload_bytes of the server under test


archive_battery = load_module("archive_battery", ROOT / "tests" / "unit" / "test_archive.py")
transfer_battery = load_module("transfer_battery", ROOT / "tests" / "escape" / "test_file_transfer.py")


class Stack:
    def __init__(self, server: BackgroundServer, orchestrator: Orchestrator, recording: RecordingBackend,
                 workspaces: DockerWorkspaces, store: SqliteEventStore) -> None:
        self.server = server
        self.orchestrator = orchestrator
        self.recording = recording
        self.workspaces = workspaces
        self.store = store
        self.run_keys: list[str] = []

    def client(self, token: str = AGENT) -> Client:
        return Client(self.server.address, token, timeout=120)

    def start(self, client: Client, workspace: bool = True) -> str:
        run_id = f"files-{uuid.uuid4().hex[:10]}"
        view = client.start_run("move files", run_id, workspace=workspace)
        self.run_keys.append(self.orchestrator.runs.get("acme", run_id).key)
        if workspace:
            assert view.workspace is not None and not view.workspace.removed
        else:
            assert view.workspace is None
        return run_id

    def volume(self, run_id: str) -> str:
        volume = self.orchestrator.runs.get("acme", run_id).live_volume
        assert volume is not None
        return volume

    def events(self, run_id: str, type_: EventType) -> list[dict]:
        key = self.orchestrator.runs.get("acme", run_id).key
        return [dict(e.data) for e in self.store.read(key) if e.type == type_]

    def helpers_of(self, run_id: str) -> list[SandboxRequest]:
        return [r for r in self.recording.requests if r.run_id == f"acme:{run_id}"]


@pytest.fixture
def stack(tmp_path, docker_client, pinned_images, backend):
    config = load_config(overrides={
        "state_dir": str(tmp_path / "state"),
        "files": {"max_upload_bytes": CAP, "max_download_bytes": 4 * CAP},
        "tenants": {
            "acme": {"tokens": [{"sha256": token_digest(AGENT), "role": "agent", "subject": "agent-1"},
                                {"sha256": token_digest(APPROVER), "role": "approver", "subject": "boss"}]},
            "globex": {"tokens": [{"sha256": token_digest(STRANGER), "role": "agent", "subject": "intruder"}]},
        },
    })
    recording = RecordingBackend(backend)
    # Scoped: the Orchestrator reaps, at start, the workspaces its store does not know; this one
    # sees only the test's own (the engine is shared).
    workspaces = DockerWorkspaces(docker_client, pinned_images, scope=f"test-files-{uuid.uuid4().hex[:12]}")
    store = SqliteEventStore(config.db_path)
    orchestrator = Orchestrator.from_config(config, recording, store, workspaces=workspaces)
    s = None
    try:
        with BackgroundServer(orchestrator, config) as server:
            s = Stack(server, orchestrator, recording, workspaces, store)
            yield s
            assert server.server.edge.unexpected_errors == 0, "the edge answered INTERNAL to something"
    finally:
        orchestrator.close()
        store.close()
        for key in s.run_keys if s is not None else ():
            workspaces.remove(key)  # only the workspaces this test made


def tar_of(*members: tuple[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


FILES = {
    "blob.bin": os.urandom(700 * 1024),  # three chunks each way
    "src/pkg/mod.py": b"def add(a, b):\n    return a + b\n",
    "src/pkg/__init__.py": b"",
    "docs/r\u00e9sum\u00e9 \u2603.txt": "caf\u00e9\n".encode(),
    "deep/a/b/c/d/e/f.txt": b"\x00\x01\xff" * 1000,
}


def test_upload_then_download_round_trips_byte_identical_files_and_records_their_sha256(stack):
    with stack.client() as agent:
        run = stack.start(agent)
        uploaded = agent.upload_files(run, FILES, dest="proj")
        assert sorted((f.path, f.size, f.sha256) for f in uploaded.files) == sorted(
            (f"proj/{p}", len(d), sha(d)) for p, d in FILES.items())

        got = agent.download_files(run, ["proj"])
        assert dict(got) == {f"proj/{p}": d for p, d in FILES.items()} and got.skipped == {}
        one = agent.download_files(run, ["proj/src/pkg/mod.py", "proj/src/pkg/__init__.py"])
        assert dict(one) == {"proj/src/pkg/mod.py": FILES["src/pkg/mod.py"], "proj/src/pkg/__init__.py": b""}

        # A caller-built archive into the workspace itself, replacing one file.
        agent.upload_tar(run, tar_of(("proj/src/pkg/mod.py", b"v2\n")))
        assert agent.download_files(run, ["proj/src/pkg/mod.py"])["proj/src/pkg/mod.py"] == b"v2\n"

    [first, second] = stack.events(run, EventType.FILES_UPLOADED)
    assert first["dest"] == "proj" and first["by"] == "agent-1"
    assert sorted((f["path"], f["size"], f["sha256"]) for f in first["files"]) == sorted(
        (f"proj/{p}", len(d), sha(d)) for p, d in FILES.items())
    assert second == {"dest": "", "by": "agent-1",
                      "files": [{"path": "proj/src/pkg/mod.py", "size": 3, "sha256": sha(b"v2\n")}]}
    downloads = stack.events(run, EventType.FILES_DOWNLOADED)
    assert [d["artifacts"] for d in downloads] == [False, False, False]
    assert sorted((f["path"], f["sha256"]) for f in downloads[0]["files"]) == sorted(
        (f"proj/{p}", sha(d)) for p, d in FILES.items())
    # Every copy was a cold sandbox of the run, the workspace read-write only to copy in.
    helpers = stack.helpers_of(run)
    assert [h.profile.workspace.read_only for h in helpers] == [False, True, True, False, True]
    assert all(h.warm is False and h.profile.workspace.volume == stack.volume(run) for h in helpers)


def test_every_unsafe_archive_of_the_battery_is_refused_naming_the_member_and_nothing_arrives(
        stack, tmp_path, backend):
    area_root = tmp_path / "area"
    area_root.mkdir()
    area = archive_battery.Area(area_root)
    (tmp_path / "host").mkdir()
    host = transfer_battery.Host(tmp_path / "host")
    # case -> (archive, what the refusal must name)
    cases: dict[str, tuple[bytes, str]] = dict(archive_battery.refused_inputs(area))
    for name, data in archive_battery.escaping_archives(area).items():
        cases[f"escaping-{name}"] = (data, "member")
    # The tool-made archives of case 38, made the same way: by a tool in a real sandbox.
    crafted = backend.run(SandboxRequest(
        profile=SandboxProfile(), run_id="files-battery",
        argv=("python3", "-I", "-c", transfer_battery.CRAFTED, str(host.sentinel), str(host.outside), str(host.a))))
    assert crafted.outcome is Outcome.OK, crafted.stderr
    for name, data in json.loads(crafted.stdout).items():
        cases[f"tool-made-{name}"] = (base64.b64decode(data), "member")

    with stack.client() as agent:
        run = stack.start(agent)
        agent.upload_files(run, {"keep.txt": b"the workspace before\n"})
        before = dict(agent.download_files(run, []))
        helpers_before = len(stack.helpers_of(run))
        for name, (data, member) in sorted(cases.items()):
            with pytest.raises(InvalidArgument) as caught:
                agent.upload_tar(run, data, dest="in")
            [violation] = caught.value.violations
            assert violation.field == "tar_chunk", name
            assert member in violation.description and "member" in violation.description, (name, violation)
        # No copy was even started, and the workspace holds exactly what it held.
        assert len(stack.helpers_of(run)) == helpers_before
        after = agent.download_files(run, [])
        assert dict(after) == before and after.skipped == {}
    assert len(stack.events(run, EventType.FILES_UPLOADED)) == 1
    area.assert_untouched()
    host.assert_untouched()


def test_an_upload_over_the_cap_is_refused_as_it_arrives(stack):
    with stack.client() as agent:
        run = stack.start(agent)
        with pytest.raises(ResourceExhausted, match="max_upload_bytes"):
            agent.upload_files(run, {"big.bin": b"x" * CAP})  # the tar is a little more than CAP

        # A client that would send 64 MiB is stopped long before: the server counts as it reads.
        sent = [0]

        def endless():
            yield files_pb2.UploadFilesRequest(run_id=run, dest="", tar_chunk=b"\0" * 65536)
            for _ in range(1024):
                sent[0] += 65536
                yield files_pb2.UploadFilesRequest(tar_chunk=b"\0" * 65536)

        channel = grpc.insecure_channel(stack.server.address)
        try:
            with pytest.raises(grpc.RpcError) as caught:
                files_pb2_grpc.FileServiceStub(channel).UploadFiles(
                    endless(), metadata=(("authorization", f"Bearer {AGENT}"),), timeout=120)
        finally:
            channel.close()
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert sent[0] < 64 * 1024 * 1024, "the whole stream was read before it was refused"
        assert agent.download_files(run, []) == {}
    assert stack.events(run, EventType.FILES_UPLOADED) == []


def test_a_run_without_a_workspace_and_another_tenants_run(stack):
    with stack.client() as agent, stack.client(STRANGER) as stranger:
        plain = stack.start(agent, workspace=False)
        with pytest.raises(FailedPrecondition, match="has no workspace"):
            agent.upload_files(plain, {"a": b"1"})
        with pytest.raises(FailedPrecondition, match="has no workspace"):
            agent.download_files(plain, [])
        run = stack.start(agent)
        agent.upload_files(run, {"secret.txt": b"acme only\n"})
        with pytest.raises(NotFound):
            stranger.upload_files(run, {"planted": b"x"})
        with pytest.raises(NotFound):
            stranger.download_files(run, ["secret.txt"])
        with pytest.raises(InvalidArgument) as caught:
            agent.download_files(run, ["secret.txt", "missing/../../etc"])
        assert [v.field for v in caught.value.violations] == ["paths[1]"]
        with pytest.raises(NotFound, match=r"'nope\.txt'"):
            agent.download_files(run, ["nope.txt"])
        assert dict(agent.download_files(run, [])) == {"secret.txt": b"acme only\n"}
        # The run ends: its workspace is gone, and so are its files.
        agent.finish_run(run)
        assert agent.get_run(run).workspace.removed is True
        with pytest.raises(FailedPrecondition, match="gone"):
            agent.download_files(run, [])


LINKS = r"""
import os
os.makedirs("/workspace/data", exist_ok=True)
open("/workspace/data/real.txt", "w").write("real\n")
os.symlink("/etc/passwd", "/workspace/data/passwd-link")
os.symlink("/etc", "/workspace/etc-dir")
os.symlink("..", "/workspace/data/up")
os.link("/workspace/data/real.txt", "/workspace/data/zz-hard")
"""


def test_links_a_tool_made_in_the_workspace_are_skipped_never_followed(stack, backend):
    with stack.client() as agent:
        run = stack.start(agent)
        # A tool of the run leaves links in the workspace (as any tool with workspace "write" may).
        made = backend.run(SandboxRequest(profile=SandboxProfile(workspace=WorkspaceMount(stack.volume(run))),
                                          argv=("python3", "-I", "-c", LINKS), run_id=f"acme:{run}", warm=False))
        assert made.outcome is Outcome.OK, made.stderr
        got = agent.download_files(run, [])
        # A hardlink can only name a file of the same workspace (its own filesystem): both names
        # are that file. A symlink is never followed, wherever it points.
        assert dict(got) == {"data/real.txt": b"real\n", "data/zz-hard": b"real\n"}
        assert set(got.skipped) == {"data/passwd-link", "etc-dir", "data/up"}
        assert "symlink to '/etc/passwd'" in got.skipped["data/passwd-link"]
        assert "symlink to '/etc'" in got.skipped["etc-dir"]
        # A path THROUGH a link is not resolved either (GNU tar would): skipped, naming the link.
        through = agent.download_files(run, ["etc-dir/passwd", "data/up/data/real.txt"])
        assert dict(through) == {}
        assert "under the link 'etc-dir'" in through.skipped["etc-dir/passwd"]
        assert "under the link 'data/up'" in through.skipped["data/up/data/real.txt"]
        # Nor is an upload's destination.
        with pytest.raises(InvalidArgument) as caught:
            agent.upload_files(run, {"x": b"1"}, dest="etc-dir/sub")
        assert caught.value.violations[0].field == "dest" and "etc-dir" in caught.value.violations[0].description
    [event] = [e for e in stack.events(run, EventType.FILES_DOWNLOADED) if e["files"]]
    assert event["files"] == [{"path": "data/real.txt", "size": 5, "sha256": sha(b"real\n")},
                              {"path": "data/zz-hard", "size": 5, "sha256": sha(b"real\n")}]


def cli(stack: Stack, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_") or k == "RINGFENCE_TEST_SESSION"}
    env.update(RINGFENCE_SERVER=stack.server.address, RINGFENCE_TOKEN=AGENT, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "ringfence.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)


def test_the_cli_puts_and_gets_the_same_bytes_and_refuses_links_locally(stack, tmp_path):
    local = tmp_path / "local"
    (local / "pkg").mkdir(parents=True)
    (local / "pkg" / "mod.py").write_bytes(FILES["src/pkg/mod.py"])
    (local / "pkg" / "blob.bin").write_bytes(FILES["blob.bin"])
    (local / "notes.txt").write_bytes(b"notes\n")
    with stack.client() as agent:
        run = stack.start(agent)
    done = cli(stack, "files", "put", run, "pkg", "notes.txt", "--to", "work/", cwd=local)
    assert done.returncode == 0, done.stderr
    assert f"{sha(FILES['blob.bin'])[:16]}  /workspace/work/pkg/blob.bin" in done.stdout

    out = tmp_path / "out"
    done = cli(stack, "files", "get", run, "work", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (out / "work" / "pkg" / "blob.bin").read_bytes() == FILES["blob.bin"]
    assert (out / "work" / "pkg" / "mod.py").read_bytes() == FILES["src/pkg/mod.py"]
    assert (out / "work" / "notes.txt").read_bytes() == b"notes\n"
    # Nothing is overwritten: the same get again refuses before writing.
    again = cli(stack, "files", "get", run, "work", "--out", str(out), cwd=tmp_path)
    assert again.returncode == 1 and "already exist" in again.stderr

    (local / "pkg" / "evil").symlink_to("/etc/passwd")
    refused = cli(stack, "files", "put", run, "pkg", cwd=local)
    assert refused.returncode == 2 and "symbolic link" in refused.stderr and "/etc/passwd" in refused.stderr
    assert len(stack.events(run, EventType.FILES_UPLOADED)) == 1  # the refused put sent nothing


def _raw_upload(stack: Stack, messages: list[bytes], token: str | None = AGENT) -> grpc.RpcError:
    """UploadFiles with hand-made message bytes (no client-side checks): the error it ends in."""
    channel = grpc.insecure_channel(stack.server.address)
    try:
        upload = channel.stream_unary("/ringfence.v1.FileService/UploadFiles",
                                      request_serializer=lambda b: b, response_deserializer=lambda b: b)
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        with pytest.raises(grpc.RpcError) as caught:
            upload(iter(messages), metadata=metadata, timeout=60)
        return caught.value
    finally:
        channel.close()


def test_the_client_stream_goes_through_the_edges_one_wrapper(stack):
    with stack.client() as agent:
        run = stack.start(agent)
    first = files_pb2.UploadFilesRequest(run_id=run, tar_chunk=tar_of(("a", b"1"))).SerializeToString()
    assert _raw_upload(stack, [first], token=None).code() == grpc.StatusCode.UNAUTHENTICATED
    denied = _raw_upload(stack, [first], token=APPROVER)
    assert denied.code() == grpc.StatusCode.PERMISSION_DENIED and "agent" in denied.details()
    # A message that is not a protobuf at all, first or later: INVALID_ARGUMENT, never INTERNAL.
    assert _raw_upload(stack, [b"\xff\xff\xff"]).code() == grpc.StatusCode.INVALID_ARGUMENT
    later = _raw_upload(stack, [first, b"\x1a\xff"])
    assert later.code() == grpc.StatusCode.INVALID_ARGUMENT and "message 1" in later.details()
    # The run and destination come first, and only first.
    again = files_pb2.UploadFilesRequest(run_id=run, tar_chunk=b"").SerializeToString()
    assert _raw_upload(stack, [first, again]).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _raw_upload(stack, []).code() == grpc.StatusCode.INVALID_ARGUMENT
    bad_dest = files_pb2.UploadFilesRequest(run_id=run, dest="../up", tar_chunk=b"").SerializeToString()
    assert _raw_upload(stack, [bad_dest]).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert stack.events(run, EventType.FILES_UPLOADED) == []


def test_the_async_client_moves_the_same_bytes(stack):
    with stack.client() as agent:
        run = stack.start(agent)

    async def round_trip() -> tuple[object, dict[str, bytes]]:
        async with AsyncClient(stack.server.address, AGENT, timeout=120) as client:
            uploaded = await client.upload_files(run, FILES)
            return uploaded, dict(await client.download_files(run, sorted(FILES)))

    uploaded, got = asyncio.run(round_trip())
    assert sorted(f.path for f in uploaded.files) == sorted(FILES)
    assert got == FILES
