"""Both distributions, built as wheels and installed the way a user installs them, work.

One module fixture builds the client's wheel (client/) and the server's (the repository root)
from a copy of the working tree (the build leaves nothing in the checkout, a stale build/lib
cannot leak in, and decoys are planted where the image build cache and stray archives live).
Each venv is a fresh `python -m venv` in tmp, filled by its own pip with normal dependency
resolution from the package index (pip's cache makes reruns fast): the client venv from the
client's wheel alone, the server venv from both wheels (the client's is given as a file because
it is not on the index). Nothing of the checkout or of the dev venv is visible to them: every
process runs with cwd in tmp, without PYTHONPATH and without any RINGFENCE_* variable, and
nothing sets a variable a user would not set (RINGFENCE_SERVER, which the README has the user
set, and the operator's overrides in the tests that are about them).

What is checked: the wheels carry the packages, their data, the image specs and Docker's
default seccomp profile and nothing else; the client venv has none of the server's
dependencies and only the client's commands, and imports beside the `control` library from the
index; the README's first agent, run from the client venv against `ringfence serve` from the
server venv, prints what the README says; the server venv's one `ringfence` has every command,
and serves the demo's echo call from the image the shipped lock pins, on its embedded defaults.
Each distribution's installed size and dependency count are printed (the release notes quote them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from serve_support import Served

# Cold, the control venv downloads numpy, scipy and matplotlib: longer than the suite's 300 s default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DEMO_AGENT_TOKEN = "demo-agent-token"  # the embedded default tenant's (public) agent token
# Never copied for the build: VCS, environments, caches, earlier build output (build/seccomp is
# put back on its own: it is the profile the server's wheel carries).
COPY_SKIP = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".state"}
# Variables that would point the installed code back at the checkout (and every RINGFENCE_* one).
ENV_DROP = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
SECCOMP_SYSTEM = Path("/usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json")
SECCOMP_CHECKOUT = ROOT / "build" / "seccomp" / "docker-default.json"
SECCOMP_SHIPPED = "ringfence_server/sandbox/docker-default-seccomp.json"
# Not distributions a venv "depends on": the installer's own.
INSTALLER = {"pip", "setuptools", "wheel"}
# The server's dependencies a client must never pull in.
SERVER_ONLY = {"docker", "psycopg", "psycopg-binary", "psycopg-pool", "jsonschema", "opentelemetry-sdk",
               "prometheus-client", "ringfence-server"}
CLIENT_COMMANDS = ["submit", "watch", "files", "approvals", "whoami", "runs", "run", "tools"]
SERVER_COMMANDS = ["serve", "sandbox", "images", "conformance", "mcp-servers", "trace", "demo", "eval", "console",
                   "worker", "workers"]
STORE_ACTIONS = ["show", "export", "verify", "prune"]

# Run in a venv: its distributions (normalized names), their versions and the bytes of the files
# their RECORD lists (the .pyc files pip compiled at install are listed there too).
DISTRIBUTIONS = r"""
import json, re
from importlib import metadata
from pathlib import Path
out = {}
for d in metadata.distributions():
    files = [Path(d.locate_file(f)) for f in d.files or []]
    out[re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower()] = {
        "version": d.version,
        "bytes": sum(p.stat().st_size for p in files if p.is_file()),
        "tops": sorted({f.parts[0] for f in d.files or [] if not f.parts[0].endswith(".dist-info")
                        and f.parts[0] not in ("..", "__pycache__")}),
        "console_scripts": sorted(f"{e.name} = {e.value}" for e in d.entry_points if e.group == "console_scripts"),
    }
print(json.dumps(out))
"""

PROBE = r"""
import json, sys
from ringfence_server import control, sandbox
from ringfence_server.control.config import BUILTIN_TOOLS_DIR, DEFAULT_CONFIG_PATH
from ringfence_server.sandbox import seccomp
from ringfence_server.sandbox.pinned_images import IMAGES_DIR, default_lock_path, load_lock
from ringfence_server.imagebuild.spec import load_specs
import ringfence

