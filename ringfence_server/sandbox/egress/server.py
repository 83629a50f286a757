"""The egress proxy: an HTTP forward proxy (plain HTTP and CONNECT) in stdlib asyncio.

Where requests come from. The proxy has no TCP listener. Each call's grant comes with a
listening unix socket of its own, `<calls_dir>/<token>/proxy.sock`, in a directory the host
created for that call and bind-mounts into that call's sandbox only (the sandbox itself has no
network; ringfence_server.sandbox.egress.relay turns the socket back into 127.0.0.1:3128 for its tools). So
every connection is known to belong to the call whose socket accepted it, before a byte of it
is read: it is that call's connection, recorded on that call, cut when that call is revoked.

It admits a request only when every check passes, in this order, and opens the upstream
connection only after the last one (each check is a pure function of ringfence_server.sandbox.egress.admission;
this module does the I/O between them):

1. credentials   Proxy-Authorization Basic user:password of a live call grant (407
                 "credentials_invalid" otherwise), AND that grant must be the one of the
                 socket the connection arrived on: a live credential of another call is
                 refused (407 "credential_misuse") and recorded on both calls, each event
                 naming the other ("call_binding")
2. target        a host *name*: a bare IP (`CONNECT 1.2.3.4:443`) is refused ("ip_literal")
3. allowlist     host:port matches the call's patterns (ringfence_server.sandbox.egress.allowlist)
4. Host header   plain HTTP: the Host header names the target ("host_mismatch")
5. ceilings      the call's connection count and byte budget
6. resolution    the proxy resolves the name itself (a test resolver in tests, never a
                 client's idea of the address), and refuses the request when ANY address is
                 loopback/private/link-local/CGNAT/metadata/... (ringfence_server.sandbox.egress.addresses),
                 unless it lies in a network the *test* configuration names. It then connects
                 to that address, so a second lookup cannot rebind it.
                 A *service* (`services`: a name the operator declared with the fixed
                 addresses of a container ringfence itself runs, e.g. the ledger) is never
                 resolved: its name stands for exactly its pinned addresses, which are
                 private and permitted for that name alone. A pinned address reached under
                 any other name (a test mapping, a public DNS name pointing inside) is
                 refused ("address_refused"), test networks or not. The allowlist check
                 (3) is the same for a service as for any host: a call reaches it only when
                 its own allowlist names it.
7. TLS           CONNECT: the client's first flight must be a TLS ClientHello whose SNI is the
                 CONNECT host, without Encrypted Client Hello ("sni_mismatch", "not_tls", ...);
                 a tunnel carrying anything else -- e.g. a CONNECT for a second proxy further
                 on -- never reaches upstream.

Why credentials at all, when the socket already names the call: defence in depth (a socket
handed to the wrong sandbox by a host bug would still need that call's password), and a
credential that leaked out of one call and is presented in another is an attack worth
reporting, which only a credential check can see.

Plain HTTP requests are forwarded one per client connection, in origin form, with the body
bounded by Content-Length (chunked request bodies are refused) and nothing read after it, so
a pipelined second request cannot ride on the first one's admission.

Bytes in both directions count against the call's budget; past it every connection of the
call is cut. Revoking a grant (the call completed) closes its socket, aborts its open
connections, and its credentials stop working at once.

Every decision is an event: one JSON object per request (call, host, port, address, allowed
or denied and why, bytes up/down, why it was cut), kept per call for the control channel to
hand back and printed as a JSON line on stdout.

Control channel: a unix socket (`control_socket`), one JSON request line and one JSON reply
line per connection: ping, grant, revoke (returns the call's events), events. It lives at the
top of the state directory, which only the host and the proxy container mount; a sandbox
mounts only its own call's directory below it (see ringfence_server.sandbox.egress.proxy).

The parts, one module each (all stdlib only, laid into the egress-proxy image as they are,
images/egress-proxy/image.json `files`, as the package `rfegress`; they import each other
relatively, so the same files are `ringfence_server.sandbox.egress.X` on the host and `rfegress.X` in the image):

    config       ProxyConfig, services, CHECKS
    http1        request heads, host:port, refusals, the forwarded head
    admission    every allow/deny decision (pure: no I/O)
    grant_table  the per-call grants: credentials, ceilings, cut_all
    pump         the relay: bytes both ways, charged to the call's budget
    control      the control channel
    events       the request event and the JSON log
    server       this: the listeners, each connection's course through the above, main()

Run inside the image as `python3 -I -S -B /opt/ringfence/egress_proxy.py --config FILE`.
"""


