"""Python wheels a child image pins: fetched with pip into a wheelhouse, installed offline.

Fetch (`ringfence images fetch`): for each pinned wheel not yet in the wheelhouse,
`pip download --only-binary=:all: --no-deps --require-hashes` of exactly `name==version
--hash=sha256:...`, for the image's interpreter and platform rather than the host's
(`--python-version 3.11 --implementation cp --abi cp311`, and one `--platform` per manylinux tag
the image's glibc runs: `manylinux_2_36_x86_64`, `manylinux_2_35_x86_64`, ... down to
`manylinux_2_17_x86_64`, then the legacy aliases `manylinux2014_x86_64`, `manylinux2010_x86_64`
and `manylinux1_x86_64`; the version and the glibc are the ones the root image's package manifest
names. pip takes exactly the platforms given, not the older ones a newer glibc also runs, so
each is listed; pure-python wheels match any). pip reads its usual configuration (an index
mirror, a proxy, PIP_NO_INDEX and PIP_FIND_LINKS for a local wheelhouse), so a user's index
works; the hash decides what is accepted, not where it came from. Dependencies are not followed
(--no-deps): every wheel the tool needs is listed, each with its hash. The file is kept as
`<wheelhouse>/<sha256>/<file>.whl`, so two files of one name never clash.

Install (the build, no network, no pip): each wheel's sha256 is checked against the pin (a
mismatch refuses the build, naming the wheel), then its archive is unpacked into
`/opt/ringfence/site` in one layer, as an installer would with --no-compile: the package files
and the .dist-info (so importlib.metadata finds them); `.data/purelib` and `.data/platlib` join
them; `.data/scripts`, `headers` and `data` are left out (a tool imports modules; a console
script's shebang would name the build host's interpreter). Owner root, mode 0644 (0755 when the
archive marks a file executable), the fixed mtime: the same wheels give the same layer whatever
pip version the host has, which is why pip itself does not do this step. The runner puts
/opt/ringfence/site on sys.path (after the standard library, so a wheel cannot shadow it).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ringfence_server.imagebuild.pins import WheelPin, normalize_wheel_name, sha256_file
from ringfence_server.sandbox.errors import ImageError
from ringfence_server.sandbox.pinned_images import LockedWheel

SITE = "opt/ringfence/site"
Progress = Callable[[str], None]
# The manylinux tags of PEP 513/571/599, by the glibc each stands for (PEP 600 names them manylinux_2_X).
_LEGACY_MANYLINUX = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}
# PEP 427: {distribution}-{version}(-{build tag})?-{python tag}-{abi tag}-{platform tag}.whl
_WHEEL_FILE = re.compile(r"(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?"
                         r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl")


@dataclass(frozen=True)
class Target:
    """The interpreter and platform wheels are chosen for: the image's, not the host's."""

    python: str  # "3.11"
    machine: str  # "x86_64"
    glibc: str  # "2.36"

    @property
    def nodot(self) -> str:
        return self.python.replace(".", "")

    @property
    def glibc_version(self) -> tuple[int, int]:
        major, minor = self.glibc.split(".")[:2]
        return int(major), int(minor)

    def platforms(self) -> list[str]:
        """Every manylinux platform tag this glibc runs, newest first: pip accepts exactly the
        `--platform`s it is given (a manylinux_2_36 target does not take a manylinux_2_17 wheel
        on its own), so each one is named: manylinux_2_N for N from the glibc's minor down to 17
        (PEP 600), then the legacy aliases manylinux2014 (2.17), manylinux2010 (2.12) and
        manylinux1 (2.5)."""
        major, minor = self.glibc_version
        tags = [f"manylinux_{major}_{n}_{self.machine}" for n in range(minor, 16, -1)] if major == 2 else []
        tags += [f"{legacy}_{self.machine}" for legacy, needs in _LEGACY_MANYLINUX.items()
                 if (major, minor) >= needs]
        return tags

    def pip_args(self) -> list[str]:
        args = ["--python-version", self.python, "--implementation", "cp", "--abi", f"cp{self.nodot}"]
        for tag in self.platforms():
            args += ["--platform", tag]
        return args

    def accepts(self, filename: str) -> bool:
        """Whether a wheel's tags fit this interpreter (what pip checked when it chose it)."""
        m = _WHEEL_FILE.fullmatch(filename)
        if m is None:
            return False
        pys, abis, plats = (set(m.group(k).split(".")) for k in ("py", "abi", "plat"))
        major = self.python.split(".")[0]
        py_ok = bool(pys & {f"py{major}", f"py{self.nodot}", f"cp{self.nodot}"}) or (
            "abi3" in abis and any(p.startswith(f"cp{major}") and p[2:].isdigit() and int(p[2:]) <= int(self.nodot)
                                   for p in pys))
        abi_ok = bool(abis & {"none", "abi3", f"cp{self.nodot}"})
        plat_ok = "any" in plats or any(self._runs(p) for p in plats)
        return py_ok and abi_ok and plat_ok

    def _runs(self, plat: str) -> bool:
        """Whether a manylinux platform tag (PEP 600, or a legacy alias) runs on this glibc."""
        if not plat.endswith(f"_{self.machine}"):
            return False
        tag = plat[: -len(self.machine) - 1]
        if tag in _LEGACY_MANYLINUX:
            return _LEGACY_MANYLINUX[tag] <= self.glibc_version
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)", tag)
        return m is not None and (int(m.group(1)), int(m.group(2))) <= self.glibc_version


