"""Files in and out of a run's workspace, and the artifacts its tools declare.

Files move only through sandboxed helper calls and `ringfence_server.sandbox.archive`; the host never opens a
path inside a workspace, and the helper containers are as hardened as any tool call (the tool
image, no network, read-only root, no capabilities), killed with the run when it is cancelled.

    upload     the client's tar, received whole (capped at the edge) -> `stage_archive` on the
               host (every unsafe member, a name that is not UTF-8 too, refuses the whole
               archive: InvalidArgument naming it, and nothing has reached the workspace) -> a
               helper call with the staged tree read-only at /input and the workspace
               read-write checks the whole plan against the workspace, copies the tree into a
               staging directory inside the workspace, then renames it into place: all or
               nothing (see `_COPY_IN`).
    download   a helper call with the workspace READ-ONLY runs GNU tar over the paths (stdout
               capped at files.max_download_bytes plus the tar's own overhead) -> the tar goes
               through `extract_output` into a fresh temp dir on the host (links recorded, never
               created or followed) -> the files are read from there, each with its sha256. A
               link in the workspace is delivered as `skipped`, never followed, and so is a
               file whose name is not UTF-8 (a tool can make one; a proto string cannot carry
               it), its path shown escaped.
    outputs    the download path for a tool's declared outputs after a successful call; each
               file becomes an artifact (the store's `records`, kind "artifact", key
               "{run key}:{path}", body with the bytes in base64), outliving the workspace.

A helper never resolves a path through a link the workspace holds: before GNU tar runs or
anything is written, it lstat's every ancestor of the paths (for an upload: of `dest` and of every
member's place) and leaves out what lies under a link; a download reports such a path as
`skipped`, an upload is refused whole (InvalidArgument naming `dest` or the member).

The helper calls run as the run's sandboxes (label `tenant:run_id`), so a cancel or the run's
deadline kills a copy in flight; they are always cold (`warm=False`: a warm container's mounts
are fixed before the call). Inside a helper, a link planted by a tool can only lead to the
helper's own filesystem (read-only root, its private /tmp) or back into the workspace: the
container is the boundary, as it is for the tool that planted it.

Every path a client gives is relative to /workspace, normalized, without `..` or NUL, at most
1024 bytes (`path_problem`); a refusal is InvalidArgument naming the field. Staged temp dirs are
removed afterwards, whatever happened.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ringfence.errors import (
    ControlError,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from ringfence.model import Event
from ringfence.workspace_paths import MAX_PATH_BYTES, path_problem
from ringfence_server.control.config import Config
from ringfence_server.control.events import (
    ArtifactCollected,
    ArtifactFile,
    EventPayload,
    FileEntry,
    FilesDownloaded,
    FilesUploaded,
)
from ringfence_server.control.registry import ToolManifest
from ringfence_server.control.state import RunState, sandbox_run_id
from ringfence_server.control.store.base import EventStore
from ringfence_server.sandbox.archive import ArchiveLimits, Tree, escaped_name, extract_output, stage_archive
from ringfence_server.sandbox.backend import SandboxBackend, SandboxRequest
from ringfence_server.sandbox.errors import ArchiveError, SandboxError
from ringfence_server.sandbox.profile import InputMount, KiB, MiB, SandboxProfile, WorkspaceMount
from ringfence_server.sandbox.result import Outcome, SandboxResult

log = logging.getLogger(__name__)

__all__ = [
    "ARTIFACT_KIND",
    "MAX_PATH_BYTES",
    "DownloadedFile",
    "FileDesk",
    "FileInfo",
    "RunLog",
    "check_path",
    "path_problem",
]

ARTIFACT_KIND = "artifact"
"""The store's record kind for artifacts (key: f"{run key}:{path}")."""

