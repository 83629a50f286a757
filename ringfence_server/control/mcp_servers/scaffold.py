"""`ringfence mcp-servers add NAME --package PKG==VERSION`: a third-party MCP server from PyPI,
as an image pinned by hash and the skeleton of its declaration.

1. Resolve. `pip download --only-binary=:all:` of PKG==VERSION with every dependency, for the
   image's interpreter rather than the host's (ringfence_server.imagebuild.wheels.Target, read
   from the package manifest of the root image the parent "base" starts from, as `ringfence
   images fetch` reads it). pip reads its usual configuration: PIP_INDEX_URL for a mirror, or
   PIP_NO_INDEX=1 with PIP_FIND_LINKS=DIR for a local wheelhouse (offline). Each downloaded
   wheel is pinned: name, version, sha256. Wheels only: a dependency published as an sdist
   alone is refused, naming it (pip's error).
2. The console script: `[console_scripts]` of the package's own wheel
   (`*.dist-info/entry_points.txt`). One is taken as it is; of several, --entry chooses.
3. Write, under the images dir and the servers dir:

       IMAGES/mcp-NAME/image.json       a child of "base": the wheels (every one, by hash: the
                                        images machinery installs them --no-deps), the Debian
                                        packages given with --debian (exact versions), tini as
                                        the entrypoint, uid 10001, workdir /tmp, HOME=/tmp
       IMAGES/mcp-NAME/rootfs/opt/ringfence/mcp_entry.py
                                        the launcher (LAUNCHER below): the image has no console
                                        scripts (a wheel's scripts name the build host's
                                        interpreter), so it finds the script's entry point in
                                        the wheels' metadata and calls it
       SERVERS/NAME/server.toml         the declaration's skeleton (write_declaration): the
                                        image, the command, no egress, no workspace, limits; no
                                        [tools.*] table until the server's tools are listed

   The image's name is mcp-NAME with "_" as "-" (image names take no underscore).
4. Fetch and build: `ringfence images fetch` and `build --update-lock mcp-NAME` on the images
   dir (the wheels just downloaded are put in its wheelhouse first, so fetch finds them), which
   pins the image in IMAGES/images.lock. The parent is read from a build cache or the engine,
   the built-in one's when "base" is built-in (ringfence_server.imagebuild.spec).

Refused with nothing written: a NAME not matching [a-z][a-z0-9_]{0,31}, an existing image or
server folder (unless --force, which writes the files again over it), an image name a built-in
image has, a package that pip cannot resolve to wheels, a package with no console script (or
several and no --entry).
"""

from __future__ import annotations

import configparser
import json
import math
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringfence_server.imagebuild.pins import WHEEL_NAME, WHEEL_VERSION, DebPin, normalize_wheel_name
from ringfence_server.imagebuild.pins import sha256_file as _sha256_file
from ringfence_server.imagebuild.spec import NAME as IMAGE_NAME
from ringfence_server.imagebuild.spec import load_specs, root_of
from ringfence_server.imagebuild.wheels import Target, target_from_packages
from ringfence_server.sandbox.errors import SandboxError
from ringfence_server.sandbox.pinned_images import IMAGES_DIR, is_builtin, lock_for

Progress = Callable[[str], None]

# A server's name, as the declaration's parser takes it (declaration.SERVER_NAME; a unit test
# keeps the two the same).
SERVER_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
SERVER_FILE = "server.toml"
PARENT = "base"
LAUNCHER_PATH = "opt/ringfence/mcp_entry.py"
COMMAND_PREFIX = ("python3", "-I", "-S", "-B", f"/{LAUNCHER_PATH}")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_LIMITS: Mapping[str, int | float] = {
    "memory_bytes": 268435456, "cpus": 0.5, "pids": 64, "timeout_s": 30, "stdout_limit": 1048576,
}
# The keys of a [tools.TOOL] table, in the order they are written (declaration._TOOL_KEYS).
TOOL_KEYS = ("mutates", "reversible", "cost", "expose", "description", "url_arguments", "paths")
_REQUIREMENT = re.compile(r"(?P<name>[^=<>!~\s\[\]]+)==(?P<version>[^=<>!~\s,;]+)")

