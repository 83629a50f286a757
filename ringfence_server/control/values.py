"""Frozen call values back to plain JSON for event data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ringfence_server.control.validation import MAX_DEPTH


def plain(value: Any, depth: int = 0) -> Any:
    """Frozen mappings back to plain JSON-able values (for event data). What validation refuses
    (too deep, a lone surrogate, NaN) is still recorded, as a readable trace of it."""
    if depth > MAX_DEPTH:
        return f"<nested deeper than {MAX_DEPTH} levels>"
    if isinstance(value, Mapping):
        return {plain_text(str(k)): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return repr(value)  # not JSON; validation rejects the call, the log keeps a trace of it
    if isinstance(value, str):
        return plain_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return repr(value)[:1000]


def plain_text(value: str) -> str:
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:  # a lone surrogate: SQLite and JSON readers would choke on it
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
