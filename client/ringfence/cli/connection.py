"""Which server, which token, which TLS: the connection settings from the command's options and
the environment (checked before anything is sent), and the client they open."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringfence.cli.errors import UsageError

if TYPE_CHECKING:  # grpc and the client are loaded when a command connects: the CLI starts without grpc
    from ringfence.options import TlsConfig
    from ringfence.sync import Client


DEFAULT_SERVER = "127.0.0.1:50051"  # where `ringfence serve` listens by default
SERVER_ENV = "RINGFENCE_SERVER"  # the server, when --server is not given
TOKEN_ENV = "RINGFENCE_TOKEN"  # the bearer token's variable, when --token-env is not given
TLS_CA_ENV = "RINGFENCE_TLS_CA"  # a CA to trust (and so TLS), when --tls-ca is not given
DEFAULT_TIMEOUT_S = 30.0  # per request; followed streams have none

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Settings:
    """How to reach the server, resolved from the options and the environment by settings_from."""

    server: str  # HOST:PORT
    token_env: str  # the variable the token came from (named in messages; the token never is)
    token: str
    tls: bool  # --tls, or implied by a CA or a client certificate
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    tls_server_name: str | None
    timeout: float  # seconds, per request
    json: bool  # one JSON object per line on stdout, errors as JSON on stderr


def option(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    """An option that may be absent from `args` (the connection options are SUPPRESSed until given)."""
    return getattr(args, name, default)


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings, each checked (UsageError otherwise) before anything is sent."""
    server = option(args, "server") or os.environ.get(SERVER_ENV) or DEFAULT_SERVER
    if ":" not in server or server.startswith("-"):
        raise UsageError(f"--server wants HOST:PORT, e.g. 127.0.0.1:50051, not {server!r}")
    token_env = option(args, "token_env") or TOKEN_ENV
    if not _ENV_NAME.fullmatch(token_env):
        # Not echoed: someone may have put the token itself here.
        raise UsageError("--token-env takes the NAME of an environment variable that holds the token "
                         "(e.g. --token-env MY_TOKEN), never the token itself")
    token = os.environ.get(token_env, "")
    if not token.strip():
        state = "is empty" if token_env in os.environ else "is not set"
        raise UsageError(
            f"no token: {token_env} {state}",
            hint=(f"set {token_env} to your bearer token (export {token_env}=...), or name another "
                  "variable with --token-env NAME. A `ringfence serve` on the embedded defaults accepts "
                  "the public dev tokens demo-agent-token and demo-approver-token."))
    tls_ca = option(args, "tls_ca") or os.environ.get(TLS_CA_ENV) or None
    tls_cert, tls_key = option(args, "tls_cert"), option(args, "tls_key")
    if bool(tls_cert) != bool(tls_key):
        raise UsageError("--tls-cert and --tls-key go together (the client certificate for mTLS)")
    for flag, path in (("--tls-ca", tls_ca), ("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path and not Path(path).is_file():
            raise UsageError(f"{flag}: there is no file {path}")
    tls = bool(option(args, "tls") or tls_ca or tls_cert)
    timeout = option(args, "timeout", DEFAULT_TIMEOUT_S)
    if not timeout > 0:
        raise UsageError("--timeout wants a number of seconds above 0")
    return Settings(server=server, token_env=token_env, token=token.strip(), tls=tls, tls_ca=tls_ca,
                    tls_cert=tls_cert, tls_key=tls_key, tls_server_name=option(args, "tls_server_name"),
                    timeout=float(timeout), json=bool(option(args, "json")))


def tls_of(s: Settings) -> TlsConfig | None:
    """The TLS settings `s` names (its files read now); None for plaintext."""
    from ringfence.options import TlsConfig

    if not s.tls:
        return None
    return TlsConfig.from_files(s.tls_ca, certificate_chain=s.tls_cert, private_key=s.tls_key,
                                server_name=s.tls_server_name)


def connect(s: Settings) -> Client:
    """A client for the server `s` names (a context manager: it closes its channel)."""
    # grpc (and the client, which needs it) only once a command connects: see failures.py.
    from ringfence.sync import Client

    # Streams get no deadline: `watch` and `submit` follow a run for as long as it runs.
    return Client(s.server, s.token, tls=tls_of(s), timeout=s.timeout, stream_timeout=None)