LAUNCHER = '''"""Runs a console script of the wheels in /opt/ringfence/site: `ringfence mcp-servers add` wrote it.

    python3 -I -S -B /opt/ringfence/mcp_entry.py SCRIPT [ARG...]

The image has no console-script files (a wheel's scripts name the build host's interpreter), so
the entry point named SCRIPT is looked up in the wheels' metadata (group console_scripts) and
called with sys.argv = [SCRIPT, ARG...]; what it returns is the exit status.
"""

import sys

# After the standard library (-I -S: no site-packages, no script folder), so a wheel cannot
# shadow a standard module.
sys.path.append("/opt/ringfence/site")

from importlib.metadata import entry_points  # noqa: E402


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: mcp_entry.py SCRIPT [ARG...]")
    name = sys.argv[1]
    found = sorted(entry_points(group="console_scripts", name=name), key=lambda e: e.value)
    if not found:
        sys.exit(f"mcp_entry.py: no console script {name!r} in /opt/ringfence/site")
    script = found[0].load()
    sys.argv = [name, *sys.argv[2:]]
    sys.exit(script())


if __name__ == "__main__":
    main()
'''


class ScaffoldError(Exception):
    """Why the command stopped: one line."""


# -- the declaration: a tiny TOML writer ---------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_value(key)


def toml_value(value: object) -> str:
    """A TOML value: a basic string, an integer, a finite float, a boolean, or an array of them.

    A string is JSON's form of it, which is a valid TOML basic string, except that JSON leaves
    DEL (U+007F) as it is (TOML needs it escaped) and ensure_ascii would write a character past
    U+FFFF as a surrogate pair (TOML's \\u takes scalar values only): so non-ASCII is kept as
    UTF-8 and DEL escaped."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r}: a declaration holds finite numbers only")
        return repr(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{value!r} is not valid Unicode text: {e}") from e
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table (a tool's `paths`)
        return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=False)} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    raise ValueError(f"{value!r} ({type(value).__name__}): not a string, number, boolean, array or table")


def declaration_text(*, name: str, image: str, command: Sequence[str], egress_hosts: Sequence[str] = (),
                     workspace: str = "", runtime: str | None = None,
                     limits: Mapping[str, int | float] = DEFAULT_LIMITS,
                     tools: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """server.toml's text (write_declaration says what goes in)."""
    lines = [
        f"# MCP server {name}: `ringfence mcp-servers add` wrote this; docs/mcp-servers.md",
        f"name = {toml_value(name)}",
        f"image = {toml_value(image)}",
        f"command = {toml_value(list(command))}",
        f"egress_hosts = {toml_value(list(egress_hosts))}",
        f"workspace = {toml_value(workspace)}",
    ]
    if runtime is not None:
        lines.append(f"runtime = {toml_value(runtime)}")
    lines.append("[limits]")
    lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in limits.items()]
    text = "\n".join(lines) + "\n"
    return text + "".join(tool_table(tool, table) for tool, table in (tools or {}).items())


def tool_table(tool: str, table: Mapping[str, Any]) -> str:
    """One [tools.TOOL] table: the keys of TOOL_KEYS it has, in that order (None leaves a key
    out). A ValueError names an unknown key or a value TOML cannot hold as written here."""
    unknown = sorted(set(table) - set(TOOL_KEYS))
    if unknown:
        raise ValueError(f"tools.{tool}: unknown keys {unknown} (known: {', '.join(TOOL_KEYS)})")
    lines = [f"[tools.{toml_key(tool)}]"]
    lines += [f"{key} = {toml_value(table[key])}" for key in TOOL_KEYS if key in table and table[key] is not None]
    return "\n".join(lines) + "\n"


