"""`ringfence images adopt NAME IMAGE`: admit an image built elsewhere (`docker build`) by ID.

Nothing here can rebuild such an image, so it is pinned by its ID alone and marked
`"reproducible": false` in the lock. Before it is pinned, and again at every `images verify`,
its filesystem and config are checked for what the sandbox relies on:

- user:    the default user is not root (uid 0, or group 0) and exists in the image's
           /etc/passwd (a named group in /etc/group): what a `docker run` of it would be;
- setuid:  no setuid-root or setgid-root file, and no file with capabilities
           (security.capability): no-new-privileges neuters them, but an image that needs one is
           not an image for a sandbox, and the battery's case must not depend on one flag;
- init:    PID 1 is an init that reaps and forwards signals: the entrypoint's program is tini
           (or tini-static), dumb-init or catatonit, and the file is there and executable;
- runner:  (--tool only) /opt/ringfence/runner.py is a regular file.

The filesystem is read without running anything from the image: a container is created
(labelled as ringfence's, never started), exported as a tar stream, and removed. Each failed
check is named in the refusal.
"""

from __future__ import annotations

import contextlib
import io
import posixpath
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.errors import EngineError, ImageError

if TYPE_CHECKING:
    from docker import DockerClient

INITS = frozenset({"tini", "tini-static", "dumb-init", "catatonit"})
RUNNER = "opt/ringfence/runner.py"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_CAP_XATTR = "SCHILY.xattr.security.capability"
_MAX_LINKS = 40


@dataclass(frozen=True)
class Check:
    name: str  # "user" | "setuid" | "init" | "runner"
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{self.name}: {'ok' if self.ok else 'FAILED'}: {self.detail}"


@dataclass(frozen=True)
class Inspection:
    image_id: str
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def describe(self) -> str:
        return "\n".join(f"    {c}" for c in self.checks)


@dataclass(frozen=True)
class _Node:
    kind: str  # "file" | "dir" | "symlink" | "other"
    mode: int
    linkname: str = ""


@dataclass(frozen=True)
class _Tree:
    nodes: dict[str, _Node]
    texts: dict[str, str]  # /etc/passwd and /etc/group, by image path
    setid_root: tuple[str, ...]
    capabilities: tuple[str, ...]

    def resolve(self, path: str) -> str | None:
        """`path` (absolute) with every symlink followed inside the image, or None."""
        parts = [p for p in path.split("/") if p]
        done: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            cur = "/".join([*done, part])
            node = self.nodes.get(cur)
            if node is None:
                return None
            if node.kind == "symlink":
                hops += 1
                if hops > _MAX_LINKS:
                    return None
                target = node.linkname
                if target.startswith("/"):
                    done = []
                parts = [p for p in target.split("/") if p] + parts
                continue
            done.append(part)
        return "/".join(done)


