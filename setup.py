"""What goes into the wheel (the metadata is in pyproject.toml).

Besides the packages (`control`, `sandbox`, `imagebuild`, `conformance`, `demo_services`) and
their data (the embedded default config, the built-in tool manifests), an installed ringfence
needs the image specs and lock that live at the top of the checkout in `images/` (the
Makefile, scripts and tests use them there). They
ship as `ringfence_images/`, a data-only folder mapped from `images/` and installed next to
`control/` and `sandbox/` in site-packages. Why top-level and not inside `sandbox/`: a spec's
`files` name modules by their repository path ("sandbox/egress/server.py") and are resolved
against the images folder's parent (imagebuild.spec), which is the checkout in a checkout
and site-packages in an install, so the same rule finds the same, installed module with no
special case. sandbox.pinned_images picks the folder at run time ($RINGFENCE_IMAGES_DIR, else
the checkout's images/, else this shipped copy).

This lives in setup.py rather than pyproject.toml because pyproject cannot add a package with
its own source folder (`package-dir`) to those `packages.find` discovers.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
IMAGES = HERE / "images"


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
    packages=[*find_packages(where=str(HERE), include=[
        "control", "control.*", "sandbox", "sandbox.*", "imagebuild", "imagebuild.*",
        "conformance", "conformance.*", "demo_services", "demo_services.*"]), "ringfence_images"],
    package_dir={"ringfence_images": "images"},
    package_data={
        # In every package: the embedded config (control/default_config.toml), the built-in
        # tool manifests (control/tools/*.json), the generated protobuf modules' stubs.
        "": ["*.toml", "*.json", "*.pyi"],
        # The contract suite's stored baseline (`ringfence eval contract` compares with it).
        "control.evals": ["baselines/*.json"],
        "ringfence_images": image_files(),
    },
    # A second guard: image_files() already leaves these out.
    exclude_package_data={"ringfence_images": [".build/*", "*.tar", "*.pyc"]},
    # Only what package_data lists: not whatever else a manifest would sweep in (and no
    # setuptools warning that images/tool/ "looks like a package").
    include_package_data=False,
)
