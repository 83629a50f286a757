"""`ringfence images fetch|build|verify|adopt`.

`register(subparsers)` adds the `images` command to a parent argparse parser; each leaf sets
`func(args) -> exit code`. Standalone: `python -m ringfence_server.imagebuild.cli build --update-lock`.

Every command takes `--images-dir DIR`: a user's images dir, layered over the built-in one
(ringfence_server.imagebuild.spec says how names resolve), with its lock at DIR/images.lock and its build
cache at DIR/.build. Without it, the built-in images (the checkout's images/) as before.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ringfence_server.sandbox.errors import SandboxError

EXIT_OK = 0
EXIT_PROBLEMS = 1  # drift or missing images: the operator has something to do
EXIT_ERROR = 2  # the command itself could not run (engine down, debootstrap failed, bad spec)


def _progress_printer() -> Callable[[str], None]:
    t0 = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {msg}", file=sys.stderr, flush=True)

    return progress


def cmd_build(args: argparse.Namespace) -> int:
    from ringfence_server.imagebuild.builder import build

    progress = _progress_printer()
    try:
        report = build(args.names or None, update_lock=args.update_lock, force=args.force,
                       progress=progress, lock_path=args.lock, images_dir=args.images_dir, offline=args.offline)
    except SandboxError as e:
        print(f"images build: {e}", file=sys.stderr)
        return EXIT_ERROR
    if report.ok:
        progress("all requested images are built, pinned and loaded")
        return EXIT_OK
    for d in report.drifts:
        if not d.accepted:
            print(f"drift: {d.describe()}", file=sys.stderr)
    if report.blocked:
        print(f"not built (parent drifted): {', '.join(report.blocked)}", file=sys.stderr)
    print("the lock was NOT changed; rerun with --update-lock to pin the new IDs", file=sys.stderr)
    return EXIT_PROBLEMS


def cmd_fetch(args: argparse.Namespace) -> int:
    from ringfence_server.imagebuild.builder import fetch

    try:
        fetch(force=args.force, progress=_progress_printer(), images_dir=args.images_dir, lock_path=args.lock)
    except SandboxError as e:
        print(f"images fetch: {e}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from ringfence_server.imagebuild import engine
    from ringfence_server.imagebuild.pinned import verify
    from ringfence_server.sandbox.pinned_images import IMAGES_DIR, lock_for

    try:
        lock = lock_for(args.images_dir, args.lock)
        problems = verify(engine.client_from_env(), lock, images_dir=args.images_dir or IMAGES_DIR)
    except SandboxError as e:
        print(f"images verify: {e}", file=sys.stderr)
        return EXIT_ERROR
    for p in problems:
        print(str(p), file=sys.stderr)
    if problems:
        return EXIT_PROBLEMS
    for entry in lock.entries:
        print(f"{entry.name}\t{entry.id}" + ("" if entry.reproducible else "\tadopted, not reproducible"))
    return EXIT_OK


def cmd_adopt(args: argparse.Namespace) -> int:
    from ringfence_server.imagebuild import engine
    from ringfence_server.imagebuild.adopt import adopt

    try:
        inspection, written = adopt(engine.client_from_env(), args.name, args.image, tool=args.tool,
                                    images_dir=args.images_dir, lock_path=args.lock)
    except SandboxError as e:
        print(f"images adopt: {e}", file=sys.stderr)
        return EXIT_ERROR
    print(f"{args.name}: {inspection.image_id}\n{inspection.describe()}", file=sys.stderr)
    if written is None:
        failed = ", ".join(c.name for c in inspection.failed)
        print(f"images adopt: {args.name} refused ({failed}); the lock was not changed", file=sys.stderr)
        return EXIT_PROBLEMS
    print(f"{args.name}\t{inspection.image_id}\tadopted, not reproducible, pinned in {written}")
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    images = subparsers.add_parser("images", help="build and verify the pinned sandbox images")
    sub = images.add_subparsers(dest="images_command", required=True)

    def where(p: argparse.ArgumentParser) -> None:
        p.add_argument("--images-dir", type=Path, default=None, metavar="DIR",
                       help="a user's images dir, over the built-in images (default: the built-in ones)")
        p.add_argument("--lock", default=None, help="lock file (default: images.lock in the images dir)")

    f = sub.add_parser("fetch", help="download what the images are installed from (the only network step) if absent")
    f.add_argument("--force", action="store_true", help="download root package tarballs again even when present")
    where(f)
    f.set_defaults(func=cmd_fetch)

    b = sub.add_parser("build", help="build images that are missing or stale")
    b.add_argument("names", nargs="*", metavar="NAME", help="images to build (default: all)")
    b.add_argument("--update-lock", action="store_true", help="accept new IDs into images.lock")
    b.add_argument("--force", action="store_true", help="rebuild even when up to date")
    b.add_argument("--offline", action="store_true",
                   help="install only from the build cache (what `images fetch` left); download nothing")
    where(b)
    b.set_defaults(func=cmd_build)

    v = sub.add_parser("verify", help="check every pinned image is in the engine with its locked ID")
    where(v)
    v.set_defaults(func=cmd_verify)

    a = sub.add_parser("adopt", help="pin an image built elsewhere (docker build) by ID, after checking it")
    a.add_argument("name", metavar="NAME", help="the name tools and dispatch know it by")
    a.add_argument("image", metavar="IMAGE_ID", help="the image's ID (or a tag: its ID is what is pinned)")
    a.add_argument("--tool", action="store_true", help="a tool image: it must carry /opt/ringfence/runner.py")
    where(a)
    a.set_defaults(func=cmd_adopt)
    return images


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ringfence_server.imagebuild.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    images = register(sub)
    # Standalone, `images` is implied: `python -m ringfence_server.imagebuild.cli build`.
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "images":
        argv = ["images", *argv]
    args = parser.parse_args(argv)
    del images
    func: Callable[[argparse.Namespace], int] = args.func  # set by each leaf (register)
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