class _Stream:
    """A read-only file over docker-py's chunk generator, for tarfile's streaming mode ("r|"),
    which only reads; the rest is the file interface tarfile.open's `fileobj` is typed with."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""
        self._pos = 0

    def write(self, b: bytes, /) -> int:
        raise io.UnsupportedOperation("read-only")

    def seek(self, pos: int, /) -> int:
        raise io.UnsupportedOperation("not seekable")

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        pass  # the generator ends with the export

    def read(self, n: int = -1, /) -> bytes:
        while n < 0 or len(self._buf) < n:
            try:
                self._buf += next(self._chunks)
            except StopIteration:
                break
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        self._pos += len(out)
        return out


def _read_tree(stream: _Stream) -> _Tree:
    nodes: dict[str, _Node] = {}
    texts: dict[str, str] = {}
    setid: list[str] = []
    caps: list[str] = []
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            name = m.name
            while name.startswith(("./", "/")):
                name = name[2:] if name.startswith("./") else name[1:]
            name = name.rstrip("/")
            if not name:
                continue
            if m.isfile():
                nodes[name] = _Node("file", m.mode)
                if (m.mode & stat.S_ISUID and m.uid == 0) or (m.mode & stat.S_ISGID and m.gid == 0):
                    setid.append(f"/{name} ({'setuid' if m.mode & stat.S_ISUID else 'setgid'} "
                                 f"{m.uid}:{m.gid} {m.mode & 0o7777:04o})")
                if _CAP_XATTR in m.pax_headers:
                    caps.append(f"/{name}")
                if name in ("etc/passwd", "etc/group"):
                    f = tar.extractfile(m)
                    texts[name] = f.read().decode("utf-8", "replace") if f is not None else ""
            elif m.isdir():
                nodes[name] = _Node("dir", m.mode)
            elif m.issym():
                nodes[name] = _Node("symlink", m.mode, m.linkname)
            elif m.islnk():
                # Export writes a hard link to a path it already wrote: the same file.
                target = m.linkname.lstrip("./").lstrip("/")
                nodes[name] = nodes.get(target, _Node("file", m.mode))
            else:
                nodes[name] = _Node("other", m.mode)
    return _Tree(nodes, texts, tuple(sorted(setid)), tuple(sorted(caps)))


def _check_user(user: str, tree: _Tree) -> Check:
    if not user:
        return Check("user", False, "no default user is set, so the image runs as root: set USER to a non-root account")
    name, _, group = user.partition(":")
    passwd = [line.split(":") for line in tree.texts.get("etc/passwd", "").splitlines() if line.count(":") >= 6]
    groups = [line.split(":") for line in tree.texts.get("etc/group", "").splitlines() if line.count(":") >= 3]
    if "etc/passwd" not in tree.texts:
        return Check("user", False, f"the default user is {user!r} but the image has no regular file /etc/passwd")
    entry = next((f for f in passwd if (f[2] == name if name.isdigit() else f[0] == name)), None)
    if name in ("0", "root") or (entry is not None and entry[2] == "0"):
        return Check("user", False, f"the default user is {user!r}, which is root")
    if entry is None:
        return Check("user", False, f"the default user {name!r} has no entry in the image's /etc/passwd")
    if group:
        if group in ("0", "root"):
            return Check("user", False, f"the default group of {user!r} is root's")
        if not group.isdigit() and not any(g[0] == group for g in groups):
            return Check("user", False, f"the default group {group!r} has no entry in the image's /etc/group")
        gid = group if group.isdigit() else next(g[2] for g in groups if g[0] == group)
        if gid == "0":
            return Check("user", False, f"the default group of {user!r} is gid 0")
    return Check("user", True, f"{user} is {entry[0]} (uid {entry[2]}) in /etc/passwd")


def _check_setid(tree: _Tree) -> Check:
    bad = list(tree.setid_root) + [f"{p} (file capabilities)" for p in tree.capabilities]
    if bad:
        return Check("setuid", False, f"{len(bad)} privileged file(s): " + ", ".join(bad))
    return Check("setuid", True, "no setuid-root or setgid-root file, no file capabilities")


def _check_init(config: dict[str, Any], tree: _Tree) -> Check:
    entrypoint = list(config.get("Entrypoint") or [])
    if not entrypoint:
        return Check("init", False, "no entrypoint: the command itself would be PID 1 (use tini, dumb-init "
                                    "or catatonit as the ENTRYPOINT)")
    program = entrypoint[0]
    if program.startswith("/"):
        candidates = [program]
    else:
        env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
        candidates = [posixpath.join(d, program) for d in env.get("PATH", DEFAULT_PATH).split(":") if d]
    for candidate in candidates:
        resolved = tree.resolve(candidate)
        if resolved is None:
            continue
        node = tree.nodes.get(resolved)
        names = {posixpath.basename(candidate), posixpath.basename(resolved)}
        if node is None or node.kind != "file":
            return Check("init", False, f"the entrypoint {program} is not a regular file in the image")
        if not names & INITS:
            return Check("init", False, f"PID 1 would be {program}, not an init ({', '.join(sorted(INITS))})")
        if not node.mode & 0o111:
            return Check("init", False, f"the entrypoint {program} is not executable")
        return Check("init", True, f"PID 1 is {candidate}" + (f" (/{resolved})" if f"/{resolved}" != candidate else ""))
    return Check("init", False, f"the entrypoint {program} does not exist in the image")


def _check_runner(tree: _Tree) -> Check:
    resolved = tree.resolve("/" + RUNNER)
    node = tree.nodes.get(resolved) if resolved is not None else None
    if node is None or node.kind != "file":
        return Check("runner", False, f"/{RUNNER} is not a regular file in the image (a tool image runs it)")
    return Check("runner", True, f"/{RUNNER} is there")


def inspect(client: DockerClient, image_id: str, *, tool: bool) -> Inspection:
    """Run every check on the image with exactly this ID (never starting it)."""
    import docker.errors

    try:
        image = client.images.get(image_id)
    except docker.errors.ImageNotFound as e:
        raise ImageError(f"the engine has no image {image_id}") from e
    except docker.errors.DockerException as e:
        raise EngineError(f"engine failed to inspect {image_id}: {e}") from e
    if image.id != image_id:
        raise ImageError(f"{image_id} is not an image ID of the engine (it names {image.id})")
    config: dict[str, Any] = image.attrs.get("Config") or {}
    container = None
    try:
        # Created to be exported, never started: the entrypoint is replaced so that even a
        # mistaken start would run nothing of the image's.
        container = client.containers.create(
            image_id, entrypoint=["/ringfence-adopt-check-never-started"], command=[],
            network_disabled=True, labels=L.base_labels("adopt-check"),
        )
        # docker-stubs type export() as str; docker-py returns a generator of bytes chunks.
        chunks = cast(Iterator[bytes], iter(container.export(chunk_size=1 << 20)))
        tree = _read_tree(_Stream(chunks))
    except docker.errors.DockerException as e:
        raise EngineError(f"cannot read the filesystem of {image_id}: {e}") from e
    except tarfile.TarError as e:
        raise ImageError(f"the exported filesystem of {image_id} is not a tar stream: {e}") from e
    finally:
        if container is not None:
            # Labelled: the reaper removes what could not be removed here.
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)
    checks = [_check_user(config.get("User") or "", tree), _check_setid(tree), _check_init(config, tree)]
    if tool:
        checks.append(_check_runner(tree))
    return Inspection(image_id, tuple(checks))


def resolve_ref(client: DockerClient, ref: str) -> str:
    """The full ID of an image given by ID, ID prefix or tag (the ID is what gets pinned)."""
    import docker.errors

    try:
        image_id = client.images.get(ref).id
    except docker.errors.ImageNotFound as e:
        raise ImageError(f"the engine has no image {ref!r} (nothing is pulled: build or load it first)") from e
    except docker.errors.DockerException as e:
        raise EngineError(f"engine failed to inspect {ref}: {e}") from e
    if image_id is None:
        raise ImageError(f"the engine gave no ID for {ref!r}")
    return image_id


def adopt(client: DockerClient, name: str, ref: str, *, tool: bool, images_dir: str | Path | None = None,
          lock_path: str | Path | None = None) -> tuple[Inspection, Path | None]:
    """Check the image `ref` names and, if every check passes, pin its ID as `name` in the
    images dir's lock (not reproducible). Returns the inspection and the lock written (None
    when refused: the lock is then untouched)."""
    from ringfence_server.imagebuild.spec import NAME, load_specs
    from ringfence_server.sandbox.pinned_images import IMAGES_DIR, LockEntry, is_builtin, lock_for

    if not NAME.fullmatch(name):
        raise ImageError(f"image names must match {NAME.pattern}: {name!r}")
    inherited = {} if is_builtin(images_dir) else load_specs(IMAGES_DIR)
    own = load_specs(Path(images_dir) if images_dir is not None else IMAGES_DIR, inherited)
    if name in own or name in inherited:
        # One name, one image: a spec's name is what `images build` pins and children name.
        raise ImageError(f"{name!r} is the name of an image spec; adopt under another name")
    lock = lock_for(images_dir, lock_path, missing_ok=True)
    if lock.owns(name) and (prior := lock.get(name)) is not None and prior.reproducible:
        raise ImageError(f"{name!r} is pinned in {lock.path} as a built image; adopt under another name")
    image_id = resolve_ref(client, ref)
    inspection = inspect(client, image_id, tool=tool)
    if not inspection.ok:
        return inspection, None
    written = lock.with_entry(LockEntry(name, image_id, image_id, reproducible=False, tool=tool)).write()
    return inspection, written
