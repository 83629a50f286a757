"""A built wheel, installed outside the checkout, is a working ringfence.

The wheel is built from a copy of the working tree (so the build leaves nothing in the
checkout, and a stale build/lib cannot leak into it), with decoys planted where the image
build cache and stray archives live, and installed into a fresh venv in tmp. That venv sees
the dependencies of the repository's .venv through a .pth path line, but not the checkout:
a path line puts the directory on sys.path without processing the .pth files in it, so the
editable install's finder (a .pth there) never loads; the probe below asserts it. Every
process runs in tmp, without PYTHONPATH. Then, from that venv: `ringfence --help`, the
images lock and specs it ships (hashing as the lock says), `ringfence images verify`, and
`ringfence serve` on the embedded defaults answering real gRPC calls until SIGTERM.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from serve_support import Served

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# The product's packages (setup.py): the runtime, the control plane and the packages beside the
# sandbox; each ships whole.
PACKAGES = ("control", "sandbox", "imagebuild", "conformance", "demo_services")
DEMO_AGENT_TOKEN = "demo-agent-token"  # the embedded default tenant's (public) agent token
# Never copied for the build: VCS, environments, caches, earlier build output.
COPY_SKIP = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".state"}
# Variables that would point the installed code back at the checkout.
ENV_DROP = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV",
            "RINGFENCE_IMAGES_DIR", "RINGFENCE_IMAGES_LOCK", "RINGFENCE_SECCOMP_BASE",
            "RINGFENCE_SERVER", "RINGFENCE_TOKEN")
SECCOMP_SYSTEM = Path("/usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json")

PROBE = r"""
import json, os, sys
import control, sandbox
from control.config import BUILTIN_TOOLS_DIR, DEFAULT_CONFIG_PATH
from sandbox.pinned_images import IMAGES_DIR, default_lock_path, load_lock
from imagebuild.spec import load_specs

