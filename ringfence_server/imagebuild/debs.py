"""Debian packages a child image pins: resolved and fetched once, installed offline without dpkg.

Fetch (`ringfence images fetch`, the only step that talks to the mirror):

1. The index. The root image's suite and mirror (the chain's debootstrap spec) give
   `dists/<suite>/InRelease`, checked with gpgv against Debian's archive keyring (as debootstrap
   does); the signed text gives the sha256 of `main/binary-<arch>/Packages.xz`, which is then
   downloaded and checked. Only `main` of that one suite is read: the suite the base was
   debootstrapped from, so a package and the parent's libraries come from the same release.
2. The resolution. What the parent already has is its lock: the root image's package manifest
   (`packages`, every "name=version" dpkg had installed) plus the `debs` of each child in
   between. Each pinned "name=version" must be in the index at exactly that version. Then its
   Pre-Depends and Depends, clause by clause: a clause (alternatives joined by "|") is met when
   the parent or a package already chosen satisfies one alternative, by name and version
   (dpkg's version order) or by a Provides of the index's stanza of that package; otherwise
   the first alternative the index can satisfy is chosen and its own dependencies followed in
   turn. Recommends and Suggests are not followed (apt --no-install-recommends). A virtual name
   with several providers, a package the parent has at another version (installing would
   replace files of a package the parent's dpkg database still lists), and a Conflicts or
   Breaks against what is installed or chosen are refused, each naming the packages.
3. The files. Each chosen .deb is downloaded from the mirror's pool and checked against the
   index's sha256, into the build cache's `debs/` (the folder debootstrap keeps the base's
   .debs in, with its naming). The lock records each with version, sha256 and pool path, so a
   later fetch for an unchanged spec downloads exactly those files and resolves nothing.

Install (the build, no network): every .deb of the image is checked against its recorded
sha256, then unpacked, the way distroless lays packages, into one layer:

- data.tar's files, in package-name order; a path shipped by two packages is refused;
- merged /usr: paths under /bin, /sbin, /lib* go to /usr/... (the base is usr-merged, and a
  layer holding a real /bin directory would hide the base's /bin -> usr/bin symlink);
- owner root:root for everything, permission bits as packaged minus setuid/setgid (the base is
  scrubbed of them too), the fixed mtime of every layer; docs, man pages, info and translations
  are left out, as in the base;
- /var/lib/dpkg/status.d/<package>: the package's control stanza, where scanners (syft, trivy)
  look for distroless packages. dpkg's own database (/var/lib/dpkg/status) is the parent's and
  is not changed, so `dpkg -l` in the image does not list these packages.

Maintainer scripts (preinst, postinst, triggers) do NOT run: nothing is configured, no
alternatives symlink is made, no user is added, ld.so.cache is not regenerated (libraries in
the multiarch directories load anyway: they are on the loader's built-in path). A package that
only works once its postinst has run will not work; the build lists the packages whose scripts
were skipped. Running them would need a chroot and root, and would make the layer depend on
what the scripts do on the build host.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import hashlib
import io
import lzma
import os
import platform
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

from ringfence_server.imagebuild.pins import DebPin, sha256_file
from ringfence_server.sandbox.errors import ImageError
from ringfence_server.sandbox.pinned_images import LockedDeb

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
COMPONENT = "main"
TIMEOUT_S = 120
# Merged /usr: these top-level names are symlinks into /usr in the base.
_MERGED = frozenset({"bin", "sbin", "lib", "lib32", "lib64", "libx32"})
# Left out of the layer, as rootfs.clean empties them in the base.
_PRUNED = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian")
_SCRIPTS = ("preinst", "postinst", "prerm", "postrm", "config", "triggers")

Progress = Callable[[str], None]


# -- versions (dpkg's order: lib/dpkg/version.c) -------------------------------------------------


def _order(c: str) -> int:
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    if c == "~":
        return -1
    return ord(c) + 256


def _verrevcmp(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i, j = i + 1, j + 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def _split_version(v: str) -> tuple[int, str, str]:
    epoch, _, rest = v.rpartition(":") if ":" in v else ("0", "", v)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
    return int(epoch or 0), upstream, revision


def compare_versions(a: str, b: str) -> int:
    """<0, 0, >0 as Debian version `a` sorts before, equal to, after `b`."""
    ea, ua, ra = _split_version(a)
    eb, ub, rb = _split_version(b)
    if ea != eb:
        return -1 if ea < eb else 1
    c = _verrevcmp(ua, ub) or _verrevcmp(ra, rb)
    return (c > 0) - (c < 0)


_OPS: dict[str, Callable[[int], bool]] = {
    "<<": lambda c: c < 0, "<=": lambda c: c <= 0, "=": lambda c: c == 0,
    ">=": lambda c: c >= 0, ">>": lambda c: c > 0,
    "<": lambda c: c <= 0, ">": lambda c: c >= 0,  # obsolete spellings of <= and >=
}


# -- the index -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alt:
    """One alternative of a dependency clause: `name (op version)`."""

    name: str
    op: str | None = None
    version: str | None = None

    def allows(self, version: str | None) -> bool:
        """Whether a package (or a Provides, whose version may be None) at `version` meets it."""
        if self.op is None or self.version is None:
            return True
        if version is None:  # an unversioned Provides never meets a versioned dependency
            return False
        return _OPS[self.op](compare_versions(version, self.version))

    def __str__(self) -> str:
        return self.name if self.op is None else f"{self.name} ({self.op} {self.version})"


Clause = tuple[Alt, ...]
_ALT = re.compile(r"\s*([a-z0-9][a-z0-9+.-]*)(?::[a-z0-9-]+)?\s*"
                  r"(?:\(\s*(<<|<=|=|>=|>>|<|>)\s*([^)\s]+)\s*\))?\s*(?:<[^>]*>\s*)*$")


def parse_relations(text: str) -> tuple[Clause, ...]:
    """`a (>= 1) | b, c` -> ((a>=1, b), (c,))."""
    clauses: list[Clause] = []
    for part in text.split(","):
        if not part.strip():
            continue
        alts = []
        for alt in part.split("|"):
            m = _ALT.match(alt)
            if m is None:
                raise ImageError(f"cannot parse the package relation {alt.strip()!r}")
            alts.append(Alt(m.group(1), m.group(2), m.group(3)))
        clauses.append(tuple(alts))
    return tuple(clauses)


@dataclass(frozen=True)
class Stanza:
    """One package of the Packages index, with the fields resolution and download need.
    Relations are parsed when first asked for: resolution reads a handful of the ~60,000."""

    name: str
    version: str
    architecture: str
    filename: str
    sha256: str
    size: int
    depends_text: str = ""  # Pre-Depends, then Depends
    conflicts_text: str = ""  # Conflicts, then Breaks
    provides: tuple[tuple[str, str | None], ...] = ()

    @functools.cached_property
    def depends(self) -> tuple[Clause, ...]:
        return parse_relations(self.depends_text)

    @functools.cached_property
    def conflicts(self) -> tuple[Clause, ...]:
        return parse_relations(self.conflicts_text)

    def locked(self, pinned: bool) -> LockedDeb:
        return LockedDeb(self.name, self.version, self.architecture, self.sha256, self.filename, pinned)


@dataclass(frozen=True)
class Index:
    suite: str
    mirror: str
    architecture: str
    packages: Mapping[str, tuple[Stanza, ...]]  # real packages by name
    providers: Mapping[str, tuple[tuple[Stanza, str | None], ...]]  # virtual name -> (provider, version)

    def exact(self, name: str, version: str) -> Stanza | None:
        return next((s for s in self.packages.get(name, ()) if s.version == version), None)

    def any_of(self, name: str, version: str | None = None) -> Stanza | None:
        """The stanza of `name` at `version` if the index has it, else its newest."""
        found = self.packages.get(name, ())
        if version is not None and (hit := self.exact(name, version)) is not None:
            return hit
        return max(found, key=_VersionKey, default=None)


class _VersionKey:
    """Sort key for stanzas by Debian version."""

    def __init__(self, s: Stanza) -> None:
        self.v = s.version

    def __lt__(self, other: _VersionKey) -> bool:
        return compare_versions(self.v, other.v) < 0


_WANTED = {"Package", "Version", "Architecture", "Filename", "SHA256", "Size", "Depends", "Pre-Depends",
           "Conflicts", "Breaks", "Provides"}


def parse_index(text: str, *, suite: str, mirror: str, architecture: str) -> Index:
    packages: dict[str, list[Stanza]] = {}
    providers: dict[str, list[tuple[Stanza, str | None]]] = {}
    fields: dict[str, str] = {}

    def flush() -> None:
        if "Package" not in fields:
            return
        try:
            s = Stanza(
                name=fields["Package"], version=fields["Version"], architecture=fields["Architecture"],
                filename=fields["Filename"], sha256=fields["SHA256"], size=int(fields["Size"]),
                depends_text=", ".join(fields[k] for k in ("Pre-Depends", "Depends") if fields.get(k)),
                conflicts_text=", ".join(fields[k] for k in ("Conflicts", "Breaks") if fields.get(k)),
                provides=tuple((a.name, a.version if a.op == "=" else None)
                               for (a, *_rest) in parse_relations(fields["Provides"])) if "Provides" in fields else (),
            )
        except (KeyError, ValueError) as e:
            raise ImageError(f"the {suite} index has a malformed stanza for {fields.get('Package')}: {e!r}") from e
        packages.setdefault(s.name, []).append(s)
        for virtual, version in s.provides:
            providers.setdefault(virtual, []).append((s, version))

    for line in text.splitlines():
        if not line:
            flush()
            fields = {}
        elif line[0] not in " \t":  # continuation lines belong to fields not read here
            key, _, value = line.partition(":")
            if key in _WANTED:
                fields[key] = value.strip()
    flush()
    return Index(suite, mirror, architecture, {k: tuple(v) for k, v in packages.items()},
                 {k: tuple(v) for k, v in providers.items()})


def _get(url: str) -> bytes:
    try:
        # http(s) mirror URLs only: `url` is the spec's mirror joined with an index or pool path.
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            data: bytes = resp.read()
            return data
    except (urllib.error.URLError, OSError) as e:
        raise ImageError(f"cannot download {url}: {e}") from e


def _signed_release(inrelease: bytes, keyring: Path) -> str:
    """The text of an InRelease file, only if Debian's archive key signed it."""
    if not keyring.is_file():
        raise ImageError(f"no Debian archive keyring at {keyring}: apt-get install debian-archive-keyring")
    if shutil.which("gpgv") is None:
        raise ImageError("gpgv is not installed (it checks the mirror's signature): apt-get install gpgv")
    with tempfile.TemporaryDirectory(prefix="ringfence-inrelease-") as tmp:
        signed, out = Path(tmp) / "InRelease", Path(tmp) / "Release"
        signed.write_bytes(inrelease)
        proc = subprocess.run(["gpgv", "--keyring", str(keyring), "--output", str(out), str(signed)],
                              capture_output=True, text=True)
        if proc.returncode != 0 or not out.is_file():
            raise ImageError(f"the mirror's InRelease is not signed by {keyring}: {proc.stderr.strip()[-500:]}")
        return out.read_text()


