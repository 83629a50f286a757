"""The control loop's side of a run's workspace (FakeBackend, FakeWorkspaces, a real SQLite log):
made at StartRun within the configured caps, removed whatever ends the run, reaped when its run
is gone; workspace tools refused without one (never reaching the sandbox), mounted with one,
ordered like writes; their outputs collected after success; and the new events replay.

The workspaces themselves (tmpfs, caps, keeper, no escape) are proven on the real engine in
tests/integration and tests/escape; this is the control flow around them.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import pytest
from control_support import AGENT, STRANGER, Call, Harness, content_result, error_result

from ringfence.errors import ConfigError, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from ringfence.model import ObservationStatus as S
from ringfence.model import RunOutcome, WorkspaceRequest, WorkspaceView
from ringfence_server.control.config import FilesConfig, WorkspaceConfig, load_config
from ringfence_server.control.events import (
    ArtifactCollected,
    ArtifactFile,
    CallOutput,
    FileEntry,
    FilesDownloaded,
    FilesUploaded,
    WorkspaceCreated,
    check_event,
)
from ringfence_server.control.registry import Registry, load_manifest_file, parse_manifest
from ringfence_server.control.state import RunState, fold
from ringfence_server.control.store.base import StoreUnavailable
from ringfence_server.control.tools import BUILTIN_DIR, manifest_files
from ringfence_server.sandbox.profile import MiB, WorkspaceMount
from ringfence_server.sandbox.workspace import WorkspaceSpec, volume_name

RULES = [{"tool": t, "verdict": "allow"} for t in ("echo", "fail", "ws_read", "ws_write", "ws_note")] + [
    {"tool": "credit", "verdict": "ask", "when": {"amount": {"lte": 100}}}]
OUTPUT = "reports/out.txt"


def _tool(name: str, workspace: str, outputs: list[str] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": name, "description": f"{name}: a workspace tool of the tests",
        "schema": {"type": "object", "properties": {"text": {"type": "string"}}, "additionalProperties": False},
        "mutates": False, "reversible": True, "workspace": workspace}
    if outputs:
        doc["outputs"] = outputs
    return doc


def registry() -> Registry:
    builtin = [load_manifest_file(p) for p in manifest_files(BUILTIN_DIR)]
    ours = [parse_manifest(_tool("ws_read", "read")), parse_manifest(_tool("ws_write", "write", [OUTPUT])),
            parse_manifest(_tool("ws_note", "write"))]
    return Registry([m for m in builtin if m.name not in {"ws_read", "ws_write", "ws_note"}] + ours)


class RecordingDesk:
    """Stands in for ringfence_server.control.files.FileDesk (its real work needs the engine): records what the
    control loop asks of it and appends the events the real desk would."""

    def __init__(self, h: Harness, fail: BaseException | None = None) -> None:
        self.repo = h.orch.runs
        self.fail = fail
        self.collected: list[tuple[str, str, str | None]] = []
        self.uploads: list[tuple[str, str]] = []

    def collect_outputs(self, state: RunState, call_id: str, manifest: Any) -> None:
        self.collected.append((call_id, manifest.name, state.live_volume))
        if self.fail is not None:
            raise self.fail
        self.repo.append(state, ArtifactCollected(
            call_id=call_id, missing=(),
            files=tuple(ArtifactFile(path=p, size=3, sha256="ab" * 32, revision=len(self.collected))
                        for p in manifest.outputs)))

    def upload(self, state: RunState, dest: str, tar_bytes: bytes, by: str) -> tuple[list[Any], int]:
        self.uploads.append((state.run_id, dest))
        event = self.repo.append(state, FilesUploaded(
            dest=dest, by=by, files=(FileEntry(path=f"{dest}/a.py", size=1, sha256="cd" * 32),)))
        return [], event.seq

    def download(self, state: RunState, paths: list[str], by: str) -> list[Any]:
        self.repo.append(state, FilesDownloaded(
            files=tuple(FileEntry(path=p, size=1, sha256="ef" * 32) for p in paths), artifacts=False, by=by))
        return []

    def download_artifacts(self, state: RunState, paths: list[str], by: str) -> list[Any]:
        self.repo.append(state, FilesDownloaded(
            files=tuple(FileEntry(path=p, size=3, sha256="ab" * 32) for p in paths), artifacts=True, by=by))
        return []


def answering_as(tool: str) -> Callable[[Call], dict[str, object]]:
    """An emulated tool that answers with its name and the arguments it was called with."""
    return lambda call: {"tool": tool, **call.arguments}


def harness(tmp_path, **kwargs: Any) -> Harness:
    h = Harness(tmp_path, rules=RULES, registry=registry(), **kwargs)
    for name in ("ws_read", "ws_write", "ws_note"):
        h.emulator.overrides[name] = answering_as(name)
    return h


def use_desk(h: Harness, desk: RecordingDesk) -> RecordingDesk:
    h.orch.files = desk  # type: ignore[assignment]  # the stand-in, for upload/download
    h.orch.dispatcher.files = desk  # type: ignore[assignment]  # and for collecting outputs
    return desk


def ws_run(h: Harness, run_id: str = "r1", **caps: int) -> str:
    return h.run("ws", run_id, workspace=WorkspaceRequest(**caps))


# --------------------------------------------------------------------------- made at StartRun


def test_a_run_asking_for_a_workspace_gets_one_made_and_recorded(tmp_path):
    h = harness(tmp_path)
    view = h.orch.start_run(AGENT, "ws", "r1", workspace=WorkspaceRequest())
    events = h.events("r1")
    assert [e.type for e in events] == ["run_started", "workspace_created"]
    assert events[0].data["workspace"] == {"bytes": 64 * MiB, "inodes": 4096}  # the ask, as resolved
    assert events[1].data == {"volume": volume_name("r1"), "bytes": 64 * MiB, "inodes": 4096}
    assert h.workspaces.workspaces == {"r1": ("acme", volume_name("r1"), WorkspaceSpec(64 * MiB, 4096))}
    assert view.workspace == WorkspaceView(bytes=64 * MiB, inodes=4096, removed=False)


def test_explicit_caps_are_kept_and_a_run_without_an_ask_has_no_workspace(tmp_path):
    h = harness(tmp_path)
    ws_run(h, "r1", bytes=8 * MiB, inodes=100)
    assert h.events("r1")[1].data == {"volume": volume_name("r1"), "bytes": 8 * MiB, "inodes": 100}
    plain = h.orch.start_run(AGENT, "plain", "r2")
    assert plain.workspace is None and h.event_types("r2") == ["run_started"]
    assert h.events("r2")[0].data["workspace"] is None
    assert h.workspaces.created == ["r1"]


def test_start_run_sent_again_keeps_the_same_workspace(tmp_path):
    h = harness(tmp_path)
    first = h.orch.start_run(AGENT, "ws", "r1", workspace=WorkspaceRequest(bytes=8 * MiB))
    again = h.orch.start_run(AGENT, "ws", "r1", workspace=WorkspaceRequest(bytes=16 * MiB))
    assert first == again and again.workspace == WorkspaceView(8 * MiB, 4096, False)
    assert h.event_types("r1") == ["run_started", "workspace_created"]
    assert h.workspaces.created == ["r1"]


@pytest.mark.parametrize("caps,field", [
    ({"bytes": 512 * MiB + 1}, "workspace.bytes"),
    ({"inodes": 65537}, "workspace.inodes"),
    ({"bytes": -1}, "workspace.bytes"),
    ({"bytes": 1024}, "workspace.bytes"),  # under the sandbox's minimum
    ({"inodes": 2}, "workspace.inodes"),
])
def test_caps_past_the_configured_maximum_are_refused_naming_the_field(tmp_path, caps, field):
    h = harness(tmp_path)
    with pytest.raises(InvalidArgument) as e:
        ws_run(h, "r1", **caps)
    assert [v.field for v in e.value.violations] == [field]
    with pytest.raises(NotFound):
        h.orch.get_run(AGENT, "r1")  # no run was started
    assert h.workspaces.created == []


def test_the_maximums_come_from_the_config(tmp_path):
    h = harness(tmp_path)
    h.config = dataclasses.replace(h.config, workspace=WorkspaceConfig(
        default_bytes=1 * MiB, default_inodes=64, max_bytes=2 * MiB, max_inodes=128))
    h.restart()
    with pytest.raises(InvalidArgument) as e:
        ws_run(h, "r1", bytes=3 * MiB, inodes=129)
    assert sorted(v.field for v in e.value.violations) == ["workspace.bytes", "workspace.inodes"]
    assert h.orch.start_run(AGENT, "ws", "r2", workspace=WorkspaceRequest()).workspace == WorkspaceView(1 * MiB, 64)


def test_a_server_without_a_workspace_store_refuses_the_ask(tmp_path):
    h = harness(tmp_path)
    h.restart(workspaces=None)
    with pytest.raises(FailedPrecondition):
        ws_run(h, "r1")
    with pytest.raises(NotFound):
        h.orch.get_run(AGENT, "r1")
    assert h.orch.start_run(AGENT, "plain", "r2").workspace is None  # runs without one are fine


def test_the_engine_failing_at_start_is_unavailable_and_start_run_again_makes_it(tmp_path):
    h = harness(tmp_path)
    h.workspaces.unhealthy = "engine down"
    with pytest.raises(Unavailable):
        ws_run(h, "r1")
    assert h.event_types("r1") == ["run_started"]  # the run exists; its ask is recorded
    h.workspaces.unhealthy = None
    view = h.orch.start_run(AGENT, "ws", "r1")  # sent again (the ask comes from run_started)
    assert h.event_types("r1") == ["run_started", "workspace_created"]
    assert view.workspace == WorkspaceView(64 * MiB, 4096, False)


# --------------------------------------------------------------------------- removed at the end


def _end_by(h: Harness, run: str, how: str) -> RunOutcome:
    if how == "finish":
        h.orch.finish_run(AGENT, run)
        return RunOutcome.COMPLETED
    if how == "cancel":
        h.orch.cancel_run(AGENT, run)
        return RunOutcome.CANCELLED
    if how == "deadline":
        h.clock.advance(h.config.limits.run_deadline_s + 1)
        h.submit(run, ("echo", {"text": "late"}))
        return RunOutcome.DEADLINE_EXCEEDED
    if how == "loop":
        h.submit(run, *[("echo", {"text": "again"})] * 3)
        return RunOutcome.LOOP_DETECTED
    assert how == "failure"

    def bug(call: Any) -> Any:
        raise RuntimeError("a bug in dispatch")

    h.emulator.overrides["echo"] = bug
    h.submit(run, ("echo", {"text": "x"}))
    return RunOutcome.ERROR


@pytest.mark.parametrize("how", ["finish", "cancel", "deadline", "loop", "failure"])
def test_whatever_ends_the_run_removes_its_workspace_just_before_run_finished(tmp_path, how):
    h = harness(tmp_path)
    run = ws_run(h)
    outcome = _end_by(h, run, how)
    events = h.events(run)
    assert [e.type for e in events[-2:]] == ["workspace_removed", "run_finished"]
    assert events[-2].data == {"volume": volume_name(run), "reason": outcome.value}
    assert events[-1].data["outcome"] == outcome.value
    assert [e.type for e in events].count("workspace_removed") == 1
    assert h.workspaces.removed == [run] and h.workspaces.workspaces == {}
    assert h.orch.get_run(AGENT, run).workspace == WorkspaceView(64 * MiB, 4096, removed=True)


def test_a_run_without_a_workspace_ends_without_touching_the_store(tmp_path):
    h = harness(tmp_path)
    run = h.run("plain", "r1")
    h.workspaces.unhealthy = "would fail if asked"
    h.orch.finish_run(AGENT, run)
    assert h.event_types(run) == ["run_started", "run_finished"]


def test_the_engine_failing_at_the_end_still_ends_the_run_and_the_reaper_removes_it(tmp_path):
    h = harness(tmp_path)
    run = ws_run(h)
    h.workspaces.unhealthy = "engine down"
    h.orch.finish_run(AGENT, run)
    assert h.event_types(run) == ["run_started", "workspace_created", "run_finished"]
    # Nothing may follow run_finished; the fold counts a finished run's workspace as removed.
    assert h.orch.get_run(AGENT, run).workspace == WorkspaceView(64 * MiB, 4096, removed=True)
    h.workspaces.unhealthy = None
    assert h.orch.reap_workspaces() == 1
    assert h.workspaces.removed == [run]
    assert h.event_types(run) == ["run_started", "workspace_created", "run_finished"]


# --------------------------------------------------------------------------- reaping


def test_reap_keeps_live_runs_and_removes_ended_and_unknown_ones(tmp_path):
    h = harness(tmp_path)
    live = ws_run(h, "live")
    ended = ws_run(h, "ended")
    h.workspaces.unhealthy = "engine down"
    h.orch.finish_run(AGENT, ended)  # its workspace stays behind
    h.workspaces.unhealthy = None
    h.workspaces.create("never-logged", "acme", WorkspaceSpec())  # a crash before run_started
    h.workspaces.create("live", "globex", WorkspaceSpec())  # idempotent create: stays acme's
    before = {k: len(h.events(k)) for k in ("live", "ended")}
    assert h.orch.reap_workspaces() == 2
    assert set(h.workspaces.workspaces) == {live}
    assert sorted(h.workspaces.removed) == ["ended", "never-logged"]
    assert {k: len(h.events(k)) for k in ("live", "ended")} == before  # nothing appended
    assert h.orch.reap_workspaces() == 0


def test_reap_removes_a_workspace_whose_run_belongs_to_another_tenant(tmp_path):
    h = harness(tmp_path)
    ws_run(h, "r1")
    # A workspace labelled for another tenant than its run's: not that run's, so it goes.
    h.workspaces.workspaces["r1"] = ("globex", volume_name("r1"), WorkspaceSpec())
    assert h.orch.reap_workspaces() == 1


def test_start_up_reaps_what_a_crash_left(tmp_path):
    h = harness(tmp_path)
    live = ws_run(h, "live")
    h.workspaces.create("orphan", "acme", WorkspaceSpec())
    h.restart()
    assert set(h.workspaces.workspaces) == {live}


def test_start_up_survives_an_engine_that_is_down(tmp_path):
    h = harness(tmp_path)
    ws_run(h, "live")
    h.workspaces.unhealthy = "engine down"
    h.restart()  # logged; the next sweep retries
    assert h.orch.get_run(AGENT, "live").workspace == WorkspaceView(64 * MiB, 4096, False)


# --------------------------------------------------------------------------- dispatch


def test_a_workspace_tool_in_a_run_without_one_is_refused_and_never_reaches_the_sandbox(tmp_path):
    h = harness(tmp_path)
    run = h.run("plain", "r1")
    obs = h.submit(run, ("ws_read", {}), ("ws_write", {"text": "x"}), ("echo", {"text": "ok"}))
    assert [o.status for o in obs] == [S.DENIED, S.DENIED, S.EXECUTED]
    for o in obs[:2]:
        assert o.error_class == "no_workspace" and not o.executed
        assert o.verdict_path[-1] == "workspace:none"
    assert h.emulator.tools() == ["echo"]
    assert [r.call_id for r in h.backend.requests] == [f"{obs[2].call_id}.a1"]
    decided = [e.data for e in h.events(run) if e.type == "call_decided"]
    assert [d["verdict"] for d in decided] == ["deny", "deny", "allow"]


def test_a_workspace_tool_gets_the_mount_and_may_be_pooled(tmp_path):
    """The mount is part of the container's shape, so a warm container of that shape was made
    for this run's workspace alone (ringfence_server.sandbox.pool; the real engine:
    tests/integration/test_pool_docker.py)."""
    h = harness(tmp_path)
    run = ws_run(h)
    h.submit(run, ("ws_read", {}), ("ws_note", {"text": "x"}), ("echo", {"text": "y"}))
    by_tool = {c.tool: c.request for c in h.emulator.log}
    volume = volume_name(run)
    assert by_tool["ws_read"].profile.workspace == WorkspaceMount(volume, read_only=True)
    assert by_tool["ws_note"].profile.workspace == WorkspaceMount(volume, read_only=False)
    assert by_tool["echo"].profile.workspace is None
    assert by_tool["ws_read"].warm and by_tool["ws_note"].warm and by_tool["echo"].warm
    paths = {o.tool: o.verdict_path for o in h.orch.get_run(AGENT, run).trajectory}
    assert "workspace:read" in paths["ws_read"] and "workspace:write" in paths["ws_note"]


def test_a_workspace_write_runs_alone_after_every_read_of_its_batch(tmp_path):
    h = harness(tmp_path)
    run = ws_run(h)
    journal: list[tuple[str, str]] = []
    lock = threading.Lock()
    reads_inside = threading.Barrier(3)  # the three reads run at once: they wait for each other

    def traced(name: str, parallel: bool) -> Any:
        def handler(call: Any) -> Any:
            with lock:
                journal.append(("start", f"{name}:{call.arguments.get('text')}"))
            if parallel:
                reads_inside.wait(timeout=30)
            with lock:
                journal.append(("end", f"{name}:{call.arguments.get('text')}"))
            return {"ok": name}
        return handler

    h.emulator.overrides.update({"ws_note": traced("ws_note", False), "ws_read": traced("ws_read", True),
                                 "echo": traced("echo", True)})
    obs = h.submit(run, ("ws_note", {"text": "w1"}), ("echo", {"text": "r1"}), ("ws_read", {"text": "r2"}),
                   ("ws_note", {"text": "w2"}), ("echo", {"text": "r3"}))
    assert all(o.status is S.EXECUTED for o in obs)
    # The writes come last, in batch order, each alone: nothing else runs between its start and end.
    assert journal[-4:] == [("start", "ws_note:w1"), ("end", "ws_note:w1"),
                            ("start", "ws_note:w2"), ("end", "ws_note:w2")]
    assert {x for _, x in journal[:6]} == {"echo:r1", "ws_read:r2", "echo:r3"}
    assert not h.orch.registry.get("ws_note").mutates  # ordered like a write; not a mutation:
    started = [e.data for e in h.events(run) if e.type == "dispatch_started" and e.data["tool"] == "ws_note"]
    assert [d["idempotency_key"] for d in started] == [None, None]  # no idempotency key


def test_outputs_are_collected_after_each_successful_call_only(tmp_path):
    h = harness(tmp_path)
    run = ws_run(h)
    desk = use_desk(h, RecordingDesk(h))
    ok = h.submit(run, ("ws_write", {"text": "one"}))[0]
    h.emulator.overrides["ws_write"] = lambda call: error_result("fatal", "it broke")
    failed = h.submit(run, ("ws_write", {"text": "two"}))[0]
    h.submit(run, ("ws_note", {"text": "no outputs declared"}))
    assert ok.status is S.EXECUTED and ok.content == {"tool": "ws_write", "text": "one"}
    assert failed.error_class == "fatal"
    assert desk.collected == [(ok.call_id, "ws_write", volume_name(run))]
    types = [e.type for e in h.events(run)]
    completed = [i for i, t in enumerate(types) if t == "call_completed"]
    assert types[completed[0] + 1] == "artifact_collected"  # after the completion, before its observation
    assert types.count("artifact_collected") == 1
    assert h.orch.runs.get("acme", run).artifacts == {
        OUTPUT: {"size": 3, "sha256": "ab" * 32, "revision": 1, "call_id": ok.call_id}}


@pytest.mark.parametrize("error", [FailedPrecondition("the workspace is gone"), Unavailable("engine down")])
def test_a_file_desk_refusal_never_turns_a_successful_call_into_a_failure(tmp_path, error):
    h = harness(tmp_path)
    run = ws_run(h)
    use_desk(h, RecordingDesk(h, fail=error))
    obs = h.submit(run, ("ws_write", {"text": "one"}))[0]
    assert obs.status is S.EXECUTED and obs.error is None
    collected = [e.data for e in h.events(run) if e.type == "artifact_collected"]
    assert collected == [{"call_id": obs.call_id, "files": [], "missing": [OUTPUT]}]
    assert not h.orch.get_run(AGENT, run).outcome


@pytest.mark.parametrize("error", [KeyError("volume"), StoreUnavailable("the store is down")])
def test_a_bug_or_a_store_failure_in_the_file_desk_is_not_swallowed(tmp_path, error):
    h = harness(tmp_path)
    run = ws_run(h)
    use_desk(h, RecordingDesk(h, fail=error))
    obs = h.submit(run, ("ws_write", {"text": "one"}))[0]
    assert obs.status is S.HALTED and obs.error_class == "error"
    assert h.orch.get_run(AGENT, run).outcome is RunOutcome.ERROR
    assert "artifact_collected" not in h.event_types(run)


# --------------------------------------------------------------------------- files at the facade


def test_files_need_the_runs_live_workspace_and_its_tenant(tmp_path):
    h = harness(tmp_path)
    desk = use_desk(h, RecordingDesk(h))
    plain = h.run("plain", "plain")
    with pytest.raises(FailedPrecondition, match="has no workspace"):
        h.orch.upload_files(AGENT, plain, "src", b"")
    with pytest.raises(FailedPrecondition, match="has no workspace"):
        h.orch.download_files(AGENT, plain, [], False)
    run = ws_run(h)
    with pytest.raises(NotFound):
        h.orch.upload_files(STRANGER, run, "src", b"")
    _files, seq = h.orch.upload_files(AGENT, run, "src", b"")
    assert desk.uploads == [(run, "src")] and h.events(run)[seq - 1].type == "files_uploaded"
    h.orch.finish_run(AGENT, run)
    with pytest.raises(FailedPrecondition, match="is gone"):
        h.orch.download_files(AGENT, run, ["src/a.py"], False)


# --------------------------------------------------------------------------- replay


def test_replay_of_a_run_with_every_new_event_type_gives_the_same_state(tmp_path):
    h = harness(tmp_path)
    live: dict[int, dict] = {}
    h.orch.on_event = lambda state, event: live.__setitem__(event.seq, state.snapshot()) \
        if event.run_id == "replayed" else None
    use_desk(h, RecordingDesk(h))
    h.emulator.overrides["ws_note"] = lambda call: content_result({"noted": True})
    # echo prints a line of its own before its result: live output (the result line is not).
    h.emulator.overrides["echo"] = lambda call: dataclasses.replace(content_result({"echo": "hello"}),
                                                                    stderr=b"echoing\n")
    run = ws_run(h, "replayed")
    h.orch.upload_files(AGENT, run, "src", b"")
    h.submit(run, ("ws_write", {"text": "one"}), ("echo", {"text": "hello"}))
    h.submit(run, ("ws_write", {"text": "two"}))
    h.orch.download_files(AGENT, run, ["src/a.py"], False)
    h.orch.finish_run(AGENT, run)

    events = h.events(run)
    types = {e.type for e in events}
    assert {"workspace_created", "workspace_removed", "call_output", "files_uploaded", "files_downloaded",
            "artifact_collected"} <= types
    assert sorted(live) == [e.seq for e in events]
    for k in range(1, len(events) + 1):
        assert fold(events[:k]).snapshot() == live[k], f"prefix {k} ({events[k - 1].type}) differs"
    final = fold(events)
    assert final.workspace == {"volume": volume_name(run), "bytes": 64 * MiB, "inodes": 4096, "removed": True}
    assert final.artifacts[OUTPUT]["revision"] == 2  # the latest collection of the path
    h.restart()
    assert h.orch.get_run(AGENT, run) == final.view()


def test_the_fold_refuses_malformed_workspace_events_before_they_are_written(tmp_path):
    h = harness(tmp_path)
    run = ws_run(h)
    state = h.orch.runs.get("acme", run)
    # Values the types admit and the fold does not: refused by the append, never written.
    bad = [
        WorkspaceCreated(volume="", bytes=1, inodes=1),
        WorkspaceCreated(volume="v", bytes=True, inodes=1),
        CallOutput(call_id="c", attempt=1, stream="stdin", seq=1, text="", bytes=0, redacted=False),
    ]
    for payload in bad:
        with pytest.raises(ValueError):
            h.orch.runs.append(state, payload)
    assert h.event_types(run) == ["run_started", "workspace_created"]
    # Shapes the types cannot even hold: refused when read (a log from elsewhere).
    for type_, data in [("artifact_collected", {"call_id": "c", "files": [{"path": "x"}], "missing": []}),
                        ("workspace_removed", {"volume": "v"})]:
        with pytest.raises(ValueError):
            check_event(type_, data)


def test_a_run_keeps_its_workspace_across_a_restart(tmp_path):
    h = harness(tmp_path)
    run = ws_run(h)
    h.restart()
    h.submit(run, ("ws_read", {}))
    assert h.emulator.log[-1].request.profile.workspace == WorkspaceMount(volume_name(run), read_only=True)
    assert set(h.workspaces.workspaces) == {run}


# --------------------------------------------------------------------------- manifests and config


def test_a_manifest_declares_its_workspace_and_outputs():
    read = parse_manifest(_tool("a", "read"))
    write = parse_manifest(_tool("b", "write", ["reports/x.txt", "out.json"]))
    plain = parse_manifest({**_tool("c", "read"), "workspace": None})
    assert (read.workspace, read.outputs, read.serial) == ("read", (), False)
    assert (write.workspace, write.outputs, write.serial) == ("write", ("reports/x.txt", "out.json"), True)
    assert (plain.workspace, plain.serial) == (None, False)
    assert parse_manifest({**_tool("d", "read"), "mutates": True}).serial  # a mutation is serial anyway


@pytest.mark.parametrize("changes,key", [
    ({"workspace": "rw"}, "workspace"),
    ({"workspace": True}, "workspace"),
    ({"workspace": None, "outputs": ["a.txt"]}, "outputs"),
    ({"outputs": "a.txt"}, "outputs"),
    ({"outputs": [f"f{i}" for i in range(17)]}, "outputs"),
    ({"outputs": ["a.txt", "a.txt"]}, "outputs"),
    ({"outputs": ["/etc/passwd"]}, "outputs[0]"),
    ({"outputs": ["ok", "a/../../b"]}, "outputs[1]"),
    ({"outputs": ["a//b"]}, "outputs[0]"),
    ({"outputs": ["a/./b"]}, "outputs[0]"),
    ({"outputs": ["."]}, "outputs[0]"),
    ({"outputs": [""]}, "outputs[0]"),
    ({"outputs": ["a\0b"]}, "outputs[0]"),
    ({"outputs": [3]}, "outputs[0]"),
    ({"outputs": ["x" * 1025]}, "outputs[0]"),
])
def test_a_bad_workspace_declaration_is_refused_naming_the_field(changes, key):
    with pytest.raises(ConfigError) as e:
        parse_manifest({**_tool("t", "write"), **changes}, source="t.json")
    assert e.value.key == f"t.json:{key}"


def test_the_workspace_and_files_config_defaults():
    c = load_config()
    assert c.workspace == WorkspaceConfig(default_bytes=64 * MiB, default_inodes=4096, max_bytes=512 * MiB,
                                          max_inodes=65536, reap_interval_s=60.0)
    assert c.files == FilesConfig(max_upload_bytes=16 * MiB, max_download_bytes=16 * MiB,
                                  max_artifact_bytes=4 * MiB, max_files=1000)
    assert c.workspace == WorkspaceConfig() and c.files == FilesConfig()  # the file and the code agree


@pytest.mark.parametrize("overrides,key", [
    ({"workspace": {"default_bytes": 600 * MiB}}, "workspace.default_bytes"),  # over max_bytes
    ({"workspace": {"max_bytes": 8192 * MiB}}, "workspace.max_bytes"),  # over what the sandbox allows
    ({"workspace": {"max_inodes": 8}}, "workspace.max_inodes"),
    ({"workspace": {"default_inodes": "many"}}, "workspace.default_inodes"),
    ({"workspace": {"reap_interval_s": 0}}, "workspace.reap_interval_s"),
    ({"workspace": {"size": 1}}, "workspace.size"),
    ({"files": {"max_artifact_bytes": 32 * MiB}}, "files.max_artifact_bytes"),  # over max_download_bytes
    ({"files": {"max_upload_bytes": 0}}, "files.max_upload_bytes"),
    ({"files": {"max_files": True}}, "files.max_files"),
    ({"files": {"max_dirs": 3}}, "files.max_dirs"),
])
def test_a_bad_workspace_or_files_value_names_its_key(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=overrides)
    assert e.value.key == key


def test_a_default_over_a_lowered_maximum_is_refused_and_says_which():
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"workspace": {"max_bytes": 32 * MiB}})
    assert e.value.key == "workspace.default_bytes" and "workspace.max_bytes" in str(e.value)
    c = load_config(overrides={"workspace": {"max_bytes": 32 * MiB, "default_bytes": 32 * MiB}})
    assert c.workspace.default_bytes == c.workspace.max_bytes == 32 * MiB