HELPER_TIMEOUT_S = 120.0
"""Wall clock of one copy in or out: a 16 MiB copy takes well under a second; this only bounds
a wedged engine."""
HELPER_MEMORY = 128 * MiB
HELPER_PIDS = 16  # python3, then GNU tar for a download: a handful of processes
_STDERR_LIMIT = 64 * KiB
_TAR_RECORD = 512
# The helpers' reports: one stderr line each, a marker then JSON.
_UNDER_LINK = "rf-under-link "  # [[path, the link it lies under], ...]
_NOT_A_DIR = "rf-not-a-directory "  # [dest, why]
_REFUSED_MEMBER = "rf-refused-member "  # [member, why]: its place in the workspace is not for it
_NOT_WRITABLE = "rf-not-writable "  # [a workspace directory the upload would write in, or pass]
_NOT_STAGED = "rf-not-staged "  # [why, whether the workspace is full]
_PARTLY_APPLIED = "rf-partly-applied "  # [moved, planned, why]; stdout: {"applied": [paths]}

# The helpers run in the tool image (`python3 -I -S -c SCRIPT ARGS`). GNU tar archives a link it
# is given as a link, but resolves the *components* of a path it is given ("a/x" with a -> /etc
# reads the helper's /etc/x); a copy into a path does the same. So each helper first lstat's
# every ancestor of the paths and leaves out (download) or refuses (upload) what lies under a
# link. Nothing else writes the workspace meanwhile: the caller holds the run's lock, and no
# process outlives a call.
#
# An upload is all or nothing: the helper checks its whole plan against the workspace first
# (dest and every member's place: no link on the way, no directory where a file goes or the
# reverse, every directory it writes in writable), then copies the staged tree into a fresh
# directory INSIDE the workspace (the same tmpfs: a byte or inode cap is met there, before
# anything is in place), then renames each new top-level entry into place (atomic per entry: a
# new directory moves whole) and removes the staging directory. A refusal or a full workspace
# leaves the workspace as it was. A rename cannot fail after those checks short of an engine or
# kernel fault; if one does, what moved already is reported and recorded, never hidden.
_COPY_IN = r"""
import errno, json, os, shutil, stat, sys
dest = sys.argv[1]
WS, SRC = "/workspace", "/input"


def report(marker, payload, code=3):
    sys.stderr.write(marker + json.dumps(payload) + "\n")
    sys.stderr.flush()
    sys.exit(code)


def join(a, b):
    return a + "/" + b if a else b


def at(rel):
    return join(WS, rel) if rel else WS


def kind(path):
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except PermissionError:  # a directory on the way that a tool made unsearchable
        report("rf-not-writable ", [os.path.dirname(path)[len(WS) + 1:]])
    return "link" if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode) else "file"


def first_file(rel):
    path = join(SRC, rel)
    if not os.path.isdir(path):
        return rel
    names = sorted(os.listdir(path))
    return first_file(join(rel, names[0])) if names else rel


# 1. dest: every existing component a directory, never a link; the missing ones are staged too.
parts = [p for p in dest.split("/") if p]
base = []
for part in parts:
    k = kind(at("/".join(base + [part])))
    if k is None:
        break
    if k == "link":
        report("rf-under-link ", [[dest, "/".join(base + [part])]])
    if k != "dir":
        report("rf-not-a-directory ", [dest, "'%s' is not a directory" % "/".join(base + [part])])
    base.append(part)
rest = parts[len(base):]
base = "/".join(base)

# 2. The plan, checked whole before anything is written: (staged path, workspace path) moves,
# a new directory moved whole, an existing one entered, a file replacing a file (or a link: the
# rename replaces the link itself). Every lstat goes through directories only.
moves, parents = [], {"", base}


def plan(rel):
    for name in sorted(os.listdir(join(SRC, rel))):
        r = join(rel, name)
        target = join(dest, r)
        k = kind(at(target))
        if os.path.isdir(join(SRC, r)):
            if k == "dir":
                parents.add(target)
                plan(r)
                continue
            if k == "link":
                report("rf-refused-member ", [first_file(r), "'%s' is a link in the workspace: links are never "
                                              "followed" % target])
            if k == "file":
                report("rf-refused-member ", [first_file(r), "'%s' is a file in the workspace, not a directory"
                                              % target])
        elif k == "dir":
            report("rf-refused-member ", [r, "'%s' is a directory in the workspace" % target])
        moves.append((r, target))


if rest:
    moves.append((rest[0], join(base, rest[0])))
else:
    plan("")
for parent in sorted(parents):
    if not os.access(at(parent), os.W_OK | os.X_OK):
        report("rf-not-writable ", [parent])

# 3. Stage: a fresh directory in the workspace (the same filesystem, so the same byte and inode
# caps, and a rename moves an entry into place atomically).
stage = ".ringfence-upload-" + os.urandom(8).hex()
staged_root = join(at(stage), "/".join(rest)) if rest else at(stage)


def copy_tree(src, dst):
    for name in sorted(os.listdir(src)):
        s, d = join(src, name), join(dst, name)
        if stat.S_ISDIR(os.lstat(s).st_mode):
            os.mkdir(d, 0o755)
            os.chmod(d, 0o755)
            copy_tree(s, d)
        else:
            fd = os.open(d, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with open(fd, "wb") as out, open(s, "rb") as data:
                os.fchmod(fd, 0o644)
                shutil.copyfileobj(data, out, 1 << 20)


def discard():
    if kind(at(stage)) == "dir":
        shutil.rmtree(at(stage), ignore_errors=True)


try:
    os.mkdir(at(stage), 0o700)
    made = at(stage)
    for part in rest:
        made = join(made, part)
        os.mkdir(made, 0o755)
    copy_tree(SRC, staged_root)
except OSError as e:
    discard()
    full = e.errno in (errno.ENOSPC, errno.EDQUOT)
    report("rf-not-staged ", [os.strerror(e.errno) if e.errno else str(e), full], code=1)

# 4. Move into place; what moved before a failure is reported (stdout), never hidden.
applied = []
try:
    for staged, target in moves:
        os.rename(join(at(stage), staged), at(target))
        applied.append(target)
except OSError as e:
    sys.stdout.buffer.write(json.dumps({"applied": applied}, ensure_ascii=False).encode())
    sys.stdout.flush()
    discard()
    report("rf-partly-applied ", [len(applied), len(moves), str(e)], code=4)
discard()
"""
_COPY_OUT = r"""
import json, os, sys
ok, under = [], []
for path in sys.argv[1:]:
    parts = path.split("/")
    link = next(("/".join(parts[:i]) for i in range(1, len(parts))
                 if os.path.islink("/workspace/" + "/".join(parts[:i]))), None)
    (under.append([path, link]) if link else ok.append(path))
if under:
    sys.stderr.write("rf-under-link " + json.dumps(under) + "\n")
sys.stderr.flush()
tar = ["tar", "-C", "/workspace", "--format=pax", "--mode=a-st", "--sort=name", "--hard-dereference",
       "--one-file-system", "-cf", "-"]
os.execvp("tar", tar + (["--", *ok] if ok else ["-T", "/dev/null"]))
"""
# GNU tar's messages when a requested path is absent, and its summary line after them: the
# only failures a download (or an output collection) reports per path instead of failing.
_MISSING_LINE = re.compile(r"^tar: .*: Cannot stat: No such file or directory$")
_SUMMARY_LINE = re.compile(r"^tar: Exiting with failure status due to previous errors$")
_NO_SPACE = ("No space left on device", "Disk quota exceeded")


