"""What a model adapter raises when the provider did not give a turn.

The agent loop catches ModelError and ends the run (outcome `error`, the reason naming the
provider and its status), cancelling it on the server: a provider failure is an end of the
run, never a crash of the caller and never a silent retry. Any other exception from a model
is a bug and propagates. No message here ever holds an API key: adapters build them from the
provider's status and error type, never from request headers.
"""

from __future__ import annotations

__all__ = ["ModelError", "ModelRequestRefused", "ModelUnavailable"]


class ModelError(Exception):
    """The provider did not give a turn."""

    def __init__(self, provider: str, message: str, *, status: int | None = None) -> None:
        super().__init__(f"{provider}: {message}" + (f" (HTTP {status})" if status is not None else ""))
        self.provider = provider
        """"openai", "anthropic", ... (what the adapter speaks, not who serves it)."""
        self.status = status
        """The HTTP status the provider answered, None when there was no answer."""

    @property
    def retryable(self) -> bool:
        """Whether trying again later could help (the loop itself never retries a turn)."""
        return False


class ModelRequestRefused(ModelError):
    """A permanent refusal (400, 401, 403, 404, 422 ...): the same request would be refused
    again, so it was not retried. A wrong key, an unknown model, a request too large."""


class ModelUnavailable(ModelError):
    """A transient failure (a connection error, 408, 409, 429, 5xx) whose retries ran out or
    whose deadline passed."""

    @property
    def retryable(self) -> bool:
        return True