def write_declaration(folder: Path, *, name: str, image: str, command: Sequence[str],
                      egress_hosts: Sequence[str] = (), workspace: str = "",
                      tools: Mapping[str, Mapping[str, Any]] | None = None, runtime: str | None = None,
                      limits: Mapping[str, int | float] = DEFAULT_LIMITS) -> Path:
    """Write `folder`/server.toml (the folder is made if needed) and return its path.

    The keys in this order: name, image, command, egress_hosts, workspace (runtime when given),
    then [limits], then one [tools.TOOL] table per tool of `tools`, with the keys of TOOL_KEYS
    it has (mutates, reversible, cost, expose, description, url_arguments; None leaves a key
    out). A ValueError names a value TOML cannot hold as written here, before anything is
    written."""
    text = declaration_text(name=name, image=image, command=command, egress_hosts=egress_hosts,
                            workspace=workspace, runtime=runtime, limits=limits, tools=tools)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SERVER_FILE
    tmp = path.with_name(f".{SERVER_FILE}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


# -- names and the request --------------------------------------------------------------------------


def check_name(name: str) -> None:
    if not SERVER_NAME.fullmatch(name):
        raise ScaffoldError(f"{name!r} is not a server name: [a-z][a-z0-9_]{{0,31}} (its tools are NAME.TOOL)")


def image_name(name: str) -> str:
    return "mcp-" + name.replace("_", "-")


def parse_requirement(text: str) -> tuple[str, str]:
    """`PKG==VERSION` -> (PKG, VERSION): one exact version, no extras, no markers."""
    m = _REQUIREMENT.fullmatch(text.strip())
    if m is None or not WHEEL_NAME.fullmatch(m.group("name")) or not WHEEL_VERSION.fullmatch(m.group("version")):
        raise ScaffoldError(f"--package {text!r}: give one exact version, PKG==VERSION "
                            "(e.g. mcp-server-time==2026.10.19)")
    return m.group("name"), m.group("version")


def parse_debian(items: Iterable[str]) -> tuple[DebPin, ...]:
    """`--debian PKG=VERSION` values: exact Debian versions, each package at most once."""
    pins = []
    for item in items:
        try:
            pins.append(DebPin.parse(item, "--debian"))
        except SandboxError as e:
            raise ScaffoldError(f"{e} (e.g. git=1:2.39.5-0+deb12u3)") from e
    names = [p.name for p in pins]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ScaffoldError(f"--debian: given more than once: {', '.join(twice)}")
    return tuple(sorted(pins, key=lambda p: p.name))


@dataclass(frozen=True)
class Request:
    name: str
    package: str
    version: str
    images_dir: Path
    servers_dir: Path
    entry: str | None = None
    debian: tuple[DebPin, ...] = ()
    args: tuple[str, ...] = ()
    force: bool = False

    @property
    def image(self) -> str:
        return image_name(self.name)

    @property
    def spec_dir(self) -> Path:
        return Path(self.images_dir) / self.image

    @property
    def server_dir(self) -> Path:
        return Path(self.servers_dir) / self.name


def check_folders(req: Request) -> None:
    """The name, and the folders it would write: refused when they exist (unless force), or
    when the image's name is a built-in image's a user's dir would shadow."""
    check_name(req.name)
    if not IMAGE_NAME.fullmatch(req.image):
        raise ScaffoldError(f"{req.image!r} is not an image name ({IMAGE_NAME.pattern})")
    if not is_builtin(req.images_dir) and (IMAGES_DIR / req.image / "image.json").is_file():
        raise ScaffoldError(f"{req.image} is a built-in image, which a spec in {req.images_dir} would shadow: "
                            "choose another NAME")
    if not req.force:
        for folder in (req.spec_dir, req.server_dir):
            if folder.exists():
                raise ScaffoldError(f"{folder} exists: choose another NAME, or --force to write over it")


# -- the image's interpreter, and the wheels -----------------------------------------------------------


def target_for(images_dir: Path, parent: str = PARENT) -> Target:
    """The interpreter and platform of `parent`'s chain: from the package manifest its root
    image is pinned with, in the images dir's lock or the built-in one (as `images fetch`)."""
    try:
        builtin = is_builtin(images_dir)
        inherited = {} if builtin else load_specs(IMAGES_DIR)
        own = load_specs(images_dir, inherited)
        spec = own.get(parent) or inherited.get(parent)
        if spec is None:
            raise ScaffoldError(f"no image spec named {parent!r} in {images_dir} or among the built-in images")
        root = root_of(spec, own, inherited)
        lock = lock_for(images_dir, missing_ok=True)
        if root.name in own and own[root.name] is root:
            entry = lock.get(root.name) if lock.owns(root.name) else None
        else:
            entry = (lock.inherited or lock).get(root.name)
        if entry is None or not entry.packages:
            raise ScaffoldError(f"the root image {root.name} is not pinned with a package manifest: build it first "
                                "(`make images`, or `ringfence images build --update-lock`)")
        return target_from_packages(entry.packages, platform.machine())
    except SandboxError as e:
        raise ScaffoldError(str(e)) from e


def _pip_errors(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return " ".join(errors[:3] or lines[-2:]) or "no output"


def download(requirement: str, target: Target, dest: Path) -> list[Path]:
    """`pip download` of `requirement` and its dependencies for `target`, wheels only, into
    `dest`; the wheel files. No --index-url: pip's configuration and PIP_* variables apply."""
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--disable-pip-version-check",
           "--no-input", "--progress-bar", "off", *target.pip_args(), "--dest", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise ScaffoldError(f"pip download {requirement} for CPython {target.python} (glibc {target.glibc}, "
                            f"{target.machine}) failed: {_pip_errors(proc.stdout + proc.stderr)}")
    files = sorted(dest.glob("*.whl"))
    others = sorted(p.name for p in dest.iterdir() if p.suffix != ".whl")
    if others or not files:
        raise ScaffoldError(f"pip download {requirement}: expected wheels only, got {', '.join(others) or 'nothing'}")
    return files


@dataclass(frozen=True)
class Wheel:
    name: str  # normalized (PEP 503)
    version: str
    sha256: str
    path: Path = field(compare=False)

    def pin(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "sha256": self.sha256}


def pin_wheels(files: Iterable[Path], target: Target) -> list[Wheel]:
    """Name, version and sha256 of each wheel file (the name and version as the file names
    them: what the images machinery checks the file against), sorted by name."""
    out: dict[str, Wheel] = {}
    for path in files:
        parts = path.name[: -len(".whl")].split("-")
        if len(parts) not in (5, 6) or not target.accepts(path.name):
            raise ScaffoldError(f"{path.name}: not a wheel for CPython {target.python} on {target.machine} "
                                f"(glibc {target.glibc})")
        name = normalize_wheel_name(parts[0])
        if name in out:
            raise ScaffoldError(f"pip gave two wheels of {name}: {out[name].path.name} and {path.name}")
        out[name] = Wheel(name, parts[1], _sha256_file(path), path)
    return [out[n] for n in sorted(out)]


def console_scripts(wheel: Path) -> list[str]:
    """The `[console_scripts]` names in the wheel's `*.dist-info/entry_points.txt`, sorted."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            found = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith("/entry_points.txt")
                     and n.split("/")[0].endswith(".dist-info")]
            if not found:
                return []
            text = zf.read(found[0]).decode("utf-8")
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise ScaffoldError(f"{wheel.name}: cannot read its entry points: {e}") from e
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # names are case-sensitive
    try:
        parser.read_string(text)
    except configparser.Error as e:
        raise ScaffoldError(f"{wheel.name}: entry_points.txt does not parse: {e}") from e
    if not parser.has_section("console_scripts"):
        return []
    return sorted(parser.options("console_scripts"))


def choose_script(scripts: Sequence[str], entry: str | None, package: str) -> str:
    if entry is not None:
        if entry not in scripts:
            raise ScaffoldError(f"--entry {entry}: {package} has no such console script "
                                f"(it has: {', '.join(scripts) or 'none'})")
        return entry
    if not scripts:
        raise ScaffoldError(f"{package} declares no console script ([console_scripts] in its entry_points.txt): "
                            "there is nothing to run")
    if len(scripts) > 1:
        raise ScaffoldError(f"{package} has {len(scripts)} console scripts ({', '.join(scripts)}): "
                            "choose one with --entry")
    return scripts[0]


def package_wheel(wheels: Sequence[Wheel], package: str, version: str) -> Wheel:
    for w in wheels:
        if w.name == normalize_wheel_name(package):
            if w.version != version:
                raise ScaffoldError(f"pip gave {w.path.name} for {package}=={version}")
            return w
    raise ScaffoldError(f"pip gave no wheel of {package} itself")


# -- the image spec -------------------------------------------------------------------------------


def command(script: str, args: Sequence[str]) -> list[str]:
    return [*COMMAND_PREFIX, script, *args]


def image_spec(req: Request, script: str, wheels: Sequence[Wheel]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "description": f"MCP server {req.name}: {req.package}=={req.version} from its pinned wheels, "
                       f"run by its console script {script} (`ringfence mcp-servers add`).",
        "parent": PARENT,
        "entrypoint": ["/usr/bin/tini", "--"],
        "cmd": command(script, req.args),
        "user": "10001:10001",
        "workdir": "/tmp",
        # HOME: the sandbox's one writable place, for a server that keeps a file there.
        "env": {"HOME": "/tmp", "PATH": PATH},
        "labels": {"ringfence.image": req.image},
    }
    if req.debian:
        doc["packages"] = [str(p) for p in req.debian]
    doc["wheels"] = [w.pin() for w in wheels]
    return doc


def write_image(spec_dir: Path, doc: Mapping[str, Any]) -> list[Path]:
    launcher = spec_dir / "rootfs" / LAUNCHER_PATH
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(LAUNCHER, encoding="utf-8")
    spec = spec_dir / "image.json"
    spec.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return [spec, launcher]


def seed_wheelhouse(wheels: Iterable[Wheel], images_dir: Path) -> int:
    """Put the downloaded wheels where `images fetch` keeps them (the images dir's build cache,
    `<sha256>/<file>`), so it downloads none of them again; returns how many were new."""
    from ringfence_server.imagebuild.builder import Cache

    house = Cache(Path(images_dir) / ".build").wheels
    added = 0
    for w in wheels:
        home = house / w.sha256
        if (home / w.path.name).is_file():
            continue
        home.mkdir(parents=True, exist_ok=True)
        tmp = home / f".{w.path.name}.tmp"
        shutil.copyfile(w.path, tmp)
        tmp.replace(home / w.path.name)
        added += 1
    return added


# -- the whole command ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Added:
    image: str
    image_id: str
    script: str
    command: tuple[str, ...]
    wheels: tuple[Wheel, ...]
    written: tuple[Path, ...]
    lock: Path


def prepare(req: Request, work: Path, progress: Progress) -> tuple[str, list[Wheel]]:
    """Checks, resolution and the console script: nothing written outside `work`."""
    check_folders(req)
    target = target_for(req.images_dir)
    requirement = f"{req.package}=={req.version}"
    t0 = time.monotonic()
    progress(f"resolving {requirement} and its dependencies for CPython {target.python} "
             f"(glibc {target.glibc}, {target.machine}), wheels only ...")
    files = download(requirement, target, work)
    wheels = pin_wheels(files, target)
    progress(f"{len(wheels)} wheel(s) pinned by sha256 in {time.monotonic() - t0:.1f}s: "
             + ", ".join(f"{w.name}=={w.version}" for w in wheels))
    own = package_wheel(wheels, req.package, req.version)
    script = choose_script(console_scripts(own.path), req.entry, requirement)
    progress(f"console script: {script}")
    return script, wheels


def add(req: Request, progress: Progress | None = None, *, build: bool = True) -> Added:
    """The whole `mcp-servers add` (the module docstring). ScaffoldError before anything is
    written; a SandboxError from the images machinery after the files are written (they stay:
    rerun the fetch and build it names)."""
    from ringfence_server.imagebuild import builder

    progress = progress or (lambda _m: None)
    with tempfile.TemporaryDirectory(prefix="ringfence-mcp-add-") as tmp:
        script, wheels = prepare(req, Path(tmp), progress)
        cmd = command(script, req.args)
        written = write_image(req.spec_dir, image_spec(req, script, wheels))
        written.append(write_declaration(req.server_dir, name=req.name, image=req.image, command=cmd))
        for path in written:
            progress(f"wrote {path}")
        seeded = seed_wheelhouse(wheels, req.images_dir)
        progress(f"{seeded} wheel(s) added to {Path(req.images_dir) / '.build' / 'wheels'}")
    lock_path = lock_for(req.images_dir, missing_ok=True).path
    assert lock_path is not None  # lock_for always says where the lock is
    if not build:
        return Added(req.image, "", script, tuple(cmd), tuple(wheels), tuple(written), lock_path)
    progress(f"images fetch --images-dir {req.images_dir} ...")
    builder.fetch(images_dir=req.images_dir, progress=progress)
    progress(f"images build --images-dir {req.images_dir} --update-lock {req.image} ...")
    report = builder.build([req.image], update_lock=True, images_dir=req.images_dir, progress=progress)
    if not report.ok:
        blocked = f"; not built: {', '.join(report.blocked)}" if report.blocked else ""
        raise ScaffoldError(f"the build of {req.image} was not accepted{blocked}")
    lock = lock_for(req.images_dir)
    return Added(req.image, lock.image_id(req.image), script, tuple(cmd), tuple(wheels), tuple(written), lock_path)


def wheelhouse(requirements: Sequence[str], dest: Path, progress: Progress | None = None,
               images_dir: Path | None = None) -> list[Path]:
    """A flat folder of the wheels `requirements` need for the image's interpreter (every
    dependency): what PIP_FIND_LINKS with PIP_NO_INDEX=1 reads, to run `add` offline."""
    progress = progress or (lambda _m: None)
    target = target_for(images_dir if images_dir is not None else IMAGES_DIR)
    dest.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    for requirement in requirements:
        parse_requirement(requirement)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="ringfence-mcp-wheels-") as tmp:
            files = download(requirement, target, Path(tmp))
            pin_wheels(files, target)
            for f in files:
                if not (dest / f.name).is_file():
                    shutil.copyfile(f, dest / f.name)
                out.append(dest / f.name)
        progress(f"{requirement}: {len(files)} wheel(s) in {dest} ({time.monotonic() - t0:.1f}s)")
    return sorted(set(out))
