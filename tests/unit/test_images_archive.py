"""Deterministic image assembly, specs, the lock, drift detection and the tool runner.

No Docker here: images are assembled with load=False and the runner runs on the host python.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ringfence_server.imagebuild import Lock, LockEntry, build, load_lock, package_diff
from ringfence_server.imagebuild.archive import (
    CREATED,
    EPOCH,
    ContainerConfig,
    digest_of,
    image_config,
    tree_entries,
    write_docker_archive,
    write_layer,
    write_layer_file,
)
from ringfence_server.imagebuild.builder import Built, Cache
from ringfence_server.imagebuild.spec import build_order, load_spec, load_specs
from ringfence_server.sandbox.errors import ImageError
from ringfence_server.sandbox.pinned_images import IMAGES_DIR

REPO = Path(__file__).resolve().parents[2]
RINGFENCE_DIR = REPO / "images/tool/rootfs/opt/ringfence"


# -- the tar writer ------------------------------------------------------------------------


def _make_tree(root: Path, mtime: int) -> Path:
    (root / "b/sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\n")
    (root / "b/sub/run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "b-c").write_text("sorts between b and b/\n")
    os.chmod(root / "b/sub/run.sh", 0o700)
    os.chmod(root / "a.txt", 0o600)
    os.symlink("../a.txt", root / "b/link")
    for p in [root, *root.rglob("*")]:
        os.utime(p, (mtime, mtime), follow_symlinks=False)
    return root


def _layer_bytes(root: Path, normalize: bool) -> bytes:
    buf = io.BytesIO()
    write_layer(tree_entries(root, normalize=normalize), buf)
    return buf.getvalue()


def test_same_tree_twice_gives_same_bytes_and_digest(tmp_path):
    one = _make_tree(tmp_path / "one", 1_000_000)
    two = _make_tree(tmp_path / "two", 1_700_000_000)  # different mtimes, different path
    for normalize in (True, False):
        a, b = _layer_bytes(one, normalize), _layer_bytes(two, normalize)
        assert a == b
        buf = io.BytesIO()
        assert write_layer(tree_entries(one, normalize=normalize), buf) == digest_of(a)


def test_members_are_sorted_with_fixed_mtime_and_numeric_owners(tmp_path):
    root = _make_tree(tmp_path / "t", 123)
    with tarfile.open(fileobj=io.BytesIO(_layer_bytes(root, True))) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    # Byte order: "b-c" ('-' is 0x2d) sorts before "b/..." ('/' is 0x2f); parents come first.
    assert names == ["a.txt", "b", "b-c", "b/link", "b/sub", "b/sub/run.sh"]
    by = {m.name: m for m in members}
    for m in members:
        assert m.mtime == EPOCH
        assert (m.uid, m.gid, m.uname, m.gname) == (0, 0, "", "")
    assert by["a.txt"].mode == 0o644  # 0600 normalized
    assert by["b/sub/run.sh"].mode == 0o755  # exec bit kept
    assert by["b"].mode == 0o755 and by["b"].isdir()
    assert by["b/link"].issym() and by["b/link"].linkname == "../a.txt"


def test_unnormalized_tree_keeps_modes_and_hardlinks(tmp_path):
    root = _make_tree(tmp_path / "t", 5)
    os.link(root / "a.txt", root / "b/hard")
    with tarfile.open(fileobj=io.BytesIO(_layer_bytes(root, False))) as tar:
        by = {m.name: m for m in tar.getmembers()}
    assert by["a.txt"].mode == 0o600 and by["a.txt"].isreg()
    assert by["b/hard"].islnk() and by["b/hard"].linkname == "a.txt"
    assert by["a.txt"].uid == os.getuid() and by["a.txt"].uname == ""


def test_overlay_skips_bytecode(tmp_path):
    root = _make_tree(tmp_path / "t", 5)
    clean = _layer_bytes(root, True)
    (root / "b/__pycache__").mkdir()
    (root / "b/__pycache__/x.cpython-311.pyc").write_bytes(b"junk")
    (root / "stray.pyc").write_bytes(b"junk")
    assert _layer_bytes(root, True) == clean


def test_special_files_are_refused(tmp_path):
    root = _make_tree(tmp_path / "t", 5)
    os.mkfifo(root / "fifo")
    with pytest.raises(ImageError, match="special files"):
        tree_entries(root, normalize=False)


def test_layer_file_is_content_addressed(tmp_path):
    root = _make_tree(tmp_path / "t", 5)
    diff_id, path = write_layer_file(tree_entries(root, normalize=True), tmp_path / "layers")
    assert path.name == diff_id.split(":")[1] + ".tar"
    assert "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest() == diff_id
    assert [p.name for p in (tmp_path / "layers").iterdir()] == [path.name]  # no temp left


def test_config_is_canonical_and_its_digest_is_the_id():
    cfg = ContainerConfig(env=(("PATH", "/usr/bin:/bin"),), entrypoint=("/usr/bin/tini", "--"),
                          cmd=("python3",), labels=(("ringfence.image", "tool"),))
    a = image_config(cfg, ["sha256:" + "1" * 64], ["layer one"])
    b = image_config(cfg, ["sha256:" + "1" * 64], ["layer one"])
    assert a == b
    doc = json.loads(a)
    assert a == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    assert doc["created"] == CREATED and doc["history"][0]["created"] == CREATED
    assert doc["config"] == {
        "User": "10001:10001", "WorkingDir": "/tmp", "Env": ["PATH=/usr/bin:/bin"],
        "Entrypoint": ["/usr/bin/tini", "--"], "Cmd": ["python3"], "Labels": {"ringfence.image": "tool"},
    }
    assert ContainerConfig.from_json(doc["config"]) == cfg
    with pytest.raises(ImageError):
        image_config(cfg, ["sha256:" + "1" * 64], [])


def test_docker_archive_manifest(tmp_path):
    root = _make_tree(tmp_path / "t", 5)
    diff_id, layer = write_layer_file(tree_entries(root, normalize=True), tmp_path / "layers")
    config = image_config(ContainerConfig(), [diff_id], ["x"])
    buf = io.BytesIO()
    image_id = write_docker_archive(buf, config, [layer])
    assert image_id == digest_of(config)
    with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        hexid = image_id.split(":")[1]
        assert manifest == [{"Config": f"{hexid}.json", "RepoTags": [],
                             "Layers": [f"{diff_id.split(':')[1]}/layer.tar"]}]
        assert tar.extractfile(f"{hexid}.json").read() == config


# -- specs -----------------------------------------------------------------------------------


def test_repo_specs_load_and_order():
    specs = load_specs(IMAGES_DIR)
    assert {"base", "tool"} <= set(specs)
    assert specs["base"].debootstrap is not None and specs["base"].parent is None
    assert specs["tool"].parent == "base"
    assert build_order(specs, ["tool"]) == ["base", "tool"]
    tool_cfg = specs["tool"].container_config(specs["base"].container_config(None))
    assert tool_cfg.entrypoint == ("/usr/bin/tini", "--")
    assert tool_cfg.user == "10001:10001" and tool_cfg.workdir == "/tmp"
    assert [k for k, _ in tool_cfg.env] == ["PATH"]
    assert dict(tool_cfg.labels) == {"ringfence.image": "tool"}
    assert specs["base"].container_config(None).entrypoint is None
    assert "-I" in tool_cfg.cmd and tool_cfg.cmd[-1] == "/opt/ringfence/runner.py"


def _child_spec_dir(images: Path, name: str = "proxy", parent: str = "base") -> Path:
    d = images / name
    (d / "rootfs/opt/proxy").mkdir(parents=True)
    (d / "rootfs/opt/proxy/proxy.py").write_text("print('proxy')\n")
    (d / "image.json").write_text(json.dumps({
        "parent": parent, "cmd": ["python3", "-I", "/opt/proxy/proxy.py"],
        "exposed_ports": [3128], "labels": {"ringfence.image": name},
    }))
    return d


def _root_spec_dir(images: Path) -> Path:
    d = images / "base"
    d.mkdir(parents=True)
    (d / "image.json").write_text(json.dumps({
        "parent": None, "debootstrap": {"suite": "bookworm", "include": ["tini"]},
        "user": "10001:10001", "workdir": "/tmp", "env": {"PATH": "/usr/bin:/bin"},
    }))
    return d


def test_inputs_hash_tracks_content_and_exec_bit_only(tmp_path):
    d = _child_spec_dir(tmp_path)
    h0 = load_spec(d).inputs_sha256()
    f = d / "rootfs/opt/proxy/proxy.py"
    os.chmod(f, 0o600)
    assert load_spec(d).inputs_sha256() == h0  # the layer would be identical
    os.chmod(f, 0o755)
    h1 = load_spec(d).inputs_sha256()
    assert h1 != h0
    f.write_text("print('changed')\n")
    assert load_spec(d).inputs_sha256() not in (h0, h1)


@pytest.mark.parametrize("doc,match", [
    ({"parent": None}, "debootstrap.suite"),
    ({"parent": "base", "bogus": 1}, "unknown fields"),
    ({"parent": "base", "cmd": "python3"}, "list of strings"),
    ({"parent": "base", "exposed_ports": ["http"]}, "exposed_ports"),
    ({"parent": "base", "debootstrap": {"suite": "x"}}, "only a root image"),
])
def test_bad_specs_are_refused(tmp_path, doc, match):
    d = tmp_path / "img"
    d.mkdir()
    (d / "image.json").write_text(json.dumps(doc))
    with pytest.raises(ImageError, match=match):
        load_spec(d)


def test_unknown_parent_and_cycles_are_refused(tmp_path):
    _child_spec_dir(tmp_path, "orphan", parent="nowhere")
    with pytest.raises(ImageError, match="no spec"):
        load_specs(tmp_path)
    shutil.rmtree(tmp_path / "orphan")
    _child_spec_dir(tmp_path, "a", parent="b")
    _child_spec_dir(tmp_path, "b", parent="a")
    with pytest.raises(ImageError, match="cycle"):
        load_specs(tmp_path)


# -- the lock --------------------------------------------------------------------------------

ID_A = "sha256:" + "a" * 64
ID_B = "sha256:" + "b" * 64


def test_repo_lock_loads_and_pins_every_spec():
    lock = load_lock()
    specs = load_specs(IMAGES_DIR)
    assert set(lock.names) == set(specs)
    for name, spec in specs.items():
        assert lock.image_id(name).startswith("sha256:")
        assert lock.entry(name).inputs_sha256 == spec.inputs_sha256(), f"images/{name} changed: rebuild"
    assert lock.entry("tool").parent_id == lock.image_id("base")
    assert any(p.startswith("python3-minimal=") for p in lock.entry("base").packages)


def test_lock_roundtrip_and_unknown_name(tmp_path):
    lock = Lock((LockEntry("base", ID_A, ID_A, packages=("tini=1",)),
                 LockEntry("tool", ID_B, ID_B, "base", ID_A)))
    p = tmp_path / "images.lock"
    lock.write(p)
    again = load_lock(p)
    assert again == lock and again.image_id("tool") == ID_B
    assert p.read_bytes() == lock.to_bytes()
    with pytest.raises(ImageError, match="not pinned"):
        again.image_id("nope")


def test_lock_env_override(tmp_path, monkeypatch):
    p = tmp_path / "other.lock"
    Lock((LockEntry("base", ID_A, ID_A),)).write(p)
    monkeypatch.setenv("RINGFENCE_IMAGES_LOCK", str(p))
    assert load_lock().image_id("base") == ID_A


@pytest.mark.parametrize("data,match", [
    (b"not json", "not JSON"),
    (b'{"version": 99, "images": {}}', "version"),
    (b'{"version": 1, "images": {"x": {"id": "sha256:zz", "inputs_sha256": "s"}}}', "sha256"),
    (b'{"version": 1, "images": {"x": {"inputs_sha256": "s"}}}', "malformed"),
    (b'{"version": 1, "images": {"x": {"id": "%s", "inputs_sha256": "s", "parent": "ghost", '
     b'"parent_id": "%s"}}}' % (ID_A.encode(), ID_B.encode()), "unknown parent"),
])
def test_bad_locks_are_refused(tmp_path, data, match):
    p = tmp_path / "images.lock"
    p.write_bytes(data)
    with pytest.raises(ImageError, match=match):
        load_lock(p)


def test_missing_lock_says_how_to_fix(tmp_path):
    with pytest.raises(ImageError, match="make images"):
        load_lock(tmp_path / "absent.lock")


def test_package_diff():
    old = ("a=1", "b=1", "c=1")
    new = ("a=1", "b=2", "d=1")
    assert package_diff(old, new) == [" b 1 -> 2", "-c=1", "+d=1"]
    assert package_diff(old, old) == []


# -- drift detection (child images assembled on a cached fake parent, no engine) -------------


@pytest.fixture
def scratch(tmp_path):
    """A specs dir with a root spec whose build is already cached and locked, plus a child."""
    images = tmp_path / "images"
    _root_spec_dir(images)
    _child_spec_dir(images, "proxy")
    cache = Cache(tmp_path / "cache")
    parent_tree = tmp_path / "parent-tree"
    (parent_tree / "usr/bin").mkdir(parents=True)
    (parent_tree / "usr/bin/python3").write_text("not really\n")
    diff_id, layer = write_layer_file(tree_entries(parent_tree, normalize=True), cache.layers)
    spec = load_spec(images / "base")
    config = image_config(spec.container_config(None), [diff_id], ["fake base"])
    parent = Built("base", digest_of(config), config, (layer,), spec.inputs_sha256(), None, None, ("tini=1",))
    cache.save(parent)
    lock_path = tmp_path / "images.lock"
    Lock((parent.lock_entry(),)).write(lock_path)
    return images, cache, lock_path, parent


def _build(scratch_, **kw):
    images, cache, lock_path, _ = scratch_
    return build(images_dir=images, cache_dir=cache.root, lock_path=lock_path, load=False, **kw)


def test_new_image_is_drift_until_the_lock_is_updated(scratch):
    _, _, lock_path, parent = scratch
    before = lock_path.read_bytes()
    report = _build(scratch)
    assert not report.ok and [d.name for d in report.drifts] == ["proxy"]
    assert report.drifts[0].locked_id is None
    assert lock_path.read_bytes() == before  # never rewritten without update_lock
    assert report.up_to_date == ("base",)

    report = _build(scratch, update_lock=True)
    assert report.ok and report.lock_written == lock_path
    entry = load_lock(lock_path).entry("proxy")
    assert entry.parent == "base" and entry.parent_id == parent.id
    assert entry.id == report.drifts[0].built_id

    report = _build(scratch)  # now everything is up to date: nothing is assembled
    assert report.ok and report.built == () and set(report.up_to_date) == {"base", "proxy"}


def test_same_inputs_give_same_child_id_and_a_change_is_drift(scratch):
    images, cache, lock_path, _ = scratch
    _build(scratch, update_lock=True)
    pinned = load_lock(lock_path).image_id("proxy")
    report = _build(scratch, names=["proxy"], force=True)  # same inputs: same ID, no drift
    assert report.ok and "proxy" in report.built and report.drifts == ()
    assert load_lock(lock_path).image_id("proxy") == pinned
    cached = cache.find(pinned)
    assert cached is not None and json.loads(cached.config)["config"]["ExposedPorts"] == {"3128/tcp": {}}

    (images / "proxy/rootfs/opt/proxy/proxy.py").write_text("print('v2')\n")
    report = _build(scratch)
    assert not report.ok
    (drift,) = report.drifts
    assert drift.locked_id == pinned and drift.built_id != pinned and not drift.accepted
    assert any("spec inputs" in d for d in drift.details)
    assert load_lock(lock_path).image_id("proxy") == pinned


def test_root_drift_reports_package_diff_and_blocks_children(scratch, monkeypatch):
    _images, _cache, lock_path, parent = scratch
    _build(scratch, update_lock=True)
    # Pretend the mirror moved: a rebuilt root comes out with another package set.
    from ringfence_server.imagebuild import builder as builder_mod

    def fake_root(self, spec):
        config = image_config(spec.container_config(None), list(parent.doc["rootfs"]["diff_ids"]), ["moved"])
        return Built(spec.name, digest_of(config), config, parent.layers, spec.inputs_sha256(),
                     None, None, ("tini=2",))

    monkeypatch.setattr(builder_mod._Builder, "assemble_root", fake_root)
    report = _build(scratch, force=True)  # forces base (faked) and proxy
    assert not report.ok
    drift = next(d for d in report.drifts if d.name == "base")
    assert " tini 1 -> 2" in drift.details
    assert "proxy" in report.blocked
    assert load_lock(lock_path).image_id("base") == parent.id


def test_missing_parent_cache_is_rebuilt(scratch, monkeypatch):
    _images, cache, _lock_path, parent = scratch
    cache.record(parent.id).unlink()
    from ringfence_server.imagebuild import builder as builder_mod

    calls = []
    monkeypatch.setattr(builder_mod._Builder, "assemble_root", lambda self, spec: calls.append(spec.name) or parent)
    report = _build(scratch, update_lock=True)
    assert calls == ["base"] and report.ok


# -- the runner ------------------------------------------------------------------------------


@pytest.fixture
def runner_dir(tmp_path):
    d = tmp_path / "ringfence"
    shutil.copytree(RINGFENCE_DIR, d, ignore=shutil.ignore_patterns("__pycache__"))
    (d / "tools/noisy.py").write_text("import os\ndef run(a, c):\n    print('junk')\n"
                                       "    os.system('echo more junk')\n    return {'ok': 1}\n")
    (d / "tools/ctx.py").write_text("def run(a, c):\n    return c\n")
    (d / "tools/bad_content.py").write_text("def run(a, c):\n    return {1, 2}\n")
    return d


def _run(runner_dir: Path, stdin: bytes, env=None):
    proc = subprocess.run([sys.executable, "-I", "-S", "-B", str(runner_dir / "runner.py")],
                          input=stdin, capture_output=True, timeout=30, env=env)
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 1, proc
    return proc.returncode, json.loads(lines[0])


def _req(tool, arguments=None, key=None):
    return json.dumps({"tool": tool, "arguments": arguments or {}, "call_id": "c1",
                       "idempotency_key": key}).encode()


def test_runner_ok(runner_dir):
    assert _run(runner_dir, _req("echo", {"x": [1, "ü"]})) == (0, {"ok": True, "content": {"x": [1, "ü"]}})


def test_runner_passes_context_with_idempotency_key(runner_dir):
    code, doc = _run(runner_dir, _req("ctx", key="k-123"))
    assert code == 0 and doc["content"] == {"call_id": "c1", "idempotency_key": "k-123"}


@pytest.mark.parametrize("cls", ["invalid", "transient", "rate_limited", "fatal"])
def test_runner_tool_error_class(runner_dir, cls):
    code, doc = _run(runner_dir, _req("fail", {"class": cls, "message": "m", "retry_after_s": 1.5}))
    assert code == 3
    assert doc == {"ok": False, "error": {"class": cls, "message": "m", "retry_after_s": 1.5}}


def test_runner_other_exceptions_are_fatal(runner_dir):
    code, doc = _run(runner_dir, _req("fail", {"class": "crash"}))
    assert code == 3 and doc["error"]["class"] == "fatal" and "RuntimeError" in doc["error"]["message"]
    code, doc = _run(runner_dir, _req("bad_content"))
    assert code == 3 and doc["error"]["class"] == "fatal"


@pytest.mark.parametrize("tool", ["nope", "../tools/echo", "Echo", "echo.py", "_x", "/etc/passwd", ""])
def test_runner_unknown_or_bad_tool_name_is_invalid(runner_dir, tool):
    code, doc = _run(runner_dir, _req(tool))
    assert code == 3 and doc["error"]["class"] == "invalid"


def test_runner_refuses_symlinked_tool(runner_dir):
    os.symlink(runner_dir / "tools/echo.py", runner_dir / "tools/linked.py")
    code, doc = _run(runner_dir, _req("linked"))
    assert code == 3 and doc["error"]["class"] == "invalid"


@pytest.mark.parametrize("stdin", [b"", b"{not json", b"[1]", b"\xff\xfe",
                                   b'{"tool": "echo", "arguments": [], "call_id": "c"}',
                                   b'{"tool": "echo", "arguments": {}}'])
def test_runner_bad_request_is_invalid(runner_dir, stdin):
    code, doc = _run(runner_dir, stdin)
    assert code == 3 and doc["error"]["class"] == "invalid"


def test_runner_refuses_oversized_input(runner_dir):
    big = json.dumps({"tool": "echo", "arguments": {"x": "a" * (4 * 1024 * 1024)}, "call_id": "c"}).encode()
    code, doc = _run(runner_dir, big)
    assert code == 3 and doc["error"]["class"] == "invalid" and "over" in doc["error"]["message"]


def test_runner_stdout_carries_only_the_result(runner_dir):
    code, doc = _run(runner_dir, _req("noisy"))
    assert code == 0 and doc == {"ok": True, "content": {"ok": 1}}


def test_runner_ignores_python_env(runner_dir, tmp_path):
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "json.py").write_text("raise SystemExit('hijacked')\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(evil), "PYTHONSTARTUP": str(evil / "json.py")}
    assert _run(runner_dir, _req("echo", {"a": 1}), env=env) == (0, {"ok": True, "content": {"a": 1}})


# -- the tools, called directly ----------------------------------------------------------------


def _tool_module(name):
    # No __pycache__ in the image sources (skipped by the layer writer anyway).
    old_flag, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    sys.path.insert(0, str(RINGFENCE_DIR))
    try:
        spec = importlib.util.spec_from_file_location(f"_rf_{name}", RINGFENCE_DIR / "tools" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(RINGFENCE_DIR))
        sys.dont_write_bytecode = old_flag


def test_read_file_stays_under_root(tmp_path):
    rf = _tool_module("read_file")
    root = tmp_path / "input"
    (root / "d").mkdir(parents=True)
    (root / "d/a.txt").write_text("hello")
    (tmp_path / "secret").write_text("s3cret")
    os.symlink(tmp_path / "secret", root / "link")
    os.symlink(tmp_path, root / "dirlink")
    (root / "bin").write_bytes(b"\xff\x00" * 10)
    r = str(root)
    assert rf.read_under(r, "d/a.txt")["content"] == "hello"
    assert rf.read_under(r, f"{r}/d/a.txt")["content"] == "hello"
    assert rf.read_under(r, "bin")["encoding"] == "base64"
    got = rf.read_under(r, "d/a.txt", max_bytes=2)
    assert got["content"] == "he" and got["truncated"] and got["size"] == 5
    ToolError = sys.modules["ringfence_tool"].ToolError
    for bad in ["../secret", "d/../../secret", "link", "dirlink/secret", "/etc/passwd", "d", "", "nope"]:
        with pytest.raises(ToolError) as e:
            rf.read_under(r, bad)
        assert e.value.cls == "invalid", bad
    with pytest.raises(ToolError):
        rf.read_under(r, "d/a.txt", max_bytes=10 ** 9)


def test_write_note_returns_the_key(tmp_path, monkeypatch):
    wn = _tool_module("write_note")
    monkeypatch.setattr(wn, "NOTES_DIR", str(tmp_path / "notes"))
    out = wn.run({"name": "n1", "text": "hi"}, {"call_id": "c", "idempotency_key": "k9"})
    assert out["idempotency_key"] == "k9" and (tmp_path / "notes/n1").read_text() == "hi"
    with pytest.raises(sys.modules["ringfence_tool"].ToolError):
        wn.run({"name": "../x"}, {})


def test_sleep_validates():
    sl = _tool_module("sleep")
    assert sl.run({"seconds": 0}, {}) == {"slept": 0}
    with pytest.raises(sys.modules["ringfence_tool"].ToolError):
        sl.run({"seconds": -1}, {})


def test_public_exports_are_pinned():
    from ringfence_server import imagebuild as api

    assert sorted(api.__all__) == [
        "BuildReport", "Built", "Drift", "ImageSpec", "Lock", "LockEntry", "Problem", "build",
        "default_lock_path", "load_lock", "load_specs", "package_diff", "resolve_pinned", "verify",
    ]
    assert callable(api.resolve_pinned) and callable(api.verify) and callable(api.build)


def test_cli_registers_build_and_verify():
    import argparse

    from ringfence_server.imagebuild import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["images", "build", "--update-lock", "--force", "tool"])
    assert args.func is cli.cmd_build and args.update_lock and args.force and args.names == ["tool"]
    args = parser.parse_args(["images", "verify"])
    assert args.func is cli.cmd_verify


def test_an_offline_root_build_needs_the_package_tarball(tmp_path):
    from ringfence_server.imagebuild import rootfs
    from ringfence_server.imagebuild.spec import Debootstrap

    with pytest.raises(ImageError, match="no package tarball"):
        rootfs.debootstrap(Debootstrap("bookworm", "http://deb.debian.org/debian", ()), tmp_path / "root",
                           tmp_path / "absent.tgz", tmp_path / "log")
