"""`ringfence mcp`: the MCP front door over stdio, the form MCP hosts launch as a subprocess.

stdout carries the protocol and nothing else: the MCP SDK's stdio transport owns fd 1 while it
serves (stray prints go to stderr), logs go to stderr, and the checks made before serving
(settings, the token, the server's reachability) report on stderr with the CLI's exit codes.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from ringfence.cli.connection import Settings, tls_of
from ringfence.cli.errors import EXIT_OK, EXIT_USAGE, CommandFailed, UsageError
from ringfence.cli.failures import guarded
from ringfence.cli.options import SubParsers, add_command
from ringfence.cli.output import Output

EXTRA_HINT = "pip install 'ringfence[mcp]'"

HOST_CONFIG = """\
MCP host configuration (e.g. Claude Desktop's claude_desktop_config.json, or any host's
"mcpServers" table); the host launches the command and speaks MCP over its stdin/stdout:

  {
    "mcpServers": {
      "ringfence": {
        "command": "ringfence",
        "args": ["mcp", "--server", "127.0.0.1:50051"],
        "env": {"RINGFENCE_TOKEN": "<an agent token of your tenant>"}
      }
    }
  }

Add "--tls-ca", "/path/to/ca.pem" to args for a server that serves TLS. One MCP session is one
ringfence run (finished when the session ends). A tools/call `_meta` may carry
"io.ringfence/idempotency-key" (a mutation resent with the same key takes effect once) and
"traceparent"/"tracestate" (the server's spans join the caller's trace).
"""


def cmd_mcp(args: argparse.Namespace, s: Settings, out: Output) -> int:
    """Serve MCP on stdin/stdout until the host closes the session."""
    try:
        import anyio

        from ringfence.mcp import FrontDoor
    except ImportError as e:
        raise CommandFailed(f"`ringfence mcp` needs the MCP Python SDK, an optional extra ({e})",
                            hint=EXTRA_HINT, code=EXIT_USAGE) from None
    if not args.progress_every > 0:
        raise UsageError("--progress-every wants a number of seconds above 0")
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, args.log_level),
                        format="ringfence mcp: %(levelname)s %(name)s: %(message)s")
    anyio.run(_serve, s, FrontDoor, float(args.progress_every))
    return EXIT_OK


async def _serve(s: Settings, front_door: Any, progress_every_s: float) -> None:
    import anyio
    from mcp.server.stdio import stdio_server

    from ringfence.aio import AsyncClient

    tls = tls_of(s)

    def client() -> AsyncClient:
        # Streams without a deadline: a call waiting for approval follows the run's log as long as it waits.
        return AsyncClient(s.server, s.token, tls=tls, timeout=s.timeout, stream_timeout=None)

    # Before any protocol: a wrong address or token is said once, on stderr, with the CLI's exit
    # code, instead of failing every request of a session the host believes is healthy.
    async with client() as probe:
        await probe.list_tools()

    async def connect(request: Any) -> AsyncClient:
        return client()

    door = front_door(connect, progress_every_s=progress_every_s)
    try:
        async with anyio.create_task_group() as tg:
            # A host that stops waiting sends SIGTERM (the MCP SDK's stdio client, 2 s after closing
            # stdin): stop serving, and still finish the session's run below.
            tg.start_soon(_stop_on_signal, tg.cancel_scope)
            async with stdio_server() as (read_stream, write_stream):
                await door.run(read_stream, write_stream, door.create_initialization_options())
            tg.cancel_scope.cancel()
    finally:
        await door.aclose()


async def _stop_on_signal(scope: Any) -> None:
    import anyio

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`mcp`, with the connection options `common`; returns its parser."""
    p = add_command(
        subparsers, "mcp", common,
        help="serve the tools to an MCP client over stdio (the MCP front door)",
        description=("Serve this token's tenant's tools over the Model Context Protocol on stdin/stdout, "
                     "for an MCP host to launch as a subprocess. Every tools/call goes through the server's "
                     "whole admission path (schema, guardrails, policy, approval, idempotency, the sandbox, "
                     "the event log): a denied call is an isError result with its reason and verdict path, "
                     "a call that needs approval waits (with progress notifications) until an approver "
                     "decides it with `ringfence approvals`, and a cancelled request withdraws its approval. "
                     "stdout carries only the protocol; logs go to stderr. Needs the extra: "
                     f"{EXTRA_HINT}.\n\n" + HOST_CONFIG),
        examples=("  RINGFENCE_TOKEN=demo-agent-token ringfence mcp --server 127.0.0.1:50051\n"
                  "  ringfence mcp --server rf.example.com:443 --tls-ca ca.pem --token-env RF_AGENT_TOKEN"))
    p.add_argument("--progress-every", metavar="SECONDS", type=float, default=1.0,
                   help="while a call waits for approval, a progress notification this often (default 1)")
    p.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="WARNING",
                   help="what is logged to stderr (default WARNING)")
    p.set_defaults(func=guarded("mcp", cmd_mcp))
    return p
