"""Image specs: `images/<name>/image.json` plus an optional `images/<name>/rootfs/` overlay.

A spec is data, so adding an image (say `images/egress-proxy/`) is a new folder, not new
Python. Two kinds exist:

- a root image (no "parent") is built from Debian packages with debootstrap; its spec names
  the suite, mirror and packages, and the unprivileged account to add;
- a child image ("parent": "<name>") is its parent's layers plus one layer made from its
  `rootfs/` folder, laid at `/` with normalized modes, owner root and the fixed mtime.

Config fields a child leaves out are inherited from its parent, as `FROM` would (labels
and exposed ports are merged). A child spec, e.g. `images/egress-proxy/image.json`:

    {
      "parent": "base",
      "entrypoint": ["/usr/bin/tini", "--"],
      "cmd": ["python3", "-I", "-S", "-B", "/opt/ringfence/proxy.py"],
      "user": "10001:10001",                       (inherited when left out)
      "workdir": "/tmp",                           (inherited when left out)
      "env": {"PATH": "/usr/bin:/bin"},            (replaces the parent's env when given)
      "labels": {"ringfence.image": "egress-proxy"},
      "exposed_ports": [3128],                     (ints mean tcp; or "53/udp")
      "files": {"opt/ringfence/x.py": "sandbox/x.py"}  (repository files laid into the image)
    }

with its files under `images/egress-proxy/rootfs/` (e.g. `rootfs/opt/ringfence/proxy.py`).
Then `ringfence images build --update-lock egress-proxy` pins it; no Python changes.

A child may also pin dependencies, each installed offline into a layer of its own (below its
rootfs/ layer, so its own files win):

    "packages": ["jq=1.6-2.1+deb12u2"],            exact Debian versions (ringfence_server.imagebuild.debs)
    "wheels": [{"name": "tabulate", "version": "0.9.0",
                "sha256": "024ca478df22e9340661486f85298cff5f6dcdba14f3813e8830015b9ed1948f"}]
                                                   exact files (ringfence_server.imagebuild.wheels), put in
                                                   /opt/ringfence/site, which the runner adds to
                                                   sys.path

`ringfence images fetch` downloads them (with the dependencies the packages need) into the
build cache; `build` installs from there and never touches the network for them.

A child of a tool image may lay tool packages (ringfence_server.control.toolpkg, docs/TOOLS.md) into its layer:

    "tools": ["../../tools/jq_table"]              package folders, relative to the folder
                                                   holding this image.json

Each folder's last part is the tool's name ([a-z][a-z0-9_]{0,63}, each at most once); its
`<name>.py` (a regular file, not a link) is laid at `/opt/ringfence/tools/<name>.py`, mode
0644, where the runner loads tools. Nothing else of the package is laid: not its manifest (the
control plane reads that from the package) and not its tests (`ringfence tools check` mounts
the package read-only beside the image to run them). The code is part of the layer, so of the
spec's inputs hash: a changed tool is a drifted image until it is rebuilt with --update-lock.
A path rootfs/ or `files` lays too is refused.

Images in the user's project
----------------------------
An images dir is a folder of `<name>/image.json` (+ rootfs/), its `images.lock`, and its
build cache `.build/`. The built-in one (ringfence_server.sandbox.pinned_images.IMAGES_DIR: the checkout's
images/, else the copy shipped in the wheel, or $RINGFENCE_IMAGES_DIR) is always there; a
user's own dir (`--images-dir DIR`, or `[images] dir` in the server's config) is layered over
it, with ONE search order for every name, a spec's parent as much as the image a tool's
manifest names at dispatch:

    1. the user's dir (its specs, and its images.lock),
    2. then the built-in dir (its specs, and its images.lock).

So a user's child may say `"parent": "tool"` and get the built-in tool image, and a user's
image of the same name as a built-in one shadows it everywhere (a dir of its own "base" is
self-contained, as the unit tests build); above a built-in image the chain stays built-in
(the built-in lock pinned "tool" on the built-in "base", whatever a user names "base"), and no
spec is its own parent. The user's lock holds the user's images only, each
child of a built-in image recording the built-in lock's ID of that parent: a user's build
never builds, retags or re-pins a built-in image; it reads the parent's layers from the
built-in build cache, else from the engine (`docker save` of the pinned ID), else asks for
`make images`. When ringfence's own lock moves (an upgrade re-pins "tool"), `verify` reports
the user's child as built on the old parent until it is rebuilt with --update-lock. A spec's
`files` resolve against the images dir's parent folder (the user's project, like the checkout
for the built-in images); Debian packages come from the suite and mirror of the root image
the chain starts from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ringfence_server.imagebuild.archive import ContainerConfig, tree_entries
from ringfence_server.imagebuild.pins import DebPin, WheelPin, normalize_wheel_name
from ringfence_server.sandbox.errors import ImageError

# Bump when the way images are assembled changes (cleaning rules, tar writer, config shape):
# it is part of every spec's input hash, so the change shows up as stale images.
BUILDER_VERSION = 2
# Bump when the way pinned packages or wheels are laid into their layers changes. Hashed only
# into specs that pin some, so adding the feature left every existing image's inputs as they were.
DEPS_VERSION = 1

NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")
_Pin = TypeVar("_Pin", DebPin, WheelPin)
_PORT = re.compile(r"\d{1,5}/(tcp|udp)")
_KEYS = {
    "parent", "debootstrap", "account", "entrypoint", "cmd", "user", "workdir", "env",
    "labels", "exposed_ports", "description", "files", "packages", "wheels", "tools",
}
# Where the runner loads a tool's code from (images/tool/rootfs/opt/ringfence/runner.py), and
# the names it accepts.
TOOLS_PATH = "opt/ringfence/tools"
TOOL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(frozen=True)
class Debootstrap:
    """How a root image's filesystem is made."""

    suite: str
    mirror: str
    include: tuple[str, ...]
    variant: str = "minbase"


