"""Deterministic docker-archive assembly: layer tars, image config, manifest.

Docker's image ID is the sha256 of the config JSON it was loaded with, and the config names
each layer by the sha256 of its uncompressed tar (`rootfs.diff_ids`). So the same tree gives
the same image ID only if every byte of the layer tar and of the config is a function of the
tree alone. Everything that usually leaks the build's circumstances is fixed here: entry order
(sorted by path), mtimes (one constant), owner names (empty: only numeric ids are kept), tar
format (PAX), and the config's `created` stamp and key order.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ringfence_server.sandbox.errors import ImageError

# SOURCE_DATE_EPOCH-style constant: 2024-01-01T00:00:00Z. Every mtime and `created` uses it.
EPOCH = 1704067200
CREATED = "2024-01-01T00:00:00Z"
TAR_FORMAT = tarfile.PAX_FORMAT
_CHUNK = 1024 * 1024


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _HashingWriter:
    """A write-only file that hashes what passes through it (so a layer is read once)."""

    def __init__(self, sink: BinaryIO) -> None:
        self._sink = sink
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, b: bytes) -> int:
        self._hash.update(b)
        self._sink.write(b)
        self.size += len(b)
        return len(b)

    def tell(self) -> int:  # tarfile asks where it starts
        return self.size

    # The rest of the file interface tarfile.open's `fileobj` is typed with. A stream being
    # written ("w" mode) is never read or sought, and tarfile does not close a file it was given.
    def read(self, size: int = -1, /) -> bytes:
        raise io.UnsupportedOperation("write-only")

    def seek(self, pos: int, /) -> int:
        raise io.UnsupportedOperation("not seekable")

    def close(self) -> None:
        pass  # the sink is the caller's to close

    @property
    def digest(self) -> str:
        return "sha256:" + self._hash.hexdigest()


@dataclass(frozen=True)
class Entry:
    """One tar member to write: where it goes and where its bytes (if any) come from."""

    name: str  # relative, no leading "/" or "./"
    kind: str  # "dir" | "file" | "symlink" | "hardlink"
    mode: int
    uid: int = 0
    gid: int = 0
    source: str | None = None  # host path of a regular file's contents
    linkname: str = ""
    size: int = 0


def tree_entries(root: Path, *, normalize: bool, owner: tuple[int, int] | None = None) -> list[Entry]:
    """List a directory tree as sorted tar entries.

    normalize=False (a root filesystem): keep each entry's mode and numeric owner, and write
    hard links as links. normalize=True (a spec's rootfs/ overlay, checked out by git with
    whatever umask and owner the checkout had): owner root, dirs 0755, files 0755 when any
    exec bit is set else 0644; __pycache__ and *.pyc are skipped. `owner` (uid, gid) replaces
    every entry's owner while keeping modes (unpacked .debs: their modes matter, and the build
    may not run as root).

    Sockets, FIFOs and device nodes are refused: an image has no business carrying them, and
    Docker creates /dev itself.
    """
    root = Path(root)
    if not root.is_dir():
        raise ImageError(f"{root} is not a directory")
    paths: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        if normalize:
            # Bytecode a local test run left in a checkout is not part of the spec (git
            # ignores it), so it must not make a local build differ from a clean one.
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            filenames = [f for f in filenames if not f.endswith((".pyc", ".pyo"))]
        rel = os.path.relpath(dirpath, root)
        for n in dirnames + filenames:
            paths.append(n if rel == "." else f"{rel}/{n}")
    # Byte order of the encoded path: a parent ("a") always sorts before its children ("a/b").
    paths.sort(key=os.fsencode)
    entries: list[Entry] = []
    first_of_inode: dict[tuple[int, int], str] = {}
    for rel in paths:
        full = root / rel
        st = os.lstat(full)
        mode = stat.S_IMODE(st.st_mode)
        uid, gid = (0, 0) if normalize else owner if owner is not None else (st.st_uid, st.st_gid)
        if stat.S_ISDIR(st.st_mode):
            entries.append(Entry(rel, "dir", 0o755 if normalize else mode, uid, gid))
        elif stat.S_ISLNK(st.st_mode):
            entries.append(Entry(rel, "symlink", 0o777, uid, gid, linkname=os.readlink(full)))
        elif stat.S_ISREG(st.st_mode):
            if normalize:
                mode = 0o755 if mode & 0o111 else 0o644
            key = (st.st_dev, st.st_ino)
            if not normalize and st.st_nlink > 1 and key in first_of_inode:
                entries.append(Entry(rel, "hardlink", mode, uid, gid, linkname=first_of_inode[key]))
                continue
            first_of_inode.setdefault(key, rel)
            entries.append(Entry(rel, "file", mode, uid, gid, source=str(full), size=st.st_size))
        else:
            raise ImageError(f"{full}: special files (device, FIFO, socket) cannot go in an image")
    return entries


def _tarinfo(entry: Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.name)
    info.mode = entry.mode
    info.uid, info.gid = entry.uid, entry.gid
    info.uname = info.gname = ""
    info.mtime = EPOCH
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif entry.kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, entry.linkname
    elif entry.kind == "hardlink":
        info.type, info.linkname = tarfile.LNKTYPE, entry.linkname
    elif entry.kind == "file":
        info.type, info.size = tarfile.REGTYPE, entry.size
    else:
        raise ImageError(f"unknown entry kind {entry.kind!r}")
    return info


def write_layer(entries: Iterable[Entry], out: BinaryIO) -> str:
    """Write `entries` as an uncompressed tar to `out`; return its digest (the layer diff_id)."""
    sink = _HashingWriter(out)
    with tarfile.open(fileobj=sink, mode="w", format=TAR_FORMAT, encoding="utf-8") as tar:
        for entry in entries:
            info = _tarinfo(entry)
            if entry.kind == "file":
                assert entry.source is not None
                with open(entry.source, "rb") as f:
                    # The size was taken at listing time; a file that changed since then would
                    # make a corrupt tar, so check rather than trust.
                    if os.fstat(f.fileno()).st_size != entry.size:
                        raise ImageError(f"{entry.source} changed while being archived")
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return sink.digest


def write_layer_file(entries: Iterable[Entry], layers_dir: Path) -> tuple[str, Path]:
    """Write a layer into a content-addressed cache dir: `<layers_dir>/<hex>.tar`."""
    layers_dir.mkdir(parents=True, exist_ok=True)
    tmp = layers_dir / f".tmp-{os.getpid()}.tar"
    try:
        with open(tmp, "wb") as f:
            diff_id = write_layer(entries, f)
        final = layers_dir / (diff_id.split(":", 1)[1] + ".tar")
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return diff_id, final


@dataclass(frozen=True)
class ContainerConfig:
    """The runtime part of an image config (Docker's `config` object)."""

    user: str = "10001:10001"
    workdir: str = "/tmp"
    env: tuple[tuple[str, str], ...] = ()
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    labels: tuple[tuple[str, str], ...] = ()
    exposed_ports: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ContainerConfig:
        def pair(item: str) -> tuple[str, str]:
            # An image config's Env items are "NAME=value" (to_json writes nothing else).
            name, value = item.split("=", 1)
            return name, value

        def pairs(items: Iterable[str]) -> tuple[tuple[str, str], ...]:
            return tuple(pair(i) for i in items)

        return cls(
            user=doc.get("User", ""),
            workdir=doc.get("WorkingDir", ""),
            env=pairs(doc.get("Env") or ()),
            entrypoint=tuple(doc["Entrypoint"]) if doc.get("Entrypoint") is not None else None,
            cmd=tuple(doc["Cmd"]) if doc.get("Cmd") is not None else None,
            labels=tuple(sorted((doc.get("Labels") or {}).items())),
            exposed_ports=tuple(sorted(doc.get("ExposedPorts") or {})),
        )

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"User": self.user, "WorkingDir": self.workdir}
        if self.env:
            doc["Env"] = [f"{k}={v}" for k, v in self.env]
        if self.entrypoint is not None:
            doc["Entrypoint"] = list(self.entrypoint)
        if self.cmd is not None:
            doc["Cmd"] = list(self.cmd)
        if self.labels:
            doc["Labels"] = dict(self.labels)
        if self.exposed_ports:
            doc["ExposedPorts"] = {p: {} for p in self.exposed_ports}
        return doc