def _release_sha256(release: str, path: str) -> tuple[str, int]:
    in_sha256 = False
    for line in release.splitlines():
        if not line.startswith(" "):
            in_sha256 = line.startswith("SHA256:")
            continue
        if in_sha256:
            parts = line.split()
            if len(parts) == 3 and parts[2] == path:
                return parts[0], int(parts[1])
    raise ImageError(f"the signed Release file lists no {path}")


def debian_architecture() -> str:
    """The build host's dpkg architecture, which debootstrap gave the base."""
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "armhf", "i686": "i386",
            "ppc64le": "ppc64el", "s390x": "s390x"}.get(machine, machine)


def fetch_index(mirror: str, suite: str, architecture: str, *, keyring: Path = KEYRING) -> Index:
    base = f"{mirror.rstrip('/')}/dists/{suite}"
    release = _signed_release(_get(f"{base}/InRelease"), keyring)
    rel = f"{COMPONENT}/binary-{architecture}/Packages.xz"
    sha, size = _release_sha256(release, rel)
    data = _get(f"{base}/{rel}")
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
        raise ImageError(f"{base}/{rel} does not match the sha256 the signed Release gives")
    return parse_index(lzma.decompress(data).decode("utf-8", "replace"), suite=suite, mirror=mirror,
                       architecture=architecture)