@dataclass(frozen=True)
class Account:
    """The unprivileged user every sandbox runs as; written into passwd/group/shadow."""

    name: str = "sandbox"
    uid: int = 10001
    gid: int = 10001
    home: str = "/tmp"
    shell: str = "/usr/sbin/nologin"


@dataclass(frozen=True)
class ImageSpec:
    name: str
    directory: Path
    parent: str | None
    debootstrap: Debootstrap | None
    account: Account | None
    # Raw config fields as given (None = inherit from the parent, or Docker's default).
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    user: str | None = None
    workdir: str | None = None
    env: tuple[tuple[str, str], ...] | None = None
    labels: tuple[tuple[str, str], ...] = ()
    exposed_ports: tuple[str, ...] = ()
    # Files of the repository laid into the image: (path in the image, path in the repo). For
    # modules the host imports too (the egress proxy's), so the image and the tests run the
    # same file instead of a copy that can drift.
    files: tuple[tuple[str, str], ...] = ()
    # Children only: exact Debian packages and exact wheel files (see the module docstring).
    packages: tuple[DebPin, ...] = ()
    wheels: tuple[WheelPin, ...] = ()
    # Tool packages whose code this layer lays at /opt/ringfence/tools/<name>.py: the folders as
    # given in the spec (relative to its directory), sorted.
    tools: tuple[str, ...] = ()
    raw: bytes = field(default=b"", repr=False)

    @property
    def rootfs(self) -> Path:
        return self.directory / "rootfs"

    def tool_sources(self) -> list[tuple[str, Path]]:
        """(tool name, its code on the host) of each package in `tools`."""
        out = []
        for rel in self.tools:
            folder = Path(os.path.normpath(self.directory / rel))
            out.append((folder.name, folder / f"{folder.name}.py"))
        return out

    def lays_tool(self, name: str) -> Path | None:
        """The host file this image's own layer lays at /opt/ringfence/tools/<name>.py (from
        `tools`, `files` or rootfs/), or None when this layer lays no such file (a parent's
        may: see `ancestors`)."""
        target = f"{TOOLS_PATH}/{name}.py"
        for tool, source in self.tool_sources():
            if tool == name:
                return source
        for laid_at, repo_path in self.files:
            if laid_at == target:
                return self.directory.resolve().parent.parent / repo_path
        candidate = self.rootfs / target
        return candidate if candidate.is_file() else None

    @contextlib.contextmanager
    def overlay(self) -> Iterator[Path | None]:
        """The tree this image's layer is made of: rootfs/ plus `files` and the code of `tools`,
        staged in a temp dir when there are any (None when there is nothing at all)."""
        if not self.files and not self.tools:
            yield self.rootfs if self.rootfs.is_dir() else None
            return
        repo = self.directory.resolve().parent.parent
        where = f"images/{self.name}/image.json"
        with tempfile.TemporaryDirectory(prefix=f"ringfence-{self.name}-overlay-") as tmp:
            staged = Path(tmp) / "rootfs"
            if self.rootfs.is_dir():
                shutil.copytree(self.rootfs, staged, symlinks=True)
            staged.mkdir(exist_ok=True)
            laid = [(target, repo / source, f"files: {source}") for target, source in self.files]
            laid += [(f"{TOOLS_PATH}/{name}.py", code, f"tools: {rel}")
                     for rel, (name, code) in zip(self.tools, self.tool_sources(), strict=True)]
            for target, src, what in laid:
                if not src.is_file() or src.is_symlink():
                    raise ImageError(f"{where}: {what}: {src} is not a regular file")
                dest = staged / target
                if dest.exists():
                    raise ImageError(f"{where}: {what}: /{target} is also in rootfs/ (or laid twice)")
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest)
                os.chmod(dest, 0o644)
            yield staged

    def container_config(self, parent: ContainerConfig | None) -> ContainerConfig:
        base = parent or ContainerConfig(user="0:0", workdir="/", env=())
        labels = dict(base.labels)
        labels.update(self.labels)
        return ContainerConfig(
            user=self.user if self.user is not None else base.user,
            workdir=self.workdir if self.workdir is not None else base.workdir,
            env=self.env if self.env is not None else base.env,
            entrypoint=self.entrypoint if self.entrypoint is not None else base.entrypoint,
            cmd=self.cmd if self.cmd is not None else base.cmd,
            labels=tuple(sorted(labels.items())),
            exposed_ports=tuple(sorted(set(base.exposed_ports) | set(self.exposed_ports))),
        )

    def inputs_sha256(self) -> str:
        """Hash of everything in the repo this image is made from (not of the parent).

        The spec file's canonical JSON, and each overlay file's path, normalized mode and
        content: exactly what goes into the layer, so a `chmod` the layer ignores is no change.
        """
        h = hashlib.sha256()
        h.update(f"builder={BUILDER_VERSION}\n".encode())
        if self.packages or self.wheels:
            h.update(f"deps={DEPS_VERSION}\n".encode())
        h.update(json.dumps(json.loads(self.raw), sort_keys=True, separators=(",", ":")).encode())
        h.update(b"\n")
        with self.overlay() as tree:
            for e in tree_entries(tree, normalize=True) if tree is not None else ():
                h.update(f"{e.kind} {e.name} {e.mode:o} {e.linkname}\n".encode())
                if e.source:
                    with open(e.source, "rb") as f:
                        h.update(hashlib.sha256(f.read()).digest())
        return "sha256:" + h.hexdigest()


