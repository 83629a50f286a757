"""A user's images dir, pinned Debian packages and wheels, adopted images: the parts that need
no engine and no network. Packages and wheels are made here, byte by byte, in the formats the
mirror and PyPI serve (an ar of tars, a zip); the index is a Packages file's text.

The real mirror, PyPI and engine are in tests/integration/test_images_user_dir.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from ringfence.errors import ConfigError
from ringfence_server.control.config import load_config
from ringfence_server.imagebuild import adopt, build, debs, wheels
from ringfence_server.imagebuild.archive import digest_of, image_config, tree_entries, write_layer, write_layer_file
from ringfence_server.imagebuild.builder import Built, Cache, _Deps
from ringfence_server.imagebuild.pins import DebPin, WheelPin, deps_diff
from ringfence_server.imagebuild.spec import ancestors, load_spec, load_specs, root_of
from ringfence_server.sandbox.errors import ImageError
from ringfence_server.sandbox.pinned_images import (
    IMAGES_DIR,
    Lock,
    LockedDeb,
    LockedWheel,
    LockEntry,
    load_lock,
    lock_for,
)

H = "ab" * 32


# -- Debian versions and relations ----------------------------------------------------------

PAIRS = [("1.0", "1.0"), ("1.0", "1.1"), ("1.0-1", "1.0-2"), ("1:0.9", "1.0"), ("1.0~rc1", "1.0"),
         ("1.0+deb12u1", "1.0"), ("2.36-9+deb12u14", "2.36-9+deb12u2"), ("1.0a", "1.0"), ("1.0.0", "1.0"),
         ("0:1.0", "1.0"), ("1.6-2.1+deb12u2", "1.6-2.1"), ("6.9.8-1", "6.8.1"), ("1.0-1~bpo1", "1.0-1")]


@pytest.mark.parametrize("a, b", PAIRS)
def test_versions_sort_as_dpkg_sorts_them(a, b):
    if shutil.which("dpkg") is None:
        pytest.skip("dpkg is the reference")
    for op, want in (("lt", -1), ("eq", 0), ("gt", 1)):
        dpkg_says = subprocess.run(["dpkg", "--compare-versions", a, op, b]).returncode == 0
        assert (debs.compare_versions(a, b) == want) is dpkg_says, (a, op, b)


def test_relations_parse_alternatives_versions_and_arch_qualifiers():
    assert debs.parse_relations("libc6 (>= 2.34), python3:any | python3-minimal (<< 3.12) <!nocheck>") == (
        (debs.Alt("libc6", ">=", "2.34"),),
        (debs.Alt("python3"), debs.Alt("python3-minimal", "<<", "3.12")),
    )
    assert debs.Alt("x", ">=", "2").allows("2.1") and not debs.Alt("x", ">=", "2").allows(None)


# -- resolution -------------------------------------------------------------------------------


def _stanza(name, version, *, depends="", provides="", conflicts="", arch="amd64", sha=H):
    lines = [f"Package: {name}", f"Version: {version}", f"Architecture: {arch}",
             f"Filename: pool/main/{name[0]}/{name}/{name}_{version}_{arch}.deb", "Size: 10", f"SHA256: {sha}",
             "Description: a package", " with a continuation line: Depends: nothing"]
    for key, value in (("Depends", depends), ("Provides", provides), ("Conflicts", conflicts)):
        if value:
            lines.append(f"{key}: {value}")
    return "\n".join(lines) + "\n"


def _index(*stanzas: str) -> debs.Index:
    return debs.parse_index("\n".join(stanzas), suite="bookworm", mirror="http://mirror", architecture="amd64")


INDEX = _index(
    _stanza("jq", "1.6-2.1+deb12u2", depends="libjq1 (= 1.6-2.1+deb12u2), libc6 (>= 2.34)"),
    _stanza("libjq1", "1.6-2.1+deb12u2", depends="libc6 (>= 2.36), libonig5 (>= 6.8.1)"),
    _stanza("libonig5", "6.9.8-1", depends="libc6 (>= 2.14)"),
    _stanza("libc6", "2.36-9+deb12u14"),
    _stanza("libc6", "2.41-1"),  # as if a newer suite's: never installed over the parent's
    _stanza("tool-a", "1", depends="mail-transport-agent"),
    _stanza("exim4", "4.96", provides="mail-transport-agent"),
    _stanza("postfix", "3.7", provides="mail-transport-agent"),
    _stanza("tool-b", "1", depends="awk"),
    _stanza("mawk", "1.3.4", provides="awk"),
    _stanza("tool-c", "1", conflicts="mawk"),
    _stanza("tool-d", "1", depends="libc6 (>= 2.40)"),
)
BASE = {"libc6": "2.36-9+deb12u14", "mawk": "1.3.4"}


def test_a_pin_pulls_what_the_parent_lacks_and_nothing_it_has():
    got = debs.resolve([DebPin("jq", "1.6-2.1+deb12u2")], BASE, INDEX)
    assert [(s.name, s.version) for s in got] == [("jq", "1.6-2.1+deb12u2"), ("libjq1", "1.6-2.1+deb12u2"),
                                                 ("libonig5", "6.9.8-1")]


def test_a_virtual_dependency_is_met_by_what_the_parent_provides():
    assert [s.name for s in debs.resolve([DebPin("tool-b", "1")], BASE, INDEX)] == ["tool-b"]


@pytest.mark.parametrize("pin, installed, message", [
    ("jq=1.7", BASE, "jq=1.7: not in bookworm's main index (http://mirror), which has 1.6-2.1+deb12u2"),
    ("libc6=2.37", BASE, "the parent has libc6=2.36-9+deb12u14; installing another version over it is refused"),
    ("tool-a=1", BASE, "mail-transport-agent is provided by exim4, postfix: pin one in packages"),
    ("tool-c=1", BASE, "tool-c=1 conflicts with the parent's mawk=1.3.4"),
    ("tool-d=1", BASE, "libc6 (>= 2.40) would replace the parent's libc6=2.36-9+deb12u14"),
])
def test_what_cannot_be_resolved_is_refused_by_name(pin, installed, message):
    with pytest.raises(ImageError) as e:
        debs.resolve([DebPin(*pin.split("="))], installed, INDEX)
    assert message in str(e.value)


# -- unpacking a .deb -------------------------------------------------------------------------


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]], compress: str) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as t:
        for info, data in members:
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    data = raw.getvalue()
    return lzma.compress(data) if compress == "xz" else __import__("gzip").compress(data, mtime=0)


def _member(name, kind="file", data=b"", mode=0o644, link="", uid=0):
    info = tarfile.TarInfo(name)
    info.mode, info.uid, info.mtime = mode, uid, 1234567890
    if kind == "dir":
        info.type = tarfile.DIRTYPE
    elif kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, link
    elif kind == "hardlink":
        info.type, info.linkname = tarfile.LNKTYPE, link
    else:
        info.size = len(data)
    return info, (data if kind == "file" else None)


def make_deb(path: Path, name: str, data_members, *, scripts=("postinst",)) -> LockedDeb:
    control = f"Package: {name}\nVersion: 1.0\nArchitecture: amd64\nDescription: test\n".encode()
    ctl = _tar([_member("./", "dir", mode=0o755), _member("./control", data=control)]
               + [_member(f"./{s}", data=b"#!/bin/sh\nexit 0\n", mode=0o755) for s in scripts], "gz")
    data = _tar(data_members, "xz")
    out = io.BytesIO()
    out.write(b"!<arch>\n")
    for member, body in (("debian-binary", b"2.0\n"), ("control.tar.gz", ctl), ("data.tar.xz", data)):
        out.write(f"{member:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body)
        if len(body) % 2:
            out.write(b"\n")
    path.write_bytes(out.getvalue())
    return LockedDeb(name, "1.0", "amd64", hashlib.sha256(out.getvalue()).hexdigest(), f"pool/main/{name}.deb")


TOOL_MEMBERS = [
    _member("./", "dir", mode=0o755), _member("./bin/", "dir", mode=0o755),
    _member("./bin/tool", data=b"\x7fELF tool", mode=0o4755, uid=1000),  # merged /usr, setuid, odd owner
    _member("./usr/", "dir", mode=0o755), _member("./usr/lib/", "dir", mode=0o755),
    _member("./usr/lib/tool/", "dir", mode=0o750),
    _member("./usr/lib/tool/a.so", data=b"library"),
    _member("./usr/lib/tool/b.so", "hardlink", link="./usr/lib/tool/a.so"),
    _member("./usr/lib/tool/c.so", "symlink", link="a.so"),
    _member("./usr/share/doc/tool/copyright", data=b"docs are left out"),
]


def _unpacked(tmp_path: Path, sub: str) -> tuple[Path, debs.Unpacked]:
    deb_path = tmp_path / f"tool-{sub}.deb"
    deb = make_deb(deb_path, "tool", TOOL_MEMBERS)
    other = make_deb(tmp_path / f"libother-{sub}.deb", "libother",
                     [_member("./usr/", "dir", mode=0o755), _member("./usr/lib/other.so", data=b"other")], scripts=())
    staging = tmp_path / sub
    staging.mkdir()
    return staging, debs.unpack([(deb, deb_path), (other, tmp_path / f"libother-{sub}.deb")], staging)


def test_a_deb_is_unpacked_as_distroless_lays_it(tmp_path):
    root, report = _unpacked(tmp_path, "one")
    assert not (root / "bin").exists() and (root / "usr/bin/tool").read_bytes() == b"\x7fELF tool"
    assert os.stat(root / "usr/bin/tool").st_mode & 0o7777 == 0o755  # setuid dropped
    assert report.setid_stripped == ("/usr/bin/tool",)
    assert os.stat(root / "usr/lib/tool").st_mode & 0o777 == 0o750  # packaged modes kept
    assert os.stat(root / "usr/lib/tool/a.so").st_ino == os.stat(root / "usr/lib/tool/b.so").st_ino
    assert os.readlink(root / "usr/lib/tool/c.so") == "a.so"
    assert not (root / "usr/share/doc").exists()
    assert (root / "var/lib/dpkg/status.d/tool").read_text().startswith("Package: tool\nVersion: 1.0\n")
    assert report.scripts_skipped == ("tool: postinst",)  # libother has none
    entries = tree_entries(root, normalize=False, owner=(0, 0))
    assert {(e.uid, e.gid) for e in entries} == {(0, 0)}
    assert next(e for e in entries if e.name == "usr/lib/tool/b.so").kind == "hardlink"


def test_the_same_debs_give_the_same_layer(tmp_path):
    layers = []
    for sub in ("one", "two"):
        root, _ = _unpacked(tmp_path, sub)
        buf = io.BytesIO()
        layers.append(write_layer(tree_entries(root, normalize=False, owner=(0, 0)), buf))
    assert layers[0] == layers[1]


@pytest.mark.parametrize("members, message", [
    ([_member("./../etc/passwd", data=b"x")], "is not a plain relative path"),
    ([_member("./usr/", "dir"), _member("./usr/x", "symlink", link="/etc"), _member("./usr/x/passwd", data=b"x")],
     "which is not a directory in the layer"),
    ([_member("./dev/null", "file", data=b"")], None),  # an ordinary file named like a device is fine
])
def test_a_deb_cannot_write_outside_its_layer(tmp_path, members, message):
    deb = make_deb(tmp_path / "evil.deb", "evil", members)
    staging = tmp_path / "root"
    staging.mkdir()
    if message is None:
        debs.unpack([(deb, tmp_path / "evil.deb")], staging)
        return
    with pytest.raises(ImageError, match=message):
        debs.unpack([(deb, tmp_path / "evil.deb")], staging)
    assert not (tmp_path / "etc").exists()


def test_a_path_shipped_by_two_packages_is_refused(tmp_path):
    a = make_deb(tmp_path / "a.deb", "a", [_member("./usr/", "dir"), _member("./usr/same", data=b"a")])
    b = make_deb(tmp_path / "b.deb", "b", [_member("./usr/", "dir"), _member("./usr/same", data=b"b")])
    (tmp_path / "root").mkdir()
    with pytest.raises(ImageError, match="/usr/same is shipped by both a and b"):
        debs.unpack([(a, tmp_path / "a.deb"), (b, tmp_path / "b.deb")], tmp_path / "root")


def test_a_cached_deb_that_is_not_the_recorded_file_is_refused_by_name(tmp_path):
    deb = make_deb(tmp_path / "x.deb", "x", [])
    (tmp_path / "debs").mkdir()
    shutil.copy(tmp_path / "x.deb", tmp_path / "debs" / deb.cache_name)
    assert debs.cached(deb, tmp_path / "debs") == tmp_path / "debs" / deb.cache_name
    other = LockedDeb("x", "1.0", "amd64", H, deb.filename)
    with pytest.raises(ImageError, match=f"x=1.0: the cached .deb .* has sha256 {deb.sha256}, but {H} is recorded"):
        debs.cached(other, tmp_path / "debs")
    with pytest.raises(ImageError, match=r"x=1\.0: not in the package cache"):
        debs.cached(deb, tmp_path / "elsewhere")


# -- wheels -------------------------------------------------------------------------------------


def make_wheel(path: Path, files: dict[str, bytes], exec_bits: tuple[str, ...] = ()) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0))
            info.external_attr = (0o100755 if name in exec_bits else 0o100644) << 16
            zf.writestr(info, data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


TARGET = wheels.Target("3.11", "x86_64", "2.36")


def test_a_wheel_is_unpacked_into_the_site_folder(tmp_path):
    whl = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    sha = make_wheel(whl, {"demo_pkg/__init__.py": b"X = 1\n", "demo_pkg/run.sh": b"#!/bin/sh\n",
                           "demo_pkg-1.0.dist-info/METADATA": b"Name: demo-pkg\nVersion: 1.0\n",
                           "demo_pkg-1.0.data/purelib/extra.py": b"Y = 2\n",
                           "demo_pkg-1.0.data/scripts/demo": b"#!python\n"}, exec_bits=("demo_pkg/run.sh",))
    (tmp_path / "wh" / sha).mkdir(parents=True)
    shutil.copy(whl, tmp_path / "wh" / sha / whl.name)
    pair = wheels.cached(WheelPin("demo-pkg", "1.0", sha), tmp_path / "wh", TARGET)
    assert pair[0] == LockedWheel("demo-pkg", "1.0", sha, whl.name)
    root = tmp_path / "root"
    skipped = wheels.install([pair], root)
    site = root / "opt/ringfence/site"
    assert (site / "demo_pkg/__init__.py").read_text() == "X = 1\n" and (site / "extra.py").is_file()
    assert (site / "demo_pkg-1.0.dist-info/METADATA").is_file()
    assert skipped == ("demo-pkg==1.0: demo_pkg-1.0.data/scripts/demo",)
    modes = {e.name: e.mode for e in tree_entries(root, normalize=True)}
    assert modes["opt/ringfence/site/demo_pkg/run.sh"] == 0o755 and modes["opt/ringfence/site/extra.py"] == 0o644


def test_a_wheel_whose_hash_is_not_the_pin_is_refused_by_name(tmp_path):
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    sha = make_wheel(whl, {"demo.py": b""})
    (tmp_path / "wh" / sha).mkdir(parents=True)
    shutil.copy(whl, tmp_path / "wh" / sha / whl.name)
    with pytest.raises(ImageError, match=f"wheel demo==1.0: no file with sha256 {H} .*demo-1.0-py3-none-any.whl"):
        wheels.cached(WheelPin("demo", "1.0", H), tmp_path / "wh", TARGET)
    # A file swapped under its hash's folder is refused too.
    (tmp_path / "wh" / sha / whl.name).write_bytes(b"not the wheel")
    with pytest.raises(ImageError, match=r"wheel demo==1.0: .* has sha256 .*, the pin says"):
        wheels.cached(WheelPin("demo", "1.0", sha), tmp_path / "wh", TARGET)


@pytest.mark.parametrize("filename, ok", [
    ("tabulate-0.9.0-py3-none-any.whl", True),
    ("six-1.16.0-py2.py3-none-any.whl", True),
    ("x-1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
    ("x-1-cp38-abi3-manylinux2014_x86_64.whl", True),
    ("x-1-cp312-cp312-manylinux_2_17_x86_64.whl", False),
    ("x-1-cp311-cp311-manylinux_2_17_aarch64.whl", False),
    ("x-1-cp311-cp311-macosx_11_0_x86_64.whl", False),
    ("x-1-cp311-cp311-musllinux_1_1_x86_64.whl", False),
    ("x-1-cp311-cp311-manylinux_2_36_x86_64.whl", True),
    ("x-1-cp311-cp311-manylinux_2_5_x86_64.manylinux1_x86_64.whl", True),
    ("x-1-cp311-cp311-manylinux2010_x86_64.whl", True),
    # Built against a newer glibc than the image's: it would not load there.
    ("x-1-cp311-cp311-manylinux_2_38_x86_64.whl", False),
    ("x-1-cp311-cp311-manylinux_3_0_x86_64.whl", False),
])
def test_wheel_tags_are_checked_for_the_image_interpreter(filename, ok):
    assert TARGET.accepts(filename) is ok


def test_the_target_is_read_from_the_root_manifest():
    t = wheels.target_from_packages(["libc6=2.36-9+deb12u14", "python3.11-minimal=3.11.2-6"], "x86_64")
    assert t == wheels.Target("3.11", "x86_64", "2.36")
    assert "--platform" in t.pip_args() and "manylinux_2_36_x86_64" in t.pip_args()


def test_pip_is_given_every_manylinux_platform_the_glibc_runs():
    # pip takes exactly the --platform values given: with manylinux_2_36 alone it finds no
    # manylinux_2_17 wheel (rpds-py's, pydantic-core's), so each tag down to 2_17 is named.
    args = TARGET.pip_args()
    assert args[:6] == ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
    flags, platforms = args[6::2], args[7::2]
    assert set(flags) == {"--platform"}
    assert platforms == [f"manylinux_2_{n}_x86_64" for n in range(36, 16, -1)] + [
        "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    # Every tag named is one the target accepts, and an older glibc names fewer.
    assert all(TARGET.accepts(f"x-1-cp311-cp311-{p}.whl") for p in platforms)
    assert wheels.Target("3.11", "aarch64", "2.17").platforms() == [
        "manylinux_2_17_aarch64", "manylinux2014_aarch64", "manylinux2010_aarch64", "manylinux1_aarch64"]


# -- specs, the lock, layering -----------------------------------------------------------------


def _spec(images: Path, name: str, doc: dict) -> Path:
    (images / name).mkdir(parents=True, exist_ok=True)
    (images / name / "image.json").write_text(json.dumps(doc))
    return images / name


@pytest.mark.parametrize("doc, message", [
    ({"parent": "tool", "packages": ["jq"]}, "must be 'name=version'"),
    ({"parent": "tool", "packages": ["jq=1.*"]}, "no ':arch', no wildcards"),
    ({"parent": "tool", "packages": ["jq=1", "jq=2"]}, "pinned more than once: jq"),
    ({"parent": "tool", "wheels": [{"name": "x", "version": "1"}]}, "exactly {name, version, sha256}"),
    ({"parent": "tool", "wheels": [{"name": "x", "version": "1", "sha256": "ABC"}]}, "64 lowercase hex"),
    ({"parent": None, "debootstrap": {"suite": "bookworm"}, "packages": ["jq=1"]}, "for child images"),
])
def test_pins_are_exact_or_refused(tmp_path, doc, message):
    with pytest.raises(ImageError, match=message):
        load_spec(_spec(tmp_path, "child", doc))


def test_pins_are_inputs_but_a_spec_without_pins_hashes_as_before(tmp_path):
    plain = load_spec(_spec(tmp_path / "a", "child", {"parent": "tool"}))
    with_wheel = load_spec(_spec(tmp_path / "b", "child", {"parent": "tool", "wheels": [
        {"name": "x", "version": "1", "sha256": H}]}))
    other_hash = load_spec(_spec(tmp_path / "c", "child", {"parent": "tool", "wheels": [
        {"name": "x", "version": "1", "sha256": "cd" * 32}]}))
    assert len({plain.inputs_sha256(), with_wheel.inputs_sha256(), other_hash.inputs_sha256()}) == 3
    # Every built-in spec still hashes to what the lock recorded before pins existed.
    lock = load_lock()
    for name, spec in load_specs(IMAGES_DIR).items():
        assert lock.entry(name).inputs_sha256 == spec.inputs_sha256()


def test_a_user_dir_resolves_parents_in_itself_then_in_the_built_in_images(tmp_path):
    builtin = load_specs(IMAGES_DIR)
    user = tmp_path / "images"
    _spec(user, "mine", {"parent": "tool"})
    _spec(user, "mine-too", {"parent": "mine"})
    own = load_specs(user, builtin)
    assert set(own) == {"mine", "mine-too"}
    chain = ancestors(own["mine-too"], own, builtin)
    assert [(s.name, is_own) for s, is_own in chain] == [("mine", True), ("tool", False), ("base", False)]
    # A user's own "base" shadows the built-in one for the user's images, but the built-in
    # tool stays on the built-in base (the built-in lock pinned it there).
    _spec(user, "base", {"parent": None, "debootstrap": {"suite": "trixie"}})
    own = load_specs(user, builtin)
    assert root_of(own["mine"], own, builtin).debootstrap.suite == "bookworm"
    _spec(user, "orphan", {"parent": "nowhere"})
    with pytest.raises(ImageError, match="parent 'nowhere' has no spec here or among the built-in images"):
        load_specs(user, builtin)


def test_a_user_lock_sits_over_the_built_in_lock(tmp_path):
    builtin = load_lock()
    tool = builtin.image_id("tool")
    deb = LockedDeb("jq", "1.6", "amd64", H, "pool/main/j/jq/jq_1.6_amd64.deb", pinned=True)
    wheel = LockedWheel("tabulate", "0.9.0", H, "tabulate-0.9.0-py3-none-any.whl")
    mine = LockEntry("mine", digest_of(b"mine"), digest_of(b"in"), "tool", tool, debs=(deb,), wheels=(wheel,))
    adopted = LockEntry("theirs", digest_of(b"theirs"), digest_of(b"theirs"), reproducible=False, tool=True)
    images = tmp_path / "images"
    images.mkdir()
    Lock((mine, adopted), inherited=builtin).write(images / "images.lock")
    doc = json.loads((images / "images.lock").read_text())
    assert set(doc["images"]) == {"mine", "theirs"}  # the built-in entries are never written here
    assert doc["images"]["theirs"]["reproducible"] is False and doc["images"]["mine"]["debs"][0]["pinned"] is True
    lock = lock_for(images)
    assert lock.entry("mine") == mine and lock.entry("theirs") == adopted
    assert lock.image_id("tool") == tool and not lock.owns("tool")  # looked up underneath
    assert tool in lock.ids() and mine.id in lock.ids()
    with pytest.raises(ImageError, match="names unknown parent 'tool'"):
        load_lock(images / "images.lock")  # alone, its parent is unknown
    with pytest.raises(ImageError, match="an adopted image records its ID only"):
        LockEntry("x", mine.id, mine.id, "tool", tool, reproducible=False)


def test_deps_diff_names_each_change():
    a = LockedDeb("jq", "1.6", "amd64", H, "p/jq.deb")
    assert deps_diff([a], [LockedDeb("jq", "1.7", "amd64", H, "p/jq.deb")], [], []) == [" jq 1.6 -> 1.7"]
    w = LockedWheel("x", "1", H, "x-1-py3-none-any.whl")
    w2 = LockedWheel("x", "1", "cd" * 32, "x-1-py3-none-any.whl")
    assert deps_diff([a], [], [w], [w2]) == ["-jq=1.6", f" wheel x==1 sha256 {H[:12]}.. -> {'cd' * 6}.."]


def test_the_config_names_the_images_dir_relative_to_itself(tmp_path):
    (tmp_path / "proj/my-images").mkdir(parents=True)
    cfg = tmp_path / "proj/ringfence.toml"
    cfg.write_text('[images]\ndir = "my-images"\n')
    assert load_config(cfg).images_dir == tmp_path / "proj/my-images"
    assert load_config().images_dir is None
    cfg.write_text('[images]\ndir = "absent"\n')
    with pytest.raises(ConfigError, match=r"images\.dir"):
        load_config(cfg)


# -- the builder: pins into layers, offline, deterministic --------------------------------------


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A dir of its own: a root image already built and cached (a fake one-layer base with a
    Debian manifest), and a child pinning a package (its .deb already cached, resolved against
    a made-up index) and a wheel (already in the wheelhouse)."""
    images, cache = tmp_path / "images", Cache(tmp_path / "images/.build")
    _spec(images, "base", {"parent": None, "debootstrap": {"suite": "bookworm"}, "user": "10001:10001"})
    deb = make_deb(tmp_path / "jq.deb", "jq", [_member("./usr/", "dir", mode=0o755),
                                               _member("./usr/bin/", "dir", mode=0o755),
                                               _member("./usr/bin/jq", data=b"jq", mode=0o755)])
    (cache.debs).mkdir(parents=True)
    shutil.copy(tmp_path / "jq.deb", cache.debs / "jq_1.0_amd64.deb")
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    sha = make_wheel(whl, {"demo.py": b"X = 1\n"})
    (cache.wheels / sha).mkdir(parents=True)
    shutil.copy(whl, cache.wheels / sha / whl.name)
    _spec(images, "child", {"parent": "base", "packages": ["jq=1.0"],
                            "wheels": [{"name": "demo", "version": "1.0", "sha256": sha}]})
    tree = tmp_path / "parent-tree"
    (tree / "usr/bin").mkdir(parents=True)
    diff_id, layer = write_layer_file(tree_entries(tree, normalize=True), cache.layers)
    spec = load_spec(images / "base")
    config = image_config(spec.container_config(None), [diff_id], ["fake base"])
    parent = Built("base", digest_of(config), config, (layer,), spec.inputs_sha256(), None, None,
                   ("libc6=2.36-9", "python3.11-minimal=3.11.2-6"))
    cache.save(parent)
    Lock((parent.lock_entry(),)).write(images / "images.lock")
    index = _index(_stanza("jq", "1.0", depends="libc6 (>= 2.30)", sha=deb.sha256), _stanza("libc6", "2.36-9"))
    monkeypatch.setattr(_Deps, "index", lambda self, spec: index)
    return images, sha