def target_from_packages(packages: Iterable[str], machine: str) -> Target:
    """The image's Python and glibc, read from the root image's package manifest
    ("python3.11-minimal=...", "libc6=2.36-9+deb12u14")."""
    python = glibc = None
    for line in packages:
        name, _, version = line.partition("=")
        if m := re.fullmatch(r"python(3\.\d+)-minimal", name):
            python = m.group(1)
        elif name.split(":", 1)[0] == "libc6":
            glibc = ".".join(version.split(":")[-1].split("-")[0].split(".")[:2])
    if python is None or glibc is None:
        raise ImageError("the root image's package manifest names no python3.X-minimal or libc6: "
                         "wheels need the base's Python")
    return Target(python, machine, glibc)


def in_wheelhouse(pin: WheelPin, wheelhouse: Path) -> Path | None:
    found = sorted((wheelhouse / pin.sha256).glob("*.whl")) if (wheelhouse / pin.sha256).is_dir() else []
    return found[0] if found else None


def fetch(pin: WheelPin, wheelhouse: Path, target: Target, progress: Progress | None = None) -> Path:
    """The pinned wheel in the wheelhouse, downloaded by pip unless already there."""
    progress = progress or (lambda _m: None)
    have = in_wheelhouse(pin, wheelhouse)
    if have is not None and sha256_file(have) == pin.sha256:
        return have
    with tempfile.TemporaryDirectory(prefix="ringfence-wheel-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{pin.name}=={pin.version} --hash=sha256:{pin.sha256}\n")
        dest = Path(tmp) / "dl"
        cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps", "--require-hashes",
               "--disable-pip-version-check", "--no-input", "--dest", str(dest), *target.pip_args(), "-r", str(req)]
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        files = sorted(dest.glob("*.whl")) if dest.is_dir() else []
        if proc.returncode != 0 or len(files) != 1:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
            raise ImageError(f"wheel {pin}: pip download (sha256 {pin.sha256}) failed:\n{tail}")
        got = sha256_file(files[0])
        if got != pin.sha256:  # pip checked it; checked again because the lock trusts this file
            raise ImageError(f"wheel {pin}: downloaded {files[0].name} has sha256 {got}, the pin says {pin.sha256}")
        _check_names(pin, files[0].name, target)
        home = wheelhouse / pin.sha256
        home.mkdir(parents=True, exist_ok=True)
        final = home / files[0].name
        shutil.move(str(files[0]), final)
    progress(f"wheel {pin}: {final.name}")
    return final


def _check_names(pin: WheelPin, filename: str, target: Target) -> None:
    m = _WHEEL_FILE.fullmatch(filename)
    if m is None or normalize_wheel_name(m.group("name")) != normalize_wheel_name(pin.name) \
            or m.group("version") != pin.version:
        raise ImageError(f"wheel {pin}: the file with sha256 {pin.sha256} is {filename}, not {pin}")
    if not target.accepts(filename):
        raise ImageError(f"wheel {pin}: {filename} does not run on CPython {target.python} {target.machine}")


def cached(pin: WheelPin, wheelhouse: Path, target: Target) -> tuple[LockedWheel, Path]:
    """The pinned wheel for an offline install; a file that is missing or not the pinned one
    refuses the build, naming the wheel."""
    path = in_wheelhouse(pin, wheelhouse)
    if path is None:
        others = [p.name for p in wheelhouse.glob("*/*.whl")
                  if normalize_wheel_name(p.name.split("-")[0]) == normalize_wheel_name(pin.name)]
        hint = f" (the wheelhouse has {', '.join(sorted(others))} under other hashes)" if others else ""
        raise ImageError(f"wheel {pin}: no file with sha256 {pin.sha256} in {wheelhouse}{hint}: "
                         "run `ringfence images fetch`")
    got = sha256_file(path)
    if got != pin.sha256:
        raise ImageError(f"wheel {pin}: {path} has sha256 {got}, the pin says {pin.sha256}: refusing it")
    _check_names(pin, path.name, target)
    return LockedWheel(pin.name, pin.version, pin.sha256, path.name), path


def _member_path(name: str, where: str) -> str:
    if name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in name.rstrip("/").split("/")):
        raise ImageError(f"{where}: member {name!r} is not a plain relative path")
    return name.rstrip("/")


def install(wheels: Iterable[tuple[LockedWheel, Path]], staging: Path) -> tuple[str, ...]:
    """Unpack the wheels into `staging`/opt/ringfence/site; returns what was left out."""
    site = staging / SITE
    site.mkdir(parents=True, exist_ok=True)
    owner: dict[str, str] = {}
    skipped: list[str] = []
    for wheel, path in sorted(wheels, key=lambda w: normalize_wheel_name(w[0].name)):
        try:
            with zipfile.ZipFile(path) as zf:
                for info in sorted(zf.infolist(), key=lambda i: i.filename):
                    rel = _member_path(info.filename, str(wheel))
                    parts = rel.split("/")
                    if parts[0].endswith(".data") and len(parts) > 1:
                        if parts[1] not in ("purelib", "platlib"):
                            skipped.append(f"{wheel}: {rel}")
                            continue
                        parts = parts[2:]
                        if not parts:
                            continue
                        rel = "/".join(parts)
                    mode = info.external_attr >> 16
                    if stat.S_ISLNK(mode):
                        raise ImageError(f"wheel {wheel}: {rel} is a symlink; wheels hold files")
                    dest = site / rel
                    if info.is_dir():
                        dest.mkdir(parents=True, exist_ok=True)
                        continue
                    if rel in owner:
                        raise ImageError(f"{SITE}/{rel} is in both wheel {owner[rel]} and wheel {wheel}")
                    owner[rel] = str(wheel)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(info) as src, open(dest, "xb") as out:
                        shutil.copyfileobj(src, out)
                    os.chmod(dest, 0o755 if mode & 0o111 else 0o644)
        except (OSError, zipfile.BadZipFile) as e:
            raise ImageError(f"wheel {wheel}: cannot unpack {path}: {e}") from e
    return tuple(skipped)
