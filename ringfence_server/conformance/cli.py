"""`ringfence conformance`: the escape and ceiling battery against the user's engine and image."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ringfence_server.sandbox.errors import EngineError, SandboxError

if TYPE_CHECKING:
    from docker import DockerClient

EXIT_OK = 0
EXIT_FAILED = 1  # a case failed: the engine or image does not hold what the sandbox relies on
EXIT_ERROR = 2  # the run could not happen: engine down, image not pinned, no runsc, bad arguments

DESCRIPTION = """\
Run the escape and ceiling battery (docs/escape-battery.md) against your Docker engine and your
pinned image: each case is an attack made from inside a real sandbox, created exactly as the
control plane creates one for a tool call (uid 10001, read-only root, no capabilities,
no-new-privileges, seccomp, no network, the ceilings), with the image --image names in your lock
and the runtime you name. The attacks are the battery's own probes.

Prints a table: the case number of docs/escape-battery.md, PASS, FAIL or XFAIL, and the case's
title; under a FAIL, what differed from the fail-closed outcome. XFAIL is a gap of the runtime
that docs/escape-battery.md documents (gVisor: exec mappings from /tmp, the tmpfs inode cap,
a sentry that dies of a fork count before the tool's budget shows): reported, not failed.
Cases N.image check the image itself, without running it (the checks of `ringfence images
adopt`): its default user is not root, it ships no setuid-root or setgid-root file, its
entrypoint is an init.

Not in a conformance run, and listed as such: the cases that need the test battery's harness
(decoy servers on test networks, the egress testbed, files on the host: 27, 29, 38, 39, 46,
47), and every red check (showing that a protection matters takes a weakened sandbox, which
only the battery has). The image needs python3 (every tool image has it).

Exit status: 0 when every case passed (or is a known finding), 1 when a case failed, 2 when
the run could not happen (the engine does not answer, the image is not pinned or not in the
engine, no runsc for --runtime gvisor, an unknown --case)."""

EPILOG = """\
examples:
  ringfence conformance
  ringfence conformance --runtime gvisor --json > conformance-gvisor.json
  ringfence conformance --images-dir ./images --image mytool --case 4 --case 13"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "conformance",
        help="run the escape and ceiling battery against your engine and image",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--image", default="tool", metavar="NAME",
                   help="the pinned image to run in, by its name in the lock (default: tool)")
    p.add_argument("--runtime", choices=["runc", "gvisor"], default="runc", help="container runtime (default: runc)")
    p.add_argument("--images-dir", type=Path, default=None, metavar="DIR",
                   help="a user's images dir, whose lock pins NAME over the built-in one (default: the built-in)")
    p.add_argument("--lock", default=None, metavar="FILE", help="lock file (default: images.lock in the images dir)")
    p.add_argument("--case", action="append", dest="cases", metavar="ID",
                   help="run only this case: a number (4 takes 4.image too) or 4.image alone; repeatable")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="sandboxes at a time (default: 3); the fork bomb and the CPU burn always run alone")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument("--verbose", "-v", action="store_true", help="say on stderr as each probe's call ends")
    p.set_defaults(func=cmd_conformance)
    return p


def _client() -> DockerClient:
    """An engine client with room for the concurrent calls (docker-py's default pool is 10)."""
    try:
        import docker

        client = docker.from_env(timeout=120, max_pool_size=32)
        client.ping()
    except Exception as e:  # docker.errors.DockerException, requests' errors, no docker-py at all
        raise EngineError(f"cannot reach the Docker engine: {e}") from e
    return client


def cmd_conformance(args: argparse.Namespace) -> int:
    from ringfence_server.conformance.runner import DEFAULT_JOBS, run_conformance, select
    from ringfence_server.sandbox.pinned_images import lock_for

    t0 = time.monotonic()

    def progress(msg: str) -> None:
        if args.verbose:
            print(f"[{time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    client: DockerClient | None = None
    try:
        select(args.cases)  # an unknown --case is a usage error, before the engine is asked anything
        lock = lock_for(args.images_dir, args.lock)
        client = _client()
        report = run_conformance(client, lock, image=args.image, runtime=args.runtime,
                                 cases=args.cases, jobs=args.jobs or DEFAULT_JOBS, progress=progress)
    except SandboxError as e:
        print(f"conformance: {e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if client is not None:
            client.close()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.table())
    return EXIT_OK if report.ok else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ringfence_server.conformance.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["conformance", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
