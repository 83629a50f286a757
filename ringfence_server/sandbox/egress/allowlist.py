"""Egress allowlists: host patterns, matching, intersection. Stdlib only, opens no socket.

A pattern is `name[:port]` or `*.suffix[:port]`:

- `api.example.com` matches exactly that name -- never `x.api.example.com`;
- `*.example.com` matches any name *under* example.com (`a.example.com`, `a.b.example.com`),
  never `example.com` itself (list both when both are wanted);
- no port means the web ports 80 and 443; `:port` means only that port.

Names are compared in one canonical form: lower case, no trailing dot, IDNA (punycode) for
non-ASCII. IP literals are never patterns and never match one: an allowlist names hosts, and
a request for a bare IP (`https://1.2.3.4/`) is a request for no allowlisted name.

    host_allowed(host, port, patterns) -> bool
    parse_pattern(text) -> HostPattern          PatternError (a ValueError) when malformed
    intersect(tool_patterns, granted_patterns) -> tuple[HostPattern, ...]
    classify_address(ip) -> AddressClass        re-exported from .addresses (no sockets)

This module is laid into the egress-proxy image as it is (images/egress-proxy/image.json, `files`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .addresses import AddressClass, classify_address, parse_address

__all__ = [
    "DEFAULT_PORTS",
    "AddressClass",
    "HostPattern",
    "PatternError",
    "check_port",
    "classify_address",
    "host_allowed",
    "intersect",
    "is_ip_literal",
    "normalize_host",
    "parse_pattern",
    "parse_patterns",
]

DEFAULT_PORTS: tuple[int, ...] = (80, 443)
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_MAX_NAME = 253


class PatternError(ValueError):
    """A host, port or pattern that is not well formed."""


def normalize_host(host: str) -> str:
    """The canonical form of a DNS name, or PatternError. IP literals are refused here."""
    if not isinstance(host, str) or not host:
        raise PatternError("empty host name")
    name = host.strip()
    if name.endswith("."):
        name = name[:-1]
    if parse_address(name) is not None or name.startswith("["):
        raise PatternError(f"{host!r} is an IP address, not a host name")
    try:
        name = name.encode("idna").decode("ascii") if not name.isascii() else name
    except UnicodeError as e:
        raise PatternError(f"{host!r} is not a valid internationalized name: {e}") from e
    name = name.lower()
    if not name or len(name) > _MAX_NAME:
        raise PatternError(f"{host!r} is not a valid host name (length)")
    labels = name.split(".")
    for label in labels:
        if not _LABEL.fullmatch(label):
            raise PatternError(f"{host!r} is not a valid host name (label {label!r})")
    # A name made only of digits and dots ("1.2.3") is what some resolvers read as an address.
    if all(label.isdigit() for label in labels):
        raise PatternError(f"{host!r} looks like a numeric address")
    return name


def is_ip_literal(host: str) -> bool:
    h = host.strip()
    return parse_address(h) is not None or (h.startswith("[") and h.endswith("]"))


def check_port(port: int | str) -> int:
    if isinstance(port, bool):
        raise PatternError(f"{port!r} is not a port")
    try:
        value = int(port)
    except (TypeError, ValueError) as e:
        raise PatternError(f"{port!r} is not a port") from e
    if isinstance(port, str) and not port.isdigit():
        raise PatternError(f"{port!r} is not a port")
    if not 1 <= value <= 65535:
        raise PatternError(f"port {value} is outside 1..65535")
    return value


@dataclass(frozen=True, order=True)
class HostPattern:
    """One allowlist entry. `wildcard` means `*.<name>`; `ports` are the ports it opens."""

    name: str
    wildcard: bool = False
    ports: tuple[int, ...] = DEFAULT_PORTS

    def matches(self, host: str, port: int) -> bool:
        if port not in self.ports:
            return False
        if self.wildcard:
            return host.endswith("." + self.name)
        return host == self.name

    def __str__(self) -> str:
        head = ("*." if self.wildcard else "") + self.name
        if self.ports == DEFAULT_PORTS:
            return head
        return ",".join(f"{head}:{p}" for p in self.ports)


def parse_pattern(text: str | HostPattern) -> HostPattern:
    """`name`, `name:port`, `*.suffix`, `*.suffix:port` -> HostPattern."""
    if isinstance(text, HostPattern):
        return text
    if not isinstance(text, str) or not text.strip():
        raise PatternError("empty allowlist entry")
    raw = text.strip()
    if raw.startswith("["):
        raise PatternError(f"{text!r}: IP addresses cannot be allowlisted, name the host")
    host, ports = raw, DEFAULT_PORTS
    if raw.count(":") == 1:
        host, port_text = raw.split(":", 1)
        ports = (check_port(port_text),)
    elif raw.count(":") > 1:
        raise PatternError(f"{text!r}: IP addresses cannot be allowlisted, name the host")
    wildcard = False
    if host.startswith("*."):
        wildcard, host = True, host[2:]
    if "*" in host:
        raise PatternError(f"{text!r}: only a leading '*.' wildcard is supported")
    if is_ip_literal(host):
        raise PatternError(f"{text!r}: IP addresses cannot be allowlisted, name the host")
    name = normalize_host(host)
    if wildcard and "." not in name:
        # `*.com` would open a whole top-level domain.
        raise PatternError(f"{text!r}: a wildcard needs at least two labels after '*.'")
    return HostPattern(name, wildcard, ports)


def parse_patterns(items: Iterable[str | HostPattern]) -> tuple[HostPattern, ...]:
    if isinstance(items, str):
        items = [p for p in items.split(",") if p.strip()]
    return tuple(sorted(set(parse_pattern(i) for i in items)))


Patterns = Iterable[str | HostPattern] | str


def host_allowed(host: str, port: int, patterns: Patterns) -> bool:
    """True when `host:port` is on the allowlist `patterns`. Malformed input is never allowed."""
    try:
        name = normalize_host(host)
        p = check_port(port)
        parsed = parse_patterns(patterns)
    except PatternError:
        return False
    return any(pattern.matches(name, p) for pattern in parsed)


def _covers(wide: HostPattern, name: str) -> bool:
    """Does `wide`'s name part cover the name `name` (an exact host)?"""
    return name == wide.name if not wide.wildcard else name.endswith("." + wide.name)


def _meet(a: HostPattern, b: HostPattern) -> HostPattern | None:
    ports = tuple(sorted(set(a.ports) & set(b.ports)))
    if not ports:
        return None
    if not a.wildcard and not b.wildcard:
        return HostPattern(a.name, False, ports) if a.name == b.name else None
    if not a.wildcard:  # exact a under wildcard b
        return HostPattern(a.name, False, ports) if _covers(b, a.name) else None
    if not b.wildcard:
        return HostPattern(b.name, False, ports) if _covers(a, b.name) else None
    # Two wildcards: the narrower one, when one suffix lies under the other.
    if a.name == b.name or a.name.endswith("." + b.name):
        return HostPattern(a.name, True, ports)
    if b.name.endswith("." + a.name):
        return HostPattern(b.name, True, ports)
    return None


def intersect(tool: Patterns, granted: Patterns) -> tuple[HostPattern, ...]:
    """The patterns that both lists allow: a call's allowlist is what its tool declares AND
    what policy grants. The result never allows a (host, port) that either side refuses."""
    out = set()
    for a in parse_patterns(tool):
        for b in parse_patterns(granted):
            m = _meet(a, b)
            if m is not None:
                out.add(m)
    return tuple(sorted(out))
