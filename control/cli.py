"""The `ringfence` command: serve the control plane, run sandboxes, build and verify images, write
and check your own tools, inspect and verify the runs in the event store."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ringfence",
        description=(
            "ringfence admits, authorizes and runs AI agents' tool calls in hardened, "
            "single-use containers."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Each area registers its own subcommands; imports stay inside so that `--help` works even
    # before optional parts (e.g. the generated gRPC code) are present.
    from conformance import cli as conformance_cli
    from control.api.cli import commands as people_commands
    from imagebuild import cli as images_cli
    from sandbox import cli as sandbox_cli

    sandbox_cli.register(sub)
    images_cli.register(sub)
    conformance_cli.register(sub)
    people_commands.register_runs(sub)  # `runs`: over gRPC, and the event store's actions under it
    try:
        from control.api import serve
    except ImportError:
        pass
    else:
        serve.register(sub)
    people_commands.register(sub)  # submit, watch, files, approvals, run, tools (and `tools new|check`)
    try:  # `ringfence trace RUN_ID`: a run's span tree, from the event store
        from control.tracing import cli as trace_cli
    except ImportError:
        pass
    else:
        trace_cli.register(sub)
    try:  # the demos run a server in-process
        from control.demo import cli as demo_cli
    except ImportError:
        pass
    else:
        demo_cli.register(sub)
    try:  # `ringfence eval SUITE`: scripted agents on a real stack, scored, compared with a baseline
        from control.evals import cli as eval_cli
    except ImportError:
        pass
    else:
        eval_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from control.api.cli.tools import route

    parser = build_parser()
    args = parser.parse_args(route(list(sys.argv[1:] if argv is None else argv)))
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