def _str_list(name: str, field_: str, value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ImageError(f"images/{name}/image.json: {field_} must be a list of strings")
    return tuple(value)


def _str_map(name: str, field_: str, value: object) -> tuple[tuple[str, str], ...] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ImageError(f"images/{name}/image.json: {field_} must map strings to strings")
    return tuple(sorted(value.items()))


def load_spec(directory: Path) -> ImageSpec:
    directory = Path(directory)
    name = directory.name
    if not NAME.fullmatch(name):
        raise ImageError(f"{directory}: image names must match {NAME.pattern}")
    path = directory / "image.json"
    try:
        raw = path.read_bytes()
        doc = json.loads(raw)
    except (OSError, ValueError) as e:
        raise ImageError(f"{path}: {e}") from e
    if not isinstance(doc, dict):
        raise ImageError(f"{path}: must be a JSON object")
    unknown = set(doc) - _KEYS
    if unknown:
        raise ImageError(f"{path}: unknown fields {sorted(unknown)}")
    parent = doc.get("parent")
    deb = acct = None
    if parent is None:
        d = doc.get("debootstrap")
        if not isinstance(d, dict) or not isinstance(d.get("suite"), str):
            raise ImageError(f"{path}: a root image (no parent) needs debootstrap.suite")
        deb = Debootstrap(
            suite=d["suite"],
            mirror=d.get("mirror", "http://deb.debian.org/debian"),
            include=_str_list(name, "debootstrap.include", d.get("include", [])) or (),
            variant=d.get("variant", "minbase"),
        )
        acct = Account(**doc["account"]) if "account" in doc else Account()
    else:
        if not isinstance(parent, str) or not NAME.fullmatch(parent) or parent == name:
            raise ImageError(f"{path}: parent must name another image")
        if "debootstrap" in doc or "account" in doc:
            raise ImageError(f"{path}: only a root image takes debootstrap/account")
    if parent is None and ("packages" in doc or "wheels" in doc or "tools" in doc):
        # A root image's packages are its debootstrap.include, installed by dpkg with their
        # maintainer scripts; pinned packages are for the layers above it.
        raise ImageError(f"{path}: packages/wheels/tools are for child images (a root image uses "
                         "debootstrap.include, and has no runner to load tools)")
    ports = doc.get("exposed_ports") or []
    ports = [f"{p}/tcp" if isinstance(p, int) else p for p in ports]
    if not all(isinstance(p, str) and _PORT.fullmatch(p) for p in ports):
        raise ImageError(f"{path}: exposed_ports are ints or 'N/tcp' / 'N/udp'")
    for key in ("user", "workdir"):
        if key in doc and not isinstance(doc[key], str):
            raise ImageError(f"{path}: {key} must be a string")
    return ImageSpec(
        name=name,
        directory=directory,
        parent=parent,
        debootstrap=deb,
        account=acct,
        entrypoint=_str_list(name, "entrypoint", doc.get("entrypoint")),
        cmd=_str_list(name, "cmd", doc.get("cmd")),
        user=doc.get("user"),
        workdir=doc.get("workdir"),
        env=_str_map(name, "env", doc.get("env")),
        labels=_str_map(name, "labels", doc.get("labels")) or (),
        exposed_ports=tuple(ports),
        files=_files(path, doc.get("files")),
        packages=_pins(path, doc.get("packages"), DebPin.parse, lambda p: p.name),
        wheels=_pins(path, doc.get("wheels"), WheelPin.parse, lambda p: normalize_wheel_name(p.name)),
        tools=_tools(path, doc.get("tools")),
        raw=raw,
    )


def _pins(path: Path, value: object, parse: Callable[[object, str], _Pin],
          key: Callable[[_Pin], str]) -> tuple[_Pin, ...]:
    """A list of pins, each name at most once (two versions of one package cannot both be)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ImageError(f"{path}: packages and wheels are lists")
    pins = [parse(item, str(path)) for item in value]
    names = [key(p) for p in pins]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ImageError(f"{path}: pinned more than once: {', '.join(twice)}")
    return tuple(sorted(pins, key=key))


def _tools(path: Path, value: object) -> tuple[str, ...]:
    """`tools`: ["../../tools/jq_table"]: relative folders whose last part is a tool name, each
    name at most once. Whether `<name>.py` is there is checked when the layer is made."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ImageError(f"{path}: tools must be a list of tool package folders")
    names: dict[str, str] = {}
    for rel in value:
        if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
            raise ImageError(f"{path}: tools: {rel!r} must be a folder relative to the spec's folder")
        name = Path(os.path.normpath(rel)).name
        if not TOOL_NAME.fullmatch(name):
            raise ImageError(f"{path}: tools: {rel!r}: the folder's name is the tool's name, "
                             f"which must match {TOOL_NAME.pattern}")
        if name in names:
            raise ImageError(f"{path}: tools: {names[name]!r} and {rel!r} are both tool {name!r}")
        names[name] = rel
    return tuple(sorted(value))


def _files(path: Path, value: object) -> tuple[tuple[str, str], ...]:
    """`files`: {"opt/x/y.py": "sandbox/x/y.py"}: relative paths on both sides, no `..`."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ImageError(f"{path}: files must map image paths to repository paths")
    out = []
    for target, source in sorted(value.items()):
        for p in (target, source):
            if not isinstance(p, str) or not p or p.startswith("/") or ".." in p.split("/"):
                raise ImageError(f"{path}: files: {p!r} must be a relative path without '..'")
        out.append((target, source))
    return tuple(out)


def load_specs(images_dir: Path, inherited: Mapping[str, ImageSpec] | None = None) -> dict[str, ImageSpec]:
    """Every `<images_dir>/*/image.json`, checked for unknown parents and cycles.

    `inherited`: the built-in specs a user's dir is layered over (see the module docstring);
    a parent is looked up in `images_dir` first, then there. Only `images_dir`'s own specs are
    returned."""
    images_dir = Path(images_dir)
    inherited = inherited or {}
    specs = {}
    for child in sorted(images_dir.iterdir()) if images_dir.is_dir() else ():
        if child.is_dir() and (child / "image.json").is_file():
            spec = load_spec(child)
            specs[spec.name] = spec
    for spec in specs.values():
        # Cycles are only possible among the user's own specs; ancestors() then walks them.
        seen = {spec.name}
        p = spec.parent
        while p is not None and p in specs:
            if p in seen:
                raise ImageError(f"images/{spec.name}: parent cycle through {p!r}")
            seen.add(p)
            p = specs[p].parent
        if p is not None and p not in inherited:
            raise ImageError(f"images/{spec.name}: parent {p!r} has no spec"
                             + (" here or among the built-in images" if inherited else ""))
    return specs


def ancestors(spec: ImageSpec, own: Mapping[str, ImageSpec],
              inherited: Mapping[str, ImageSpec]) -> list[tuple[ImageSpec, bool]]:
    """`spec`'s parent, grandparent, ... up to the root, each with whether it is the user's
    own (True) or built-in. The search order applies to each parent name, except that above a
    built-in image the chain stays built-in (the built-in lock pinned it on those parents)."""
    out: list[tuple[ImageSpec, bool]] = []
    here_own = spec.name in own and own[spec.name] is spec
    while (parent := spec.parent) is not None:
        if here_own and parent in own:
            spec = own[parent]
        elif parent in inherited:
            spec, here_own = inherited[parent], False
        else:
            raise ImageError(f"images/{spec.name}: parent {parent!r} has no spec")
        out.append((spec, here_own))
    return out


def root_of(spec: ImageSpec, own: Mapping[str, ImageSpec], inherited: Mapping[str, ImageSpec]) -> ImageSpec:
    """The root image (debootstrap) a chain of children starts from."""
    chain = ancestors(spec, own, inherited)
    return chain[-1][0] if chain else spec


def build_order(specs: dict[str, ImageSpec], names: list[str] | None) -> list[str]:
    """`names` (default: all) and their ancestors among `specs`, parents before children.
    (A parent outside `specs`, a built-in one under a user's dir, is not built here.)"""
    wanted = list(specs) if not names else list(names)
    for n in wanted:
        if n not in specs:
            raise ImageError(f"no image spec named {n!r} (known: {', '.join(sorted(specs))})")
    order: list[str] = []

    def visit(n: str) -> None:
        if n in order:
            return
        p = specs[n].parent
        if p is not None and p in specs:
            visit(p)
        order.append(n)

    for n in sorted(wanted):
        visit(n)
    return order
