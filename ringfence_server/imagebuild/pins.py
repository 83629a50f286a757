"""What a child image pins (Debian packages, Python wheels) and what the lock records of them.

A spec names what the user asked for (`DebPin`, `WheelPin`); the lock records what was
installed (`LockedDeb`, `LockedWheel`: declared with the lock in ringfence_server.sandbox.pinned_images, which
the runtime reads): for packages that includes the dependencies the resolver pulled in, each
with the sha256 of the exact file, so a later fetch downloads these files and no others, and a
changed file is named rather than silently installed. Hashes of files are bare lowercase hex.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ringfence_server.sandbox.errors import ImageError
from ringfence_server.sandbox.pinned_images import SHA256_HEX, LockedDeb, LockedWheel

DEB_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")
# Debian policy 5.6.12: [epoch:]upstream[-revision]; no spaces, no wildcards.
DEB_VERSION = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~:-]*")
WHEEL_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
WHEEL_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*")


def sha256_file(path: Path) -> str:
    """The bare hex sha256 of a file (read in chunks: .debs can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def normalize_wheel_name(name: str) -> str:
    """PEP 503: `Foo_Bar.baz` and `foo-bar-baz` are the same project."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class DebPin:
    """`"name=version"` in a spec's `packages`: an exact version, never a range."""

    name: str
    version: str

    @classmethod
    def parse(cls, text: object, where: str) -> DebPin:
        if not isinstance(text, str) or "=" not in text:
            raise ImageError(f"{where}: packages: {text!r} must be 'name=version' (an exact Debian version)")
        name, version = text.split("=", 1)
        if not DEB_NAME.fullmatch(name) or not DEB_VERSION.fullmatch(version):
            raise ImageError(f"{where}: packages: {text!r} is not 'name=version' (no ':arch', no wildcards)")
        return cls(name, version)

    def __str__(self) -> str:
        return f"{self.name}={self.version}"


@dataclass(frozen=True)
class WheelPin:
    """`{"name": ..., "version": ..., "sha256": ...}` in a spec's `wheels`: one exact file."""

    name: str
    version: str
    sha256: str

    @classmethod
    def parse(cls, doc: object, where: str) -> WheelPin:
        if not isinstance(doc, dict) or set(doc) != {"name", "version", "sha256"}:
            raise ImageError(f"{where}: wheels: each entry is exactly {{name, version, sha256}}, not {doc!r}")
        name, version, sha = doc["name"], doc["version"], doc["sha256"]
        if not isinstance(name, str) or not WHEEL_NAME.fullmatch(name):
            raise ImageError(f"{where}: wheels: bad name {name!r}")
        if not isinstance(version, str) or not WHEEL_VERSION.fullmatch(version):
            raise ImageError(f"{where}: wheels: {name}: bad version {version!r} (an exact version)")
        if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha):
            raise ImageError(f"{where}: wheels: {name}: sha256 must be 64 lowercase hex digits")
        return cls(name, version, sha)

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


def deps_diff(old_debs: Iterable[LockedDeb], new_debs: Iterable[LockedDeb],
              old_wheels: Iterable[LockedWheel], new_wheels: Iterable[LockedWheel]) -> list[str]:
    """Human lines naming each package or wheel that was added, removed, or changed version or
    file: '+libonig5=6.9.8-1', '-jq=1.6', ' jq 1.6 -> 1.7', ' jq sha256 ab12.. -> cd34..'."""
    lines: list[str] = []
    for kind, old, new in (("", {d.name: d for d in old_debs}, {d.name: d for d in new_debs}),
                           ("wheel ", {normalize_wheel_name(w.name): w for w in old_wheels},
                            {normalize_wheel_name(w.name): w for w in new_wheels})):
        for key in sorted(set(old) | set(new)):
            o, n = old.get(key), new.get(key)
            if n is None:
                lines.append(f"-{kind}{o}")
            elif o is None:
                lines.append(f"+{kind}{n}")
            elif o.version != n.version:
                lines.append(f" {kind}{n.name} {o.version} -> {n.version}")
            elif o.sha256 != n.sha256:
                lines.append(f" {kind}{n} sha256 {o.sha256[:12]}.. -> {n.sha256[:12]}..")
    return lines


def package_diff(old: tuple[str, ...], new: tuple[str, ...]) -> list[str]:
    """Human lines for how a package manifest changed: '+pkg=v', '-pkg=v', 'pkg a -> b'."""
    o = dict(p.split("=", 1) for p in old)
    n = dict(p.split("=", 1) for p in new)
    lines = []
    for pkg in sorted(set(o) | set(n)):
        if pkg not in n:
            lines.append(f"-{pkg}={o[pkg]}")
        elif pkg not in o:
            lines.append(f"+{pkg}={n[pkg]}")
        elif o[pkg] != n[pkg]:
            lines.append(f" {pkg} {o[pkg]} -> {n[pkg]}")
    return lines
