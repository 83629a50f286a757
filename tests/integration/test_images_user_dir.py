"""A user's images dir outside the checkout: a child of the built-in `tool` image that pins one
Debian package (jq, which pulls libjq1 and libonig5 that the base lacks) and one wheel
(tabulate), fetched from the real Debian mirror and PyPI, built twice to one image ID (the
second time in a network namespace of its own, with the mirror and index pointed nowhere),
used from a tool in a sandbox, and recorded in the user's lock with every hash; a changed hash
is named by `verify` and refused by `build`. Then `images adopt` of images made by
`docker build` FROM the pinned tool image's ID: a clean one is pinned (not reproducible), one
with a setuid-root shell and one whose default user is root are refused, naming the check.

The commands run as the CLI (`python -m ringfence.cli images ...`, this checkout's code) in a
subprocess, as a user would run them. Every image made here carries the product labels and
this session's label, and is removed at the end; the built-in images are only read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from image_support import TEST_LABELS, docker_built, remove_image

from ringfence_server.imagebuild import engine
from ringfence_server.imagebuild.archive import digest_of, file_digest
from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.pinned_images import lock_for
from ringfence_server.sandbox.profile import SandboxProfile
from ringfence_server.sandbox.result import Outcome

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# Exact versions the bookworm mirror serves (a point release may move them: see the report in
# a failure, which names what the index has instead).
JQ = "jq=1.6-2.1+deb12u2"
PULLED = {"libjq1": "1.6-2.1+deb12u2", "libonig5": "6.9.8-1"}
TABULATE = {"name": "tabulate", "version": "0.9.0",
            "sha256": "024ca478df22e9340661486f85298cff5f6dcdba14f3813e8830015b9ed1948f"}
WRONG = "0" * 64
SESSION = os.environ[L.TEST_SESSION_ENV]

PROBE = '''import subprocess

import tabulate


def run(args, context):
    out = subprocess.run(["jq", "-c", ".a"], input=b'{"a": [1, 2]}', capture_output=True, check=True)
    return {"jq": out.stdout.decode().strip(), "table": tabulate.tabulate([[1, 2]], tablefmt="plain"),
            "tabulate_from": tabulate.__file__}
'''


def cli(*args: str, netns: bool = False, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ringfence.cli", "images", *args]
    if netns:
        cmd = ["unshare", "--net", "--", *cmd]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project folder outside the checkout with one image spec: a child of the built-in tool."""
    root = tmp_path_factory.mktemp("user-project")
    assert REPO not in root.parents
    name = f"rftest-{uuid.uuid4().hex[:8]}"
    spec = root / "images" / name
    (spec / "rootfs/opt/ringfence/tools").mkdir(parents=True)
    (spec / "rootfs/opt/ringfence/tools/deps_probe.py").write_text(PROBE)
    (spec / "image.json").write_text(json.dumps({
        "parent": "tool", "labels": TEST_LABELS, "packages": [JQ], "wheels": [TABULATE],
    }, indent=2))
    return root / "images", name


@pytest.fixture(scope="module")
def built(docker_client, pinned_images, project):
    """fetch, build (pins the lock), build again --force --offline with no network: the steps
    and their timings, and the image made (removed at the end)."""
    images, name = project
    timings: dict[str, float] = {}
    runs: dict[str, subprocess.CompletedProcess[str]] = {}
    ids: list[str] = []
    netns = os.geteuid() == 0 and shutil.which("unshare") is not None
    try:
        for step, args, kw in [
            ("fetch", ("fetch", "--images-dir", str(images)), {}),
            ("build", ("build", "--images-dir", str(images), "--update-lock"), {}),
            # The same inputs again, from scratch, with nothing to reach: its own network
            # namespace (root only), and the mirror's and index's addresses pointed nowhere.
            ("rebuild offline", ("build", "--images-dir", str(images), "--force", "--offline"),
             {"netns": netns,
              "env": {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "http_proxy": "http://127.0.0.1:9",
                      "https_proxy": "http://127.0.0.1:9", "no_proxy": ""}}),
        ]:
            t0 = time.monotonic()
            runs[step] = cli(*args, **kw)
            timings[step] = time.monotonic() - t0
            assert runs[step].returncode == 0, f"{step}:\n{runs[step].stderr}"
            if step != "fetch":
                ids.append(lock_for(images).image_id(name))
        yield {"images": images, "name": name, "runs": runs, "timings": timings, "ids": ids, "netns": netns}
    finally:
        for image_id in set(ids):
            remove_image(docker_client, image_id)


