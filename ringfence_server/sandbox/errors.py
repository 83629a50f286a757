"""Errors of the sandbox layer.

    SandboxError                  base: every error this package raises
    ├── ProfileError              a SandboxProfile refused its own settings (a usage error)
    ├── ArchiveError              a file transfer was refused (traversal, link out, device node)
    ├── ImageError                an image is missing, not in the lock, or drifted from it
    └── EngineError               the Docker engine failed or could not be reached (transient)

A tool that runs and fails is not an error here: it is a classified SandboxResult. These
exceptions are for calls that could not be attempted at all.
"""


class SandboxError(Exception):
    """Base of every exception raised by the sandbox package."""


class ProfileError(SandboxError, ValueError):
    """A profile setting is out of range or would weaken the sandbox."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ArchiveError(SandboxError):
    """A file transfer into or out of a sandbox was refused."""


class ImageError(SandboxError):
    """An image cannot be used: missing, not pinned in images.lock, or drifted."""


class EngineError(SandboxError):
    """The Docker engine is unreachable or failed an operation; retrying may help."""