lock = load_lock()
print(json.dumps({
    "control": control.__file__,
    "sandbox": sandbox.__file__,
    "config": str(DEFAULT_CONFIG_PATH),
    "tools": sorted(p.stem for p in BUILTIN_TOOLS_DIR.glob("*.json")),
    "images_dir": str(IMAGES_DIR),
    "lock": str(default_lock_path()),
    "lock_path": str(lock.path),
    "locked": {e.name: e.inputs_sha256 for e in lock.entries},
    "inputs": {n: s.inputs_sha256() for n, s in load_specs(IMAGES_DIR).items()},
    "sys_path": sys.path,
    "meta_path": [type(f).__module__ + "." + type(f).__qualname__ for f in sys.meta_path],
}))
"""


@dataclass(frozen=True)
class Installed:
    work: Path  # the cwd of every process
    src: Path  # the copy of the working tree the wheel was built from
    wheel: Path
    venv: Path
    site: Path  # the fresh venv's site-packages
    env: dict[str, str]

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def run(self, *argv: str | Path, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in argv], cwd=self.work, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)

    def ringfence(self, *args: str, env: dict[str, str] | None = None,
                  timeout: float = 120) -> subprocess.CompletedProcess:
        return self.run(self.bin / "ringfence", *args, env=env, timeout=timeout)

    def under_venv(self, path: str | Path) -> bool:
        return Path(path).resolve().is_relative_to(self.venv.resolve())


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (f"{proc.args} exited {proc.returncode}\n"
                                  f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}")
    return proc


def _copy_ignore(directory: str, names: list[str]) -> list[str]:
    top_images = Path(directory) == ROOT / "images"
    return [n for n in names if n in COPY_SKIP or n.endswith(".egg-info") or (top_images and n == ".build")]


def _shippable(tree: Path, *, top_cache: bool) -> set[str]:
    """Files under `tree` the wheel must carry, relative to it: all but bytecode, *.tar and (for
    images/) the .build/ cache."""
    out = set()
    for path in tree.rglob("*"):
        rel = path.relative_to(tree)
        if not path.is_file() or "__pycache__" in rel.parts or path.suffix in (".pyc", ".pyo", ".tar"):
            continue
        if top_cache and rel.parts[0] == ".build":
            continue
        out.add(rel.as_posix())
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    env["PYTHONNOUSERSITE"] = "1"

    src = work / "src"
    shutil.copytree(ROOT, src, ignore=_copy_ignore, symlinks=True)
    # Decoys: a working tree may hold these, the wheel must not.
    cache = src / "images" / ".build"
    (cache / "layers").mkdir(parents=True)
    (cache / "layers" / "decoy.tar").write_bytes(b"decoy")
    (cache / "decoy").mkdir()
    (cache / "decoy" / "image.json").write_text("{}")
    (src / "images" / "decoy.tar").write_bytes(b"decoy")
    stray = src / "images" / "tool" / "rootfs" / "opt" / "__pycache__"
    stray.mkdir(parents=True, exist_ok=True)
    (stray / "decoy.cpython-311.pyc").write_bytes(b"decoy")

    dist = work / "dist"
    _ok(subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--no-cache-dir", "-w", str(dist), str(src)],
                       cwd=work, env=env, capture_output=True, text=True, timeout=300))
    [wheel] = dist.glob("ringfence-*.whl")

    venv = work / "venv"
    _ok(subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                       cwd=work, env=env, capture_output=True, text=True, timeout=120))
    python = venv / "bin" / "python"
    _ok(subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                        "--no-index", "--no-cache-dir", str(wheel)],
                       cwd=work, env=env, capture_output=True, text=True, timeout=300))
    site = Path(_ok(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   cwd=work, env=env, capture_output=True, text=True, timeout=60)).stdout.strip())
    # The dependencies, not the checkout: path lines only (see the module docstring).
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_ringfence_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    return Installed(work=work, src=src, wheel=wheel, venv=venv, site=site, env=env)


@pytest.fixture(scope="module")
def probe(installed) -> dict:
    return json.loads(_ok(installed.run(installed.bin / "python", "-c", PROBE)).stdout)


def test_the_wheel_carries_the_packages_their_data_and_the_image_specs_and_nothing_else(installed):
    with zipfile.ZipFile(installed.wheel) as z:
        names = {n for n in z.namelist() if not n.endswith("/")}
    tops = {n.split("/", 1)[0] for n in names}
    [dist_info] = [t for t in tops if t.endswith(".dist-info")]
    assert tops == {*PACKAGES, "ringfence_images", dist_info}  # no tests/, bench/, images/
    assert not [n for n in names if "/.build/" in n or n.endswith((".tar", ".pyc")) or "__pycache__" in n]
    # The packages ship whole: every module and data file (a package without __init__.py, or a
    # data file of a kind setup.py does not list, would be missing).
    for package in PACKAGES:
        shipped = {n.split("/", 1)[1] for n in names if n.startswith(f"{package}/")}
        assert shipped == _shippable(installed.src / package, top_cache=False), package
    assert {"default_config.toml", "tools/echo.json"} <= {n.split("/", 1)[1] for n in names if n.startswith("control/")}
    # No test harness ships: the egress testbed, its decoys and the scripted proxies live in tests/.
    harness = [n for n in names if n.rsplit("/", 1)[-1] in ("testing.py", "decoy.py", "conftest.py")
               or "/tests/" in n or n.rsplit("/", 1)[-1].startswith("test_")]
    assert harness == []
    # images/ ships as ringfence_images/, exactly, minus its build cache and the decoys.
    shipped = {n.split("/", 1)[1] for n in names if n.startswith("ringfence_images/")}
    assert shipped == _shippable(installed.src / "images", top_cache=True)
    assert {"images.lock", "tool/image.json", "egress-proxy/image.json"} <= shipped
    entry_points = zipfile.ZipFile(installed.wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "ringfence = control.cli:main" in entry_points


def test_the_fresh_venv_imports_the_installed_packages_not_the_checkout(installed, probe):
    assert installed.under_venv(probe["control"]) and installed.under_venv(probe["sandbox"]), probe
    assert not Path(probe["control"]).resolve().is_relative_to(ROOT)
    assert str(ROOT) not in probe["sys_path"] and "" not in probe["sys_path"][1:]
    assert not [m for m in probe["meta_path"] if "editable" in m.lower()], probe["meta_path"]
    # The embedded config and the built-in manifests come from the installed package.
    assert installed.under_venv(probe["config"]) and Path(probe["config"]).is_file()
    assert probe["tools"] == sorted(p.stem for p in (installed.src / "control" / "tools").glob("*.json"))


def test_the_images_lock_and_specs_resolve_inside_the_installed_package(installed, probe):
    images = installed.site / "ringfence_images"
    assert Path(probe["images_dir"]) == images
    assert Path(probe["lock"]) == Path(probe["lock_path"]) == images / "images.lock"
    assert (images / "images.lock").is_file() and not (images / ".build").exists()
    # The installed specs, with their `files` resolved against site-packages (the installed
    # sandbox/ modules), hash exactly as the same specs do in the tree the wheel was built from:
    # a verify or build from the wheel means what it means in the checkout.
    from imagebuild.spec import load_specs

    built_from = {n: s.inputs_sha256() for n, s in load_specs(installed.src / "images").items()}
    assert probe["inputs"] == built_from
    assert set(probe["locked"]) == set(built_from)


def test_RINGFENCE_IMAGES_DIR_overrides_the_shipped_images(installed):
    """An installed ringfence can build and verify from a writable copy of the specs."""
    proc = _ok(installed.run(installed.bin / "python", "-c",
                             "from sandbox.pinned_images import IMAGES_DIR, default_lock_path; "
                             "print(IMAGES_DIR); print(default_lock_path())",
                             env={"RINGFENCE_IMAGES_DIR": str(installed.src / "images")}))
    assert proc.stdout.split() == [str(installed.src / "images"), str(installed.src / "images" / "images.lock")]


def test_images_verify_reads_the_shipped_lock(installed, probe):
    proc = installed.ringfence("images", "verify")
    out = proc.stdout + proc.stderr
    if proc.returncode == 2:  # no engine: it says so, after reading the lock
        assert "images verify:" in proc.stderr
    else:
        assert proc.returncode in (0, 1), out  # 1: images missing or drifted, each named
        for name in probe["locked"]:
            assert name in out
    # Without the shipped lock (this venv is ours to break), the error names where it looked.
    lock = installed.site / "ringfence_images" / "images.lock"
    saved = lock.read_bytes()
    lock.unlink()
    try:
        proc = installed.ringfence("images", "verify")
    finally:
        lock.write_bytes(saved)
    assert proc.returncode == 2
    assert f"{lock} does not exist" in proc.stderr


def test_help_lists_the_subcommands_as_the_checkout_does(installed):
    proc = _ok(installed.ringfence("--help"))
    for command in ("serve", "images", "sandbox", "runs", "tools", "submit", "approvals"):
        assert f"\n    {command} " in proc.stdout or f"\n    {command}\n" in proc.stdout, command
    # The CLI skips a subcommand whose module does not import (control/cli.py): one missing
    # from the wheel would vanish from --help silently, so compare with the checkout's.
    checkout = _ok(subprocess.run([str(Path(sys.executable).parent / "ringfence"), "--help"], cwd=installed.work,
                                  env=installed.env, capture_output=True, text=True, timeout=60))
    assert proc.stdout == checkout.stdout
    _ok(installed.ringfence("serve", "--help"))


def test_the_seccomp_source_error_names_the_debian_package(installed):
    if SECCOMP_SYSTEM.is_file():
        pytest.skip(f"{SECCOMP_SYSTEM} is installed on this host")
    proc = installed.run(installed.bin / "python", "-c", "from sandbox.seccomp import source_path; source_path()")
    assert proc.returncode == 1
    assert "golang-github-docker-docker-dev" in proc.stderr and "RINGFENCE_SECCOMP_BASE" in proc.stderr


def _docker_error() -> str | None:
    try:
        import docker

        client = docker.from_env(timeout=10)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as e:  # noqa: BLE001 - any failure means "no engine"
        return str(e)
    return None


def _serve(installed: Installed, state: Path, env: dict[str, str] | None = None) -> Served:
    """The installed `ringfence serve` on the embedded defaults (no --config), from tmp."""
    return Served(None, state, command=[str(installed.bin / "ringfence")], cwd=installed.work,
                  base_env=installed.env, env=env)


def _stopped(served: Served) -> None:
    code = served.stop()
    assert served.proc.stderr is not None, "Served pipes stderr"
    assert code == 0, "\n".join(served.lines) + served.proc.stderr.read()[-2000:]
    assert served.lines[-1] == "ringfence: stopped"


def test_serve_without_the_seccomp_profile_says_so_at_start(installed, tmp_path):
    if _docker_error() is not None:
        pytest.skip("no Docker engine answers")
    proc = installed.ringfence("serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"),
                               env={"RINGFENCE_SECCOMP_BASE": str(tmp_path / "no-such-profile.json")})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "error: the sandbox engine is not usable" in proc.stderr and "seccomp" in proc.stderr


def test_serve_on_the_embedded_defaults_lists_the_shipped_tools_and_stops_on_sigterm(installed, tmp_path):
    from control.client import Client

    engine_error = _docker_error()
    if engine_error is not None:
        # What a user without Docker sees: a one-line reason and exit 1, no traceback.
        proc = installed.ringfence("serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"))
        assert proc.returncode == 1
        assert "error: the sandbox engine is not usable" in proc.stderr and "Traceback" not in proc.stderr
        return

    seccomp = next((p for p in (SECCOMP_SYSTEM, ROOT / "build" / "seccomp" / "docker-default.json") if p.is_file()),
                   None)
    if seccomp is None:
        # Without Docker's default seccomp profile nothing could run: serve says so at start.
        proc = installed.ringfence("serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"))
        assert proc.returncode == 1 and "seccomp profile was not found" in proc.stderr, proc.stderr
        return
    served = _serve(installed, tmp_path / "state", env={"RINGFENCE_SECCOMP_BASE": str(seccomp)})
    try:
        assert served.lines[0].startswith("ringfence: serving ringfence.v1 on 127.0.0.1:")
        with Client(served.address, DEMO_AGENT_TOKEN, timeout=30) as client:
            tools = client.list_tools()
        manifests = (installed.src / "control" / "tools").glob("*.json")
        expected = sorted(json.loads(p.read_text())["name"] for p in manifests)
        assert sorted(t.name for t in tools) == expected
        assert all(t.description and t.schema for t in tools)
        # The installed CLI's own client says the same.
        proc = _ok(installed.ringfence("tools", "--server", served.address, "--json",
                                       env={"RINGFENCE_TOKEN": DEMO_AGENT_TOKEN}))
        assert sorted(json.loads(line)["name"] for line in proc.stdout.splitlines()) == expected
    finally:
        _stopped(served)


def test_a_call_through_the_installed_server_runs_the_image_the_shipped_lock_pins(installed, tmp_path):
    engine_error = _docker_error()
    if engine_error is not None:
        pytest.skip(f"no Docker engine answers: {engine_error}")
    # Dispatch resolves `tool` through the lock the package ships; the engine must hold that ID.
    pinned = installed.run(installed.bin / "python", "-c",
                           "from imagebuild import engine; from sandbox.pinned_images import resolve_pinned; "
                           "print(resolve_pinned(engine.client_from_env(), 'tool'))")
    if pinned.returncode != 0:
        pytest.skip(f"the pinned tool image is not in the engine (run `make images`): {pinned.stderr.strip()[-300:]}")
    # Docker's default seccomp profile is a host file (sandbox/seccomp.py): the system's, else the
    # checkout's copy (scripts/ensure-packages.sh).
    seccomp = next((p for p in (SECCOMP_SYSTEM, ROOT / "build" / "seccomp" / "docker-default.json") if p.is_file()),
                   None)
    if seccomp is None:
        pytest.skip("no Docker default seccomp profile on this host (run `make packages`)")
    from control.client import Client

    served = _serve(installed, tmp_path / "state", env={"RINGFENCE_SECCOMP_BASE": str(seccomp)})
    try:
        with Client(served.address, DEMO_AGENT_TOKEN, timeout=120) as client:
            run = client.start_run("wheel probe", "wheel-run")
            [obs] = client.submit_batch(run.run_id, [{"call_id": "c1", "tool": "echo", "arguments": {"text": "hi"}}])
        assert obs.error is None and obs.content == {"text": "hi"}, obs
    finally:
        _stopped(served)
