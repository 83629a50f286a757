"""What goes into the wheel (the metadata is in pyproject.toml).

Besides the package `ringfence_server` (control, sandbox, imagebuild, conformance,
demo_services) and its data (the embedded default config, the built-in tool manifests), an
installed server needs the image specs and lock that live at the top of the checkout in
`images/` (the Makefile, scripts and tests use them there). They ship as `ringfence_images/`, a
data-only folder mapped from `images/` and installed next to `ringfence_server/` in
site-packages. Why top-level and not inside `ringfence_server/sandbox/`: a spec's `files` name
modules by their repository path ("ringfence_server/sandbox/egress/server.py") and are resolved
against the images folder's parent (ringfence_server.imagebuild.spec), which is the checkout in
a checkout and site-packages in an install, so the same rule finds the same, installed module
with no special case. ringfence_server.sandbox.pinned_images picks the folder at run time
($RINGFENCE_IMAGES_DIR, else the checkout's images/, else this shipped copy).

It also carries Docker's default seccomp profile, the one ringfence_server.sandbox.seccomp derives
every tool container's profile from. It is not in the repository (derived, not vendored: it
follows Debian's docker package), so `build_py` below copies it into the built package as
ringfence_server/sandbox/docker-default-seccomp.json at build time, from the first of
SECCOMP_SOURCES that exists; without it an installed server could not start a single sandbox.

This lives in setup.py rather than pyproject.toml because pyproject cannot add a package with
its own source folder (`package-dir`) to those `packages.find` discovers.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
IMAGES = HERE / "images"
# Where the built package carries Docker's default seccomp profile (seccomp.py reads it there).
SECCOMP_SHIPPED = Path("ringfence_server", "sandbox", "docker-default-seccomp.json")
# profiles/seccomp/default.json of Docker's source, in order: the copy `bash scripts/ensure-packages.sh`
# extracts into the checkout, the Debian package golang-github-docker-docker-dev's, and the copy an
# sdist made by this file carries (a wheel built from that sdist has neither of the first two).
SECCOMP_SOURCES = (
    HERE / "build" / "seccomp" / "docker-default.json",
    Path("/usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json"),
    HERE / SECCOMP_SHIPPED,
)


def seccomp_source() -> Path:
    for candidate in SECCOMP_SOURCES:
        if candidate.is_file() and candidate.stat().st_size > 0:
            return candidate
    raise SystemExit(
        "Docker's default seccomp profile was not found (looked in "
        f"{', '.join(str(c) for c in SECCOMP_SOURCES)}); the server's wheel must carry it. "
        "Run `bash scripts/ensure-packages.sh` in the checkout (it extracts the file from the Debian "
        "package golang-github-docker-docker-dev into build/seccomp/), then build again."
    )


class BuildPyWithSeccomp(build_py):
    """build_py, plus Docker's default seccomp profile copied into the built package."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the checkout's build/ copy in place
            return
        source = seccomp_source()
        self.copy_file(str(source), str(Path(self.build_lib) / SECCOMP_SHIPPED), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        shipped = str(Path(self.build_lib) / SECCOMP_SHIPPED)
        # From an sdist, package_data already lists it (the sdist carries it in the package).
        if not self.editable_mode and shipped not in outputs:
            outputs.append(shipped)
        return outputs


class SdistWithSeccomp(sdist):
    """sdist, plus the profile at its installed path, so a wheel built from the sdist carries it."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        self.copy_file(str(seccomp_source()), str(Path(base_dir) / SECCOMP_SHIPPED), preserve_mode=False)


def image_files() -> list[str]:
    """Every file of images/, relative to it, except the build cache (images/.build: layers,
    package tarballs), *.tar archives and bytecode. Listed one by one (escaped as globs)
    instead of with patterns, because setuptools' globs skip dotfiles, and a rootfs/ dotfile
    left out would make the installed spec hash differently from the lock."""
    out = []
    for dirpath, dirnames, filenames in os.walk(IMAGES):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not (here == IMAGES and d == ".build"))
        for name in sorted(filenames):
            path = here / name
            if name.endswith((".pyc", ".pyo", ".tar")):
                continue
            if path.is_symlink():
                # A wheel would carry the target's content, and the image built from the
                # installed spec would differ from the one the lock pins.
                raise SystemExit(f"{path}: symlinks cannot be shipped in the wheel")
            out.append(glob.escape(str(path.relative_to(IMAGES))))
    return out


setup(
    cmdclass={"build_py": BuildPyWithSeccomp, "sdist": SdistWithSeccomp},
    packages=[*find_packages(where=str(HERE), include=["ringfence_server", "ringfence_server.*"]), "ringfence_images"],
    package_dir={"ringfence_images": "images"},
    package_data={
        # In every package: the embedded config (ringfence_server/control/default_config.toml), the built-in
        # tool manifests (ringfence_server/control/tools/*.json), the generated protobuf modules' stubs.
        "": ["*.toml", "*.json", "*.pyi"],
        # The contract suite's stored baseline (`ringfence eval contract` compares with it).
        "ringfence_server.control.evals": ["baselines/*.json"],
        # The reviewer's console: its page templates, its one script and its one stylesheet.
        "ringfence_server.console": ["templates/*.html", "static/*.js", "static/*.css"],
        "ringfence_images": image_files(),
    },
    # A second guard: image_files() already leaves these out.
    exclude_package_data={"ringfence_images": [".build/*", "*.tar", "*.pyc"]},
    # Only what package_data lists: not whatever else a manifest would sweep in (and no
    # setuptools warning that images/tool/ "looks like a package").
    include_package_data=False,
)
