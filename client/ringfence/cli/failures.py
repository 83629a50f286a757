"""Every command runs inside `guarded`: it reads the connection settings, runs the command's body
and turns each failure (a usage error, a diagnosed failure, an error the server answered, a
transport that never reached it, a closed pipe) into one message with a hint and an exit code.

grpc is imported where a failure is classified, not at the top: `ringfence --help` and the
commands that never connect start without it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from ringfence import errors as E
from ringfence.cli.connection import DEFAULT_TIMEOUT_S, SERVER_ENV, TOKEN_ENV, Settings, option, settings_from
from ringfence.cli.errors import EXIT_OK, EXIT_SERVER, EXIT_USAGE, CommandFailed, UsageError
from ringfence.cli.output import Output

# What a transport failure (nothing answered, or not the protocol we speak) looks like in
# grpc's UNAVAILABLE details, as opposed to an UNAVAILABLE the server itself sent.
_TRANSPORT_MARKERS = (
    "failed to connect", "connection refused", "errors resolving", "dns resolution", "socket closed",
    "handshake", "connection reset", "broken pipe", "connections to all backends failing", "ssl",
    "tls", "end of tcp stream", "goaway",
)


def _transport_failure(message: str) -> bool:
    low = message.lower()
    return any(marker in low for marker in _TRANSPORT_MARKERS)


def report_failure(out: Output, error: BaseException, s: Settings | None, command: str) -> int:
    """Say what went wrong and what to do; return the exit code."""
    import grpc

    server = s.server if s else "the server"
    token_env = s.token_env if s else TOKEN_ENV
    if isinstance(error, E.InvalidArgument):
        details = [f"{v.field}: {v.description}" for v in error.violations]
        out.error(f"the server refused the request: {error.message}", details, code="INVALID_ARGUMENT",
                  hint=None if details else "check the command's arguments (--help)")
        return EXIT_USAGE
    if isinstance(error, E.Unauthenticated):
        out.error(f"the server at {server} did not accept the token in {token_env}: {error.message}",
                  code="UNAUTHENTICATED",
                  hint=f"set {token_env} to a bearer token that server's config lists "
                       "(or pick the variable with --token-env NAME)")
        return EXIT_SERVER
    if isinstance(error, E.PermissionDenied):
        role_hint = {
            "approvals": "listing, showing and deciding approvals needs an approver (or admin) token",
            "submit": "starting runs and executing plans needs an agent (or admin) token",
            "files": "moving files in and out of a run needs an agent (or admin) token",
        }.get(command, "use a token with the role this command needs")
        denied_hint = f"{role_hint}: set {token_env} to one"
        if command == "approvals" and "proposed this call" in error.message:
            # Four eyes: the role is right, the person is not; another token will not be this one's.
            denied_hint = ("four eyes: whoever proposed a call cannot decide it; someone else decides it with their "
                           f"own approver (or admin) token (`ringfence whoami` says whose token {token_env} holds)")
        out.error(f"permission denied: {error.message}", code="PERMISSION_DENIED", hint=denied_hint)
        return EXIT_SERVER
    if isinstance(error, E.Unavailable):
        if _transport_failure(error.message):
            tls_hint = ("if it serves plaintext, drop --tls/--tls-ca; otherwise check --tls-ca and --tls-server-name"
                        if s is not None and s.tls else "if it serves TLS, pass --tls-ca CA.pem")
            out.error(f"cannot reach a ringfence server at {server}: {error.message}", code="UNAVAILABLE",
                      hint=f"is `ringfence serve` running on {server}? Choose the address with --server "
                           f"HOST:PORT or {SERVER_ENV}; {tls_hint}.")
        else:
            out.error(f"the server is unavailable: {error.message}", code="UNAVAILABLE",
                      hint="try again in a moment")
        return EXIT_SERVER
    if isinstance(error, E.NotFound):
        out.error(error.message, code="NOT_FOUND",
                  hint="ids are per tenant: `ringfence runs` lists this token's runs, `ringfence approvals` "
                       "its pending approvals")
        return EXIT_SERVER
    if isinstance(error, E.VersionMismatch):
        out.error(error.message, code="VERSION_MISMATCH")  # the message says what to upgrade
        return EXIT_SERVER
    if isinstance(error, E.FailedPrecondition):
        hint = None
        if command == "submit" and "is finished" in error.message:
            hint = ("a finished run takes no more calls: submit without --run-id (and without run_id in the plan) "
                    "for a new run")
        out.error(error.message, code="FAILED_PRECONDITION", hint=hint)
        return EXIT_SERVER
    if isinstance(error, E.ResourceExhausted):
        out.error(error.message, code="RESOURCE_EXHAUSTED", hint="the tenant is at a limit: try again later")
        return EXIT_SERVER
    if isinstance(error, E.Internal):
        out.error(error.message, code="INTERNAL",
                  hint="a server fault, not your request: retrying will not help; report the incident id")
        return EXIT_SERVER
    if isinstance(error, E.ControlError):
        out.error(error.message, code=type(error).__name__)
        return EXIT_SERVER
    if isinstance(error, grpc.RpcError):
        code = error.code() if hasattr(error, "code") else None
        text = error.details() if hasattr(error, "details") else str(error)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            out.error(f"no answer from {server} within {s.timeout if s else DEFAULT_TIMEOUT_S:g}s",
                      code="DEADLINE_EXCEEDED", hint="raise --timeout, or check that the server is not stuck")
        else:
            name = code.name if code is not None else "UNKNOWN"
            out.error(f"{name}: {text}", code=name)
        return EXIT_SERVER
    raise error


Action = Callable[[argparse.Namespace, Settings, Output], int]
"""A command's body: (its arguments, connection settings, where to print) -> exit code."""


def guarded(command: str, action: Action) -> Callable[[argparse.Namespace], int]:
    """The command's func: settings, client errors and exit codes in one place."""

    def run(args: argparse.Namespace) -> int:
        import grpc

        out = Output(bool(option(args, "json")))
        settings = None
        try:
            settings = settings_from(args)
            return int(action(args, settings, out) or EXIT_OK)
        except UsageError as e:
            out.error(e.message, e.details, e.hint, code="USAGE")
            return EXIT_USAGE
        except CommandFailed as e:
            out.error(e.message, hint=e.hint, code="FAILED")
            return e.code
        except (E.ControlError, grpc.RpcError) as e:
            return report_failure(out, e, settings, command)
        except BrokenPipeError:
            # The reader went away (`| head`): stop quietly.
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            except OSError:
                pass
            return EXIT_OK

    return run
