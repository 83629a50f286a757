"""The console's HTTP server: uvicorn on a socket bound first (so port 0 works and the address is
known before anything is served), over TLS when given a certificate, and the listen rule: off
loopback, TLS or nothing (a session cookie and a bearer token must not cross a network in clear).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from starlette.applications import Starlette

from ringfence_server.control.netloc import is_loopback_host

__all__ = ["ConsoleServer", "ListenRefused", "check_listen", "parse_host_port"]


class ListenRefused(ValueError):
    """The listen address and TLS settings break the rule (the message says what to do)."""


def parse_host_port(text: str, flag: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ListenRefused(f"{flag} wants HOST:PORT (e.g. 127.0.0.1:8080), not {text!r}")
    return host.strip("[]"), int(port)


def check_listen(host: str, tls_cert: Path | None, tls_key: Path | None) -> None:
    if bool(tls_cert) != bool(tls_key):
        raise ListenRefused("--tls-cert and --tls-key go together (the console's own certificate and key)")
    for flag, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path is not None and not path.is_file():
            raise ListenRefused(f"{flag}: there is no file {path}")
    if tls_cert is None and not is_loopback_host(host):
        raise ListenRefused(
            f"refusing to serve the console on {host} without TLS: off loopback, sign-in tokens and session "
            "cookies would cross the network in clear. Give --tls-cert CERT.pem --tls-key KEY.pem, or listen "
            "on 127.0.0.1 (and reach it through an SSH tunnel or a TLS-terminating proxy on the same host)")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers (they re-raise the signal once stopped, so the
    process would end "killed by SIGTERM"): serve_until_signal() installs ours."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ConsoleServer:
    """uvicorn serving `app` on host:port (bound at construction: `url` is known at once)."""

    def __init__(self, app: Starlette, host: str, port: int, *, tls_cert: Path | None = None,
                 tls_key: Path | None = None, grace_s: int = 2) -> None:
        check_listen(host, tls_cert, tls_key)
        self.host = host
        self.https = tls_cert is not None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
            self.sock.listen(128)
            self.sock.setblocking(False)
        except OSError:
            self.sock.close()
            raise
        self.server = _Server(uvicorn.Config(
            app, lifespan="on", log_level="warning", access_log=False,
            ssl_certfile=str(tls_cert) if tls_cert else None, ssl_keyfile=str(tls_key) if tls_key else None,
            timeout_graceful_shutdown=grace_s))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        port = self.sock.getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.https else 'http'}://{host}:{port}"

    async def serve(self) -> None:
        """Serve until stop() (or request_stop())."""
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            self.sock.close()

    async def serve_until_signal(self) -> None:
        """Serve until SIGINT or SIGTERM, then stop gracefully (the command's exit is 0)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)
        await self.serve()

    def request_stop(self) -> None:
        self.server.should_exit = True

    def start_in_thread(self, timeout: float = 30.0) -> None:
        """Serve from a thread of its own, with an event loop of its own (uvicorn installs no
        signal handlers off the main thread); returns once it serves."""
        self._thread = threading.Thread(target=lambda: asyncio.run(self.serve()), name="ringfence-console",
                                        daemon=True)
        self._thread.start()
        ended = threading.Event()
        for _ in range(int(timeout * 100)):
            if self.server.started or not self._thread.is_alive():
                break
            ended.wait(0.01)
        if not self.server.started:
            self.stop()
            raise RuntimeError("the console did not start (uvicorn logged why)")

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
