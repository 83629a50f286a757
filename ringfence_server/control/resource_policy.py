"""Resource policy (admission step 4): paths under their roots, egress hosts on the allowlist.

It runs before any contextual rule, and its DENY is final: a policy rule can only narrow what
resource policy lets through, never widen it. Paths are checked twice: lexically (after
normalization, which removes `..`), and, where the root exists on this host (directly or via
the configured `inputs` mapping), with realpath, so a symlink inside the root cannot lead out.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ringfence_server.control.registry import ToolManifest
from ringfence_server.sandbox.egress.addresses import AddressClass, classify_address
from ringfence_server.sandbox.egress.allowlist import HostPattern, PatternError, host_allowed, intersect, parse_patterns

# Names that resolve to cloud metadata services; denied whatever the allowlist says.
METADATA_HOSTS = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data",
    "instance-data.ec2.internal", "metadata.azure.com", "metadata.packet.net",
})


@dataclass(frozen=True)
class ResourceDecision:
    allowed: bool
    reason: str = ""
    resolved: Mapping[str, str] | None = None
    """Path arguments as resolved container paths (for the audit trail)."""
    egress: tuple[str, ...] = ()
    """The call's egress allowlist: the tool's declared hosts that policy also grants."""


def call_allowlist(manifest: ToolManifest, granted: tuple[str, ...] | None) -> tuple[str, ...]:
    """What a call may reach: its tool's declared hosts AND what policy grants (None: the
    caller applies no policy narrowing). One `name:port` entry per port, canonical and sorted."""
    if not manifest.egress_hosts:
        return ()
    try:
        patterns: tuple[HostPattern, ...] = (
            intersect(manifest.egress_hosts, granted) if granted is not None else parse_patterns(manifest.egress_hosts)
        )
    except PatternError:
        return ()  # an entry the proxy could not enforce (an IP literal, say) opens nothing
    return tuple(sorted({f"{'*.' if p.wildcard else ''}{p.name}:{port}" for p in patterns for port in p.ports}))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def resolve_path(value: str, roots: tuple[str, ...], host_roots: Mapping[str, str]) -> tuple[str | None, str]:
    """Return (resolved container path, "") or (None, why it is denied)."""
    if not isinstance(value, str) or not value or "\0" in value:
        return None, "path must be a non-empty string without NUL"
    # Relative paths are relative to the first root, like the tool itself reads them.
    joined = value if value.startswith("/") else posixpath.join(roots[0], value)
    if "\\" in value:
        return None, "backslashes are not path separators here"
    lexical = posixpath.normpath(joined)
    if lexical.startswith("//"):
        lexical = "/" + lexical.lstrip("/")
    root = next((r for r in roots if _under(lexical, r)), None)
    if root is None:
        return None, f"{value!r} resolves to {lexical}, outside {', '.join(roots)}"
    host_root = host_roots.get(root, root)
    if os.path.isdir(host_root):
        # The root exists here: follow symlinks for real. A link inside the root pointing out
        # (or a `..` through a symlinked directory) is an escape even if the text looks fine.
        real_root = os.path.realpath(host_root)
        rel = posixpath.relpath(lexical, root)
        real = os.path.realpath(os.path.join(host_root, rel))
        if not _under(real, real_root):
            return None, f"{value!r} leaves {root} through a symbolic link"
        # Also resolve the raw text (before normalization) on the host: `a/../..` through a
        # symlinked `a` resolves differently from its lexical form.
        raw_rel = value[len(root):].lstrip("/") if value.startswith("/") else value
        real_raw = os.path.realpath(os.path.join(host_root, raw_rel))
        if not _under(real_raw, real_root):
            return None, f"{value!r} leaves {root} through a symbolic link"
    return lexical, ""


def _host_of(value: str) -> tuple[str, int] | None:
    """(host, port) of a URL or a bare `host[:port]` (https's 443 when no port is given)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        if "://" in value:
            parts = urlsplit(value)
            if parts.scheme.lower() not in ("http", "https"):
                return None
            host = parts.hostname
            port = parts.port or (80 if parts.scheme.lower() == "http" else 443)
        else:
            parts = urlsplit("//" + value)
            host, port = parts.hostname, parts.port or 443
    except ValueError:
        return None
    if not host:
        return None
    return host.rstrip(".").lower(), port


def _ip_forbidden(host: str) -> str:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        # Numeric forms the resolver would accept (0x7f.1, 2130706433, 127.1) are refused outright.
        if host.replace(".", "").replace("x", "").isalnum() and all(
            p.isdigit() or p.startswith("0x") for p in host.split(".")
        ):
            return f"{host} is a numeric address in a non-canonical form"
        return ""
    # The egress proxy's own classifier (IPv4-mapped, 6to4, NAT64 forms included).
    cls = classify_address(ip)
    if cls is not AddressClass.PUBLIC:
        return f"{host} is a {cls.value.replace('_', '-')} address"
    return f"{host} is an IP address: egress is allowlisted by host name only"


def check_host(host: str, port: int, allowed: tuple[str, ...]) -> str:
    """"" when `host:port` may be reached, else why not. Matching is the egress proxy's own
    (ringfence_server.sandbox.egress.allowlist), so admission and the proxy cannot disagree."""
    why = _ip_forbidden(host)
    if why:
        return why
    if host in METADATA_HOSTS or host.endswith(".internal") or host == "localhost" or host.endswith(".localhost"):
        return f"{host} is a metadata or local name"
    if host_allowed(host, port, allowed):
        return ""
    return f"{host}:{port} is not on the call's egress allowlist"


def check_resources(manifest: ToolManifest, arguments: Mapping[str, Any],
                    host_roots: Mapping[str, str] | None = None,
                    granted_egress: tuple[str, ...] | None = None) -> ResourceDecision:
    host_roots = host_roots or {}
    allowlist = call_allowlist(manifest, granted_egress)
    resolved: dict[str, str] = {}
    for arg, roots in manifest.paths.items():
        if arg not in arguments:
            continue
        path, why = resolve_path(arguments[arg], roots, host_roots)
        if path is None:
            return ResourceDecision(False, f"{arg}: {why}")
        resolved[arg] = path
    for arg in manifest.url_arguments:
        if arg not in arguments:
            continue
        target = _host_of(arguments[arg])
        if target is None:
            return ResourceDecision(False, f"{arg}: not an http(s) URL or host name")
        why = check_host(*target, allowlist)
        if why:
            return ResourceDecision(False, f"{arg}: {why}")
    return ResourceDecision(True, "", resolved, allowlist)