# -- resolution ----------------------------------------------------------------------------------


def installed_versions(root_packages: Iterable[str], debs: Iterable[LockedDeb]) -> dict[str, str]:
    """name -> version of everything the parent has: the root's manifest lines
    ("name=version", or "name:arch=version" for a foreign-arch package) and the children's debs."""
    out: dict[str, str] = {}
    for line in root_packages:
        name, _, version = line.partition("=")
        out[name.split(":", 1)[0]] = version
    for d in debs:
        out[d.name] = d.version
    return out


def resolve(pins: Iterable[DebPin], installed: Mapping[str, str], index: Index,
            progress: Progress | None = None) -> tuple[Stanza, ...]:
    """The packages to unpack for `pins` over a parent that has `installed` (module docstring)."""
    progress = progress or (lambda _m: None)
    where = f"{index.suite}'s {COMPONENT} index ({index.mirror})"
    chosen = _pinned_stanzas(pins, installed, index, progress, where)
    provided = _provided_by(installed, index)

    def satisfied(alt: Alt) -> bool:
        if alt.name in installed and alt.allows(installed[alt.name]):
            return True
        if alt.name in chosen and alt.allows(chosen[alt.name].version):
            return True
        if any(alt.allows(v) for v in provided.get(alt.name, ())):
            return True
        return any(v == alt.name and alt.allows(pv) for s in chosen.values() for v, pv in s.provides)

    def choose(clause: Clause, wanted_by: Stanza) -> Stanza:
        problems = []
        for alt in clause:
            real = [s for s in index.packages.get(alt.name, ()) if alt.allows(s.version)]
            if real:
                pick = max(real, key=_VersionKey)
                if pick.name in installed:
                    problems.append(f"{alt} would replace the parent's {pick.name}={installed[pick.name]}")
                    continue
                return pick
            provs = sorted({s.name: s for s, pv in index.providers.get(alt.name, ()) if alt.allows(pv)}.values(),
                           key=lambda s: s.name)
            if len(provs) == 1 and provs[0].name not in installed:
                return provs[0]
            if len(provs) > 1:
                problems.append(f"{alt} is provided by {', '.join(s.name for s in provs)}: pin one in packages")
            else:
                problems.append(f"{alt} is not in the index")
        clause_text = " | ".join(map(str, clause))
        raise ImageError(f"{wanted_by.name}={wanted_by.version} depends on {clause_text}, which neither the parent "
                         f"nor {where} can satisfy: " + "; ".join(problems))

    queue = sorted(chosen.values(), key=lambda s: s.name)
    while queue:
        stanza = queue.pop(0)
        for clause in stanza.depends:
            if any(satisfied(alt) for alt in clause):
                continue
            pick = choose(clause, stanza)
            progress(f"{stanza.name} needs {pick.name}={pick.version}")
            chosen[pick.name] = pick
            queue.append(pick)

    _refuse_conflicts(chosen, installed)
    return tuple(sorted(chosen.values(), key=lambda s: s.name))


