"""ringfence_server.control.files.FileDesk through the real Orchestrator on a real SQLite log, with a FakeBackend
that plays the helper containers against an in-memory workspace.

What the host does is real here: the archive checks (ringfence_server.sandbox.archive), the staging and its
removal, the extraction of what a helper sends back, the sha256 of every file, the events and
the artifact records. What runs in a container (cp, tar) is played by `Workspace` below; the
real helpers, on the real engine and real workspaces, are tests/integration/test_files_api.py.
The FakeBackend's `requests` are the witness of whether anything reached a sandbox.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import posixpath
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from control_support import AGENT, STRANGER, Harness
from module_support import load_module

from ringfence.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from ringfence.model import Principal, Role, RunOutcome, WorkspaceRequest
from ringfence_server.control import files
from ringfence_server.control.files import check_path, path_problem
from ringfence_server.control.registry import Registry, parse_manifest
from ringfence_server.control.state import EventType, sandbox_run_id
from ringfence_server.control.tools import BUILTIN_DIR
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.fake import FakeBackend, FakeWorkspaces
from ringfence_server.sandbox.result import Outcome, SandboxResult

ROOT = Path(__file__).resolve().parents[2]
APPROVER_ACME = Principal("acme", Role.APPROVER, "boss")


def _load_archive_battery():
    """The unsafe-archive builders of the archive battery (cases 38-39, tests/unit/test_archive.py)."""
    return load_module("archive_battery", ROOT / "tests" / "unit" / "test_archive.py")


battery = _load_archive_battery()


def result(outcome: Outcome = Outcome.OK, stdout: bytes = b"", stderr: bytes = b"", exit_code: int | None = 0,
           truncated: bool = False) -> SandboxResult:
    return SandboxResult(outcome=outcome, exit_code=exit_code, stdout=stdout, stderr=stderr,
                         stdout_truncated=truncated, stderr_truncated=False, duration_ms=1, image_id="sha256:fake",
                         runtime="fake", message=str(outcome))


@dataclass
class Workspace:
    """An in-memory workspace and the two helpers played against it (the real ones run cp and GNU
    tar in the tool image; these do what those do to a dict)."""

    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    capacity: int = 1 << 30
    answer: SandboxResult | None = None
    """Set: every helper call answers this instead (a failing engine, a killed call)."""

    def dirs(self) -> set[str]:
        out = set()
        for path in self.files:
            parent = posixpath.dirname(path)
            while parent:
                out.add(parent)
                parent = posixpath.dirname(parent)
        return out

    def __call__(self, request: SandboxRequest) -> SandboxResult:
        if self.answer is not None:
            return self.answer
        script, args = request.argv[4], request.argv[5:]
        if script == files._COPY_IN:
            return self.copy_in(request, args[0])
        assert script == files._COPY_OUT
        return self.copy_out(args)

    def copy_in(self, request: SandboxRequest, dest: str) -> SandboxResult:
        parts = [p for p in dest.split("/") if p]
        for i in range(1, len(parts) + 1):
            if "/".join(parts[:i]) in self.links:
                line = "rf-under-link " + json.dumps([[dest, "/".join(parts[:i])]]) + "\n"
                return result(Outcome.TOOL_ERROR, stderr=line.encode(), exit_code=3)
        [mount] = request.profile.inputs
        staged = Path(mount.host_path)
        incoming = {}
        for root, _dirs, names in os.walk(staged):
            for name in names:
                rel = str(Path(root, name).relative_to(staged))
                incoming[posixpath.join(dest, rel) if dest else rel] = Path(root, name).read_bytes()
        if sum(map(len, self.files.values())) + sum(map(len, incoming.values())) > self.capacity:
            return result(Outcome.TOOL_ERROR, exit_code=1,
                          stderr=b"cp: error writing '/workspace/x': No space left on device\n")
        self.files.update(incoming)
        return result()

    def copy_out(self, paths: tuple[str, ...]) -> SandboxResult:
        buf = io.BytesIO()
        errors = []
        under = []
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in paths:
                parts = path.split("/")
                link = next((
                    "/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in self.links), None)
                if link is not None:
                    under.append([path, link])
                    continue
                chosen = [p for p in sorted(self.files) if path == "." or p == path or p.startswith(path + "/")]
                linked = [p for p in sorted(self.links) if path == "." or p == path or p.startswith(path + "/")]
                if not chosen and not linked and path not in self.dirs():
                    errors.append(f"tar: {path}: Cannot stat: No such file or directory")
                for p in chosen:
                    info = tarfile.TarInfo(p)
                    info.size = len(self.files[p])
                    tar.addfile(info, io.BytesIO(self.files[p]))
                for p in linked:
                    info = tarfile.TarInfo(p)
                    info.type = tarfile.SYMTYPE
                    info.linkname = self.links[p]
                    tar.addfile(info)
        stderr = ("rf-under-link " + json.dumps(under) + "\n" if under else "")
        if errors:
            stderr += "\n".join(errors) + "\ntar: Exiting with failure status due to previous errors\n"
            return result(Outcome.TOOL_ERROR, buf.getvalue(), stderr.encode(), exit_code=2)
        return result(stdout=buf.getvalue(), stderr=stderr.encode())


class Desk:
    """The Harness's Orchestrator with workspaces (FakeWorkspaces) and helper calls answered by a
    Workspace; tool calls still go to the Harness's tool emulator."""

    def __init__(self, tmp_path: Path, **files_config: int) -> None:
        self.h = Harness(tmp_path)
        self.h.orch.close()
        if files_config:
            from dataclasses import replace

            self.h.config = replace(self.h.config, files=replace(self.h.config.files, **files_config))
        self.ws = Workspace()
        self.h.backend = FakeBackend(lambda r: self.ws(r) if r.argv else self.h.emulator(r))
        self.workspaces = FakeWorkspaces()
        builtin = Registry.from_dir(BUILTIN_DIR)
        # Every name is the registry's own, so every get finds its manifest.
        manifests = [m for n in builtin.names if (m := builtin.get(n)) is not None]
        registry = Registry([*manifests, parse_manifest(WRITER)])
        self.h.registry = registry
        self.h.orch = self.h.new_orchestrator(workspaces=self.workspaces)
        self.orch = self.h.orch

    def run(self, run_id: str = "r1", workspace: bool = True) -> str:
        return self.orch.start_run(AGENT, "files", run_id,
                                   workspace=WorkspaceRequest() if workspace else None).run_id

    def helpers(self) -> list[SandboxRequest]:
        return [r for r in self.h.backend.requests if r.argv]

    def events(self, run_id: str, type_: EventType) -> list[dict]:
        return [dict(e.data) for e in self.h.store.read(run_id) if e.type == type_]


