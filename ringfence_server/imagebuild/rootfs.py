"""Make a root image's filesystem with debootstrap and scrub it until two builds are equal.

Every rule in `clean` removes something found to differ between two builds of the same
packages (logs, caches, files copied from the build host, dates), or something a sandbox has
no use for (docs, translations, setuid bits). Verified by building twice and diffing trees.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from ringfence_server.imagebuild.archive import EPOCH
from ringfence_server.imagebuild.spec import Account, Debootstrap
from ringfence_server.sandbox.errors import ImageError

# /etc/shadow's "last change" field is a day number: the build day, unless fixed.
SHADOW_DAY = str(EPOCH // 86400)


def _debootstrap_cmd(spec: Debootstrap) -> list[str]:
    if os.geteuid() != 0:
        raise ImageError("building a root image needs root (debootstrap chroots and mknods)")
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed: apt-get install debootstrap")
    cmd = ["debootstrap", f"--variant={spec.variant}"]
    if spec.include:
        cmd.append("--include=" + ",".join(spec.include))
    return cmd


def _run(cmd: list[str], log: Path, what: str) -> None:
    with open(log, "wb") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise ImageError(f"{what} failed (exit {rc}); log {log}:\n" + "\n".join(tail))


def fetch_packages(spec: Debootstrap, tarball: Path, cache_dir: Path, log: Path) -> None:
    """Download the packages of `spec` (and the mirror's index) into one tarball. The only step
    of an image build that talks to the network: Debian's mirror, nothing else."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    tarball.parent.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_name(tarball.name + ".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="ringfence-fetch-") as scratch:
        cmd = [*_debootstrap_cmd(spec), f"--cache-dir={cache_dir.resolve()}", f"--make-tarball={partial}",
               spec.suite, str(Path(scratch) / "root"), spec.mirror]
        _run(cmd, log, "debootstrap --make-tarball")
    os.replace(partial, tarball)


def debootstrap(spec: Debootstrap, target: Path, tarball: Path, log: Path) -> None:
    """Install `spec` into `target` from the package tarball alone, in a network namespace of
    its own (`unshare --net`) so that this step provably reaches nothing."""
    if not tarball.is_file():
        raise ImageError(f"no package tarball at {tarball}: build without --offline first")
    cmd = [*_debootstrap_cmd(spec), f"--unpack-tarball={tarball.resolve()}", spec.suite, str(target), spec.mirror]
    if shutil.which("unshare"):
        # --mount: debootstrap mounts /proc inside the target and unmounts it on the way out,
        # which fails while anything on the host holds a file there open (a `grep -r` of the
        # checkout is enough); the leftover mount then breaks clean() and every later build.
        # In a mount namespace of its own, its mounts end with it whatever happens.
        cmd = ["unshare", "--net", "--mount", "--", *cmd]
    _run(cmd, log, "debootstrap --unpack-tarball")


def package_manifest(root: Path) -> tuple[str, ...]:
    try:
        out = subprocess.run(
            ["dpkg-query", f"--admindir={root / 'var/lib/dpkg'}", "-W", "-f", "${Package}=${Version}\n"],
            check=True, capture_output=True, text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise ImageError(f"dpkg-query failed on {root}: {e}") from e
    return tuple(sorted(line for line in out.splitlines() if line))


def _empty_dir(path: Path) -> None:
    if not path.is_dir() or path.is_symlink():
        return
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    if path.is_symlink():
        path.unlink()
    path.write_text(text)
    os.chmod(path, mode)


def clean(root: Path) -> None:
    """Scrub a fresh debootstrap tree for determinism and size."""
    # Size: nothing here is read by python or by a tool at run time.
    for rel in ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
                "usr/share/lintian", "var/cache/apt", "var/lib/apt/lists", "var/log", "dev"):
        # /dev: device nodes copied by debootstrap; Docker mounts its own /dev.
        _empty_dir(root / rel)
    # Build-time state that differs on every build.
    for rel in ("var/cache/ldconfig/aux-cache", "var/lib/dbus/machine-id"):
        (root / rel).unlink(missing_ok=True)
    for pattern in ("var/lib/dpkg/*-old", "var/cache/debconf/*-old"):
        for p in root.glob(pattern):
            p.unlink()
    # Bytecode: python3's postinst compiles the stdlib; the image's root is read-only and the
    # runner runs with -B, so the .pyc files are only size (and a determinism risk).
    for dirpath, dirnames, filenames in os.walk(root):
        if "__pycache__" in dirnames:
            shutil.rmtree(Path(dirpath) / "__pycache__")
            dirnames.remove("__pycache__")
        for f in filenames:
            if f.endswith((".pyc", ".pyo")):
                os.unlink(Path(dirpath) / f)
    # Files debootstrap copies from the build host (its hostname, its resolver).
    _write(root / "etc/machine-id", "", 0o444)
    _write(root / "etc/hostname", "sandbox\n")
    _write(root / "etc/resolv.conf", "")
    # Setuid/setgid binaries (su, mount, passwd...): no-new-privileges already neuters them,
    # but a sandbox has no use for them, so they go as defence in depth.
    for dirpath, _dirnames, filenames in os.walk(root):
        for f in filenames:
            p = Path(dirpath) / f
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
    # PID 1 (tini) execute-only: a process that execs a binary its user cannot read is made
    # non-dumpable by the kernel, so the tool (same uid) cannot open /proc/1/mem, maps or
    # environ. tini-static stays readable for gVisor, whose loader must read what it runs.
    init = root / "usr/bin/tini"
    if init.is_file():
        os.chmod(init, 0o711)


def _set_shadow_days(path: Path) -> None:
    if not path.exists():
        return
    lines = []
    for line in path.read_text().splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[2]:
            fields[2] = SHADOW_DAY
        lines.append(":".join(fields))
    st = os.stat(path)
    path.write_text("\n".join(lines) + "\n")
    os.chmod(path, stat.S_IMODE(st.st_mode))


def add_account(root: Path, acct: Account) -> None:
    """Add the sandbox user and group (idempotent), and fix shadow's build-day fields."""
    etc = root / "etc"

    def append(name: str, line: str, key: str) -> None:
        p = etc / name
        text = p.read_text() if p.exists() else ""
        if any(existing.split(":", 1)[0] == key for existing in text.splitlines()):
            return
        if text and not text.endswith("\n"):
            text += "\n"
        mode = stat.S_IMODE(os.stat(p).st_mode) if p.exists() else 0o644
        p.write_text(text + line + "\n")
        os.chmod(p, mode)

    for name in ("passwd", "group"):
        for line in (etc / name).read_text().splitlines():
            f = line.split(":")
            if len(f) > 2 and f[2] in (str(acct.uid) if name == "passwd" else str(acct.gid),) and f[0] != acct.name:
                raise ImageError(f"/etc/{name} already has id {f[2]} as {f[0]!r}")
    append("passwd", f"{acct.name}:x:{acct.uid}:{acct.gid}:ringfence sandbox:{acct.home}:{acct.shell}", acct.name)
    append("group", f"{acct.name}:x:{acct.gid}:", acct.name)
    append("shadow", f"{acct.name}:*:{SHADOW_DAY}:0:99999:7:::", acct.name)
    append("gshadow", f"{acct.name}:!::", acct.name)
    # Only shadow has a date (field 3); gshadow's third field is the admin list.
    for name in ("shadow", "shadow-"):
        _set_shadow_days(etc / name)


def architecture(root: Path) -> str:
    """Docker's (Go's) name for the rootfs's dpkg architecture."""
    try:
        arch = subprocess.run(
            ["dpkg", f"--admindir={root / 'var/lib/dpkg'}", "--print-architecture"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise ImageError(f"cannot tell the architecture of {root}: {e}") from e
    return {"amd64": "amd64", "arm64": "arm64", "armhf": "arm", "i386": "386",
            "ppc64el": "ppc64le", "s390x": "s390x"}.get(arch, arch)
