"""The people's CLI's exit codes and the two failures it diagnoses itself (before or instead of
anything the server says)."""

from __future__ import annotations

from collections.abc import Sequence

EXIT_OK = 0  # done (for submit: the plan ran, whatever its calls' verdicts)
EXIT_SERVER = 1  # the server answered with an error, or could not be reached
EXIT_USAGE = 2  # bad usage, a bad plan file, a missing token, a request refused as INVALID_ARGUMENT


class UsageError(Exception):
    """The command cannot be sent as given (exit 2); `details` are printed one per line."""

    def __init__(self, message: str, details: Sequence[str] = (), hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = tuple(details)
        self.hint = hint


class CommandFailed(Exception):
    """A failure the CLI diagnosed itself (exit 1 unless `code` says otherwise)."""

    def __init__(self, message: str, hint: str | None = None, code: int = EXIT_SERVER) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code
