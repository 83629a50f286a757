"""What a child image pins (Debian packages, Python wheels) and what the lock records of them.

A spec names what the user asked for (`DebPin`, `WheelPin`); the lock records what was
installed (`LockedDeb`, `LockedWheel`): for packages that includes the dependencies the
resolver pulled in, each with the sha256 of the exact file, so a later fetch downloads these
files and no others, and a changed file is named rather than silently installed.

Hashes of files are bare lowercase hex, as Debian's Packages index and pip write them (image
IDs keep Docker's "sha256:" prefix).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.errors import ImageError

DEB_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")
# Debian policy 5.6.12: [epoch:]upstream[-revision]; no spaces, no wildcards.
DEB_VERSION = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~:-]*")
WHEEL_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
WHEEL_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


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


def _fields(doc: object, keys: tuple[str, ...], what: str) -> dict[str, str]:
    if not isinstance(doc, Mapping) or not all(isinstance(doc.get(k), str) for k in keys):
        raise ImageError(f"images.lock: a {what} entry needs string fields {', '.join(keys)}: {doc!r}")
    return {k: doc[k] for k in keys}


@dataclass(frozen=True)
class LockedDeb:
    """One installed .deb: the version, the file's sha256, and where the mirror keeps it."""

    name: str
    version: str
    architecture: str
    sha256: str
    filename: str  # the pool path in the mirror ("pool/main/j/jq/jq_1.6-2.1+deb12u2_amd64.deb")
    # Named in the spec's `packages` (False: pulled in as a dependency). Which pins a lock
    # entry's packages were resolved from, so that a rebuild reuses them exactly when the
    # pins (and the parent) are the same, whatever else in the spec changed.
    pinned: bool = False

    def __post_init__(self) -> None:
        if not SHA256_HEX.fullmatch(self.sha256):
            raise ImageError(f"images.lock: package {self.name}: sha256 {self.sha256!r} is not 64 hex digits")
        if self.filename.startswith("/") or ".." in self.filename.split("/"):
            raise ImageError(f"images.lock: package {self.name}: filename {self.filename!r} leaves the mirror")

    @property
    def cache_name(self) -> str:
        """debootstrap's cache naming (the epoch's ':' quoted), so the base's .debs and these
        share one folder without clashing."""
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.architecture}.deb"

    def __str__(self) -> str:
        return f"{self.name}={self.version}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "architecture": self.architecture,
                "sha256": self.sha256, "filename": self.filename, "pinned": self.pinned}

    @classmethod
    def from_json(cls, doc: object) -> LockedDeb:
        fields = _fields(doc, ("name", "version", "architecture", "sha256", "filename"), "package")
        pinned = doc.get("pinned", False) if isinstance(doc, Mapping) else False
        if not isinstance(pinned, bool):
            raise ImageError(f"images.lock: package {fields['name']}: pinned must be true or false")
        return cls(**fields, pinned=pinned)


@dataclass(frozen=True)
class LockedWheel:
    name: str
    version: str
    sha256: str
    filename: str  # the .whl's own name (its tags say which interpreters and platforms)

    def __post_init__(self) -> None:
        if not SHA256_HEX.fullmatch(self.sha256):
            raise ImageError(f"images.lock: wheel {self.name}: sha256 {self.sha256!r} is not 64 hex digits")
        if "/" in self.filename or not self.filename.endswith(".whl"):
            raise ImageError(f"images.lock: wheel {self.name}: bad filename {self.filename!r}")

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "sha256": self.sha256, "filename": self.filename}

    @classmethod
    def from_json(cls, doc: object) -> LockedWheel:
        return cls(**_fields(doc, ("name", "version", "sha256", "filename"), "wheel"))


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
