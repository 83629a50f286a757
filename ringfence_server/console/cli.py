"""`ringfence console`: the reviewer's console, a web app in front of a control plane."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import textwrap
from pathlib import Path

__all__ = ["register", "run"]

DESCRIPTION = """\
Serve the reviewer's console: pending approvals arriving live, each request with its exact
arguments, digest, tool risk and the run's earlier turns, approve / approve and remember /
decline with a reason; runs filtered by status and outcome, each with its turns, trace
waterfall, egress decisions, artifacts and audit-chain check; the tools with their risk.

People sign in with their own approver (or admin) token. The console has no authority of its
own: it calls the control plane's public gRPC API (--server) with that token, so it can do
exactly what the token may do, and the server's rules (roles, tenants, four eyes, the digest
of what was judged) hold as they do everywhere. The token stays in the console's memory for
the session; the browser holds only a random session id (an HttpOnly, SameSite=Strict
cookie, Secure under TLS).

Off loopback the console serves TLS only (--tls-cert/--tls-key); on 127.0.0.1 it may serve
plain HTTP, for one machine (or an SSH tunnel)."""

EXAMPLES = """\
examples:
  ringfence serve &                                   # a control plane on 127.0.0.1:50051
  ringfence console --listen 127.0.0.1:8080 --server 127.0.0.1:50051
  # then open http://127.0.0.1:8080 and sign in with an approver token
  # (the embedded defaults' demo tenant: demo-approver-token)

  ringfence console --listen 0.0.0.0:8443 --tls-cert console.pem --tls-key console-key.pem \\
      --server cp.internal:50051 --server-tls-ca ca.pem

exit codes: 0 stopped by SIGINT/SIGTERM; 2 bad usage (e.g. a non-loopback --listen without TLS)."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("console", help="serve the reviewer's web console (approvals, runs, traces)",
                            description="\n\n".join(textwrap.fill(" ".join(par.split()), 88)
                                                    for par in DESCRIPTION.split("\n\n")),
                            epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                            allow_abbrev=False)
    listen = p.add_argument_group("the console")
    listen.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                        help="where the console serves (default 127.0.0.1:8080; port 0 picks one). "
                             "A non-loopback HOST needs --tls-cert and --tls-key")
    listen.add_argument("--tls-cert", type=Path, metavar="CERT.pem", help="serve HTTPS with this certificate chain")
    listen.add_argument("--tls-key", type=Path, metavar="KEY.pem", help="the private key of --tls-cert")
    listen.add_argument("--session-idle", type=float, default=8 * 3600, metavar="SECONDS",
                        help="sign a session out after this long without a request (default 28800)")
    signin = p.add_argument_group(
        "sign-in throttle", "Failed sign-ins are limited per client address and across all addresses; a refused "
        "attempt gets HTTP 429 with Retry-After and is never sent to the control plane. Behind a reverse proxy "
        "every request has the proxy's address: then the global cap is what protects.")
    signin.add_argument("--signin-failures", type=int, default=5, metavar="N",
                        help="failed sign-ins one address may make within --signin-window (default 5)")
    signin.add_argument("--signin-window", type=float, default=300.0, metavar="SECONDS",
                        help="the per-address window (default 300)")
    signin.add_argument("--signin-global", type=int, default=60, metavar="N",
                        help="failed sign-ins all addresses together may make per minute (default 60)")
    server = p.add_argument_group("the control plane it talks to")
    server.add_argument("--server", metavar="HOST:PORT", default=None,
                        help="the ringfence server (default: $RINGFENCE_SERVER, else 127.0.0.1:50051)")
    server.add_argument("--server-tls", action="store_true", help="reach it over TLS with the system's CA roots")
    server.add_argument("--server-tls-ca", metavar="CA.pem",
                        help="reach it over TLS, trusting this PEM CA (default: $RINGFENCE_TLS_CA if set)")
    server.add_argument("--server-tls-cert", metavar="CERT.pem",
                        help="client certificate for mTLS to the server (with --server-tls-key)")
    server.add_argument("--server-tls-key", metavar="KEY.pem", help="client private key for mTLS")
    server.add_argument("--server-tls-server-name", metavar="NAME",
                        help="the name to check the server's certificate against (when it differs from HOST)")
    server.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="per request to the server (default 30)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ringfence.options import TlsConfig
    from ringfence_server.console.app import ConsoleSettings, create_app
    from ringfence_server.console.server import ConsoleServer, ListenRefused, check_listen, parse_host_port
    from ringfence_server.console.throttle import ThrottleSettings

    try:
        host, port = parse_host_port(args.listen, "--listen")
        check_listen(host, args.tls_cert, args.tls_key)
        target = args.server or os.environ.get("RINGFENCE_SERVER") or "127.0.0.1:50051"
        parse_host_port(target, "--server")
        ca = args.server_tls_ca or os.environ.get("RINGFENCE_TLS_CA") or None
        if bool(args.server_tls_cert) != bool(args.server_tls_key):
            raise ListenRefused("--server-tls-cert and --server-tls-key go together")
        for flag, path in (("--server-tls-ca", ca), ("--server-tls-cert", args.server_tls_cert),
                           ("--server-tls-key", args.server_tls_key)):
            if path and not Path(path).is_file():
                raise ListenRefused(f"{flag}: there is no file {path}")
        if not args.timeout > 0 or not args.session_idle > 0 or not args.signin_window > 0:
            raise ListenRefused("--timeout, --session-idle and --signin-window want a number of seconds above 0")
        if args.signin_failures < 1 or args.signin_global < 1:
            raise ListenRefused("--signin-failures and --signin-global want a whole number of at least 1")
    except ListenRefused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tls = None
    if args.server_tls or ca or args.server_tls_cert:
        tls = TlsConfig.from_files(ca, certificate_chain=args.server_tls_cert, private_key=args.server_tls_key,
                                   server_name=args.server_tls_server_name)
    settings = ConsoleSettings(server=target, tls=tls, https=args.tls_cert is not None, timeout=args.timeout,
                               idle_s=args.session_idle,
                               signin=ThrottleSettings(failures=args.signin_failures, window_s=args.signin_window,
                                                       global_failures=args.signin_global))
    try:
        server = ConsoleServer(create_app(settings), host, port, tls_cert=args.tls_cert, tls_key=args.tls_key)
    except OSError as e:
        print(f"error: cannot listen on {args.listen}: {e}", file=sys.stderr)
        return 2
    print(f"ringfence: console on {server.url} (control plane {target})", flush=True)
    asyncio.run(server.serve_until_signal())
    print("ringfence: console stopped", flush=True)
    return 0
