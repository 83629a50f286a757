"""Parsing of human sizes and durations for the CLI and config ("64m", "1MiB", "5s", "500ms")."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_size(text: str) -> int:
    """Bytes from '1048576', '64m', '64M', '64MiB', '1.5g', '512k'. Units are binary (Docker's)."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a size (examples: 64m, 16MiB, 512k, 1048576)")
    number, unit, _ = match.groups()
    return int(float(number) * 1024 ** _POWERS[unit.lower()])


def parse_duration(text: str) -> float:
    """Seconds from '5s', '500ms', '2m', '1h' or a bare number of seconds."""
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a duration (examples: 5s, 500ms, 2m)")
    number, unit = match.groups()
    return float(number) * _SECONDS[(unit or "s").lower()]