from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TextIO

from . import admission, http1, pump
from .admission import CredentialMisuse
from .config import CHECKS, ConfigError, ProxyConfig, parse_services
from .control import PROTOCOL_VERSION
from .control import start as start_control
from .errors import Cut, Deny
from .events import EventLog, JSONObject, RequestEvent
from .grant_table import SOCKET_NAME, Grant, GrantTable
from .tlspeek import MAX_HELLO, HelloError, NeedMore, parse_client_hello

# Re-exported: the host (sandbox.egress.proxy, control.config) names these as sandbox.egress.server's.
__all__ = ["CHECKS", "PROTOCOL_VERSION", "SOCKET_NAME", "ConfigError", "Connector", "EgressProxyServer", "Grant",
           "ProxyConfig", "load_config", "main", "parse_services"]

Connector = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _open_tcp(ip: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(ip, port)


class EgressProxyServer:
    """The proxy and its control channel on one event loop."""

    def __init__(self, config: ProxyConfig, *, connector: Connector | None = None,
                 log: TextIO | None = None) -> None:
        self.cfg = config
        self._connect = connector or _open_tcp
        self._log = EventLog(log if log is not None else sys.stdout, config.max_events_per_call)
        self._grants = GrantTable(config.calls_dir)
        self._servers: list[asyncio.AbstractServer] = []
        self._handlers: set[asyncio.Task[None]] = set()

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        # No TCP listener: a connection that did not arrive on a call's own socket could not be
        # attributed to a call, and a port would be one more thing the proxy's upstream
        # networks could reach.
        if self.cfg.control_socket:
            self._servers.append(await start_control(self, self.cfg.control_socket))
        if self.cfg.disabled_checks:
            self._emit({"event": "warning", "message": "TEST configuration: checks disabled",
                        "disabled_checks": sorted(self.cfg.disabled_checks)})

    async def close(self) -> None:
        for g in self._grants:
            g.revoked = True
            g.close_listener()
            g.cut_all("shutdown")
        for s in self._servers:
            s.close()
        # Connections of no grant (still reading a head) end here too, before the loop does.
        pending = [t for t in self._handlers if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=2)
        for s in self._servers:
            await s.wait_closed()
        self._servers.clear()

    # -- grants (the control channel's operations) ---------------------------------------

    def status(self) -> JSONObject:
        return {"grants": len(self._grants), "listeners": self._grants.listening()}

    async def grant(self, *, call_id: str, username: str, password: str, allow: list[str],
                    max_bytes: int, max_connections: int, socket_dir: str) -> str:
        """Register a call and start listening on its own socket; returns the socket's path.

        `socket_dir` names a directory the host made for this call under `calls_dir`; the
        proxy never creates directories, so a grant cannot make it write anywhere else."""
        grant = self._grants.prepare(call_id=call_id, username=username, password=password, allow=allow,
                                     max_bytes=max_bytes, max_connections=max_connections, socket_dir=socket_dir)
        assert grant.socket_path is not None
        grant.listener = await asyncio.start_unix_server(
            lambda r, w: self._handle(r, w, grant), grant.socket_path, limit=http1.MAX_HEAD)
        # Anyone who can reach the path may connect: only this call's sandbox can (the directory
        # is bind-mounted into it alone; on the host it lies in the proxy's 0700 state dir),
        # and a sandbox may run as any non-root uid.
        try:
            os.chmod(grant.socket_path, 0o666)
            self._grants.add(grant)
        except BaseException:
            grant.close_listener()
            raise
        self._emit({"event": "grant", "call_id": call_id, "allow": [str(p) for p in grant.patterns],
                    "max_bytes": max_bytes, "max_connections": max_connections})
        return grant.socket_path

    async def revoke(self, username: str, wait_s: float = 5.0) -> JSONObject:
        g = self._grants.pop(username)
        if g is None:
            raise KeyError(f"no grant for {username!r}")
        g.revoked = True
        g.close_listener()
        g.cut_all("revoked")
        pending = [t for t in g.tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=wait_s)
        self._emit({"event": "revoke", "call_id": g.call_id, "bytes": g.bytes_used,
                    "connections": g.connections})
        return g.summary()

    def events(self, username: str) -> JSONObject:
        g = self._grants.get(username)
        if g is None:
            raise KeyError(f"no grant for {username!r}")
        return g.summary()

    # -- events ------------------------------------------------------------------------

    def _emit(self, event: JSONObject) -> None:
        self._log.emit(event)

    # -- the proxy ---------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, arrived: Grant) -> None:
        """One connection accepted on `arrived`'s own socket: it is that call's, whatever it says."""
        grant: Grant | None = None
        ev = RequestEvent()
        upstream: asyncio.StreamWriter | None = None
        answered = False
        task = asyncio.current_task()
        assert task is not None  # a connection callback runs in a task of its own
        self._handlers.add(task)
        # Known from the first byte: revoking the call ends this connection even mid-head.
        arrived.tasks.add(task)
        arrived.transports[writer.transport] = ev
        try:
            if arrived.revoked:
                return
            try:
                head = await asyncio.wait_for(reader.readuntil(http1.HEAD_END), self.cfg.head_timeout_s)
            except asyncio.LimitOverrunError:
                raise Deny(400, "bad_request", "request head too large") from None
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                return
            req = http1.parse_head(head)
            ev.method = req.method
            grant = self._authenticate(req, arrived, ev)
            if grant is not arrived:  # only with the call_binding check off (tests)
                grant.tasks.add(task)
                grant.transports[writer.transport] = ev
            if req.method == "CONNECT":
                host, port = admission.connect_target(req)
                ev.host, ev.port = host, port
                name, address = await self._admit(grant, host, port, ev)
                writer.write(http1.CONNECT_ESTABLISHED)
                await writer.drain()
                answered = True
                first = await self._read_hello(reader, name, ev)
                ureader, upstream = await self._open_upstream(grant, address, port, ev)
                upstream.write(first)
                ev.bytes_up += len(first)
                pump.charge(grant, len(first), ev)
                await pump.tunnel(grant, reader, writer, ureader, upstream, ev, idle_timeout_s=self.cfg.idle_timeout_s)
            else:
                await self._forward_http(grant, req, reader, writer, ev)
                answered = True
        except Deny as d:
            ev.decision, ev.reason = "denied", d.reason
            if d.detail:
                ev.detail = d.detail
            if not answered:
                await self._refuse(writer, d)
        except Cut:
            ev.cut = ev.cut or (grant.cut_reason if grant else "cut")
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, OSError) as e:
            if ev.decision == "allowed" and not ev.cut:
                ev.cut = "revoked" if grant is not None and grant.revoked else "connection_error"
                ev.detail = type(e).__name__
        finally:
            for w in (upstream, writer):
                if w is not None:
                    w.transport.abort() if ev.cut else w.close()
            for g in {arrived, grant} - {None}:
                assert g is not None
                g.tasks.discard(task)
                g.transports.pop(writer.transport, None)
                if upstream is not None:
                    g.transports.pop(upstream.transport, None)
            if ev.method is not None:
                # Attributed to the call whose socket it came in on, whatever credential it bore.
                self._log.record(arrived, ev.to_json())
            self._handlers.discard(task)

    def _authenticate(self, req: http1.Request, arrived: Grant, ev: RequestEvent) -> Grant:
        try:
            return admission.authenticate(self.cfg, self._grants.by_username(), arrived, req)
        except CredentialMisuse as misuse:
            ev.credential_of, ev.target = misuse.owner_call_id, req.target
            owner = self._grants.get(misuse.owner_username)
            self._misuse(owner=owner, arrived=arrived, req=req)
            raise

    def _misuse(self, *, owner: Grant | None, arrived: Grant, req: http1.Request) -> None:
        """A live credential came in on another call's socket: it leaked out of `owner` (its
        sandbox handed it on, or something read it) and `arrived` tried to use it. Both calls
        get an event naming the other (the one on `arrived` is its request event)."""
        self._log.record(owner, {"event": "credential_misuse", "method": req.method, "target": req.target,
                                 "decision": "denied", "reason": "credential_misuse",
                                 "presented_by": arrived.call_id})

    async def _admit(self, grant: Grant, host: str, port: int, ev: RequestEvent) -> tuple[str, str]:
        """All checks before any upstream packet; returns (canonical name, address to use)."""
        name = admission.canonical_name(self.cfg, host)
        ev.host = name
        admission.check_grant(self.cfg, grant, name, port)
        addresses = await self._resolve(name, port)
        if name in self.cfg.services:
            ev.service = True
        try:
            address = admission.check_addresses(self.cfg, name, addresses)
        except Deny as d:
            ev.address = d.address
            raise
        grant.connections += 1
        ev.address = address
        ev.decision = "allowed"
        return name, address

    async def _resolve(self, name: str, port: int) -> list[str]:
        fixed = admission.fixed_addresses(self.cfg, name)
        if fixed is not None:
            return fixed
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP),
                self.cfg.connect_timeout_s)
        except (TimeoutError, OSError) as e:
            raise Deny(502, "resolve_failed", f"{name}: {e}") from e
        out: list[str] = []
        for info in infos:
            a = str(info[4][0])
            if a not in out:
                out.append(a)
        if not out:
            raise Deny(502, "resolve_failed", f"{name}: no addresses")
        return out

    async def _read_hello(self, reader: asyncio.StreamReader, name: str, ev: RequestEvent) -> bytes:
        """The client's first TLS flight (unchanged), once its SNI has been checked."""
        off = "sni" in self.cfg.disabled_checks
        buf = b""
        deadline = time.monotonic() + self.cfg.hello_timeout_s
        while True:
            try:
                hello = parse_client_hello(buf) if buf else None
            except NeedMore:
                hello = None
            except HelloError as e:
                if off:
                    return buf
                ev.decision = "denied"
                raise Deny(403, e.reason, str(e)) from None
            if hello is not None:
                break
            if len(buf) > MAX_HELLO + 5:
                ev.decision = "denied"
                raise Deny(403, "bad_tls", "ClientHello too large")
            left = deadline - time.monotonic()
            if left <= 0:
                ev.decision = "denied"
                raise Deny(403, "hello_timeout")
            try:
                chunk = await asyncio.wait_for(reader.read(16384), left)
            except TimeoutError:
                if off and buf:
                    return buf
                ev.decision = "denied"
                raise Deny(403, "hello_timeout") from None
            if not chunk:
                ev.decision = "denied"
                raise Deny(403, "hello_missing", "the client closed the tunnel before a ClientHello")
            buf += chunk
        if off:
            return buf
        ev.sni = list(hello.server_names)
        try:
            admission.check_hello(name, hello)
        except Deny:
            ev.decision = "denied"
            raise
        return buf

    async def _open_upstream(self, grant: Grant, address: str, port: int,
                             ev: RequestEvent) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to the admitted address (never the name again: no second lookup)."""
        try:
            ureader, uwriter = await asyncio.wait_for(self._connect(address, port), self.cfg.connect_timeout_s)
        except (TimeoutError, OSError) as e:
            ev.decision = "denied"
            raise Deny(502, "connect_failed", f"{address}:{port}: {e}") from e
        if grant.revoked:
            uwriter.transport.abort()
            raise Cut()
        grant.transports[uwriter.transport] = ev
        return ureader, uwriter

    async def _forward_http(self, grant: Grant, req: http1.Request, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter, ev: RequestEvent) -> None:
        target = admission.forward_target(req)
        host, port = target.host, target.port
        ev.host, ev.port = host, port
        body = admission.forward_body(req)
        admission.check_host_header(self.cfg, host, port, body.host_headers)
        name, address = await self._admit(grant, host, port, ev)
        host_field = name if port == 80 else f"{name}:{port}"
        head = http1.forward_head(req.method, target.path, host_field, req.headers)
        ureader, upstream = await self._open_upstream(grant, address, port, ev)
        try:
            upstream.write(head)
            ev.bytes_up += len(head)
            pump.charge(grant, len(head), ev)
            if body.length:
                await pump.pump(grant, reader, upstream, "up", ev, idle_timeout_s=self.cfg.idle_timeout_s,
                                limit=body.length, half_close=False)
            await upstream.drain()
            await pump.pump(grant, ureader, writer, "down", ev, idle_timeout_s=self.cfg.idle_timeout_s)
        finally:
            grant.transports.pop(upstream.transport, None)
            upstream.transport.abort() if ev.cut else upstream.close()

    async def _refuse(self, writer: asyncio.StreamWriter, d: Deny) -> None:
        try:
            writer.write(http1.refusal(d))
            await asyncio.wait_for(writer.drain(), 5)
        except (TimeoutError, ConnectionError, OSError):
            pass


def load_config(path: str) -> ProxyConfig:
    with open(path, encoding="utf-8") as f:
        return ProxyConfig.from_json(json.load(f))


async def _serve(config: ProxyConfig) -> None:
    server = EgressProxyServer(config)
    await server.start()
    server._emit({"event": "ready", "control_socket": config.control_socket, "calls_dir": config.calls_dir,
                  "resolver": config.resolver, "services": sorted(config.services)})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="egress-proxy")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except (OSError, ValueError, TypeError) as e:
        print(json.dumps({"event": "error", "message": f"bad config: {e}"}), flush=True)
        return 2
    asyncio.run(_serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