def test_fetch_then_two_builds_give_one_image_id_the_second_offline(built, docker_client):
    first, second = built["ids"]
    assert first == second
    runs = built["runs"]
    # The first build made the image; the second made it again from scratch (not the cache's
    # record) and came out byte for byte the same, downloading nothing.
    assert f"assembled {first}" in runs["build"].stderr
    assert f"assembled {second}" in runs["rebuild offline"].stderr
    assert "downloaded" not in runs["rebuild offline"].stderr and "index from" not in runs["rebuild offline"].stderr
    # fetch did the network work: the signed index, the three .debs, the wheel.
    fetch = runs["fetch"].stderr
    assert "signature checked" in fetch and "jq needs libjq1=" in fetch and "libjq1 needs libonig5=" in fetch
    assert "3 package file(s) and 1 wheel(s)" in fetch
    assert docker_client.images.get(first).attrs["Config"]["Labels"][L.TEST_SESSION_LABEL] == SESSION
    print(f"\ntimings: {', '.join(f'{k} {v:.1f}s' for k, v in built['timings'].items())}; "
          f"offline rebuild in its own network namespace: {built['netns']}")


def test_the_lock_records_every_package_and_wheel_with_hashes(built, pinned_images):
    lock = lock_for(built["images"])
    entry = lock.entry(built["name"])
    assert lock.names == (built["name"],)  # the user's lock holds the user's image only
    assert (entry.parent, entry.parent_id) == ("tool", pinned_images.image_id("tool"))
    assert entry.reproducible
    debs = {d.name: d for d in entry.debs}
    assert {n: d.version for n, d in debs.items()} == {"jq": JQ.split("=")[1], **PULLED}
    assert {n for n, d in debs.items() if d.pinned} == {"jq"}
    cache = built["images"] / ".build"
    for d in entry.debs:
        assert d.filename.startswith("pool/main/") and d.architecture == "amd64"
        assert sha256(cache / "debs" / d.cache_name) == d.sha256
    (wheel,) = entry.wheels
    assert (wheel.name, wheel.version, wheel.sha256) == (TABULATE["name"], TABULATE["version"], TABULATE["sha256"])
    assert wheel.filename == "tabulate-0.9.0-py3-none-any.whl"
    assert sha256(cache / "wheels" / wheel.sha256 / wheel.filename) == wheel.sha256
    verify = cli("verify", "--images-dir", str(built["images"]))
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.split() == [built["name"], entry.id]


def test_the_package_and_the_wheel_work_in_a_sandbox(built, docker_client, runtime):
    """The tool imports the wheel and runs the package's binary, in the real sandbox (read-only
    root, uid 10001, no network) that dispatch gives any tool, on both runtimes."""
    backend = DockerBackend(docker_client, lock=lock_for(built["images"]))
    request = SandboxRequest(
        profile=SandboxProfile(image=built["name"], runtime=runtime), run_id="user-images",
        stdin=json.dumps({"tool": "deps_probe", "arguments": {}, "call_id": "c1"}).encode())
    result = backend.run(request)
    assert result.outcome is Outcome.OK, (result.stdout, result.stderr)
    assert result.image_id == built["ids"][0]
    assert json.loads(result.stdout) == {"ok": True, "content": {
        "jq": "[1,2]", "table": "1  2", "tabulate_from": "/opt/ringfence/site/tabulate/__init__.py"}}


def test_a_changed_hash_is_named_by_verify_and_refused_by_build(built):
    images, name = built["images"], built["name"]
    spec, lock = images / name / "image.json", images / "images.lock"
    spec_text, lock_text = spec.read_text(), lock.read_text()
    try:
        # A wheel pinned to another hash: verify names the wheel and both hashes; the offline
        # build refuses it by name (the wheelhouse has no file with that hash).
        spec.write_text(spec_text.replace(TABULATE["sha256"], WRONG))
        v = cli("verify", "--images-dir", str(images))
        assert v.returncode == 1
        assert f"wheel tabulate==0.9.0: images/{name} pins sha256 {WRONG}, the lock records" in v.stderr
        assert TABULATE["sha256"] in v.stderr
        b = cli("build", "--images-dir", str(images), "--offline")
        assert b.returncode == 2 and f"wheel tabulate==0.9.0: no file with sha256 {WRONG}" in b.stderr
        spec.write_text(spec_text)

        # A package's recorded hash changed in the lock: the cached .deb is no longer the file
        # the lock pins; verify names it, and a rebuild refuses to unpack it.
        doc = json.loads(lock_text)
        (onig,) = [d for d in doc["images"][name]["debs"] if d["name"] == "libonig5"]
        onig["sha256"] = WRONG
        lock.write_text(json.dumps(doc))
        v = cli("verify", "--images-dir", str(images))
        assert v.returncode == 1
        assert f"package libonig5={PULLED['libonig5']}: the cached" in v.stderr
        assert f"the lock records {WRONG}" in v.stderr
        b = cli("build", "--images-dir", str(images), "--force", "--offline")
        assert b.returncode == 2
        assert f"libonig5={PULLED['libonig5']}: the cached .deb" in b.stderr and "refusing to install it" in b.stderr
    finally:
        spec.write_text(spec_text)
        lock.write_text(lock_text)
    assert cli("verify", "--images-dir", str(images)).returncode == 0


