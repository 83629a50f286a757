"""A sandbox result as it crosses the wire from a worker to the control plane.

`encode_result` is the worker's half: one canonical JSON document (sorted keys, no whitespace,
ASCII only, no NaN) naming its format and version, with every field of `SandboxResult` by name and
the tool's stdout and stderr in base64, so every byte the tool wrote survives, whatever it is.
These bytes are what the worker records (ringfence_server.worker.results) and answers every
later delivery of the call with, so one result has one spelling.

`decode_result` is the control plane's half, and strict: a worker's host runs untrusted tool code
and may be taken over (docs/workers.md), so what it sends is read as input, never trusted. It is
checked against the sandbox profile the call was sent with (`limits`: the envelope's
`SandboxSpec`): a worker cannot hand back more output than the call was allowed to write. It
checks in this order, the first failure raising WireError (ringfence_server.worker.errors) with
its reason:

1. too_large            more bytes than `max_wire_bytes(limits)` (the output's caps in base64,
                        plus MAX_METADATA_BYTES for the rest), before a byte of it is parsed
2. not_json             not ASCII JSON: another encoding, a key twice, nesting past the parser's
                        depth, trailing text
3. non_finite           a NaN, an Infinity, or a number too large to be a finite float (steps 2
                        and 3 are one pass of the parser: the first fault it meets decides)
4. wrong_format         not an object naming this FORMAT and FORMAT_VERSION
5. fields               a key unknown or missing (every field of SandboxResult but those the
                        control plane sets itself, CONTROL_PLANE_FIELDS; no other)
6. wrong_type           a field of another JSON type (an integer where a bool is meant included)
7. out_of_range         a negative duration or retry-after, an exit code past 64 bits
8. unknown_outcome      an outcome that is not one of Outcome's
9. unknown_error_class  an error class that is not one of ToolErrorClass's
10. bad_base64          stdout or stderr not in canonical base64 (the standard alphabet, padded)
11. output_over_limit   more stdout or stderr than the profile's stdout_limit or stderr_limit
12. too_many_events     more than MAX_EGRESS_EVENTS egress events
13. not_flat            an egress event that is not a flat object: its values are JSON scalars or
                        lists of scalars (the proxy's `sni` is a list of names), never objects
14. not_canonical       not the one spelling `encode_result` writes (whitespace, key order, 1 for
                        1.0, an escape written another way)

The checks that need nothing parsed come first (a worker cannot make the control plane parse a
huge document), then the shape, then the values.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from ringfence_server.sandbox.profile import LIMIT_RANGES
from ringfence_server.sandbox.result import Outcome, SandboxResult, ToolErrorClass
from ringfence_server.worker.envelope import SandboxSpec
from ringfence_server.worker.errors import WireError, WireFault

__all__ = [
    "CONTROL_PLANE_FIELDS",
    "FORMAT",
    "FORMAT_VERSION",
    "MAX_EGRESS_EVENTS",
    "MAX_METADATA_BYTES",
    "decode_result",
    "encode_result",
    "max_wire_bytes",
]

FORMAT = "ringfence/sandbox-result"
FORMAT_VERSION = 1
"""Raised for any change to the fields or their encoding: a reader refuses a version it does not
know (wrong_format) rather than reading it as the one it does."""
MAX_EGRESS_EVENTS = 1000
"""Egress events one result may carry: the egress proxy keeps at most this many per call
(ringfence_server.sandbox.egress.config.ProxyConfig.max_events_per_call) and counts the rest as
dropped, so more can only come from a worker that made them up."""
MAX_METADATA_BYTES = 4 * 1024 * 1024
"""Bytes of a result's wire form beyond its output: the message, the applied settings and up to
MAX_EGRESS_EVENTS egress events (a few hundred bytes each) fit with room to spare."""
CONTROL_PLANE_FIELDS = frozenset({"worker"})
"""Fields of SandboxResult that are not on the wire: the control plane sets them on a result it
received (`worker`: which worker ran it, known from the stream it came on), never from a worker's
word; a document that names one is refused (fields). A result decoded here has their defaults."""
_MAX_INT = 2**63
# An output cap when the caller names none (encode_result checks its own document): the
# sandbox's largest.
_LARGEST_OUTPUT = int(LIMIT_RANGES["stdout_limit"][1])


def _b64_len(n: int) -> int:
    return 4 * ((n + 2) // 3)


def max_wire_bytes(limits: SandboxSpec) -> int:
    """The most bytes a result of a call run under `limits` may take on the wire."""
    return _b64_len(limits.stdout_limit) + _b64_len(limits.stderr_limit) + MAX_METADATA_BYTES


# -- encoding --------------------------------------------------------------------------------


def _doc(result: SandboxResult) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "outcome": _member(Outcome, result.outcome, WireFault.UNKNOWN_OUTCOME),
        "exit_code": result.exit_code,
        "stdout": base64.b64encode(result.stdout).decode("ascii"),
        "stderr": base64.b64encode(result.stderr).decode("ascii"),
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
        "duration_ms": result.duration_ms,
        "image_id": result.image_id,
        "runtime": result.runtime,
        "error_class": (_member(ToolErrorClass, result.error_class, WireFault.UNKNOWN_ERROR_CLASS)
                        if result.error_class is not None else None),
        "message": result.message,
        # One spelling per value: a float always (5 is written 5.0), as the reader requires.
        "retry_after_s": _as_float(result.retry_after_s),
        "container_name": result.container_name,
        "applied": dict(result.applied),
        "egress_events": [dict(e) for e in result.egress_events],
        "setup_ms": result.setup_ms,
        "warm": result.warm,
    }


def _member(kind: type[Outcome] | type[ToolErrorClass], value: str, fault: WireFault) -> str:
    try:
        return kind(value).value
    except ValueError:
        raise WireError(fault, repr(value)[:64]) from None


def _as_float(value: float | None) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return float(value)


def _dump(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def encode_result(result: SandboxResult) -> bytes:
    """The canonical wire form of `result`. WireError when `result` holds what its reader would
    refuse (a non-finite number, a value that is not JSON, a nested egress event): the bytes are
    checked by the reader's own checks before they are returned, so a worker never records a
    result the control plane cannot read (its output is checked against the sandbox's largest
    caps here; the reader checks the call's own)."""
    doc = _doc(result)
    try:
        data = _dump(doc)
    except ValueError as e:  # json's refusal of NaN and Infinity, or of a circular reference
        raise WireError(_why_not_json(doc), str(e)[:300]) from None
    except (TypeError, RecursionError) as e:
        raise WireError(WireFault.NOT_JSON, str(e)[:300]) from None
    _decode(data, _LARGEST_OUTPUT, _LARGEST_OUTPUT, _b64_len(_LARGEST_OUTPUT) * 2 + MAX_METADATA_BYTES)
    return data


def _why_not_json(doc: Mapping[str, Any]) -> WireFault:
    """Whether a document json refused with ValueError holds a non-finite number (it is JSON once
    those are allowed) or is not JSON at all (a circular reference)."""
    try:
        json.dumps(doc, allow_nan=True)
    except (ValueError, TypeError, RecursionError):
        return WireFault.NOT_JSON
    return WireFault.NON_FINITE


# -- decoding --------------------------------------------------------------------------------


class _Fault(Exception):
    """Raised by the parser's hooks; becomes WireError with its fault."""

    def __init__(self, fault: WireFault, detail: str) -> None:
        super().__init__(detail)
        self.fault = fault


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise _Fault(WireFault.NOT_JSON, "a key appears twice")
    return doc


def _no_constant(name: str) -> Any:
    raise _Fault(WireFault.NON_FINITE, f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Fault(WireFault.NON_FINITE, f"{text[:40]} is not a finite float")
    return value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_opt_int(v: Any) -> bool:
    return v is None or _is_int(v)


def _is_num_or_none(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_opt_str(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


# Each field's JSON type: a value of another type is refused, never coerced.
_TYPES: dict[str, Callable[[Any], bool]] = {
    "outcome": _is_str, "exit_code": _is_opt_int, "stdout": _is_str, "stderr": _is_str,
    "stdout_truncated": _is_bool, "stderr_truncated": _is_bool, "duration_ms": _is_int, "image_id": _is_str,
    "runtime": _is_str, "error_class": _is_opt_str, "message": _is_str, "retry_after_s": _is_num_or_none,
    "container_name": _is_str, "applied": lambda v: isinstance(v, dict),
    "egress_events": lambda v: isinstance(v, list), "setup_ms": _is_int, "warm": _is_bool,
}
_SCALARS = (str, int, float, bool, type(None))


def _is_flat(event: object) -> bool:
    if not isinstance(event, dict):
        return False
    for value in event.values():
        if isinstance(value, list):
            if not all(isinstance(x, _SCALARS) for x in value):
                return False
        elif not isinstance(value, _SCALARS):
            return False
    return True


def _output(name: str, text: str, limit: int) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise WireError(WireFault.BAD_BASE64, f"{name}: {e}") from None
    if base64.b64encode(raw).decode("ascii") != text:
        raise WireError(WireFault.BAD_BASE64, f"{name}: not in canonical base64")
    if len(raw) > limit:
        raise WireError(WireFault.OUTPUT_OVER_LIMIT, f"{name}: {len(raw)} bytes, the call's limit is {limit}")
    return raw


def _parse(data: bytes) -> object:
    try:
        text = data.decode("ascii")
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                          parse_float=_finite_float)
    except _Fault as e:
        raise WireError(e.fault, str(e)) from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise WireError(WireFault.NOT_JSON, str(e)[:300]) from None


def _decode(data: bytes, stdout_limit: int, stderr_limit: int, max_bytes: int) -> SandboxResult:
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError("a result's wire form is bytes")
    if len(data) > max_bytes:
        raise WireError(WireFault.TOO_LARGE, f"{len(data)} bytes, at most {max_bytes}")
    doc = _parse(bytes(data))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != FORMAT_VERSION \
            or not _is_int(doc.get("version")):
        raise WireError(WireFault.WRONG_FORMAT, f"not a {FORMAT} version {FORMAT_VERSION} document")
    expected = {"format", "version", *_TYPES}
    if set(doc) != expected:
        raise WireError(WireFault.FIELDS, f"keys {sorted(set(doc) ^ expected)[:20]} unknown or missing")
    for name, accept in _TYPES.items():
        if not accept(doc[name]):
            raise WireError(WireFault.WRONG_TYPE, f"{name}: {type(doc[name]).__name__}")
    for name in ("duration_ms", "setup_ms", "retry_after_s"):
        if doc[name] is not None and doc[name] < 0:
            raise WireError(WireFault.OUT_OF_RANGE, f"{name}: negative")
    if doc["exit_code"] is not None and not -_MAX_INT <= doc["exit_code"] < _MAX_INT:
        raise WireError(WireFault.OUT_OF_RANGE, "exit_code: past 64 bits")
    try:
        outcome = Outcome(doc["outcome"])
    except ValueError:
        raise WireError(WireFault.UNKNOWN_OUTCOME, repr(doc["outcome"][:64])) from None
    try:
        error_class = ToolErrorClass(doc["error_class"]) if doc["error_class"] is not None else None
    except ValueError:
        raise WireError(WireFault.UNKNOWN_ERROR_CLASS, repr(doc["error_class"][:64])) from None
    stdout = _output("stdout", doc["stdout"], stdout_limit)
    stderr = _output("stderr", doc["stderr"], stderr_limit)
    events = doc["egress_events"]
    if len(events) > MAX_EGRESS_EVENTS:
        raise WireError(WireFault.TOO_MANY_EVENTS, f"{len(events)} egress events, at most {MAX_EGRESS_EVENTS}")
    for i, event in enumerate(events):
        if not _is_flat(event):
            raise WireError(WireFault.NOT_FLAT, f"egress event {i}: not an object of scalars and lists of scalars")
    result = SandboxResult(
        outcome=outcome, exit_code=doc["exit_code"], stdout=stdout, stderr=stderr,
        stdout_truncated=doc["stdout_truncated"], stderr_truncated=doc["stderr_truncated"],
        duration_ms=doc["duration_ms"], image_id=doc["image_id"], runtime=doc["runtime"], error_class=error_class,
        message=doc["message"], retry_after_s=_as_float(doc["retry_after_s"]),
        container_name=doc["container_name"], applied=doc["applied"], egress_events=tuple(events),
        setup_ms=doc["setup_ms"], warm=doc["warm"])
    if _dump(_doc(result)) != data:
        # Whitespace, key order, 5 for 5.0, "\u0041" for "A": one result, one spelling.
        raise WireError(WireFault.NOT_CANONICAL, "not in the canonical form encode_result writes")
    return result


def decode_result(data: bytes, *, limits: SandboxSpec) -> SandboxResult:
    """The result whose wire form is exactly `data`, from a call run under `limits` (the sandbox
    profile it was sent with); WireError otherwise, in the order of the module's docstring."""
    return _decode(data, limits.stdout_limit, limits.stderr_limit, max_wire_bytes(limits))
