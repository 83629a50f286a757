"""Images against a real engine: the base rebuilds to the pinned ID, verify and
resolve_pinned refuse what the lock does not pin.

Anything loaded or tagged under a scratch name is removed in `finally`; the pinned images
(whose IDs are in images/images.lock) are never removed, even when a scratch build
reproduces one of them byte for byte.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from pathlib import Path

import pytest

from ringfence_server.imagebuild import Lock, LockEntry, build, engine, load_lock, resolve_pinned, verify
from ringfence_server.imagebuild.archive import (
    ContainerConfig,
    digest_of,
    image_config,
    tree_entries,
    write_docker_archive,
    write_layer_file,
)
from ringfence_server.sandbox.errors import ImageError
from ringfence_server.sandbox.pinned_images import IMAGES_DIR

pytestmark = pytest.mark.docker

WRONG_ID = digest_of(b"not an image anyone built")


@pytest.fixture(scope="module")
def client():
    try:
        import docker

        c = docker.from_env()
        c.ping()
    except Exception as e:  # noqa: BLE001 - any failure to reach the engine means "no engine here"
        if os.environ.get("RINGFENCE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"Docker is required but unreachable: {e}")
        pytest.skip(f"Docker unreachable: {e}")
    return c


@pytest.fixture(scope="module")
def pinned(client):
    """The real lock, with every pinned image present (built from cache/specs if missing)."""
    lock = load_lock()
    if verify(client, lock, images_dir=None):
        report = build(client=client)
        if not report.ok:
            pytest.fail("pinned images cannot be rebuilt to their locked IDs: "
                        + "; ".join(d.describe() for d in report.drifts))
    return lock


def _scratch_prefix() -> str:
    return f"ringfence-test-{uuid.uuid4().hex[:8]}/"


def _remove_scratch(client, ref: str, pinned_ids: frozenset[str]) -> None:
    """Drop a scratch tag; delete the image too unless it is a pinned one."""
    image_id = engine.tagged_id(client, ref)
    if image_id is None:
        return
    if image_id in pinned_ids:
        img = client.images.get(image_id)
        if len(img.tags) <= 1:
            # Untagging the last tag of an image deletes it: keep the pinned image named.
            name = ref.split("/", 1)[1].split(":")[0]
            img.tag(engine.TAG_PREFIX + name, "latest")
        client.images.remove(ref)
    else:
        client.images.remove(image_id, force=True)


@pytest.mark.slow
def test_base_rebuilds_to_the_pinned_id(client, pinned, tmp_path):
    """Building the base twice gives the same image ID: here, from scratch, vs the lock.

    The second build installs from the package tarball that `make images` fetched (the same
    .debs, which apt verified) inside its own network namespace: a test sends nothing off the
    machine. Every other step (debootstrap's install, cleaning, the layer, the config) runs again.
    """
    scratch_lock = tmp_path / "images.lock"
    scratch_lock.write_bytes(pinned.path.read_bytes())
    cache = tmp_path / "cache"
    cache.mkdir()
    tarball = IMAGES_DIR / ".build" / "base-packages.tgz"
    assert tarball.is_file(), "no package tarball: `make images` runs `ringfence images fetch`"
    (cache / "base-packages.tgz").symlink_to(tarball)
    prefix = _scratch_prefix()
    lines: list[str] = []
    try:
        report = build(["base"], force=True, client=client, lock_path=scratch_lock, offline=True,
                       cache_dir=cache, tag_prefix=prefix, progress=lines.append)
        assert report.ok, "\n".join(lines)
        assert report.built == ("base",) and report.drifts == ()
        rebuilt = load_lock(scratch_lock)
        assert rebuilt.image_id("base") == pinned.image_id("base")
        assert client.images.get(f"{prefix}base:latest").id == pinned.image_id("base")
        assert any("debootstrap" in line and "no network: done in" in line for line in lines)
        assert not any("fetch packages" in line for line in lines)
    finally:
        _remove_scratch(client, f"{prefix}base:latest", pinned.ids())


def test_pinned_images_verify_clean(client, pinned):
    assert verify(client, pinned) == []
    for e in pinned.entries:
        assert resolve_pinned(client, e.name, pinned) == e.id
    cfg = client.images.get(pinned.image_id("tool")).attrs["Config"]
    assert cfg["User"] == "10001:10001" and cfg["Entrypoint"] == ["/usr/bin/tini", "--"]


def _load_scratch_image(client, tmp_path: Path, ref: str) -> str:
    """A tiny single-layer image assembled by our writer; Docker must agree on its ID."""
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc/scratch").write_text("scratch\n")
    diff_id, layer = write_layer_file(tree_entries(tree, normalize=True), tmp_path / "layers")
    config = image_config(ContainerConfig(labels=(("ringfence.test", "1"),)), [diff_id], ["scratch"])
    archive = tmp_path / "scratch.tar"
    with open(archive, "wb") as f:
        image_id = write_docker_archive(f, config, [layer])
    engine.load_archive(client, archive, image_id)
    repo, tag = ref.rsplit(":", 1)
    engine.tag(client, image_id, repo, tag)
    assert client.images.get(ref).id == image_id == digest_of(config)
    return image_id


def test_verify_lists_every_missing_and_drifted_image(client, pinned, tmp_path):
    prefix = _scratch_prefix()
    ref = f"{prefix}tool:latest"
    try:
        scratch_id = _load_scratch_image(client, tmp_path, ref)
        # A lock copy: "tool" pinned to an ID the engine lacks while its tag names another
        # image (drifted), and "ghost" pinned to an ID nothing has (missing).
        entries = tuple(dataclasses.replace(e, id=WRONG_ID) if e.name == "tool" else e for e in pinned.entries)
        lock = Lock((*entries, LockEntry("ghost", digest_of(b"ghost"), digest_of(b"g"))))
        problems = verify(client, lock, images_dir=None, tag_prefix=prefix)
        kinds = {(p.name, p.kind) for p in problems}
        assert kinds == {("tool", "drifted"), ("ghost", "missing")}, problems
        tool = next(p for p in problems if p.name == "tool")
        assert scratch_id in tool.message and "make images" in tool.message
        # The real spec dir is checked too: "ghost" has no spec, but tool's spec still
        # matches, so only engine problems show.
        assert {(p.name, p.kind) for p in verify(client, lock, tag_prefix=prefix)} == kinds
    finally:
        _remove_scratch(client, ref, pinned.ids())
    assert engine.tagged_id(client, ref) is None


def test_resolve_pinned_refuses_what_the_lock_does_not_pin(client, pinned, tmp_path):
    prefix = _scratch_prefix()
    ref = f"{prefix}tool:latest"
    try:
        scratch_id = _load_scratch_image(client, tmp_path, ref)
        # The engine has the scratch image, but no lock names it: nothing resolves to it.
        assert resolve_pinned(client, "tool", pinned) == pinned.image_id("tool") != scratch_id
        with pytest.raises(ImageError, match="not pinned"):
            resolve_pinned(client, "scratch", pinned)
        # A lock pinning an ID the engine does not hold is refused, tags notwithstanding.
        wrong = Lock(tuple(dataclasses.replace(e, id=WRONG_ID) if e.name == "tool" else e
                           for e in pinned.entries))
        with pytest.raises(ImageError, match="make images"):
            resolve_pinned(client, "tool", wrong)
        # The lock is the only authority: pin the scratch ID and it resolves.
        own = Lock((LockEntry("tool", scratch_id, scratch_id),))
        assert resolve_pinned(client, "tool", own) == scratch_id
    finally:
        _remove_scratch(client, ref, pinned.ids())


def test_the_tool_image_runs_the_runner(client, pinned):
    """The pinned tool image answers a request as non-root on a read-only root."""
    import json

    c = client.containers.create(
        pinned.image_id("tool"), stdin_open=True, network_mode="none", read_only=True,
        cap_drop=["ALL"], security_opt=["no-new-privileges"],
        tmpfs={"/tmp": "rw,noexec,nosuid,nodev,size=8m"},
        labels={"ringfence.product": "ringfence", "ringfence.purpose": "test"},
    )
    try:
        sock = c.attach_socket(params={"stdin": 1, "stream": 1})
        c.start()
        req = {"tool": "write_note", "arguments": {"name": "n", "text": "x"}, "call_id": "c1",
               "idempotency_key": "key-1"}
        sock._sock.sendall(json.dumps(req).encode())
        sock._sock.shutdown(1)  # EOF on the runner's stdin
        assert c.wait(timeout=60)["StatusCode"] == 0
        out = c.logs(stdout=True, stderr=False).decode().strip()
        assert json.loads(out) == {"ok": True, "content": {"path": "/tmp/notes/n", "bytes": 1,
                                                           "idempotency_key": "key-1"}}
    finally:
        c.remove(force=True)
