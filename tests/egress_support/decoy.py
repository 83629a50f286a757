"""Decoy servers for the egress tests and benchmark. Test support only; stdlib only.

A decoy logs every TCP connection the moment it is accepted (before any TLS handshake or
request byte), every request line, and every UDP datagram, as JSON lines on stdout, so a test
can show that a refused request never reached it. It serves:

    GET /            "hello from <name>"
    GET /big?n=N     N bytes (to run into byte ceilings and measure throughput)
    CONNECT ip:port  only with --relay: it is then a second-hop proxy that relays anywhere,
                     which is what case 29's "CONNECT relayed through a second hop" abuses

Runs on the host (tests/unit, loopback) through `Decoy`, and inside `base` containers as
`python3 -I -S -B -c <this file's source> --name N --port P [--tls-port Q --cert C --key K]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

MAX_HEAD = 16384


class Decoy:
    """TCP (optionally TLS) and UDP decoy listeners on one address, in daemon threads."""

    def __init__(self, name: str, host: str = "127.0.0.1", port: int = 0, *, tls_port: int | None = None,
                 cert: str | None = None, key: str | None = None, udp_port: int | None = None,
                 relay: bool = False, log: Callable[[dict], None] | None = None) -> None:
        self.name, self.host, self.relay = name, host, relay
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._log = log
        self._socks: list[socket.socket] = []
        self.port = self._listen_tcp(port, None)
        self.tls_port = None
        if tls_port is not None:
            assert cert is not None, "a TLS listener needs a certificate"
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            ctx.sni_callback = lambda _sock, sni, _ctx: self.record(event="tls", sni=sni)
            self.tls_port = self._listen_tcp(tls_port, ctx)
        self.udp_port = self._listen_udp(udp_port) if udp_port is not None else None

    # -- logging -----------------------------------------------------------------------

    def record(self, **event) -> None:
        event = {"decoy": self.name, **event}
        with self._lock:
            self.events.append(event)
        if self._log:
            self._log(event)

    def connections(self) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e["event"] in ("tcp", "udp")]

    def close(self) -> None:
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()

    # -- listeners ---------------------------------------------------------------------

    def _listen_tcp(self, port: int, tls: ssl.SSLContext | None) -> int:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, port))
        s.listen(64)
        self._socks.append(s)
        threading.Thread(target=self._accept, args=(s, tls), daemon=True).start()
        return s.getsockname()[1]

    def _listen_udp(self, port: int) -> int:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.bind((self.host, port))
        self._socks.append(s)

        def loop() -> None:
            while True:
                try:
                    data, peer = s.recvfrom(65536)
                except OSError:
                    return
                self.record(event="udp", peer=peer[0], port=s.getsockname()[1], size=len(data))

        threading.Thread(target=loop, daemon=True).start()
        return s.getsockname()[1]

    def _accept(self, s: socket.socket, tls: ssl.SSLContext | None) -> None:
        while True:
            try:
                conn, peer = s.accept()
            except OSError:
                return
            # Logged at accept: a connection counts even if it never sends a byte.
            self.record(event="tcp", peer=peer[0], port=s.getsockname()[1], tls=tls is not None)
            threading.Thread(target=self._serve, args=(conn, tls), daemon=True).start()

    # -- serving -----------------------------------------------------------------------

    def _serve(self, conn: socket.socket, tls: ssl.SSLContext | None) -> None:
        try:
            conn.settimeout(30)
            if tls is not None:
                conn = tls.wrap_socket(conn, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < MAX_HEAD:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            head, _, rest = head.partition(b"\r\n\r\n")
            text = head.decode("latin-1")
            lines = text.split("\r\n")
            host = next((line.split(":", 1)[1].strip() for line in lines[1:]
                         if line.lower().startswith("host:")), None)
            proxy_auth = any(line.lower().startswith("proxy-authorization:") for line in lines[1:])
            self.record(event="request", line=lines[0], host=host, proxy_auth=proxy_auth)
            parts = lines[0].split(" ")
            if len(parts) == 3 and parts[0] == "CONNECT" and self.relay:
                self._relay(conn, parts[1], rest)
                return
            url = urlsplit(parts[1] if len(parts) > 1 else "/")
            if url.path == "/big":
                n = int(parse_qs(url.query).get("n", ["0"])[0])
                conn.sendall(f"HTTP/1.0 200 OK\r\nContent-Length: {n}\r\n\r\n".encode())
                block = b"x" * 65536
                while n > 0:
                    sent = conn.send(block[: min(n, len(block))])
                    n -= sent
            else:
                body = f"hello from {self.name}\n".encode()
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
        except (OSError, ValueError, ssl.SSLError):
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def _relay(self, conn: socket.socket, target: str, rest: bytes) -> None:
        host, _, port = target.rpartition(":")
        try:
            upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
        except (OSError, ValueError):
            conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            return
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.record(event="relayed", target=target)
        if rest:
            upstream.sendall(rest)

        def pipe(a: socket.socket, b: socket.socket) -> None:
            try:
                while True:
                    data = a.recv(65536)
                    if not data:
                        break
                    b.sendall(data)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    b.shutdown(socket.SHUT_WR)

        t = threading.Thread(target=pipe, args=(upstream, conn), daemon=True)
        t.start()
        pipe(conn, upstream)
        t.join(30)
        upstream.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="decoy")
    p.add_argument("--name", required=True)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=80)
    p.add_argument("--tls-port", type=int)
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--udp-port", type=int)
    p.add_argument("--relay", action="store_true")
    args = p.parse_args(argv)

    def log(event: dict) -> None:
        sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
        sys.stdout.flush()

    decoy = Decoy(args.name, args.host, args.port, tls_port=args.tls_port, cert=args.cert, key=args.key,
                  udp_port=args.udp_port, relay=args.relay, log=log)
    log({"decoy": args.name, "event": "ready", "port": decoy.port, "tls_port": decoy.tls_port,
         "udp_port": decoy.udp_port})
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
