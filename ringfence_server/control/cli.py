"""The server's commands, added to the client's one `ringfence` command (entry point group
`ringfence.cli`, declared in pyproject.toml): serve the control plane, run sandboxes, build
and verify images, run the conformance suite, write and check your own tools, inspect and
verify the runs in the event store, add third-party MCP servers, the demos, the evaluation
suites and the reviewer's web console."""

from __future__ import annotations

import sys

from ringfence.cli.extension import CommandLine

_STORE_ACTIONS = ("The ACTIONs show, export, verify and prune read the event store directly instead (no "
                  "server, no token; --state-dir, --config or --database-url after the ACTION), e.g. "
                  "`ringfence runs show RUN_ID --state-dir ./.state`.")
_OWN_TOOLS = ("Your own tools, without a server: `ringfence tools new NAME` scaffolds a tool package, "
              "`ringfence tools check DIR...` checks one (each has --help; docs/TOOLS.md). A QUERY that is "
              "literally new or check: `ringfence tools -- new`.")


def extend(cli: CommandLine) -> None:
    """Add the server's commands; each area registers its own."""
    from ringfence_server.conformance import cli as conformance_cli
    from ringfence_server.console import cli as console_cli
    from ringfence_server.control.api import serve
    from ringfence_server.control.demo import cli as demo_cli
    from ringfence_server.control.evals import cli as eval_cli
    from ringfence_server.control.mcp_servers import scaffold_cli as mcp_servers_cli
    from ringfence_server.control.store import cli as store_cli
    from ringfence_server.control.toolpkg import cli as toolpkg_cli
    from ringfence_server.control.tracing import cli as trace_cli
    from ringfence_server.control.workers import cli as workers_cli
    from ringfence_server.imagebuild import cli as images_cli
    from ringfence_server.sandbox import cli as sandbox_cli
    from ringfence_server.worker import cli as worker_cli

    serve.register(cli.commands)
    sandbox_cli.register(cli.commands)
    images_cli.register(cli.commands)
    conformance_cli.register(cli.commands)
    cli.extend_runs(store_cli.add_actions, _STORE_ACTIONS + "\n\n" + store_cli.DESCRIPTION)
    cli.add_tool_action("new", toolpkg_cli.add_new_parser, _OWN_TOOLS)
    cli.add_tool_action("check", toolpkg_cli.add_check_parser)
    mcp_servers_cli.register(cli.commands)  # `ringfence mcp-servers add`: a PyPI MCP server's image and declaration
    trace_cli.register(cli.commands)  # `ringfence trace RUN_ID`: a run's span tree, from the event store
    demo_cli.register(cli.commands)  # the demos run a server in-process
    eval_cli.register(cli.commands)  # `ringfence eval SUITE`: scripted agents on a real stack, scored
    console_cli.register(cli.commands)  # `ringfence console`: the reviewer's web console (over the public API)
    worker_cli.register(cli.commands)  # `ringfence worker`: a sandbox worker on another host, its keys and tokens
    workers_cli.register(cli.commands)  # `ringfence workers`: the workers' leases and late results, from the store


def main(argv: list[str] | None = None) -> int:
    """`python -m ringfence_server.control.cli ...`: the same `ringfence` command."""
    from ringfence.cli.main import main as ringfence_main

    return ringfence_main(argv)


if __name__ == "__main__":
    sys.exit(main())