def image_config(
    config: ContainerConfig,
    diff_ids: Iterable[str],
    history: Iterable[str],
    architecture: str = "amd64",
) -> bytes:
    """The image config bytes; their sha256 is the image ID."""
    diff_ids = list(diff_ids)
    history = list(history)
    if len(history) != len(diff_ids):
        # Docker refuses a config whose non-empty history outnumbers its layers.
        raise ImageError("one history line per layer is required")
    doc = {
        "architecture": architecture,
        "os": "linux",
        "created": CREATED,
        "config": config.to_json(),
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": CREATED, "created_by": h} for h in history],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def write_docker_archive(
    out: BinaryIO, config: bytes, layers: Iterable[Path], repo_tags: Iterable[str] = ()
) -> str:
    """Write a `docker load` archive (manifest.json format) and return the image ID."""
    image_id = digest_of(config)
    hexid = image_id.split(":", 1)[1]
    layer_names = []
    with tarfile.open(fileobj=out, mode="w", format=TAR_FORMAT) as tar:

        def add_bytes(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), EPOCH, 0o644
            tar.addfile(info, io.BytesIO(data))

        add_bytes(f"{hexid}.json", config)
        for path in layers:
            name = f"{Path(path).stem}/layer.tar"
            info = tarfile.TarInfo(Path(path).stem)
            info.type, info.mtime, info.mode = tarfile.DIRTYPE, EPOCH, 0o755
            tar.addfile(info)
            with open(path, "rb") as f:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = os.fstat(f.fileno()).st_size, EPOCH, 0o644
                tar.addfile(info, f)
            layer_names.append(name)
        manifest = [{"Config": f"{hexid}.json", "RepoTags": list(repo_tags), "Layers": layer_names}]
        add_bytes("manifest.json", json.dumps(manifest, sort_keys=True).encode())
    return image_id


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()
