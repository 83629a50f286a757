"""An image spec's `files`: repository files laid into the image, checked before any build."""

import json

import pytest

from ringfence_server.imagebuild.spec import load_spec
from ringfence_server.sandbox.errors import ImageError


def make_repo(tmp_path, files, rootfs=None):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("X = 1\n")
    spec_dir = repo / "images" / "child"
    spec_dir.mkdir(parents=True)
    (spec_dir / "image.json").write_text(json.dumps({"parent": "base", "files": files}))
    for rel, text in (rootfs or {}).items():
        path = spec_dir / "rootfs" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return spec_dir


def test_files_are_laid_with_their_content_and_change_the_inputs_hash(tmp_path):
    spec_dir = make_repo(tmp_path, {"opt/app/mod.py": "pkg/mod.py"}, rootfs={"opt/app/main.py": "import mod\n"})
    spec = load_spec(spec_dir)
    with spec.overlay() as tree:
        assert (tree / "opt/app/mod.py").read_text() == "X = 1\n"
        assert (tree / "opt/app/main.py").read_text() == "import mod\n"
    before = spec.inputs_sha256()
    (spec_dir.parent.parent / "pkg" / "mod.py").write_text("X = 2\n")
    assert load_spec(spec_dir).inputs_sha256() != before


@pytest.mark.parametrize("files", [{"/etc/passwd": "pkg/mod.py"}, {"opt/x.py": "../outside.py"},
                                   {"opt/x.py": "/etc/passwd"}, ["pkg/mod.py"]])
def test_paths_that_leave_the_tree_are_refused(tmp_path, files):
    with pytest.raises(ImageError):
        load_spec(make_repo(tmp_path, files))


def test_a_missing_source_or_a_clash_with_rootfs_is_refused(tmp_path):
    spec = load_spec(make_repo(tmp_path, {"opt/x.py": "pkg/absent.py"}))
    with pytest.raises(ImageError, match="not a regular file"), spec.overlay():
        pass
    spec = load_spec(make_repo(tmp_path / "b", {"opt/x.py": "pkg/mod.py"}, rootfs={"opt/x.py": "y"}))
    with pytest.raises(ImageError, match="also in rootfs"), spec.overlay():
        pass


def test_fetch_skips_a_root_image_whose_package_tarball_is_present(tmp_path):
    """`ringfence images fetch` (run by `make images`) downloads only what is missing."""
    from ringfence_server.imagebuild.builder import fetch

    images = tmp_path / "images"
    (images / "base").mkdir(parents=True)
    (images / "base" / "image.json").write_text(json.dumps({"parent": None, "debootstrap": {"suite": "bookworm"}}))
    (images / ".build").mkdir()
    (images / ".build" / "base-packages.tgz").write_bytes(b"cached")
    lines: list[str] = []
    assert fetch(images_dir=images, progress=lines.append) == []
    assert lines == [f"base: package tarball present ({images / '.build' / 'base-packages.tgz'})"]