def _pinned_stanzas(pins: Iterable[DebPin], installed: Mapping[str, str], index: Index, progress: Progress,
                    where: str) -> dict[str, Stanza]:
    """The index's stanza of each pin the parent does not have yet (by name); a pin the parent
    has at another version, or the index lacks, is an ImageError."""
    chosen: dict[str, Stanza] = {}
    for pin in pins:
        if installed.get(pin.name) == pin.version:
            progress(f"{pin}: the parent already has it")
            continue
        if pin.name in installed:
            raise ImageError(f"{pin}: the parent has {pin.name}={installed[pin.name]}; installing another version "
                             "over it is refused (rebuild the parent on the version you need)")
        stanza = index.exact(pin.name, pin.version)
        if stanza is None:
            have = ", ".join(s.version for s in index.packages.get(pin.name, ())) or "no version at all"
            raise ImageError(f"{pin}: not in {where}, which has {have}")
        chosen[pin.name] = stanza
    return chosen


def _provided_by(installed: Mapping[str, str], index: Index) -> dict[str, list[str | None]]:
    """What provides each virtual name among the installed packages (by the index's stanza of
    that package, at the installed version when the index still has it): virtual name -> the
    provided versions."""
    provided: dict[str, list[str | None]] = {}
    for name, version in installed.items():
        s = index.any_of(name, version)
        for virtual, pv in s.provides if s is not None else ():
            provided.setdefault(virtual, []).append(pv)
    return provided