@dataclass(frozen=True)
class FileInfo:
    path: str
    """Relative to /workspace."""
    size: int
    sha256: str


@dataclass(frozen=True)
class DownloadedFile:
    path: str
    data: bytes | None
    """None for an entry that was not delivered (see `skipped`)."""
    size: int = 0
    sha256: str = ""
    skipped: str = ""
    """Why it was not delivered (a link: recorded, never followed), or ""."""


class RunLog(Protocol):
    """What the desk needs of the run repository (ringfence_server.control.orchestration.runs.RunRepository):
    the durable append of a run's events, and the store its artifacts go to. A protocol, so
    that this module does not depend on the orchestration (tests/unit/test_architecture.py)."""

    store: EventStore

    def append(self, state: RunState, payload: EventPayload, keys: Sequence[str] = ()) -> Event: ...


# --- paths -----------------------------------------------------------------------------------


def check_path(value: str, field: str, *, allow_root: bool = False) -> str:
    """`value` when it is a usable workspace path; else InvalidArgument naming `field`."""
    problem = path_problem(value, allow_root=allow_root)
    if problem is not None:
        raise InvalidArgument(f"{field} is not a usable workspace path", [FieldViolation(field, problem)])
    return value


def _check_paths(paths: Sequence[str], max_files: int) -> list[str]:
    if len(paths) > max_files:
        raise InvalidArgument("too many paths", [FieldViolation("paths", f"{len(paths)} paths; at most {max_files}")])
    violations = [FieldViolation(f"paths[{i}]", problem) for i, p in enumerate(paths)
                  if (problem := path_problem(p)) is not None]
    if violations:
        raise InvalidArgument("a path is not a usable workspace path", violations)
    return list(dict.fromkeys(paths))  # a path asked twice is delivered once


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_staged(root: Path, rel: str) -> bytes:
    """A file of a tree this process just wrote (never a workspace path), without following a
    link even so: O_NOFOLLOW, and it must be a regular file."""
    fd = os.open(root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RuntimeError(f"staged entry {rel!r} is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def _joined(dest: str, rel: str) -> str:
    return posixpath.join(dest, rel) if dest else rel


def _tar_slack(members: int) -> int:
    """The bytes a tar adds around its files' data: per member a header, padding up to the next
    512-byte block and a long-name (PAX) record with its own header; then the end-of-archive
    blocks and GNU tar's padding of the last 10 KiB record."""
    return members * 4 * _TAR_RECORD + 20 * _TAR_RECORD


# --- the desk --------------------------------------------------------------------------------


class FileDesk:
    def __init__(self, *, repo: RunLog, backend: SandboxBackend, config: Config) -> None:
        self.repo = repo
        self.backend = backend
        self.config = config

    # -- the operations ------------------------------------------------------------------

    def upload(self, state: RunState, dest: str, tar_bytes: bytes, by: str) -> tuple[list[FileInfo], int]:
        """Check, stage and copy `tar_bytes` into the run's workspace under `dest`; append
        `files_uploaded`; return the files and that event's seq. The caller holds the run's lock
        and has checked that the run has a live workspace."""
        check_path(dest, "dest", allow_root=True)
        volume = self._volume(state)
        cap = self.config.files.max_upload_bytes
        if len(tar_bytes) > cap:
            raise ResourceExhausted(f"the archive is {len(tar_bytes)} bytes, over files.max_upload_bytes ({cap})")
        limits = ArchiveLimits(max_members=self.config.files.max_files, max_total_bytes=cap,
                               max_archive_bytes=cap, max_path_bytes=MAX_PATH_BYTES)
        with _scratch("up") as scratch:
            try:
                tree = stage_archive(tar_bytes, scratch / "in", limits=limits)
            except ArchiveError as e:
                raise InvalidArgument("the archive is refused; nothing was copied into the workspace",
                                      [FieldViolation("tar_chunk", str(e))]) from e
            files = [FileInfo(_joined(dest, f.path), f.size, _sha256(_read_staged(tree.root, f.path)))
                     for f in tree.files]
            # `dest` is an argument of the script, never spliced into it. stdout carries the
            # report of a move that stopped part way: at most every path of the tree, as JSON.
            paths_bytes = sum(len(_joined(dest, p).encode()) + 4 for p in (*tree.file_paths(), *tree.directories))
            argv = ("python3", "-I", "-S", "-c", _COPY_IN, dest)
            result = self._helper(state, volume, argv, read_only=False,
                                  inputs=(InputMount(str(tree.root), "/input"),),
                                  stdout_limit=_STDERR_LIMIT + 2 * paths_bytes)
            if not result.ok:
                self._record_partial(state, result, dest, files, by)
                _raise_for_dest(result, dest)
                _raise_for_members(result)
                raise _failure(result, "copy the files into the workspace")
        event = self.repo.append(state, FilesUploaded(dest=dest, files=tuple(_entry(f) for f in files), by=by))
        return files, event.seq

    def download(self, state: RunState, paths: Sequence[str], by: str) -> list[DownloadedFile]:
        """The workspace's files under `paths` (links skipped, never followed); appends
        `files_downloaded`."""
        wanted = _check_paths(paths, self.config.files.max_files)
        volume = self._volume(state)
        with _scratch("down") as scratch:
            tree, missing, under_link = self._copy_out(state, volume, wanted, scratch,
                                                       self.config.files.max_download_bytes)
            if missing:
                raise NotFound(f"not in the workspace of run {state.run_id}: {', '.join(map(repr, missing))}")
            out = _delivered(tree, under_link)
        self.repo.append(state, FilesDownloaded(files=tuple(_entry(f) for f in out if f.data is not None),
                                                artifacts=False, by=by))
        return out

    def download_artifacts(self, state: RunState, paths: Sequence[str], by: str) -> list[DownloadedFile]:
        """The run's artifacts (all of them when `paths` is empty); appends `files_downloaded`."""
        wanted = _check_paths(paths, self.config.files.max_files)
        known: Mapping[str, Mapping[str, Any]] = state.artifacts
        if wanted:
            # A path names an artifact, or a directory its artifacts were collected under.
            chosen = [a for a in sorted(known) if any(a == p or a.startswith(p + "/") for p in wanted)]
            unknown = [p for p in wanted if not any(a == p or a.startswith(p + "/") for a in known)]
            if unknown:
                raise NotFound(f"run {state.run_id} has no artifact {', '.join(map(repr, unknown))}")
        else:
            chosen = sorted(known)
        total = sum(int(known[a]["size"]) for a in chosen)
        cap = self.config.files.max_download_bytes
        if total > cap:
            raise ResourceExhausted(f"the artifacts asked for are {total} bytes, over files.max_download_bytes "
                                    f"({cap}); ask for fewer paths")
        out = []
        for path in chosen:
            meta = known[path]
            records = self.repo.store.read_records(state.tenant, ARTIFACT_KIND, f"{state.key}:{path}")
            record = next((r for r in records if r.revision == meta["revision"]), None)
            if record is None:
                # The log says it was written: a store that lost it is a fault, not the caller's.
                raise RuntimeError(f"artifact {path!r} revision {meta['revision']} of run {state.run_id} "
                                   "is not in the store")
            data = base64.b64decode(record.body["data_b64"], validate=True)
            digest = _sha256(data)
            if digest != meta["sha256"] or digest != record.body.get("sha256"):
                raise RuntimeError(f"artifact {path!r} of run {state.run_id} does not match its sha256")
            out.append(DownloadedFile(path, data, len(data), digest))
        entries = tuple(_entry(f) for f in out)
        if state.finished:
            # A finished run's log is closed (nothing is appended after run_finished): the
            # download of what outlived it is recorded in the server's log instead.
            log.info("run %s (finished): %d artifact(s) downloaded by %s: %s", state.run_id, len(out), by,
                     json.dumps([dataclasses.asdict(e) for e in entries], separators=(",", ":")))
        else:
            self.repo.append(state, FilesDownloaded(files=entries, artifacts=True, by=by))
        return out

    def collect_outputs(self, state: RunState, call_id: str, manifest: ToolManifest) -> None:
        """After a successful call of a tool with declared outputs: copy them out of the
        workspace into the run's artifacts and append `artifact_collected`.

        Never raises for what the tool left (a missing output, a link, a file over
        files.max_artifact_bytes, a workspace it cannot be read from): the call succeeded, and
        what could not be collected is listed in `missing`. A store failure does raise."""
        outputs = list(dict.fromkeys(manifest.outputs))
        if not outputs:
            return
        collected: list[ArtifactFile] = []
        missing: list[str] = [p for p in outputs if path_problem(p) is not None]
        readable = [p for p in outputs if p not in missing]
        volume = state.live_volume
        if volume is None or not readable:
            missing.extend(readable)
        else:
            cap = self.config.files.max_artifact_bytes
            try:
                with _scratch("out") as scratch:
                    tree, absent, under_link = self._copy_out(state, volume, readable, scratch,
                                                              self.config.files.max_download_bytes)
                    missing.extend(absent)
                    missing.extend(under_link)  # never followed
                    missing.extend(escaped_name(link.path) for link in tree.links)  # never followed
                    for f in tree.files:
                        if not _is_text(f.path):
                            log.warning("run %s call %s: output %s: %s", state.run_id, call_id,
                                        escaped_name(f.path), _NOT_TEXT)
                            missing.append(escaped_name(f.path))
                            continue
                        if f.size > cap:
                            log.warning("run %s call %s: output %s is %d bytes, over files.max_artifact_bytes (%d)",
                                        state.run_id, call_id, f.path, f.size, cap)
                            missing.append(f.path)
                            continue
                        data = _read_staged(tree.root, f.path)
                        digest = _sha256(data)
                        record = self.repo.store.append_record(
                            state.tenant, ARTIFACT_KIND, f"{state.key}:{f.path}",
                            {"path": f.path, "size": len(data), "sha256": digest, "call_id": call_id,
                             "data_b64": base64.b64encode(data).decode("ascii")},
                            written_by=f"call:{call_id}")
                        collected.append(ArtifactFile(path=f.path, size=len(data), sha256=digest,
                                                      revision=record.revision))
            except (ControlError, SandboxError) as e:
                # The copy-out failed as a whole (the workspace's content, or the engine): the
                # outputs not recorded yet are missing; the call's own result stands.
                log.warning("run %s call %s: outputs not collected: %s", state.run_id, call_id, e)
                done = {c.path for c in collected}
                missing.extend(p for p in readable if p not in done)
        self.repo.append(state, ArtifactCollected(
            call_id=call_id, files=tuple(collected),
            missing=tuple(sorted(set(missing) - {c.path for c in collected}))))

    # -- helpers ---------------------------------------------------------------------------

    def _record_partial(self, state: RunState, result: SandboxResult, dest: str, files: Sequence[FileInfo],
                        by: str) -> None:
        """When the copy-in helper stopped part way through moving the files into place: append
        `files_uploaded` with the files that did arrive (and `incomplete`, why), then raise.
        Otherwise nothing."""
        report = _report(result.stderr, _PARTLY_APPLIED)
        if report is None:
            return
        moved, planned, why = report
        try:
            applied = [str(p) for p in json.loads(result.stdout)["applied"]]
        except (ValueError, KeyError, TypeError):
            applied = None  # the report was lost (cut): say so rather than guess
        arrived = [f for f in files if applied is not None
                   and any(f.path == p or f.path.startswith(p + "/") for p in applied)]
        incomplete = (f"the copy stopped after {moved} of {planned} moves into place: {why}" if applied is not None
                      else f"the copy stopped after {moved} of {planned} moves into place ({why}); which files "
                           "arrived is not known")
        event = self.repo.append(state, FilesUploaded(dest=dest, files=tuple(_entry(f) for f in arrived), by=by,
                                                      incomplete=incomplete))
        raise FailedPrecondition(f"could not copy the files into the workspace: {incomplete}; "
                                 f"files_uploaded (seq {event.seq}) lists the {len(arrived)} file(s) that arrived")

    @staticmethod
    def _volume(state: RunState) -> str:
        if state.workspace is None:
            raise FailedPrecondition(f"run {state.run_id} has no workspace")
        volume = state.live_volume
        if volume is None or state.finished:
            raise FailedPrecondition(f"the workspace of run {state.run_id} is gone (the run ended); "
                                     "its artifacts stay: download them with artifacts set")
        return volume

    def _helper(self, state: RunState, volume: str, argv: tuple[str, ...], *, read_only: bool,
                inputs: tuple[InputMount, ...] = (), stdout_limit: int) -> SandboxResult:
        """One copy in or out, as a sandbox of the run (killed with it), never warm."""
        files = self.config.files
        profile = SandboxProfile(
            image="tool", workspace=WorkspaceMount(volume, read_only=read_only), inputs=inputs,
            memory_bytes=HELPER_MEMORY, pids=HELPER_PIDS, timeout_s=HELPER_TIMEOUT_S,
            stdout_limit=stdout_limit, stderr_limit=_STDERR_LIMIT,
            # cp writes each file whole into the workspace: the largest an upload may hold.
            fsize_bytes=min(max(files.max_upload_bytes, 16 * MiB), 1024 * MiB),
        )
        request = SandboxRequest(profile=profile, argv=argv, run_id=sandbox_run_id(state),
                                 call_id=f"files-{uuid.uuid4().hex[:16]}", warm=False)
        return self.backend.run(request)

    def _copy_out(self, state: RunState, volume: str, paths: Sequence[str], scratch: Path,
                  max_bytes: int) -> tuple[Tree, list[str], dict[str, str]]:
        """The workspace's `paths` (all of it when empty) as a tree under `scratch`, the paths
        that do not exist, and those under a link (path -> the link). Links are in
        `tree.links`, never created, never followed."""
        # A path under another one asked for is in that one's tree already (tar would write it
        # twice, and a duplicate member refuses the whole archive).
        members = [p for p in paths if not any(p.startswith(q + "/") for q in paths)] or ["."]
        max_members = self.config.files.max_files + 1  # the "." of a whole-workspace tar
        stdout_limit = min(max_bytes + _tar_slack(max_members), 64 * MiB)
        # tar --mode=a-st: a tool may chmod u+s its own file (the workspace is nosuid, but the
        # bit is stored); it means nothing in a download, where every file is written 0644. The
        # archive is still checked whole by extract_output. --hard-dereference: each name of a
        # hardlinked file comes as the file itself, whichever name tar meets first; a hardlink
        # in a workspace can only name a file of that workspace (its own tmpfs: link(2) across
        # filesystems fails with EXDEV), so this reads nothing else. Symlinks stay links,
        # recorded and skipped. --format=pax: long names as PAX records, which tarfile reads
        # exactly; --sort=name: the same workspace gives the same archive.
        argv = ("python3", "-I", "-S", "-c", _COPY_OUT, *members)
        result = self._helper(state, volume, argv, read_only=True, stdout_limit=stdout_limit)
        if result.outcome is Outcome.OUTPUT_LIMIT or result.stdout_truncated:
            raise ResourceExhausted(f"the files are over files.max_download_bytes ({max_bytes} bytes); "
                                    "ask for fewer paths")
        under_link = _under_link(result.stderr)
        if not result.ok and not (result.outcome is Outcome.TOOL_ERROR and _only_missing(result.stderr)):
            raise _failure(result, "read the files of the workspace")
        limits = ArchiveLimits(max_members=max_members, max_total_bytes=max_bytes,
                               max_archive_bytes=stdout_limit, max_path_bytes=MAX_PATH_BYTES)
        try:
            tree = extract_output(result.stdout, scratch / "out", limits=limits)
        except ArchiveError as e:
            text = str(e)
            if "exceeds" in text or "more than" in text:
                raise ResourceExhausted(f"the files are over files.max_download_bytes ({max_bytes}) or files.max_files "
                                        f"({self.config.files.max_files}): {text}; ask for fewer paths") from e
            # A fifo, a device node: not a file to deliver, and the archive is refused whole.
            raise FailedPrecondition(f"the workspace's files cannot be delivered: {text}") from e
        present = {f.path for f in tree.files} | set(tree.directories) | {link.path for link in tree.links}
        missing = [p for p in paths if p not in present and p not in under_link]
        return tree, missing, under_link


def _entry(f: FileInfo | DownloadedFile) -> FileEntry:
    return FileEntry(path=f.path, size=f.size, sha256=f.sha256)


_NOT_TEXT = "its name is not valid UTF-8 (shown escaped): it cannot be named in a reply or the log"


def _is_text(path: str) -> bool:
    """Whether a name read from a tool's tar (surrogate-escaped where it is not UTF-8) is text."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _delivered(tree: Tree, under_link: Mapping[str, str]) -> list[DownloadedFile]:
    out = []
    for f in tree.files:
        if not _is_text(f.path):
            out.append(DownloadedFile(escaped_name(f.path), None, skipped=_NOT_TEXT))
            continue
        data = _read_staged(tree.root, f.path)
        out.append(DownloadedFile(f.path, data, len(data), _sha256(data)))
    for link in tree.links:
        target = _printable(link.target)
        out.append(DownloadedFile(escaped_name(link.path), None,
                                  skipped=f"a {link.kind} to {target!r}: links are never followed"))
    for path, link_path in under_link.items():
        out.append(DownloadedFile(path, None,
                                  skipped=f"under the link {link_path!r}: links are never followed"))
    return sorted(out, key=lambda f: f.path)


def _printable(text: str) -> str:
    # A link target is the tool's text (any bytes, surrogate-escaped by tarfile): proto strings
    # and event JSON need valid UTF-8.
    return escaped_name(text)


def _stderr_lines(stderr: bytes) -> list[str]:
    return [line for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]


def _under_link(stderr: bytes) -> dict[str, str]:
    """The helper's report: requested path -> the link it lies under."""
    for line in _stderr_lines(stderr):
        if line.startswith(_UNDER_LINK):
            return {str(path): str(link) for path, link in json.loads(line[len(_UNDER_LINK):])}
    return {}


def _only_missing(stderr: bytes) -> bool:
    """GNU tar failed only because some requested paths do not exist (it archived the rest)."""
    lines = [line for line in _stderr_lines(stderr) if not line.startswith(_UNDER_LINK)]
    return (bool(lines) and all(_MISSING_LINE.match(line) or _SUMMARY_LINE.match(line) for line in lines)
            and any(_MISSING_LINE.match(line) for line in lines))


def _report(stderr: bytes, marker: str) -> Any:
    """The JSON a helper reported after `marker`, or None."""
    for line in _stderr_lines(stderr):
        if line.startswith(marker):
            return json.loads(line[len(marker):])
    return None


def _raise_for_members(result: SandboxResult) -> None:
    """The copy-in helper's refusals of the archive against the workspace (nothing was copied):
    InvalidArgument naming the member, FailedPrecondition for a directory it may not write in,
    ResourceExhausted when staging met the workspace's cap."""
    refused = _report(result.stderr, _REFUSED_MEMBER)
    if refused is not None:
        member, why = refused
        raise InvalidArgument("the archive does not fit the workspace; nothing was copied", [FieldViolation(
            "tar_chunk", f"member {member!r}: {why}")])
    not_writable = _report(result.stderr, _NOT_WRITABLE)
    if not_writable is not None:
        [path] = not_writable
        where = repr(path) if path else "the workspace itself"
        raise FailedPrecondition(f"could not copy the files into the workspace: {where} cannot be written in (a "
                                 "tool changed its mode); nothing was copied")
    not_staged = _report(result.stderr, _NOT_STAGED)
    if not_staged is not None:
        why, full = not_staged
        if full:
            raise ResourceExhausted(f"could not copy the files into the workspace: the workspace is full (its bytes "
                                    f"or inodes cap): {why}; nothing was copied")
        raise FailedPrecondition(f"could not copy the files into the workspace: {why}; nothing was copied")


def _raise_for_dest(result: SandboxResult, dest: str) -> None:
    """The copy-in helper's refusals of `dest` itself: InvalidArgument naming the field."""
    for line in _stderr_lines(result.stderr):
        if line.startswith(_UNDER_LINK):
            [[_path, link]] = json.loads(line[len(_UNDER_LINK):])
            raise InvalidArgument("dest is under a link in the workspace; nothing was copied", [FieldViolation(
                "dest", f"{dest!r} lies under the link {link!r} in the workspace: links are never followed")])
        if line.startswith(_NOT_A_DIR):
            _path, why = json.loads(line[len(_NOT_A_DIR):])
            raise InvalidArgument("dest cannot be a directory in the workspace; nothing was copied",
                                  [FieldViolation("dest", f"cannot create directory {dest!r}: {why}")])


def _failure(result: SandboxResult, what: str) -> ControlError:
    """The error for a helper call that did not succeed (never a bug: a ControlError)."""
    stderr = result.stderr.decode("utf-8", "replace").strip()
    detail = stderr[-500:] or result.message or str(result.outcome)
    if result.outcome in (Outcome.START_FAILED, Outcome.UNCERTAIN):
        return Unavailable(f"could not {what}: the sandbox engine failed ({detail})")
    if result.outcome is Outcome.KILLED:
        return FailedPrecondition(f"could not {what}: stopped ({detail}); the run was cancelled or reached its "
                                  "deadline")
    if any(marker in stderr for marker in _NO_SPACE):
        return ResourceExhausted(f"could not {what}: the workspace is full (its bytes or inodes cap): {detail}")
    return FailedPrecondition(f"could not {what}: {detail}")


@contextmanager
def _scratch(what: str) -> Iterator[Path]:
    """A fresh private temp dir on the host (the Docker engine bind-mounts a staged tree from
    it), removed afterwards whatever happened."""
    path = Path(tempfile.mkdtemp(prefix=f"rf-files-{what}-"))
    try:
        yield path
    finally:
        # rmtree does not follow links (and nothing here is one: the trees are ours).
        shutil.rmtree(path, ignore_errors=True)