lock = load_lock()
print(json.dumps({
    "ringfence": ringfence.__file__,
    "control": control.__file__,
    "sandbox": sandbox.__file__,
    "config": str(DEFAULT_CONFIG_PATH),
    "tools": sorted(p.stem for p in BUILTIN_TOOLS_DIR.glob("*.json")),
    "seccomp": str(seccomp.source_path()),
    "seccomp_shipped": str(seccomp.SHIPPED_SOURCE),
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
class Wheels:
    src: Path  # the copy of the working tree both were built from
    client: Path
    server: Path
    seccomp: Path  # the Docker default profile the server's build found (in the copy's build/, else the system's)


@dataclass(frozen=True)
class Venv:
    path: Path
    site: Path  # its site-packages
    work: Path  # the cwd of every process
    env: dict[str, str]

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    def run(self, *argv: str | Path, env: dict[str, str] | None = None, timeout: float = 120,
            check: bool = False) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(a) for a in argv], cwd=self.work, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)
        return _ok(proc) if check else proc

    def python(self, code: str, **kw) -> subprocess.CompletedProcess[str]:
        return self.run(self.bin / "python", "-c", code, **kw)

    def ringfence(self, *args: str, **kw) -> subprocess.CompletedProcess[str]:
        return self.run(self.bin / "ringfence", *args, **kw)

    def pip_install(self, *requirements: str | Path) -> None:
        # Normal resolution from the index: no --no-deps, no --no-index, pip's cache allowed.
        self.run(self.bin / "pip", "install", "-q", *requirements, timeout=800, check=True)

    def distributions(self) -> dict[str, dict]:
        return json.loads(self.python(DISTRIBUTIONS, check=True).stdout)

    def under(self, path: str | Path) -> bool:
        return Path(path).resolve().is_relative_to(self.path.resolve())


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, (f"{proc.args} exited {proc.returncode}\n"
                                  f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}")
    return proc


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP and not k.startswith("RINGFENCE_")}
    env["PYTHONNOUSERSITE"] = "1"
    # Not the dev venv's scripts either (it has both distributions installed editable).
    dev_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != dev_bin)
    return env


def _copy_ignore(directory: str, names: list[str]) -> list[str]:
    top_images = Path(directory) == ROOT / "images"
    return [n for n in names if n in COPY_SKIP or n.endswith(".egg-info") or (top_images and n == ".build")]


def _shippable(tree: Path, *, top_cache: bool = False) -> set[str]:
    """Files under `tree` a wheel must carry, relative to it: all but bytecode, *.tar and (for
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


def _wheel_files(wheel: Path) -> tuple[set[str], str]:
    """The wheel's files and its .dist-info folder."""
    with zipfile.ZipFile(wheel) as z:
        names = {n for n in z.namelist() if not n.endswith("/")}
    [dist_info] = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    return names, dist_info


def _build(src: Path, work: Path, dist: Path, *projects: Path) -> subprocess.CompletedProcess[str]:
    """`pip wheel` as a user runs it: build isolation (setuptools from the index), no dependencies."""
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist),
                           *(str(p) for p in projects)],
                          cwd=work, env=_clean_env(), capture_output=True, text=True, timeout=600)


