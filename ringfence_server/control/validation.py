"""Argument validation (admission step 2): JSON Schema 2020-12, a size cap, canonical form.

The canonical form is what every later step sees: the loop detector, the approval digest and
the idempotency key are all computed from it, so two spellings of one call are one call.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator, ValidationError

from ringfence.errors import FieldViolation
from ringfence_server.control.registry import ToolManifest

_validators: dict[int, Draft202012Validator] = {}
# Deeper nesting is refused, not recursed into: Python's stack is the limit otherwise.
MAX_DEPTH = 32


def _text(value: str, path: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{path}: not valid Unicode (a lone surrogate)") from None
    return value


def _normalize(value: Any, path: str, depth: int = 0) -> Any:
    """Plain JSON types only; integral floats become ints (50.0 and 50 are one amount)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _text(value, path)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path}: NaN and infinity are not JSON")
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise ValueError(f"{path}: object keys must be strings")
        # Keys sorted: the canonical form is also the form the tool receives.
        return {_text(k, path): _normalize(value[k], f"{path}.{k}", depth + 1) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_normalize(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise ValueError(f"{path}: {type(value).__name__} is not a JSON value")


def canonical(value: Any) -> Any:
    """A plain-JSON deep copy of `value` in normal form (raises ValueError for non-JSON)."""
    return _normalize(value, "arguments")


def canonical_json(value: Any) -> str:
    return json.dumps(canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def signature(tool: str, arguments: Mapping[str, Any]) -> str:
    """The canonical signature of a call: the same tool with the same arguments is the same call."""
    return f"{tool}:{canonical_json(arguments)}"


def sha256_hex(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        data = p.encode("utf-8")
        # Length-prefix each part so ("ab","c") and ("a","bc") never collide.
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def _validator(manifest: ToolManifest) -> Draft202012Validator:
    key = id(manifest.schema)
    v = _validators.get(key)
    if v is None:
        v = Draft202012Validator(manifest.schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        _validators[key] = v
    return v


def _where(prefix: str, error: ValidationError) -> str:
    path = prefix
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def validate_arguments(
    manifest: ToolManifest,
    arguments: Any,
    *,
    max_bytes: int,
    field_prefix: str = "arguments",
) -> tuple[dict[str, Any] | None, list[FieldViolation]]:
    """Return (canonical arguments, []) or (None, every violation found): the arguments are None
    exactly when there are violations, so callers test `is None` and mypy knows the rest."""
    if not isinstance(arguments, Mapping):
        return None, [FieldViolation(field_prefix, "must be an object")]
    try:
        canon = canonical(arguments)
    except ValueError as e:
        return None, [FieldViolation(field_prefix, str(e))]
    size = len(canonical_json(canon).encode("utf-8"))
    if size > max_bytes:
        return None, [FieldViolation(field_prefix, f"{size} bytes is over the {max_bytes}-byte cap")]
    errors = sorted(_validator(manifest).iter_errors(canon), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        return None, [FieldViolation(_where(field_prefix, e), e.message[:500]) for e in errors]
    return canon, []
