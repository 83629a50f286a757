"""Files in and out of a run's workspace, and the artifacts its tools declare.

STUB written by the lead to fix the interface; the files owner replaces the bodies (keep the
signatures: the control loop and the edge call them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from control.config import Config
from control.orchestration.runs import RunRepository
from control.registry import ToolManifest
from control.state import RunState
from sandbox.backend import SandboxBackend


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


class FileDesk:
    def __init__(self, *, repo: RunRepository, backend: SandboxBackend, config: Config) -> None:
        self.repo = repo
        self.backend = backend
        self.config = config

    def upload(self, state: RunState, dest: str, tar_bytes: bytes, by: str) -> tuple[list[FileInfo], int]:
        """Check, stage and copy `tar_bytes` into the run's workspace under `dest`; append
        `files_uploaded`; return the files and that event's seq. The caller holds the run's lock
        and has checked that the run has a live workspace."""
        raise NotImplementedError

    def download(self, state: RunState, paths: Sequence[str], by: str) -> list[DownloadedFile]:
        """The workspace's files under `paths` (links skipped, never followed); appends
        `files_downloaded`."""
        raise NotImplementedError

    def download_artifacts(self, state: RunState, paths: Sequence[str], by: str) -> list[DownloadedFile]:
        """The run's artifacts (all of them when `paths` is empty); appends `files_downloaded`."""
        raise NotImplementedError

    def collect_outputs(self, state: RunState, call_id: str, manifest: ToolManifest) -> None:
        """After a successful call of a tool with declared outputs: copy them out of the
        workspace into the run's artifacts and append `artifact_collected`."""
        raise NotImplementedError