def _refuse_conflicts(chosen: Mapping[str, Stanza], installed: Mapping[str, str]) -> None:
    """An ImageError when a chosen package conflicts with one the parent has or another chosen."""
    for stanza in chosen.values():
        for (alt, *_rest) in stanza.conflicts:
            if alt.name == stanza.name:
                continue
            if alt.name in installed and alt.allows(installed[alt.name]):
                raise ImageError(f"{stanza.name}={stanza.version} conflicts with the parent's "
                                 f"{alt.name}={installed[alt.name]} ({alt})")
            if alt.name in chosen and alt.allows(chosen[alt.name].version):
                raise ImageError(f"{stanza.name}={stanza.version} conflicts with {alt.name}="
                                 f"{chosen[alt.name].version} ({alt})")


# -- files ---------------------------------------------------------------------------------------


def download(deb: LockedDeb, mirror: str, debs_dir: Path) -> Path:
    """The .deb in the cache, downloaded from the mirror's pool unless already there; its
    sha256 must be the one recorded (from the signed index, or the lock)."""
    path = debs_dir / deb.cache_name
    if path.is_file() and sha256_file(path) == deb.sha256:
        return path
    debs_dir.mkdir(parents=True, exist_ok=True)
    data = _get(f"{mirror.rstrip('/')}/{deb.filename}")
    got = hashlib.sha256(data).hexdigest()
    if got != deb.sha256:
        raise ImageError(f"{deb}: {deb.filename} from {mirror} has sha256 {got}, expected {deb.sha256}")
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def cached(deb: LockedDeb, debs_dir: Path) -> Path:
    """The cached .deb for an offline install, refused by name when absent or not the file the
    lock records."""
    path = debs_dir / deb.cache_name
    if not path.is_file():
        raise ImageError(f"{deb}: not in the package cache ({path}): run `ringfence images fetch`")
    got = sha256_file(path)
    if got != deb.sha256:
        raise ImageError(f"{deb}: the cached .deb {path} has sha256 {got}, but {deb.sha256} is recorded "
                         "(the lock or the file changed): refusing to install it")
    return path


