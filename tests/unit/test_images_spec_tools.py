"""An image spec's `tools`: tool packages whose code is laid at /opt/ringfence/tools/<name>.py,
checked before any build, part of the spec's inputs, built twice offline to one image ID."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from ringfence_server.imagebuild import build
from ringfence_server.imagebuild.archive import digest_of, image_config, tree_entries, write_layer_file
from ringfence_server.imagebuild.builder import Built, Cache
from ringfence_server.imagebuild.spec import load_spec
from ringfence_server.sandbox.errors import ImageError
from ringfence_server.sandbox.pinned_images import Lock, load_lock

CODE = "def run(arguments, context):\n    return arguments\n"


def project(tmp_path, tools=("../../tools/probe",), *, rootfs=None, parent="base"):
    """A user's project: tools/probe/{manifest.json, probe.py, test_probe.py} and
    images/probe/image.json laying it."""
    pkg = tmp_path / "tools" / "probe"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "probe.py").write_text(CODE)
    (pkg / "test_probe.py").write_text("import unittest\n")
    (pkg / "manifest.json").write_text("{}")
    spec = tmp_path / "images" / "probe"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "image.json").write_text(json.dumps({"parent": parent, "tools": list(tools)}))
    for rel, text in (rootfs or {}).items():
        (spec / "rootfs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (spec / "rootfs" / rel).write_text(text)
    return spec


def test_the_code_alone_is_laid_where_the_runner_loads_tools(tmp_path):
    spec = load_spec(project(tmp_path))
    assert spec.tools == ("../../tools/probe",)
    assert spec.tool_sources() == [("probe", tmp_path / "tools/probe/probe.py")]
    assert spec.lays_tool("probe") == tmp_path / "tools/probe/probe.py" and spec.lays_tool("other") is None
    with spec.overlay() as tree:
        laid = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
        assert laid == ["opt/ringfence/tools/probe.py"]  # not the manifest, not the tests
        assert (tree / "opt/ringfence/tools/probe.py").read_text() == CODE
        assert (tree / "opt/ringfence/tools/probe.py").stat().st_mode & 0o777 == 0o644


def test_the_code_is_among_the_inputs_so_a_changed_tool_is_a_changed_image(tmp_path):
    spec_dir = project(tmp_path)
    before = load_spec(spec_dir).inputs_sha256()
    (tmp_path / "tools/probe/test_probe.py").write_text("import unittest  # changed\n")
    assert load_spec(spec_dir).inputs_sha256() == before  # the tests are not in the image
    (tmp_path / "tools/probe/probe.py").write_text(CODE + "# changed\n")
    assert load_spec(spec_dir).inputs_sha256() != before


def test_a_spec_without_tools_hashes_as_before(tmp_path):
    spec_dir = tmp_path / "images" / "plain"
    spec_dir.mkdir(parents=True)
    (spec_dir / "image.json").write_text(json.dumps({"parent": "base"}))
    spec = load_spec(spec_dir)
    assert spec.tools == ()
    with spec.overlay() as tree:
        assert tree is None  # nothing staged: the layer is what it was before the key existed


@pytest.mark.parametrize("tools, message", [
    ("../../tools/probe", "must be a list"),
    (["/abs/tools/probe"], "relative to the spec's folder"),
    ([""], "relative to the spec's folder"),
    (["../../tools/Probe"], "the folder's name is the tool's name"),
    (["../../tools/probe", "../../other/probe"], "are both tool 'probe'"),
])
def test_bad_tools_are_refused_by_name(tmp_path, tools, message):
    spec_dir = tmp_path / "images" / "probe"
    spec_dir.mkdir(parents=True)
    (spec_dir / "image.json").write_text(json.dumps({"parent": "base", "tools": tools}))
    with pytest.raises(ImageError, match=message):
        load_spec(spec_dir)


def test_a_root_image_lays_no_tools(tmp_path):
    spec_dir = tmp_path / "images" / "root"
    spec_dir.mkdir(parents=True)
    (spec_dir / "image.json").write_text(json.dumps({"debootstrap": {"suite": "bookworm"}, "tools": ["x/probe"]}))
    with pytest.raises(ImageError, match="for child images"):
        load_spec(spec_dir)


def test_missing_code_a_link_or_a_clash_with_rootfs_is_refused(tmp_path):
    spec = load_spec(project(tmp_path, ("../../tools/absent",)))
    with pytest.raises(ImageError, match=r"tools: ../../tools/absent: .*absent.py is not a regular file"), \
            spec.overlay():
        pass
    b = tmp_path / "b"
    spec = load_spec(project(b, rootfs={"opt/ringfence/tools/probe.py": "other"}))
    with pytest.raises(ImageError, match="is also in rootfs"), spec.overlay():
        pass
    c = tmp_path / "c"
    spec_dir = project(c)
    code = c / "tools/probe/probe.py"
    code.unlink()
    code.symlink_to(c / "tools/probe/test_probe.py")
    with pytest.raises(ImageError, match="not a regular file"), load_spec(spec_dir).overlay():
        pass


@pytest.fixture
def built_base(tmp_path):
    """A user's dir with a root image of its own already built and cached (a fake one-layer
    base), so a child can be assembled with no engine and no network."""
    images, cache = tmp_path / "images", Cache(tmp_path / "images/.build")
    (images / "base").mkdir(parents=True)
    (images / "base" / "image.json").write_text(json.dumps({"debootstrap": {"suite": "bookworm"},
                                                             "user": "10001:10001"}))
    tree = tmp_path / "parent-tree"
    (tree / "opt/ringfence").mkdir(parents=True)
    (tree / "opt/ringfence/runner.py").write_text("# the runner\n")
    diff_id, layer = write_layer_file(tree_entries(tree, normalize=True), cache.layers)
    spec = load_spec(images / "base")
    config = image_config(spec.container_config(None), [diff_id], ["fake base"])
    parent = Built("base", digest_of(config), config, (layer,), spec.inputs_sha256(), None, None, ("libc6=2.36-9",))
    cache.save(parent)
    Lock((parent.lock_entry(),)).write(images / "images.lock")
    return images


def _layer_files(built_id, images):
    record = Cache(images / ".build").find(built_id)
    with tarfile.open(fileobj=io.BytesIO(record.layers[-1].read_bytes())) as tar:
        return {m.name: (m.mode, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()}


def test_a_child_laying_a_tool_builds_to_the_same_id_offline_and_a_changed_tool_drifts(tmp_path, built_base):
    images = built_base
    project(tmp_path)
    report = build(images_dir=images, load=False, update_lock=True)
    assert report.ok and "probe" in report.built
    first = load_lock(images / "images.lock").image_id("probe")
    files = _layer_files(first, images)
    assert files["opt/ringfence/tools/probe.py"] == (0o644, CODE.encode())
    again = build(["probe"], images_dir=images, load=False, force=True, offline=True)
    assert again.ok and again.built == ("probe",) and again.drifts == ()
    # The tool changes: the image is another one, and the build says the lock no longer pins it.
    (tmp_path / "tools/probe/probe.py").write_text(CODE + "# v2\n")
    changed = build(["probe"], images_dir=images, load=False, offline=True)
    assert not changed.ok
    (drift,) = changed.drifts
    assert drift.locked_id == first and drift.built_id != first
    assert any(line.startswith("spec inputs ") for line in drift.details)
