"""The version handshake: what a client sends, and which clients a server serves.

Every call of the SDK (ringfence.Client, ringfence.AsyncClient, and so the `ringfence` command)
carries the client's version (ringfence/_version.py) in the metadata key KEY,
`ringfence-client-version`. The server (ringfence_server/control/api/servicer.py, its edge) reads
it right after authenticating the caller, before anything else runs:

  no such key          served: the wire contract is the protos; grpcurl, a client in another
                       language or a health check sends none and owes none
  not a version        INVALID_ARGUMENT naming the key (parse(): X.Y.Z, with at most a PEP 440
                       pre/post/dev/local suffix, which the rule ignores)
  refused by serves()  FAILED_PRECONDITION naming both versions and what to upgrade (message()),
                       with a `google.rpc.ErrorInfo` (REASON, DOMAIN; client_version, server_version,
                       upgrade) that the SDK raises as ringfence.errors.VersionMismatch
  served               the call goes on

The rule, serves(server, client), reads major.minor only (a patch release never changes the wire):
  major 0    a server serves clients of its own major.minor: 0.2.x serves 0.2.*, refuses 0.1 and
             0.3 (before 1.0 any minor release may change the contract, in either direction);
  major >= 1 the same major and client minor <= server minor: an older client of that major calls
             only what this server has; a newer one could call what it lacks.

Which side to upgrade (advice()): a client older than the server upgrades the client to the
server's major.minor; a client newer than the server needs a server of the client's major.minor
(or, until there is one, a client of the server's).

Pure, stdlib only: the client's wire and the server's edge both read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DOMAIN", "KEY", "MAX_CHARS", "REASON", "Version", "advice", "message", "parse", "served_clients",
           "serves"]

KEY = "ringfence-client-version"
"""The metadata key a client's version travels in (lower case: gRPC's keys are)."""
REASON = "VERSION_MISMATCH"
"""The `google.rpc.ErrorInfo` reason of a refused client version."""
DOMAIN = "ringfence"
"""The ErrorInfo's domain: ours, so a reason of another system's is never mistaken for it."""
MAX_CHARS = 64
"""Longest version string read; longer is garbage (and is not echoed back whole)."""

# X.Y.Z without leading zeros, then PEP 440's optional suffixes in their order (a dev build,
# 0.3.0.dev1, or a release candidate must still talk to its server). ASCII digits only.
_PATTERN = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"((?:a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[a-z0-9]+(?:\.[a-z0-9]+)*)?",
    re.ASCII,
)


@dataclass(frozen=True)
class Version:
    """A parsed version; `suffix` (rc1, .dev2, +local ...) is kept for display, never compared."""

    major: int
    minor: int
    patch: int
    suffix: str = ""

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}{self.suffix}"

    @property
    def series(self) -> str:
        """major.minor, e.g. "0.2": what the rule reads."""
        return f"{self.major}.{self.minor}"


def parse(text: str) -> Version:
    """`text` as a Version; ValueError saying what is wrong (quoting at most MAX_CHARS of it)."""
    match = _PATTERN.fullmatch(text) if len(text) <= MAX_CHARS else None
    if match is None:
        shown = repr(text[:MAX_CHARS]) + ("..." if len(text) > MAX_CHARS else "")
        raise ValueError(f"{shown} is not a version of the form X.Y.Z (e.g. 0.2.0)")
    major, minor, patch = (int(match.group(i)) for i in (1, 2, 3))
    return Version(major, minor, patch, "".join(g for g in match.groups()[3:] if g))


def _version(value: Version | str) -> Version:
    return value if isinstance(value, Version) else parse(value)


def serves(server: Version | str, client: Version | str) -> bool:
    """Whether a server of version `server` serves a client of version `client` (the rule above)."""
    s, c = _version(server), _version(client)
    if c.major != s.major:
        return False
    if s.major == 0:
        return c.minor == s.minor
    return c.minor <= s.minor


def served_clients(server: Version | str) -> str:
    """The clients `server` serves, as a pip requirement: ringfence==0.2.* or ringfence>=1.0,<1.4."""
    s = _version(server)
    if s.major == 0:
        return f"ringfence=={s.series}.*"
    return f"ringfence>={s.major}.0,<{s.major}.{s.minor + 1}"


def advice(server: Version | str, client: Version | str) -> str:
    """What to upgrade so that `server` serves `client`, with the pip command (meaningful only when
    it does not serve it)."""
    s, c = _version(server), _version(client)
    pin_client = f'pip install -U "ringfence=={s.series}.*"'
    if (c.major, c.minor) < (s.major, s.minor):
        return f"upgrade the client: {pin_client}"
    # Not merely ">= the client's version": a server of a later major (or, before 1.0, of a
    # later minor) would refuse this client too.
    wanted = f"=={c.series}.*" if c.major == 0 else f">={c.series},<{c.major + 1}"
    return (f'upgrade the server: pip install -U "ringfence-server{wanted}" '
            f"(or, until then, use a client it serves: {pin_client})")


def message(server: Version | str, client: Version | str) -> str:
    """The refusal a client reads: both versions, what the server serves, and what to upgrade."""
    s, c = _version(server), _version(client)
    return (f"this server (ringfence-server {s}) does not serve the client's version {c} "
            f"(it serves {served_clients(s)}): {advice(s, c)}")