WRITER = {
    "name": "report_writer", "description": "writes reports", "schema": {"type": "object"},
    "mutates": False, "reversible": True, "workspace": "write",
    "outputs": ["reports/summary.txt", "reports/plots", "reports/absent.txt"],
}


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


@pytest.fixture
def desk(tmp_path, monkeypatch) -> Iterator[Desk]:
    # Every staged tree goes under a directory of the test's own, checked empty afterwards.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    d = Desk(tmp_path)
    yield d
    d.orch.close()
    assert list(scratch.iterdir()) == [], "a staged temp dir was left behind"


BINARY = bytes(range(256)) * 300


# --- upload ----------------------------------------------------------------------------------------


def test_upload_stages_copies_in_and_records_every_file_with_its_sha256(desk):
    run = desk.run()
    archive = tar_of(("a.txt", b"alpha\n"), ("bin/blob", BINARY), ("empty", b""))
    uploaded, seq = desk.orch.upload_files(AGENT, run, "in", archive)

    assert [(f.path, f.size, f.sha256) for f in uploaded] == [
        ("in/a.txt", 6, sha(b"alpha\n")), ("in/bin/blob", len(BINARY), sha(BINARY)), ("in/empty", 0, sha(b""))]
    assert desk.ws.files == {"in/a.txt": b"alpha\n", "in/bin/blob": BINARY, "in/empty": b""}
    [event] = desk.events(run, EventType.FILES_UPLOADED)
    assert event == {"dest": "in", "by": AGENT.subject, "files": [
        {"path": "in/a.txt", "size": 6, "sha256": sha(b"alpha\n")},
        {"path": "in/bin/blob", "size": len(BINARY), "sha256": sha(BINARY)},
        {"path": "in/empty", "size": 0, "sha256": sha(b"")}]}
    assert desk.h.store.read(run)[-1].seq == seq

    # The copy ran as one of the run's sandboxes: killed with the run, cold, the workspace
    # read-write, the staged tree read-only at /input, in the tool image.
    [helper] = desk.helpers()
    state = desk.orch.runs.get("acme", run)
    assert helper.run_id == sandbox_run_id(state)
    assert helper.warm is False
    assert helper.profile.image == "tool"
    assert helper.profile.workspace.volume == state.live_volume and helper.profile.workspace.read_only is False
    assert [m.container_path for m in helper.profile.inputs] == ["/input"]
    assert helper.argv[:4] == ("python3", "-I", "-S", "-c") and helper.argv[5:] == ("in",)