def test_pinned_packages_and_wheels_build_to_the_same_id_offline(scratch):
    images, sha = scratch
    lines: list[str] = []
    report = build(images_dir=images, load=False, update_lock=True, progress=lines.append)
    assert report.ok and "child" in report.built
    entry = load_lock(images / "images.lock").entry("child")
    assert [(d.name, d.version, d.pinned) for d in entry.debs] == [("jq", "1.0", True)]
    assert [(w.name, w.sha256) for w in entry.wheels] == [("demo", sha)]
    assert any("maintainer scripts NOT run: jq: postinst" in line for line in lines)
    again = build(["child"], images_dir=images, load=False, force=True, offline=True)
    assert again.ok and again.built == ("child",) and again.drifts == ()
    assert load_lock(images / "images.lock").image_id("child") == entry.id
    record = Cache(images / ".build").find(entry.id)
    assert record is not None and [h for h in json.loads(record.config)["history"][-3:]] == [
        {"created": "2024-01-01T00:00:00Z", "created_by": "ringfence: packages jq=1.0"},
        {"created": "2024-01-01T00:00:00Z", "created_by": "ringfence: wheels demo==1.0"},
        {"created": "2024-01-01T00:00:00Z", "created_by": "ringfence: images/child/rootfs"},
    ]