def test_a_parent_in_no_build_cache_is_read_back_from_the_engine(docker_client, pinned_images, tmp_path):
    """Where the built-in images were built elsewhere (no .build cache here), a user's child
    takes its parent's layers from the engine: `docker save` gives back the very bytes, the
    config hashing to the pinned ID and each layer to its diff_id."""
    tool = pinned_images.image_id("tool")
    config, layers = engine.save_image(docker_client, tool, tmp_path / "layers")
    assert digest_of(config) == tool
    assert [file_digest(p) for p in layers] == json.loads(config)["rootfs"]["diff_ids"]
    assert all(p.parent == tmp_path / "layers" for p in layers)


# -- adopt -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def adoptees(docker_client, pinned_images, tmp_path_factory):
    """Images made by `docker build` FROM the pinned tool image's ID (no registry: the engine's
    own image), each labelled; removed at the end (with the builder's intermediate images)."""
    with docker_built(docker_client, pinned_images.image_id("tool"), ("clean", "root-user", "setuid-shell"),
                      lambda kind: tmp_path_factory.mktemp(f"adopt-{kind}")) as made:
        yield made


def test_adopt_pins_a_docker_built_tool_image_that_passes_every_check(adoptees, docker_client, tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    r = cli("adopt", "mine", adoptees["clean"], "--tool", "--images-dir", str(images))
    assert r.returncode == 0, r.stderr
    for check in ("user: ok", "setuid: ok", "init: ok: PID 1 is /usr/bin/tini", "runner: ok"):
        assert check in r.stderr
    entry = lock_for(images).entry("mine")
    assert (entry.id, entry.reproducible, entry.tool, entry.parent) == (adoptees["clean"], False, True, None)
    assert json.loads((images / "images.lock").read_text())["images"]["mine"]["reproducible"] is False
    v = cli("verify", "--images-dir", str(images))
    assert v.returncode == 0, v.stderr
    assert v.stdout.split("\t")[:2] == ["mine", adoptees["clean"]] and "adopted, not reproducible" in v.stdout
    # Dispatch resolves the adopted name like any pinned one, and the runner answers in it.
    backend = DockerBackend(docker_client, lock=lock_for(images))
    result = backend.run(SandboxRequest(profile=SandboxProfile(image="mine"), run_id="adopted", stdin=json.dumps(
        {"tool": "echo", "arguments": {"x": 1}, "call_id": "c1"}).encode()))
    assert result.outcome is Outcome.OK and json.loads(result.stdout) == {"ok": True, "content": {"x": 1}}


@pytest.mark.parametrize("kind, failed, named", [
    ("root-user", "user", "the default user is 'root', which is root"),
    ("setuid-shell", "setuid", "1 privileged file(s): /usr/local/bin/rootsh (setuid 0:0 4755)"),
])
def test_adopt_refuses_naming_the_failed_check(adoptees, tmp_path, kind, failed, named):
    images = tmp_path / "images"
    images.mkdir()
    r = cli("adopt", "bad", adoptees[kind], "--tool", "--images-dir", str(images))
    assert r.returncode == 1
    assert f"{failed}: FAILED: {named}" in r.stderr
    assert f"bad refused ({failed})" in r.stderr
    assert not (images / "images.lock").exists()  # nothing pinned


def test_verify_checks_an_adopted_image_again(adoptees, tmp_path):
    """A lock that pins an image adopt would refuse (written by hand, or the image's checks
    changed meaning) is reported by verify, naming the check."""
    images = tmp_path / "images"
    images.mkdir()
    (images / "images.lock").write_text(json.dumps({"version": 1, "images": {"bad": {
        "id": adoptees["setuid-shell"], "inputs_sha256": adoptees["setuid-shell"], "parent": None,
        "parent_id": None, "reproducible": False, "tool": True}}}))
    v = cli("verify", "--images-dir", str(images))
    assert v.returncode == 1
    assert "bad: refused: adopted image" in v.stderr and "fails the setuid check" in v.stderr
    assert "/usr/local/bin/rootsh" in v.stderr