def _make_venv(work: Path, name: str, *requirements: str | Path) -> Venv:
    path = work / name
    _ok(subprocess.run([sys.executable, "-m", "venv", str(path)], cwd=work, env=_clean_env(),
                       capture_output=True, text=True, timeout=120))
    purelib = _ok(subprocess.run([str(path / "bin" / "python"), "-c",
                                  "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 cwd=work, env=_clean_env(), capture_output=True, text=True, timeout=60))
    venv = Venv(path=path, site=Path(purelib.stdout.strip()), work=work, env=_clean_env())
    venv.pip_install(*requirements)
    return venv


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("distributions")


@pytest.fixture(scope="module")
def wheels(work) -> Wheels:
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=_copy_ignore, symlinks=True)
    # The profile the server's build copies into its wheel: the checkout's (scripts/ensure-packages.sh),
    # else the build falls back to the Debian package's, as setup.py does.
    if SECCOMP_CHECKOUT.is_file():
        (src / "build" / "seccomp").mkdir(parents=True)
        shutil.copy2(SECCOMP_CHECKOUT, src / "build" / "seccomp" / "docker-default.json")
        seccomp = src / "build" / "seccomp" / "docker-default.json"
    else:
        seccomp = SECCOMP_SYSTEM
    # Decoys: a working tree may hold these, the wheels must not.
    cache = src / "images" / ".build"
    (cache / "layers").mkdir(parents=True)
    (cache / "layers" / "decoy.tar").write_bytes(b"decoy")
    (cache / "decoy").mkdir()
    (cache / "decoy" / "image.json").write_text("{}")
    (src / "images" / "decoy.tar").write_bytes(b"decoy")
    stray = src / "images" / "tool" / "rootfs" / "opt" / "__pycache__"
    stray.mkdir(parents=True, exist_ok=True)
    (stray / "decoy.cpython-311.pyc").write_bytes(b"decoy")
    (src / "client" / "ringfence" / "__pycache__").mkdir(exist_ok=True)
    (src / "client" / "ringfence" / "__pycache__" / "decoy.cpython-311.pyc").write_bytes(b"decoy")

    dist = work / "dist"
    _ok(_build(src, work, dist, src / "client", src))
    [client] = dist.glob("ringfence-*.whl")
    [server] = dist.glob("ringfence_server-*.whl")
    return Wheels(src=src, client=client, server=server, seccomp=seccomp)


@pytest.fixture(scope="module")
def client_venv(work, wheels) -> Venv:
    """The client's wheel alone; its dependencies resolved from the index."""
    return _make_venv(work, "client-venv", wheels.client)


@pytest.fixture(scope="module")
def server_venv(work, wheels) -> Venv:
    """The server's wheel, and the client's as a file (not on the index); the rest from the index."""
    return _make_venv(work, "server-venv", wheels.server, wheels.client)


@pytest.fixture(scope="module")
def probe(server_venv) -> dict:
    return json.loads(server_venv.python(PROBE, check=True).stdout)


# --- the wheels ----------------------------------------------------------------------------------


def test_the_client_wheel_carries_its_package_and_nothing_else(wheels):
    names, dist_info = _wheel_files(wheels.client)
    assert {n.split("/", 1)[0] for n in names} == {"ringfence", dist_info}
    shipped = {n.split("/", 1)[1] for n in names if n.startswith("ringfence/")}
    assert shipped == _shippable(wheels.src / "client" / "ringfence")
    assert {"py.typed", "v1/__init__.py", "cli/main.py", "wire/status.py"} <= shipped
    assert [n for n in shipped if n.startswith("v1/") and n.endswith("_pb2.pyi")]  # the stubs' types ship
    entry_points = zipfile.ZipFile(wheels.client).read(f"{dist_info}/entry_points.txt").decode()
    assert "ringfence = ringfence.cli.main:main" in entry_points


def test_the_server_wheel_carries_its_package_the_image_specs_and_the_seccomp_profile_and_nothing_else(wheels):
    names, dist_info = _wheel_files(wheels.server)
    assert {n.split("/", 1)[0] for n in names} == {"ringfence_server", "ringfence_images", dist_info}
    assert not [n for n in names if "/.build/" in n or n.endswith((".tar", ".pyc")) or "__pycache__" in n]
    # The package ships whole (a subpackage without __init__.py, or a data file of a kind setup.py
    # does not list, would be missing), plus the profile its build generated into it.
    shipped = {n.split("/", 1)[1] for n in names if n.startswith("ringfence_server/")}
    generated = SECCOMP_SHIPPED.split("/", 1)[1]
    assert shipped == _shippable(wheels.src / "ringfence_server") | {generated}
    assert not (wheels.src / SECCOMP_SHIPPED).exists()  # generated into the wheel, not into the tree
    assert zipfile.ZipFile(wheels.server).read(SECCOMP_SHIPPED) == wheels.seccomp.read_bytes()
    assert {"control/default_config.toml", "control/tools/echo.json"} <= shipped
    # No test harness ships: the egress testbed, its decoys and the scripted proxies live in tests/.
    harness = [n for n in names if n.rsplit("/", 1)[-1] in ("testing.py", "decoy.py", "conftest.py")
               or "/tests/" in n or n.rsplit("/", 1)[-1].startswith("test_")]
    assert harness == []
    # images/ ships as ringfence_images/, exactly, minus its build cache and the decoys.
    images = {n.split("/", 1)[1] for n in names if n.startswith("ringfence_images/")}
    assert images == _shippable(wheels.src / "images", top_cache=True)
    assert {"images.lock", "tool/image.json", "egress-proxy/image.json"} <= images
    # No script of its own: its commands join the client's `ringfence` through the entry point group.
    entry_points = zipfile.ZipFile(wheels.server).read(f"{dist_info}/entry_points.txt").decode()
    assert "[console_scripts]" not in entry_points
    assert "[ringfence.cli]\nserver = ringfence_server.control.cli:extend" in entry_points


def test_the_server_build_without_the_checkouts_profile_takes_the_debian_packages_or_names_the_script(wheels, work):
    """From a tree without build/seccomp/: the Debian package's file when installed, else the
    build stops and says how to get the file (never a wheel that cannot start a sandbox)."""
    bare = work / "bare"
    shutil.copytree(wheels.src, bare, ignore=shutil.ignore_patterns("build", "*.egg-info"), symlinks=True)
    dist = work / "bare-dist"
    proc = _build(bare, work, dist, bare)
    if SECCOMP_SYSTEM.is_file():
        _ok(proc)
        [server] = dist.glob("ringfence_server-*.whl")
        assert zipfile.ZipFile(server).read(SECCOMP_SHIPPED) == SECCOMP_SYSTEM.read_bytes()
    else:
        assert proc.returncode != 0 and not list(dist.glob("*.whl"))
        assert "Docker's default seccomp profile was not found" in proc.stderr, proc.stderr[-3000:]
        assert "bash scripts/ensure-packages.sh" in proc.stderr and "golang-github-docker-docker-dev" in proc.stderr


# --- the client venv -----------------------------------------------------------------------------


def _report(capsys, name: str, venv: Venv) -> tuple[float, int]:
    """`name`'s installed size (MB, its RECORD's files) and dependency count, printed for the notes."""
    dists = venv.distributions()
    size_mb = dists[name]["bytes"] / 1e6
    deps = sorted(set(dists) - INSTALLER - {name})
    deps_mb = sum(dists[d]["bytes"] for d in deps) / 1e6
    line = (f"{name} {dists[name]['version']}: installed {size_mb:.2f} MB; {len(deps)} dependencies "
            f"({deps_mb:.1f} MB): {', '.join(deps)}")
    with capsys.disabled():
        print(f"\n{line}")
    print(line)
    return size_mb, len(deps)


def test_the_client_venv_has_none_of_the_servers_dependencies(client_venv, capsys):
    dists = client_venv.distributions()
    assert "ringfence" in dists
    assert sorted(SERVER_ONLY & set(dists)) == []
    assert [d for d in dists if d.startswith("opentelemetry-exporter-")] == []
    # It imports the installed package, not the checkout, and has no server to import.
    proc = client_venv.python("import ringfence, sys; print(ringfence.__file__); import ringfence_server")
    assert proc.returncode == 1 and "No module named 'ringfence_server'" in proc.stderr, proc.stderr
    assert client_venv.under(proc.stdout.strip())
    _report(capsys, "ringfence", client_venv)


def _commands(help_text: str) -> list[str]:
    """The COMMAND names `ringfence --help` lists, in order."""
    block = help_text.split("  COMMAND\n", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^    (\S+)", block, re.M)


def test_the_client_venvs_ringfence_has_only_the_clients_commands(client_venv):
    helped = client_venv.ringfence("--help", check=True).stdout
    assert _commands(helped) == CLIENT_COMMANDS
    # `ringfence mcp` needs the `mcp` extra, which this venv does not have: the help says how.
    assert "pip install 'ringfence[mcp]'" in " ".join(helped.split())
    runs = client_venv.ringfence("runs", "--help", check=True).stdout
    assert "list" in runs and not [a for a in STORE_ACTIONS if re.search(rf"^    {a}\b", runs, re.M)], runs
    # `tools new` is the server's scaffold: here `new` is a query and `x` a usage error.
    proc = client_venv.ringfence("tools", "new", "x")
    assert proc.returncode == 2 and "unrecognized arguments: x" in proc.stderr, proc.stderr


def test_the_installed_client_carries_its_types(client_venv, tmp_path):
    """py.typed ships: a type checker reads the installed package's own annotations (PEP 561).
    The dev venv's mypy checks a user's file against the client venv's site-packages."""
    user = tmp_path / "user_code.py"
    user.write_text("from ringfence import Client, ProposedCall\n"
                    "client: int = Client('127.0.0.1:50051', 'token')\n"
                    "call = ProposedCall(call_id='c1', tool='echo', arguments={'text': 'hi'})\n"
                    "reveal_type(call.tool)\n")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--python-executable",
                           str(client_venv.bin / "python"), str(user)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert 'Incompatible types in assignment (expression has type "Client", variable has type "int")' in out, out
    assert 'Revealed type is "str"' in out or 'Revealed type is "builtins.str"' in out, out
    assert "missing library stubs or py.typed marker" not in out, out


def test_the_client_imports_beside_the_control_library_from_the_index(work, wheels):
    """`control` (the Python Control Systems Library) is a top-level name the server once took:
    both import in one interpreter, each from its own distribution, and they share no top-level name."""
    venv = _make_venv(work, "control-venv", wheels.client, "control")
    code = ("import json, control, ringfence; "
            "print(json.dumps([control.__file__, ringfence.__file__, "
            "hasattr(control, 'TransferFunction'), hasattr(ringfence, 'Client')]))")
    control_file, ringfence_file, has_tf, has_client = json.loads(venv.python(code, check=True).stdout)
    assert has_tf and has_client
    assert Path(control_file) == venv.site / "control" / "__init__.py"
    assert Path(ringfence_file) == venv.site / "ringfence" / "__init__.py"
    dists = venv.distributions()
    assert "control" in dists["control"]["tops"] and dists["ringfence"]["tops"] == ["ringfence"]
    assert set(dists["control"]["tops"]).isdisjoint(dists["ringfence"]["tops"])


# --- the server venv -----------------------------------------------------------------------------


def test_the_server_venv_has_one_ringfence_script_the_clients(server_venv, capsys):
    assert sorted(p.name for p in server_venv.bin.iterdir() if p.name.startswith("ringfence")) == ["ringfence"]
    dists = server_venv.distributions()
    ringfence_scripts = [(name, script) for name, d in dists.items() for script in d["console_scripts"]
                         if script.startswith("ringfence ")]
    assert ringfence_scripts == [("ringfence", "ringfence = ringfence.cli.main:main")]
    _report(capsys, "ringfence-server", server_venv)


def test_the_server_venvs_ringfence_lists_the_clients_and_the_servers_commands(server_venv):
    proc = server_venv.ringfence("--help", check=True)
    assert proc.stderr == ""  # no "could not be loaded" for the server's extension
    # The server depends on ringfence[mcp]: its `ringfence` has the MCP front door too.
    assert _commands(proc.stdout) == [*CLIENT_COMMANDS, "mcp", *SERVER_COMMANDS]
    # The same as the checkout's (dev venv, both installed editable): nothing is missing from a wheel.
    checkout = _ok(subprocess.run([str(Path(sys.executable).parent / "ringfence"), "--help"], cwd=server_venv.work,
                                  env=server_venv.env, capture_output=True, text=True, timeout=60))
    assert proc.stdout == checkout.stdout
    runs = server_venv.ringfence("runs", "--help", check=True).stdout
    assert all(re.search(rf"^    {a}\b", runs, re.M) for a in STORE_ACTIONS), runs
    server_venv.ringfence("serve", "--help", check=True)


def test_the_server_venv_imports_the_installed_packages_not_the_checkout(server_venv, wheels, probe):
    for module in ("ringfence", "control", "sandbox", "config", "seccomp_shipped"):
        assert server_venv.under(probe[module]), (module, probe[module])
    assert not Path(probe["control"]).resolve().is_relative_to(ROOT)
    assert str(ROOT) not in probe["sys_path"] and "" not in probe["sys_path"][1:]
    assert not [m for m in probe["meta_path"] if "editable" in m.lower()], probe["meta_path"]
    assert Path(probe["config"]).is_file()
    manifests = (wheels.src / "ringfence_server" / "control" / "tools").glob("*.json")
    assert probe["tools"] == sorted(p.stem for p in manifests)
    # Docker's default seccomp profile: the Debian package's when installed, else the copy the wheel carries.
    assert Path(probe["seccomp_shipped"]) == server_venv.site / SECCOMP_SHIPPED
    assert Path(probe["seccomp_shipped"]).read_bytes() == wheels.seccomp.read_bytes()
    assert Path(probe["seccomp"]) == (SECCOMP_SYSTEM if SECCOMP_SYSTEM.is_file() else Path(probe["seccomp_shipped"]))


def test_the_images_lock_and_specs_resolve_inside_the_installed_package(server_venv, wheels, probe):
    images = server_venv.site / "ringfence_images"
    assert Path(probe["images_dir"]) == images
    assert Path(probe["lock"]) == Path(probe["lock_path"]) == images / "images.lock"
    assert (images / "images.lock").is_file() and not (images / ".build").exists()
    # The installed specs, with their `files` resolved against site-packages (the installed
    # ringfence_server modules), hash exactly as the same specs do in the tree the wheel was built
    # from: a verify or build from the wheel means what it means in the checkout.
    from ringfence_server.imagebuild.spec import load_specs

    built_from = {n: s.inputs_sha256() for n, s in load_specs(wheels.src / "images").items()}
    assert probe["inputs"] == built_from
    assert set(probe["locked"]) == set(built_from)


def test_RINGFENCE_IMAGES_DIR_overrides_the_shipped_images(server_venv, wheels):
    """An installed server can build and verify from a writable copy of the specs."""
    proc = server_venv.python("from ringfence_server.sandbox.pinned_images import IMAGES_DIR, default_lock_path; "
                              "print(IMAGES_DIR); print(default_lock_path())",
                              env={"RINGFENCE_IMAGES_DIR": str(wheels.src / "images")}, check=True)
    assert proc.stdout.split() == [str(wheels.src / "images"), str(wheels.src / "images" / "images.lock")]


def test_images_verify_reads_the_shipped_lock(server_venv, probe):
    proc = server_venv.ringfence("images", "verify")
    out = proc.stdout + proc.stderr
    if proc.returncode == 2:  # no engine: it says so, after reading the lock
        assert "images verify:" in proc.stderr
    else:
        assert proc.returncode in (0, 1), out  # 1: images missing or drifted, each named
        for name in probe["locked"]:
            assert name in out
    # Without the shipped lock (this venv is ours to break), the error names where it looked.
    lock = server_venv.site / "ringfence_images" / "images.lock"
    saved = lock.read_bytes()
    lock.unlink()
    try:
        proc = server_venv.ringfence("images", "verify")
    finally:
        lock.write_bytes(saved)
    assert proc.returncode == 2
    assert f"{lock} does not exist" in proc.stderr


def test_serve_without_an_engine_says_so_in_one_line(server_venv, tmp_path):
    """What a user whose Docker is not running sees (DOCKER_HOST is the user's own variable)."""
    proc = server_venv.ringfence("serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"),
                                 env={"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "error: the sandbox engine is not usable" in proc.stderr


# --- serving -------------------------------------------------------------------------------------


@dataclass
class Serving:
    served: Served
    venv: Venv
    state: Path


def _leftovers(docker_client, pid: int) -> list[str]:
    """Remove (and name) the Docker objects the served process `pid` left behind: it runs without
    the test session's variable, so the session's cleanup would not see them."""
    selector = {"label": [f"ringfence.pid={pid}", f"ringfence.host={socket.gethostname()}"]}
    left = []
    for container in docker_client.containers.list(all=True, filters=selector):
        left.append(f"container {container.name}")
        container.remove(force=True)
    for network in docker_client.networks.list(filters=selector):
        left.append(f"network {network.name}")
        network.remove()
    for volume in docker_client.volumes.list(filters=selector):
        left.append(f"volume {volume.name}")
        volume.remove(force=True)
    return left


@pytest.fixture
def serving(server_venv, docker_client, pinned_images, tmp_path) -> Iterator[Serving]:
    """`ringfence serve` from the server venv on its embedded defaults (no --config), no variable set."""
    served = Served(None, tmp_path / "state", command=[str(server_venv.bin / "ringfence")], cwd=server_venv.work,
                    base_env=server_venv.env)
    try:
        yield Serving(served, server_venv, tmp_path / "state")
    finally:
        served.stop()  # a no-op after the test's own stop; else SIGTERM, then SIGKILL after 60 s
        left = _leftovers(docker_client, served.proc.pid)
    assert left == [], f"the served server left Docker objects behind (removed now): {left}"


def _stopped(served: Served) -> None:
    code = served.stop()
    assert served.proc.stderr is not None, "Served pipes stderr"
    assert code == 0, "\n".join(served.lines) + served.proc.stderr.read()[-2000:]
    assert served.lines[-1] == "ringfence: stopped"


@pytest.mark.docker
def test_serve_from_the_server_venv_serves_the_echo_call_from_the_pinned_image_and_stops_on_sigterm(serving, wheels):
    from ringfence import Client

    served = serving.served
    assert served.lines[0].startswith("ringfence: serving ringfence.v1 on 127.0.0.1:")
    manifests = {json.loads(p.read_text())["name"]: json.loads(p.read_text())
                 for p in (wheels.src / "ringfence_server" / "control" / "tools").glob("*.json")}
    with Client(served.address, DEMO_AGENT_TOKEN, timeout=120) as client:
        tools = client.list_tools()
        assert sorted(t.name for t in tools) == sorted(manifests)
        assert all(t.description and t.schema for t in tools)
        run = client.start_run("distribution probe", "distribution-run")
        [obs] = client.submit_batch(run.run_id, [{"call_id": "c1", "tool": "echo", "arguments": {"text": "hi"}}])
    assert obs.error is None and obs.content == {"text": "hi"}, obs
    # The installed CLI's own client lists the same tools.
    proc = serving.venv.ringfence("tools", "--server", served.address, "--json",
                                  env={"RINGFENCE_TOKEN": DEMO_AGENT_TOKEN}, check=True)
    assert sorted(json.loads(line)["name"] for line in proc.stdout.splitlines()) == sorted(manifests)
    _stopped(served)
    # The call ran in the image the shipped lock pins (the attempt records the image ID).
    export = serving.venv.ringfence("runs", "export", "--state-dir", str(serving.state), "distribution-run",
                                    check=True)
    attempts = [e["data"] for e in map(json.loads, export.stdout.splitlines()) if e["type"] == "attempt"]
    shipped_lock = json.loads((serving.venv.site / "ringfence_images" / "images.lock").read_text())
    pinned = shipped_lock["images"][manifests["echo"].get("image", "tool")]["id"]
    assert [(a["call_id"], a["outcome"], a["image_id"]) for a in attempts] == [("c1", "ok", pinned)]


@pytest.mark.docker
def test_serve_with_an_operators_seccomp_override_that_points_nowhere_says_so_at_start(server_venv, docker_client,
                                                                                       tmp_path):
    proc = server_venv.ringfence("serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"),
                                 env={"RINGFENCE_SECCOMP_BASE": str(tmp_path / "no-such-profile.json")})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "error: the sandbox engine is not usable" in proc.stderr and "no-such-profile.json" in proc.stderr


def _readme_agent() -> tuple[str, str]:
    """The first python block under "## A first agent", and what the README says it prints."""
    section = README.read_text(encoding="utf-8").split("\n## A first agent\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```python\n(.*?)^```$", section, re.S | re.M)
    assert block, "README.md: no ```python block under '## A first agent'"
    # One line as `It prints `...``, or several as "It prints:" and a fenced block.
    after = section[block.end():]
    stated = re.search(r"It prints `([^`]+)`", after) or re.search(r"It prints:\s*\n+```\w*\n(.*?)\n```", after, re.S)
    assert stated, "README.md: the paragraph after the first agent does not say what it prints (It prints `...`)"
    return block.group(1), stated.group(1)


@pytest.mark.docker
def test_the_readmes_first_agent_from_the_client_venv_prints_what_the_readme_says(client_venv, serving):
    code, stated = _readme_agent()
    agent = client_venv.work / "agent.py"
    agent.write_text(code, encoding="utf-8")
    proc = client_venv.run(client_venv.bin / "python", agent, env={"RINGFENCE_SERVER": serving.served.address},
                           timeout=180, check=True)
    assert proc.stdout == stated + "\n", proc.stderr[-2000:]
    _stopped(serving.served)