def test_a_changed_file_is_refused_and_a_new_version_is_drift(scratch):
    images, sha = scratch
    build(images_dir=images, load=False, update_lock=True)
    cached = images / ".build/debs/jq_1.0_amd64.deb"
    good = cached.read_bytes()
    cached.write_bytes(good + b"tampered")
    with pytest.raises(ImageError, match=r"jq=1.0: the cached .deb .* refusing to install it"):
        build(["child"], images_dir=images, load=False, force=True, offline=True)
    cached.write_bytes(good)
    # The wheel's pin changes: offline, the build refuses it by name; the lock is untouched.
    spec = images / "child/image.json"
    spec.write_text(spec.read_text().replace(sha, H))
    before = (images / "images.lock").read_bytes()
    with pytest.raises(ImageError, match=f"wheel demo==1.0: no file with sha256 {H}"):
        build(images_dir=images, load=False, offline=True)
    assert (images / "images.lock").read_bytes() == before


# -- adopt: the checks, on exported filesystems made here ---------------------------------------


def _export(*members: tuple[tarfile.TarInfo, bytes | None]) -> adopt._Tree:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        for info, data in members:
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    data = raw.getvalue()
    return adopt._read_tree(adopt._Stream(iter([data[:1000], data[1000:]])))


PASSWD = b"root:x:0:0:root:/root:/bin/sh\nsandbox:x:10001:10001::/tmp:/usr/sbin/nologin\n"
GROUP = b"root:x:0:\nsandbox:x:10001:\n"


