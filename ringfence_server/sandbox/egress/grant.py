"""EgressGrant: what one call may reach through the egress proxy, as a profile field.

A call's allowlist is the intersection of what its tool declares and what policy grants
(`ringfence_server.sandbox.egress.allowlist.intersect`); the control plane computes it and puts the result
here. The sandbox layer enforces it and knows nothing of how it was decided.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ringfence_server.sandbox.egress.allowlist import HostPattern, PatternError, parse_patterns
from ringfence_server.sandbox.errors import ProfileError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True)
class EgressGrant:
    """One call's egress: host patterns and ceilings, enforced by the proxy per credential."""

    allow: tuple[str, ...]
    """Patterns `name[:port]` or `*.suffix[:port]` (see ringfence_server.sandbox.egress.allowlist); at least one.
    Stored in canonical form, sorted."""

    max_bytes: int = 64 * MiB
    """Bytes up plus down over all of the call's connections; past it every one is cut."""

    max_connections: int = 32
    """Connections (CONNECT tunnels and plain HTTP requests) the call may open in total."""

    def __post_init__(self) -> None:
        allow: object = self.allow  # a str too, from a command line or config
        if isinstance(allow, str):
            allow = tuple(p for p in allow.split(",") if p.strip())
        try:
            if not isinstance(allow, Iterable):
                raise TypeError(f"{type(allow).__name__} is not a sequence")
            patterns = parse_patterns(tuple(allow))
        except PatternError as e:
            raise ProfileError("egress.allow", str(e)) from e
        except TypeError as e:
            raise ProfileError("egress.allow", "must be a sequence of host patterns") from e
        if not patterns:
            raise ProfileError("egress.allow", "an egress grant needs at least one host pattern")
        if len(patterns) > 256:
            raise ProfileError("egress.allow", "at most 256 host patterns")
        for name, value, low, high in (("max_bytes", self.max_bytes, 1, 16 * GiB),
                                       ("max_connections", self.max_connections, 1, 10_000)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ProfileError(f"egress.{name}", f"{value!r} is outside [{low}, {high}]")
        object.__setattr__(self, "allow", tuple(_expand(patterns)))

    @property
    def patterns(self) -> tuple[HostPattern, ...]:
        return parse_patterns(self.allow)


def _expand(patterns: tuple[HostPattern, ...]) -> list[str]:
    """One string per (pattern, port) pair, so the stored form round-trips exactly."""
    out = set()
    for p in patterns:
        head = ("*." if p.wildcard else "") + p.name
        if p.ports == (80, 443):
            out.add(head)
        else:
            out.update(f"{head}:{port}" for port in p.ports)
    return sorted(out)
