"""`ringfence images fetch|build|verify`.

`register(subparsers)` adds the `images` command to a parent argparse parser; each leaf sets
`func(args) -> exit code`. Standalone: `python -m sandbox.images.cli build --update-lock`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from sandbox.errors import SandboxError

EXIT_OK = 0
EXIT_PROBLEMS = 1  # drift or missing images: the operator has something to do
EXIT_ERROR = 2  # the command itself could not run (engine down, debootstrap failed, bad spec)


def _progress_printer() -> Callable[[str], None]:
    t0 = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {msg}", file=sys.stderr, flush=True)

    return progress


def cmd_build(args: argparse.Namespace) -> int:
    from sandbox.images.builder import build

    progress = _progress_printer()
    try:
        report = build(args.names or None, update_lock=args.update_lock, force=args.force,
                       progress=progress, lock_path=args.lock)
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
    from sandbox.images.builder import fetch

    try:
        fetch(force=args.force, progress=_progress_printer())
    except SandboxError as e:
        print(f"images fetch: {e}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from sandbox.images import engine
    from sandbox.images.lock import load_lock
    from sandbox.images.pinned import verify

    try:
        lock = load_lock(args.lock)
        problems = verify(engine.client_from_env(), lock)
    except SandboxError as e:
        print(f"images verify: {e}", file=sys.stderr)
        return EXIT_ERROR
    for p in problems:
        print(str(p), file=sys.stderr)
    if problems:
        return EXIT_PROBLEMS
    for entry in lock.entries:
        print(f"{entry.name}\t{entry.id}")
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    images = subparsers.add_parser("images", help="build and verify the pinned sandbox images")
    sub = images.add_subparsers(dest="images_command", required=True)

    f = sub.add_parser("fetch", help="download the root images' packages (the only network step) if absent")
    f.add_argument("--force", action="store_true", help="download again even when present")
    f.set_defaults(func=cmd_fetch)

    b = sub.add_parser("build", help="build images that are missing or stale")
    b.add_argument("names", nargs="*", metavar="NAME", help="images to build (default: all)")
    b.add_argument("--update-lock", action="store_true", help="accept new IDs into images.lock")
    b.add_argument("--force", action="store_true", help="rebuild even when up to date")
    b.add_argument("--lock", default=None, help="lock file (default: images/images.lock)")
    b.set_defaults(func=cmd_build)

    v = sub.add_parser("verify", help="check every pinned image is in the engine with its locked ID")
    v.add_argument("--lock", default=None, help="lock file (default: images/images.lock)")
    v.set_defaults(func=cmd_verify)
    return images


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.images.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    images = register(sub)
    # Standalone, `images` is implied: `python -m sandbox.images.cli build`.
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "images":
        argv = ["images"] + argv
    args = parser.parse_args(argv)
    del images
    func: Callable[[argparse.Namespace], int] = args.func  # set by each leaf (register)
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