def _image(*extra):
    return _export(_member("etc/", "dir"), _member("etc/passwd", data=PASSWD), _member("etc/group", data=GROUP),
                   _member("usr/", "dir"), _member("usr/bin/", "dir"),
                   _member("usr/bin/tini", data=b"tini", mode=0o711),
                   _member("sbin", "symlink", link="usr/sbin"), _member("usr/sbin/", "dir"),
                   _member("usr/sbin/docker-init", "symlink", link="../bin/tini"), *extra)


@pytest.mark.parametrize("user, ok, detail", [
    ("10001:10001", True, "10001:10001 is sandbox (uid 10001)"),
    ("sandbox", True, "sandbox is sandbox"),
    ("", False, "no default user is set"),
    ("0", False, "which is root"),
    ("root:10001", False, "which is root"),
    ("sandbox:root", False, "group of 'sandbox:root' is root's"),
    ("4242", False, "'4242' has no entry in the image's /etc/passwd"),
    ("sandbox:nogroup", False, "'nogroup' has no entry in the image's /etc/group"),
])
def test_the_user_check(user, ok, detail):
    check = adopt._check_user(user, _image())
    assert check.ok is ok and detail in check.detail


@pytest.mark.parametrize("config, ok, detail", [
    ({"Entrypoint": ["/usr/bin/tini", "--"]}, True, "PID 1 is /usr/bin/tini"),
    ({"Entrypoint": ["tini", "--"], "Env": ["PATH=/usr/bin"]}, True, "PID 1 is /usr/bin/tini"),
    ({"Entrypoint": ["/sbin/docker-init", "--"]}, True, "(/usr/bin/tini)"),  # through two symlinks
    ({"Entrypoint": None, "Cmd": ["python3"]}, False, "no entrypoint"),
    ({"Entrypoint": ["/etc/passwd"]}, False, "not an init"),
    ({"Entrypoint": ["/usr/bin/dumb-init"]}, False, "does not exist in the image"),
])
def test_the_init_check(config, ok, detail):
    check = adopt._check_init(config, _image())
    assert check.ok is ok and detail in check.detail


def test_the_setuid_check_lists_every_privileged_file_and_the_runner_check():
    suid = _member("usr/bin/rootsh", data=b"sh", mode=0o4755)
    sgid = _member("usr/bin/crontab", data=b"c", mode=0o2755)
    harmless = _member("usr/bin/mine", data=b"m", mode=0o4755, uid=1000)  # setuid to a non-root user
    capped = _member("usr/bin/ping", data=b"p", mode=0o755)
    capped[0].pax_headers = {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}
    tree = _image(suid, sgid, harmless, capped)
    check = adopt._check_setid(tree)
    assert not check.ok
    assert "3 privileged file(s)" in check.detail
    for path in ("/usr/bin/rootsh (setuid 0:0 4755)", "/usr/bin/crontab (setgid 0:0 2755)",
                 "/usr/bin/ping (file capabilities)"):
        assert path in check.detail
    assert "/usr/bin/mine" not in check.detail
    assert adopt._check_setid(_image()).ok
    assert not adopt._check_runner(_image()).ok
    runner = _image(_member("opt/", "dir"), _member("opt/ringfence/", "dir"),
                    _member("opt/ringfence/runner.py", data=b"# runner"))
    assert adopt._check_runner(runner).ok
