"""`ringfence sandbox exec|gc`: run one command in a fresh sandbox, or remove orphans."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING

from ringfence_server.sandbox.errors import SandboxError
from ringfence_server.sandbox.units import parse_duration, parse_size

if TYPE_CHECKING:
    from ringfence_server.sandbox.backend import SandboxBackend
    from ringfence_server.sandbox.egress.grant import EgressGrant

_DEFAULTS = dict(memory="256m", cpus=1.0, pids=128, timeout="10s", output_limit="1MiB", tmpfs="16MiB")


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sandbox = subparsers.add_parser(
        "sandbox",
        help="run a command in a hardened single-use container, or clean up",
        description="Run commands in the same hardened, single-use sandbox the control plane uses.",
    )
    sub = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")

    exec_ = sub.add_parser(
        "exec",
        help="run one command in a fresh sandbox and print one JSON result",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Run CMD in a fresh container of a pinned image: non-root (10001), read-only root,\n"
            "no capabilities, no-new-privileges, seccomp, no network, a noexec /tmp, and the\n"
            "limits below. Prints exactly one JSON object on stdout: outcome (ok, tool_error,\n"
            "oom, timeout, output_limit, start_failed, killed), exit_code, stdout, stderr,\n"
            "*_truncated, duration_ms, image_id, runtime, and `applied`: the settings read back\n"
            "from the engine. Exits 0 whenever the command ran, whatever its outcome;\n"
            "2 for usage errors, 1 when the engine or the image is not usable."
        ),
        epilog="example: ringfence sandbox exec --memory 64m --timeout 2s -- sh -c 'id -u'",
    )
    exec_.add_argument("--image", default="tool", help="image name from images/images.lock (default: tool)")
    exec_.add_argument("--memory", type=_size, default=_DEFAULTS["memory"],
                       help="memory limit, e.g. 64m (default 256m)")
    exec_.add_argument("--cpus", type=float, default=_DEFAULTS["cpus"], help="CPU quota in cores (default 1.0)")
    exec_.add_argument("--pids", type=int, default=_DEFAULTS["pids"], help="max processes+threads (default 128)")
    exec_.add_argument("--timeout", type=_duration, default=_DEFAULTS["timeout"],
                       help="wall time, e.g. 5s, 500ms (default 10s)")
    exec_.add_argument("--output-limit", type=_size, default=_DEFAULTS["output_limit"],
                       help="stdout cap, e.g. 1MiB (default)")
    exec_.add_argument("--tmpfs", type=_size, default=_DEFAULTS["tmpfs"],
                       help="size of each writable memory filesystem, /tmp and /dev/shm (default 16MiB)")
    exec_.add_argument("--tmpfs-inodes", type=int, default=4096,
                       help="files each of /tmp and /dev/shm may hold (default 4096)")
    exec_.add_argument("--runtime", choices=["runc", "gvisor"], default="runc",
                       help="container runtime (default runc)")
    exec_.add_argument("--stdin", action="store_true", help="pass this process's stdin to the command")
    _add_egress_arguments(exec_)
    exec_.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]", help="the command to run")
    exec_.set_defaults(func=exec_command)

    gc = sub.add_parser(
        "gc", help="remove containers, networks and egress socket directories of dead ringfence instances")
    gc.set_defaults(func=gc_command)


def _add_egress_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        from ringfence_server.sandbox.egress.cli import add_exec_arguments
    except ImportError:
        return
    add_exec_arguments(parser)


def _egress_from_args(args: argparse.Namespace) -> EgressGrant | None:
    """The call's egress grant, or None: no --egress-allow (or no egress package)."""
    try:
        from ringfence_server.sandbox.egress.cli import profile_egress_from_args
    except ImportError:
        return None
    return profile_egress_from_args(args)


def exec_command(args: argparse.Namespace) -> int:
    from ringfence_server.sandbox.backend import SandboxRequest
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.profile import SandboxProfile

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("error: give the command after --, e.g. ringfence sandbox exec -- id -u", file=sys.stderr)
        return 2
    try:
        profile = SandboxProfile(
            image=args.image,
            runtime=args.runtime,
            memory_bytes=args.memory,
            cpus=args.cpus,
            pids=args.pids,
            timeout_s=args.timeout,
            stdout_limit=args.output_limit,
            tmpfs_bytes=args.tmpfs,
            tmpfs_inodes=args.tmpfs_inodes,
            egress=_egress_from_args(args),  # None: the profile's default, no egress
        )
        stdin = sys.stdin.buffer.read() if args.stdin else b""
        request = SandboxRequest(profile=profile, argv=tuple(command), stdin=stdin, run_id="cli")
    except (ValueError, SandboxError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        backend = DockerBackend()
        try:
            with _kill_on_signals(backend) as received:
                result = backend.run(request)
        finally:
            backend.close()
    except SandboxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    json.dump(result.to_json(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    # Killed by a signal to us: say so in the exit status too, the way a shell would (128+N).
    return 128 + received[0] if received else 0


@contextlib.contextmanager
def _kill_on_signals(backend: SandboxBackend) -> Iterator[list[int]]:
    """SIGTERM and SIGINT (timeout(1), kill, service managers, Ctrl-C) kill the call's container
    before we go: otherwise it would run on with nobody enforcing its wall time. The kill runs
    on its own thread (a signal handler must not re-enter the engine client the main thread may
    be using); the call then ends `killed` and is reported like any other."""
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not received:
            received.append(signum)
            name = signal.Signals(signum).name
            threading.Thread(target=backend.kill_all, args=(f"ringfence sandbox exec received {name}",),
                             daemon=True).start()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def gc_command(args: argparse.Namespace) -> int:
    import docker

    from ringfence_server.sandbox.reaper import reap

    try:
        client = docker.from_env()
        reaped = reap(client)
    except docker.errors.DockerException as e:
        print(f"error: cannot reach the Docker engine: {e}", file=sys.stderr)
        return 1
    for item in reaped:
        print(f"removed {item.kind} {item.name}: {item.reason}")
    print(f"{len(reaped)} orphan(s) removed", file=sys.stderr)
    return 0