@pytest.mark.parametrize("case", battery.REFUSED_INPUTS)
def test_every_unsafe_archive_of_the_battery_is_refused_before_any_sandbox_runs(desk, tmp_path, case):
    run = desk.run()
    (tmp_path / case).mkdir()
    area = battery.Area(tmp_path / case)
    data, member = battery.refused_inputs(area)[case]
    with pytest.raises(InvalidArgument) as caught:
        desk.orch.upload_files(AGENT, run, "", data)
    [violation] = caught.value.violations
    assert violation.field == "tar_chunk" and member in violation.description
    assert desk.helpers() == [] and desk.ws.files == {}
    assert desk.events(run, EventType.FILES_UPLOADED) == []
    area.assert_untouched()


@pytest.mark.parametrize("case", battery.ESCAPING)
def test_every_escaping_archive_of_the_battery_is_refused(desk, tmp_path, case):
    run = desk.run()
    (tmp_path / case).mkdir()
    area = battery.Area(tmp_path / case)
    with pytest.raises(InvalidArgument, match="nothing was copied"):
        desk.orch.upload_files(AGENT, run, "", battery.escaping_archives(area)[case])
    assert desk.helpers() == [] and not battery.escaped(area)
    area.assert_untouched()


def test_upload_caps_bad_destinations_and_helper_failures(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    d = Desk(tmp_path / "d", max_upload_bytes=64 * 1024, max_files=3)
    run = d.run()
    with pytest.raises(ResourceExhausted, match="max_upload_bytes"):
        d.orch.upload_files(AGENT, run, "", tar_of(("big", b"x" * 70_000)))
    with pytest.raises(InvalidArgument) as caught:
        d.orch.upload_files(AGENT, run, "", tar_of(*[(f"f{i}", b"") for i in range(4)]))
    assert "more than 3 members" in caught.value.violations[0].description
    for dest in ("/abs", "a/../b", "a//b", "a/", ".", "x\0y", "d" * 1025):
        with pytest.raises(InvalidArgument) as caught:
            d.orch.upload_files(AGENT, run, dest, tar_of(("a", b"1")))
        assert [v.field for v in caught.value.violations] == ["dest"]
    assert d.helpers() == []

    # What the helper reports: a dest under a link is the caller's (dest), a full workspace a cap.
    d.ws.links["linked"] = "/etc"
    with pytest.raises(InvalidArgument) as caught:
        d.orch.upload_files(AGENT, run, "linked/sub", tar_of(("a", b"1")))
    assert caught.value.violations[0].field == "dest" and "'linked'" in caught.value.violations[0].description
    d.ws.capacity = 10
    with pytest.raises(ResourceExhausted, match="workspace is full"):
        d.orch.upload_files(AGENT, run, "", tar_of(("a", b"x" * 11)))
    d.ws.answer = result(Outcome.START_FAILED, exit_code=None)
    with pytest.raises(Unavailable):
        d.orch.upload_files(AGENT, run, "", tar_of(("a", b"1")))
    d.ws.answer = result(Outcome.KILLED, exit_code=None)
    with pytest.raises(FailedPrecondition, match="cancelled or reached its deadline"):
        d.orch.upload_files(AGENT, run, "", tar_of(("a", b"1")))
    assert d.events(run, EventType.FILES_UPLOADED) == []
    assert [p for p in tmp_path.iterdir() if p.name.startswith("rf-files-")] == []
    d.orch.close()


def test_a_run_without_a_live_workspace_and_another_tenants_run(desk):
    plain = desk.run("plain", workspace=False)
    with pytest.raises(FailedPrecondition, match="has no workspace"):
        desk.orch.upload_files(AGENT, plain, "", tar_of(("a", b"1")))
    with pytest.raises(FailedPrecondition, match="has no workspace"):
        desk.orch.download_files(AGENT, plain, [], False)
    run = desk.run()
    with pytest.raises(NotFound):
        desk.orch.upload_files(STRANGER, run, "", tar_of(("a", b"1")))
    with pytest.raises(NotFound):
        desk.orch.download_files(STRANGER, run, [], False)
    desk.orch.finish_run(AGENT, run)
    with pytest.raises(FailedPrecondition, match="gone"):
        desk.orch.download_files(AGENT, run, ["a"], False)
    assert desk.helpers() == []


# --- download --------------------------------------------------------------------------------------


def test_download_delivers_files_with_sha256_and_links_as_skipped(desk):
    run = desk.run()
    desk.ws.files.update({"src/m.py": b"print(1)\n", "src/deep/x.bin": BINARY, "empty": b""})
    desk.ws.links.update({"src/shadow": "/etc/shadow", "up": ".."})
    got = desk.orch.download_files(AGENT, run, ["src", "empty", "up/etc/passwd"], False)

    by_path = {f.path: f for f in got}
    assert {p: (f.data, f.size, f.sha256) for p, f in by_path.items() if f.data is not None} == {
        "empty": (b"", 0, sha(b"")), "src/deep/x.bin": (BINARY, len(BINARY), sha(BINARY)),
        "src/m.py": (b"print(1)\n", 9, sha(b"print(1)\n"))}
    assert by_path["src/shadow"].data is None and "symlink to '/etc/shadow'" in by_path["src/shadow"].skipped
    assert by_path["up/etc/passwd"].data is None and "under the link 'up'" in by_path["up/etc/passwd"].skipped
    [event] = desk.events(run, EventType.FILES_DOWNLOADED)
    assert event == {"artifacts": False, "by": AGENT.subject, "files": [
        {"path": "empty", "size": 0, "sha256": sha(b"")},
        {"path": "src/deep/x.bin", "size": len(BINARY), "sha256": sha(BINARY)},
        {"path": "src/m.py", "size": 9, "sha256": sha(b"print(1)\n")}]}
    [helper] = desk.helpers()
    assert helper.profile.workspace.read_only is True and helper.profile.inputs == () and helper.warm is False


def test_download_of_everything_missing_paths_and_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    d = Desk(tmp_path / "d", max_download_bytes=1024, max_files=4)
    run = d.run()
    d.ws.files.update({"a": b"1", "b/c": b"2"})
    assert {f.path: f.data for f in d.orch.download_files(AGENT, run, [], False)} == {"a": b"1", "b/c": b"2"}
    assert d.helpers()[-1].argv[5:] == (".",)
    # A path inside another one asked for is sent once (tar is not asked for it twice).
    assert {f.path for f in d.orch.download_files(AGENT, run, ["b/c", "b", "b/c"], False)} == {"b/c"}
    assert d.helpers()[-1].argv[5:] == ("b",)
    with pytest.raises(NotFound, match="'nope'"):
        d.orch.download_files(AGENT, run, ["a", "nope"], False)
    with pytest.raises(InvalidArgument) as caught:
        d.orch.download_files(AGENT, run, ["a", "../etc", "/etc/passwd", "a/./b"], False)
    assert [v.field for v in caught.value.violations] == ["paths[1]", "paths[2]", "paths[3]"]
    with pytest.raises(InvalidArgument, match="too many paths"):
        d.orch.download_files(AGENT, run, ["a", "b", "c", "d", "e"], False)
    d.ws.files["big"] = b"x" * 2000
    with pytest.raises(ResourceExhausted, match="max_download_bytes"):
        d.orch.download_files(AGENT, run, ["big"], False)
    # The helper's own stdout cap (the tar over its slack) is the same refusal.
    d.ws.answer = result(Outcome.OUTPUT_LIMIT, stdout=b"\0" * 10, exit_code=None, truncated=True)
    with pytest.raises(ResourceExhausted, match="max_download_bytes"):
        d.orch.download_files(AGENT, run, ["a"], False)
    # A fifo in the workspace refuses the archive whole: the workspace's, not the caller's fault.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("pipe")
        info.type = tarfile.FIFOTYPE
        tar.addfile(info)
    d.ws.answer = result(stdout=buf.getvalue())
    with pytest.raises(FailedPrecondition, match="'pipe'"):
        d.orch.download_files(AGENT, run, ["pipe"], False)
    assert len(d.events(run, EventType.FILES_DOWNLOADED)) == 2  # only the downloads that succeeded
    assert [p for p in tmp_path.iterdir() if p.name.startswith("rf-files-")] == []
    d.orch.close()


# --- outputs and artifacts -----------------------------------------------------------------------------


def test_outputs_become_artifacts_in_the_records_and_outlive_the_workspace(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    d = Desk(tmp_path / "d", max_artifact_bytes=100)
    run = d.run()
    d.ws.files.update({"reports/summary.txt": b"all good\n", "reports/plots/a.png": BINARY[:50],
                       "reports/plots/huge.bin": b"x" * 101})
    d.ws.links["reports/plots/l"] = "/etc/passwd"
    state = d.orch.runs.get("acme", run)
    manifest = d.orch.registry.get("report_writer")
    with d.orch.runs.writing(state):
        d.orch.files.collect_outputs(state, "c1", manifest)

    [event] = d.events(run, EventType.ARTIFACT_COLLECTED)
    assert event == {"call_id": "c1", "files": [
        {"path": "reports/plots/a.png", "size": 50, "sha256": sha(BINARY[:50]), "revision": 1},
        {"path": "reports/summary.txt", "size": 9, "sha256": sha(b"all good\n"), "revision": 1}],
        "missing": ["reports/absent.txt", "reports/plots/huge.bin", "reports/plots/l"]}
    [record] = d.h.store.read_records("acme", files.ARTIFACT_KIND, f"{state.key}:reports/summary.txt")
    assert record.body["sha256"] == sha(b"all good\n") and base64.b64decode(record.body["data_b64"]) == b"all good\n"
    assert record.body["call_id"] == "c1"

    # A second collection is a new revision; the run's artifacts point at the latest.
    d.ws.files["reports/summary.txt"] = b"better\n"
    with d.orch.runs.writing(state):
        d.orch.files.collect_outputs(state, "c2", manifest)
    assert state.artifacts["reports/summary.txt"]["revision"] == 2

    got = d.orch.download_files(AGENT, run, ["reports/summary.txt"], True)
    assert [(f.path, f.data, f.sha256) for f in got] == [("reports/summary.txt", b"better\n", sha(b"better\n"))]
    assert {f.path for f in d.orch.download_files(AGENT, run, ["reports/plots"], True)} == {"reports/plots/a.png"}
    assert [e["artifacts"] for e in d.events(run, EventType.FILES_DOWNLOADED)] == [True, True]
    with pytest.raises(NotFound, match="no artifact 'reports/nope'"):
        d.orch.download_files(AGENT, run, ["reports/nope"], True)

    # The run ends, its workspace goes; its artifacts stay, and reading them appends nothing.
    d.orch.finish_run(AGENT, run)
    assert d.workspaces.workspaces == {}
    events_before = len(d.h.store.read(run))
    got = d.orch.download_files(AGENT, run, [], True)
    assert {f.path: f.data for f in got} == {"reports/plots/a.png": BINARY[:50], "reports/summary.txt": b"better\n"}
    assert len(d.h.store.read(run)) == events_before
    assert d.h.store.read(run)[-1].type == EventType.RUN_FINISHED
    d.orch.close()


def test_outputs_of_a_failing_copy_out_are_missing_never_an_error(desk):
    run = desk.run()
    desk.ws.files["reports/summary.txt"] = b"x"
    desk.ws.answer = result(Outcome.START_FAILED, exit_code=None)
    state = desk.orch.runs.get("acme", run)
    with desk.orch.runs.writing(state):
        desk.orch.files.collect_outputs(state, "c1", desk.orch.registry.get("report_writer"))
    [event] = desk.events(run, EventType.ARTIFACT_COLLECTED)
    assert event == {"call_id": "c1", "files": [],
                     "missing": ["reports/absent.txt", "reports/plots", "reports/summary.txt"]}


def test_a_tampered_artifact_is_a_server_fault_not_delivered(desk):
    run = desk.run()
    desk.ws.files["reports/summary.txt"] = b"original"
    state = desk.orch.runs.get("acme", run)
    with desk.orch.runs.writing(state):
        desk.orch.files.collect_outputs(state, "c1", desk.orch.registry.get("report_writer"))
    # Someone with the database writes another revision behind the log's back.
    desk.h.store.append_record("acme", files.ARTIFACT_KIND, f"{state.key}:reports/summary.txt",
                               {"path": "reports/summary.txt", "size": 8, "sha256": sha(b"original"),
                                "call_id": "c1", "data_b64": base64.b64encode(b"tampered").decode()}, "x")
    state.artifacts["reports/summary.txt"]["revision"] = 2
    with pytest.raises(RuntimeError, match="does not match its sha256"):
        desk.orch.files.download_artifacts(state, [], "someone")


# --- paths ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path, ok", [
    ("a", True), ("a/b.txt", True), ("é/ü", True), ("", False), (".", False), ("./a", False), ("a/", False),
    ("a//b", False), ("/a", False), ("..", False), ("a/../b", False), ("a/..", False), ("a\0b", False),
    ("x" * 1024, True), ("x" * 1025, False),
])
def test_path_rules(path, ok):
    assert (path_problem(path) is None) is ok
    if not ok:
        with pytest.raises(InvalidArgument) as caught:
            check_path(path, "paths[0]")
        assert caught.value.violations[0].field == "paths[0]"
    assert path_problem("", allow_root=True) is None


def test_an_approver_may_not_move_files(desk):
    run = desk.run()
    from ringfence.errors import PermissionDenied

    with pytest.raises(PermissionDenied):
        desk.orch.upload_files(APPROVER_ACME, run, "", tar_of(("a", b"1")))


def test_finished_run_outcome_is_not_touched_by_an_artifact_download(desk):
    run = desk.run()
    desk.orch.cancel_run(AGENT, run)
    assert desk.orch.get_run(AGENT, run).outcome is RunOutcome.CANCELLED
    assert desk.orch.download_files(AGENT, run, [], True) == []


def test_the_helper_scripts_are_python_the_tool_image_can_run():
    """They run as `python3 -I -S -c SCRIPT` in the tool image (their behaviour on real
    workspaces: tests/integration/test_files_api.py); here, that they compile at all."""
    for script in (files._COPY_IN, files._COPY_OUT):
        compile(script, "<helper>", "exec")
        assert "import site" not in script  # -S: nothing beyond the stdlib's builtins modules
