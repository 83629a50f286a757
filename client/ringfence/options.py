"""Options and values of the client SDK: TLS, the read retry policy, a run's workspace, and what
a file transfer answers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

__all__ = ["DownloadedFiles", "RetryPolicy", "TlsConfig", "UploadResult", "UploadedFile", "WorkspaceOptions"]


@dataclass(frozen=True)
class TlsConfig:
    """TLS to the control plane; with a client certificate and key, mutual TLS.

    A certificate says which machine is calling; the bearer token is still required, because
    it says which tenant and role.
    """

    root_certificates: bytes | None = None
    """PEM bundle of the CAs trusted to sign the server's certificate; None: the system's."""
    private_key: bytes | None = None
    """PEM private key of the client certificate (mTLS); set together with certificate_chain."""
    certificate_chain: bytes | None = None
    """PEM client certificate chain (mTLS); set together with private_key."""
    server_name: str | None = None
    """The name to check the server's certificate against, when it differs from the target's
    host (an IP target with a DNS-named certificate)."""

    def __post_init__(self) -> None:
        if (self.private_key is None) != (self.certificate_chain is None):
            raise ValueError("mTLS needs both private_key and certificate_chain, or neither")

    @classmethod
    def from_files(
        cls,
        root_certificates: str | Path | None = None,
        *,
        certificate_chain: str | Path | None = None,
        private_key: str | Path | None = None,
        server_name: str | None = None,
    ) -> TlsConfig:
        def read(path: str | Path | None) -> bytes | None:
            return Path(path).read_bytes() if path is not None else None

        return cls(read(root_certificates), read(private_key), read(certificate_chain), server_name)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


@dataclass(frozen=True)
class RetryPolicy:
    """How an idempotent call is retried when the server (or the channel) answers UNAVAILABLE.

    Only UNAVAILABLE is retried: it is the one code that means "not done, try again". INTERNAL
    is a server bug and would fail the same way; DEADLINE_EXCEEDED means the call's own deadline
    is spent, and every attempt shares that one deadline.
    """

    attempts: int = 4
    """Attempts in all, the first included; 1 turns retrying off."""
    initial_backoff_s: float = 0.1
    """The wait before the second attempt; it doubles each time (with jitter)."""
    max_backoff_s: float = 2.0
    """No single wait is longer than this (nor longer than what is left of the deadline)."""
    jitter_s: float = 0.1
    """Up to this much random extra per wait, so many clients do not retry in step."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if min(self.initial_backoff_s, self.max_backoff_s, self.jitter_s) < 0:
            raise ValueError("backoffs and jitter must not be negative")


DEFAULT_RETRY = RetryPolicy()
"""The clients' default policy: one shared instance (RetryPolicy is frozen), built once at import."""


@dataclass(frozen=True)
class WorkspaceOptions:
    """The caps of a run's workspace (`start_run(..., workspace=WorkspaceOptions(...))`); 0 is
    the server's default. Past the server's maximums the run is refused (InvalidArgument naming
    workspace.bytes or workspace.inodes). `workspace=True` is WorkspaceOptions()."""

    bytes: int = 0
    """Bytes of file data the workspace may hold (a write past it fails with ENOSPC)."""
    inodes: int = 0
    """Files and directories it may hold."""

    def __post_init__(self) -> None:
        for name in ("bytes", "inodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"WorkspaceOptions.{name} must be an integer >= 0 (0: the server's default)")


@dataclass(frozen=True)
class UploadedFile:
    """One file an upload put in the workspace, as the server recorded it."""

    path: str
    """Relative to /workspace."""
    size: int
    sha256: str


@dataclass(frozen=True)
class UploadResult:
    files: tuple[UploadedFile, ...]
    seq: int
    """The run's `files_uploaded` event."""


class DownloadedFiles(dict[str, bytes]):
    """A download: path (relative to /workspace) -> the file's bytes, each checked against the
    sha256 and size the server sent. `skipped` holds what was not delivered and why (a link in
    the workspace is never followed)."""

    def __init__(self, files: dict[str, bytes] | None = None, skipped: dict[str, str] | None = None) -> None:
        super().__init__(files or {})
        self.skipped: dict[str, str] = dict(skipped or {})