class _Slice(io.RawIOBase):
    """A read-only window on an open file: one member of an ar archive."""

    def __init__(self, f: BinaryIO, offset: int, size: int) -> None:
        self._f, self._offset, self._size, self._pos = f, offset, size, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b).cast("B")
        n = min(len(view), self._size - self._pos)
        if n <= 0:
            return 0
        self._f.seek(self._offset + self._pos)
        data = self._f.read(n)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _ar_members(f: BinaryIO, where: Path) -> Iterator[tuple[str, int, int]]:
    """(name, offset, size) of each member of an ar archive (the .deb container)."""
    if f.read(8) != b"!<arch>\n":
        raise ImageError(f"{where} is not a .deb (no ar header)")
    offset = 8
    while True:
        f.seek(offset)
        head = f.read(60)
        if len(head) < 60:
            return
        if head[58:60] != b"`\n":
            raise ImageError(f"{where}: corrupt ar member header")
        name = head[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(head[48:58].decode("ascii").strip())
        yield name, offset + 60, size
        offset += 60 + size + (size & 1)


class _TarSource(Protocol):
    """What tarfile.open reads a member's tar from (the gzip, lzma and bz2 files are ones)."""

    def read(self, size: int, /) -> bytes: ...
    def write(self, b: bytes, /) -> object: ...
    def tell(self) -> int: ...
    def seek(self, pos: int, /) -> object: ...
    def close(self) -> object: ...


def _decompressed(raw: io.BufferedReader, member: str, where: Path) -> _TarSource:
    if member.endswith(".xz"):
        return lzma.open(raw)
    if member.endswith(".gz"):
        return gzip.open(raw)
    if member.endswith(".bz2"):
        return bz2.open(raw)
    if member.endswith(".zst"):
        if shutil.which("zstd") is None:
            raise ImageError(f"{where}: {member} needs zstd: apt-get install zstd")
        proc = subprocess.run(["zstd", "-dc"], input=raw.read(), capture_output=True)
        if proc.returncode != 0:
            raise ImageError(f"{where}: zstd failed on {member}")
        return io.BytesIO(proc.stdout)
    if member.endswith(".tar"):
        return raw
    raise ImageError(f"{where}: unknown member {member}")


@dataclass(frozen=True)
class Unpacked:
    """What unpacking a set of .debs laid down, for the build's report."""

    files: int
    scripts_skipped: tuple[str, ...]  # "name: postinst, triggers"
    setid_stripped: tuple[str, ...]  # image paths whose setuid/setgid bit was dropped


def _image_path(raw: str, where: str) -> str | None:
    """The normalized image path of a data.tar member, or None to leave it out."""
    name = raw
    while name.startswith(("./", "/")):
        name = name[2:] if name.startswith("./") else name[1:]
    name = name.rstrip("/")
    if name in ("", "."):
        return None
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ImageError(f"{where}: member {raw!r} is not a plain relative path")
    if parts[0] in _MERGED:
        parts = ["usr", *parts]
    path = "/".join(parts)
    if any(path == p or path.startswith(p + "/") for p in _PRUNED):
        return None
    return path


class _Tree:
    """The staging directory of one layer, written without ever following a symlink in it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.owner: dict[str, str] = {}  # image path -> the package that shipped it

    def _parent(self, path: str, where: str) -> Path:
        cur = self.root
        for part in path.split("/")[:-1]:
            cur = cur / part
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                os.mkdir(cur, 0o755)
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise ImageError(f"{where}: {path} would be written through /{cur.relative_to(self.root)}, "
                                 "which is not a directory in the layer")
        return cur

    def claim(self, path: str, package: str, kind: str) -> Path | None:
        """The host path to create for `path`; None when it is a directory a package already
        listed (the first package's mode stays: packages are taken in name order)."""
        prior = self.owner.get(path)
        target = self._parent(path, package) / path.rsplit("/", 1)[-1]
        if prior is not None:
            if kind == "dir" and target.is_dir() and not target.is_symlink():
                return None
            raise ImageError(f"/{path} is shipped by both {prior} and {package}")
        if kind != "dir" and os.path.lexists(target):  # a directory made for another's files
            raise ImageError(f"/{path} of {package} is a directory of another package")
        self.owner[path] = package
        return target


def _unpack_one(tree: _Tree, deb: LockedDeb, path: Path, stripped: list[str]) -> tuple[int, bytes, list[str]]:
    """Lay one .deb's data.tar into the tree; (files written, control stanza, maintainer scripts)."""
    control: bytes | None = None
    scripts: list[str] = []
    files = 0
    with open(path, "rb") as f:
        members = list(_ar_members(f, path))
        for member, offset, size in members:
            if not member.startswith("control.tar"):
                continue
            with tarfile.open(fileobj=_decompressed(io.BufferedReader(_Slice(f, offset, size)), member, path),
                              mode="r|") as ctl:
                for m in ctl:
                    base = m.name.lstrip("./")
                    if base == "control" and m.isfile():
                        fobj = ctl.extractfile(m)
                        control = fobj.read() if fobj is not None else None
                    elif base in _SCRIPTS and m.isfile():
                        scripts.append(base)
        data = [(m, o, s) for m, o, s in members if m.startswith("data.tar")]
        if control is None or len(data) != 1:
            raise ImageError(f"{deb}: {path} has no control file or not exactly one data.tar")
        member, offset, size = data[0]
        with tarfile.open(fileobj=_decompressed(io.BufferedReader(_Slice(f, offset, size)), member, path),
                          mode="r|") as tar:
            for m in tar:
                name = _image_path(m.name, str(deb))
                if name is None:
                    continue
                if m.isdir():
                    target = tree.claim(name, deb.name, "dir")
                    if target is not None:
                        if not target.is_dir():  # else made earlier for a file under it
                            os.mkdir(target)
                        os.chmod(target, m.mode & 0o1777)
                elif m.issym():
                    target = tree.claim(name, deb.name, "symlink")
                    assert target is not None
                    os.symlink(m.linkname, target)
                elif m.islnk():
                    source = _image_path(m.linkname, str(deb))
                    src = tree.root / source if source is not None else None
                    # Only to a regular file this package wrote: a link made through a
                    # symlink would pull a host file into the layer.
                    if (source is None or src is None or tree.owner.get(source) != deb.name
                            or not stat.S_ISREG(os.lstat(src).st_mode)):
                        raise ImageError(f"{deb}: hard link {name} -> {m.linkname} is not to a file of the package")
                    target = tree.claim(name, deb.name, "file")
                    assert target is not None
                    os.link(src, target, follow_symlinks=False)
                elif m.isfile():
                    target = tree.claim(name, deb.name, "file")
                    assert target is not None
                    fobj = tar.extractfile(m)
                    assert fobj is not None  # a regular member always has a body
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                    with os.fdopen(fd, "wb") as out:
                        shutil.copyfileobj(fobj, out)
                    if m.mode & (stat.S_ISUID | stat.S_ISGID):
                        stripped.append(f"/{name}")
                    os.chmod(target, m.mode & 0o777)
                    files += 1
                else:
                    raise ImageError(f"{deb}: {name} is a device, FIFO or other special file")
    return files, control, scripts


def unpack(debs: Iterable[tuple[LockedDeb, Path]], staging: Path) -> Unpacked:
    """Unpack verified .debs into `staging` as the module docstring says (owners are set by the
    layer writer, not here); returns what was skipped or changed."""
    tree = _Tree(staging)
    files = 0
    scripts: list[str] = []
    stripped: list[str] = []
    for deb, path in sorted(debs, key=lambda d: d[0].name):
        try:
            n, control, ran = _unpack_one(tree, deb, path, stripped)
        except (OSError, tarfile.TarError, lzma.LZMAError, EOFError) as e:
            raise ImageError(f"{deb}: cannot unpack {path}: {e}") from e
        files += n
        if ran:
            scripts.append(f"{deb.name}: {', '.join(sorted(ran))}")
        target = tree.claim(f"var/lib/dpkg/status.d/{deb.name}", deb.name, "file")
        assert target is not None
        target.write_bytes(control.rstrip(b"\n") + b"\n")
        os.chmod(target, 0o644)
    # Directories no package listed itself (status.d, or a parent a package left out): 0755.
    for dirpath, _dirs, _files in os.walk(staging):
        rel = os.path.relpath(dirpath, staging)
        if rel != "." and rel.replace(os.sep, "/") not in tree.owner:
            os.chmod(dirpath, 0o755)
    return Unpacked(files, tuple(scripts), tuple(sorted(stripped)))
