"""Where a command prints: human lines or JSON lines on stdout, errors on stderr, and the helpers
that turn the model's values into JSON (jsonable) or one short line (compact, short)."""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any


def jsonable(value: Any) -> Any:
    """The model's frozen values as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def compact(value: Any) -> str:
    """Canonical one-line JSON (sorted keys): the arguments an approver compares."""
    return json.dumps(jsonable(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def short(value: Any, limit: int = 90) -> str:
    """Text (or compact JSON) on one line, cut to `limit` characters with '...'."""
    text = value if isinstance(value, str) else compact(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Output:
    """Human lines or JSON lines on stdout, flushed at once (a pipe sees events as they come)."""

    def __init__(self, json_mode: bool) -> None:
        self.json = json_mode

    def line(self, text: str = "") -> None:
        if not self.json:
            print(text, flush=True)

    def obj(self, value: Mapping[str, Any]) -> None:
        if self.json:
            print(json.dumps(jsonable(value), sort_keys=False, ensure_ascii=False, default=str), flush=True)

    def error(self, message: str, details: Iterable[str] = (), hint: str | None = None,
              code: str | None = None) -> None:
        details = list(details)
        if self.json:
            doc = {"error": {"code": code, "message": message, "details": details, "hint": hint}}
            print(json.dumps(doc, ensure_ascii=False), file=sys.stderr, flush=True)
            return
        print(f"error: {message}", file=sys.stderr)
        for d in details:
            print(f"  {d}", file=sys.stderr)
        if hint:
            print(hint, file=sys.stderr)
        sys.stderr.flush()
