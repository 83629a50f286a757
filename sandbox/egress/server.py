"""The egress proxy: an HTTP forward proxy (plain HTTP and CONNECT) in stdlib asyncio.

Where requests come from. The proxy has no TCP listener. Each call's grant comes with a
listening unix socket of its own, `<calls_dir>/<token>/proxy.sock`, in a directory the host
created for that call and bind-mounts into that call's sandbox only (the sandbox itself has no
network; sandbox.egress.relay turns the socket back into 127.0.0.1:3128 for its tools). So
every connection is known to belong to the call whose socket accepted it, before a byte of it
is read: it is that call's connection, recorded on that call, cut when that call is revoked.

It admits a request only when every check passes, in this order, and opens the upstream
connection only after the last one:

1. credentials   Proxy-Authorization Basic user:password of a live call grant (407
                 "credentials_invalid" otherwise), AND that grant must be the one of the
                 socket the connection arrived on: a live credential of another call is
                 refused (407 "credential_misuse") and recorded on both calls, each event
                 naming the other ("call_binding")
2. target        a host *name*: a bare IP (`CONNECT 1.2.3.4:443`) is refused ("ip_literal")
3. allowlist     host:port matches the call's patterns (sandbox.egress.allowlist)
4. Host header   plain HTTP: the Host header names the target ("host_mismatch")
5. ceilings      the call's connection count and byte budget
6. resolution    the proxy resolves the name itself (a test resolver in tests, never a
                 client's idea of the address), and refuses the request when ANY address is
                 loopback/private/link-local/CGNAT/metadata/... (sandbox.egress.addresses),
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
mounts only its own call's directory below it (see sandbox.egress.proxy).

Run inside the image as `python3 -I -S -B /opt/ringfence/egress_proxy.py --config FILE`.
Stdlib only; laid into the egress-proxy image as it is (images/egress-proxy/image.json, `files`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TextIO
from urllib.parse import urlsplit

from .addresses import AddressClass, address_permitted, classify_address, embedded_ipv4, parse_address
from .allowlist import HostPattern, PatternError, check_port, is_ip_literal, normalize_host, parse_patterns
from .tlspeek import MAX_HELLO, HelloError, NeedMore, parse_client_hello

# 2: grants carry the call's socket directory; no TCP listener. 3: the config declares services.
PROTOCOL_VERSION = 3
MAX_HEAD = 16 * 1024
MAX_CONTROL = 1024 * 1024
# Checks a TEST configuration may switch off to prove that each one matters (red checks).
# A production configuration never carries any (sandbox.egress.proxy refuses to write one).
CHECKS = frozenset({"allowlist", "address", "ip_literal", "sni", "host_header", "call_binding"})
SOCKET_NAME = "proxy.sock"
# A call's socket directory, as the host names it in a grant: one path component, no dots.
_SOCKET_DIR = re.compile(r"[A-Za-z0-9_-]{8,64}")
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authorization", "proxy-authenticate", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade",
})
_PHRASES = {200: "OK", 400: "Bad Request", 403: "Forbidden", 407: "Proxy Authentication Required",
            405: "Method Not Allowed", 429: "Too Many Requests", 501: "Not Implemented",
            502: "Bad Gateway", 504: "Gateway Timeout"}

Connector = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ConfigError(ValueError):
    pass


# What a service's pinned address may be: the private ranges Docker gives its networks. Never
# loopback (that is the proxy itself), link-local or metadata (the cloud's), nor a public
# address (a service is a container ringfence runs on the proxy's own networks, not the internet).
SERVICE_ADDRESS_CLASSES = frozenset({AddressClass.PRIVATE, AddressClass.CGNAT})


def _address_key(ip: ipaddress.IPv4Address | ipaddress.IPv6Address):
    """The address a connection to `ip` reaches: an IPv6 form of an IPv4 address is that IPv4."""
    if isinstance(ip, ipaddress.IPv6Address):
        return embedded_ipv4(ip) or ip
    return ip


def parse_services(raw: Any) -> dict[str, tuple[str, ...]]:
    """Operator-declared services, `{host name: [address, ...]}`, checked and canonical.

    Each name is an exact host name (no wildcard, no IP literal); each address a literal
    private address (never resolved: the operator pins the addresses of containers it runs);
    no address belongs to two names, so a name stands for its addresses and for nothing else.
    """
    if not isinstance(raw, dict):
        raise ConfigError("services must map host names to lists of IP addresses")
    out: dict[str, tuple[str, ...]] = {}
    owner: dict[Any, str] = {}
    for name, addrs in raw.items():
        try:
            canon = normalize_host(name)
        except PatternError as e:
            raise ConfigError(f"services[{name!r}]: {e}") from None
        if canon in out:
            raise ConfigError(f"services[{name!r}]: {canon} is declared twice")
        if isinstance(addrs, str):
            addrs = (addrs,)
        if not isinstance(addrs, (list, tuple)) or not addrs:
            raise ConfigError(f"services[{name!r}]: needs at least one IP address")
        pinned: list[str] = []
        for a in addrs:
            ip = parse_address(a) if isinstance(a, str) and "%" not in a else None
            if ip is None:
                raise ConfigError(f"services[{name!r}]: {a!r} is not an IP address (services are never resolved)")
            if _address_key(ip) != ip:
                raise ConfigError(f"services[{name!r}]: {a} is an IPv6 form of {_address_key(ip)}: pin that address")
            cls = classify_address(ip)
            if cls not in SERVICE_ADDRESS_CLASSES:
                raise ConfigError(f"services[{name!r}]: {a} is a {cls.value} address; a service is pinned to "
                                  f"the private address of a container on the proxy's own networks")
            other = owner.setdefault(_address_key(ip), canon)
            if other != canon:
                raise ConfigError(f"services[{name!r}]: {a} is already the address of service {other}")
            if str(ip) not in pinned:
                pinned.append(str(ip))
        out[canon] = tuple(pinned)
    return out


@dataclass(frozen=True)
class ProxyConfig:
    control_socket: str | None = "/run/rfproxy/control.sock"
    calls_dir: str = "/run/rfproxy/calls"
    """Where the host creates one directory per call; the proxy listens in it for that call."""
    resolver: str = "system"
    """`system` (getaddrinfo in the proxy's own network namespace) or `test`."""
    test_hosts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Test resolver: name -> addresses of decoys. With `resolver: test` nothing else resolves."""
    test_networks: tuple[Network, ...] = ()
    """Decoy networks whose (private) addresses a test allows. Metadata addresses never."""
    disabled_checks: frozenset[str] = frozenset()
    """Tests only: checks switched off to show that the attack they stop then gets through."""
    services: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Operator-declared internal services: exact host name -> the pinned private addresses of
    a container ringfence runs (see parse_services). Never resolved; each address is permitted
    for its own name only. Valid with either resolver: this is production configuration."""
    head_timeout_s: float = 10.0
    hello_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 120.0
    max_events_per_call: int = 1000

    def __post_init__(self) -> None:
        if self.resolver not in ("system", "test"):
            raise ConfigError(f"resolver must be 'system' or 'test', not {self.resolver!r}")
        unknown = set(self.disabled_checks) - CHECKS
        if unknown:
            raise ConfigError(f"unknown checks {sorted(unknown)}; known: {sorted(CHECKS)}")
        hosts = {}
        for name, addrs in dict(self.test_hosts).items():
            if isinstance(addrs, str):
                addrs = (addrs,)
            for a in addrs:
                if parse_address(a) is None:
                    raise ConfigError(f"test_hosts[{name!r}]: {a!r} is not an IP address")
            hosts[normalize_host(name)] = tuple(addrs)
        object.__setattr__(self, "test_hosts", hosts)
        object.__setattr__(self, "test_networks", tuple(
            n if isinstance(n, (ipaddress.IPv4Network, ipaddress.IPv6Network)) else ipaddress.ip_network(n)
            for n in self.test_networks))
        object.__setattr__(self, "disabled_checks", frozenset(self.disabled_checks))
        services = parse_services(dict(self.services))
        both = sorted(set(services) & set(hosts))
        if both:
            raise ConfigError(f"{both} are both services and test_hosts: a service's addresses are its pinned ones")
        object.__setattr__(self, "services", services)

    def service_of(self, address: str) -> str | None:
        """The service whose pinned address `address` is (in any of its forms), or None."""
        ip = parse_address(address)
        if ip is None:
            return None
        key = _address_key(ip)
        for name, pinned in self.services.items():
            if any(_address_key(parse_address(p)) == key for p in pinned):
                return name
        return None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ProxyConfig:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(doc) - known
        if unknown:
            raise ConfigError(f"unknown config keys {sorted(unknown)}")
        doc = dict(doc)
        if "test_hosts" in doc:
            doc["test_hosts"] = {k: tuple(v) if isinstance(v, list) else v for k, v in doc["test_hosts"].items()}
        if "test_networks" in doc:
            doc["test_networks"] = tuple(doc["test_networks"])
        if "disabled_checks" in doc:
            doc["disabled_checks"] = frozenset(doc["disabled_checks"])
        return cls(**doc)


class _Deny(Exception):
    def __init__(self, status: int, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.status, self.reason, self.detail = status, reason, detail


class _Cut(Exception):
    """A ceiling or a revocation ended a connection that had been admitted."""


@dataclass(eq=False)
class Grant:
    """One call's right to use the proxy, from dispatch until completion."""

    call_id: str
    username: str
    password_sha256: bytes
    patterns: tuple[HostPattern, ...]
    max_bytes: int
    max_connections: int
    bytes_used: int = 0
    connections: int = 0
    revoked: bool = False
    cut_reason: str | None = None
    events: list[dict] = field(default_factory=list)
    events_dropped: int = 0
    tasks: set = field(default_factory=set)
    transports: dict = field(default_factory=dict)  # open transport -> the event of its request
    socket_path: str | None = None
    """This call's own listening socket: every connection it accepts is this call's."""
    listener: Any = field(default=None, repr=False)  # the asyncio server on socket_path

    def cut_all(self, reason: str) -> None:
        self.cut_reason = self.cut_reason or reason
        for transport, ev in list(self.transports.items()):
            ev["cut"] = ev.get("cut") or reason
            transport.abort()


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def header_values(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name]


def _parse_head(head: bytes) -> _Request:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as e:  # latin-1 decodes everything; kept for clarity
        raise _Deny(400, "bad_request") from e
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Deny(400, "bad_request", "malformed request line")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in " \t" or ":" not in line:
            raise _Deny(400, "bad_request", "malformed header line")
        name, value = line.split(":", 1)
        if not name or name != name.strip() or any(c in name for c in " \t"):
            raise _Deny(400, "bad_request", "malformed header name")
        headers.append((name, value.strip()))
    return _Request(parts[0], parts[1], parts[2], headers)


def _split_hostport(text: str, default_port: int | None) -> tuple[str, int]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise _Deny(400, "bad_host")
        host, rest = text[: end + 1], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise _Deny(400, "bad_host")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port_text = text.split(":", 1)
    elif ":" in text:
        # An unbracketed IPv6 literal: a host that is an address either way.
        host, port_text = text, None
    else:
        host, port_text = text, None
    if port_text is None:
        if default_port is None:
            raise _Deny(400, "bad_request", "CONNECT needs host:port")
        return host, default_port
    try:
        return host, check_port(port_text)
    except PatternError as e:
        raise _Deny(400, "bad_port", str(e)) from e


async def _open_tcp(ip: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(ip, port)


class EgressProxyServer:
    """The proxy and its control channel on one event loop."""

    def __init__(self, config: ProxyConfig, *, connector: Connector | None = None,
                 log: TextIO | None = None) -> None:
        self.cfg = config
        self._connect = connector or _open_tcp
        self._log = log if log is not None else sys.stdout
        self._grants: dict[str, Grant] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._handlers: set[asyncio.Task] = set()

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        # No TCP listener: a connection that did not arrive on a call's own socket could not be
        # attributed to a call, and a port would be one more thing the proxy's upstream
        # networks could reach.
        if self.cfg.control_socket:
            path = self.cfg.control_socket
            if os.path.exists(path):
                os.unlink(path)
            control = await asyncio.start_unix_server(self._control, path, limit=MAX_CONTROL)
            os.chmod(path, 0o600)
            self._servers.append(control)
        if self.cfg.disabled_checks:
            self._emit({"event": "warning", "message": "TEST configuration: checks disabled",
                        "disabled_checks": sorted(self.cfg.disabled_checks)})

    async def close(self) -> None:
        for g in list(self._grants.values()):
            g.revoked = True
            self._close_listener(g)
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

    # -- grants ------------------------------------------------------------------------

    async def grant(self, *, call_id: str, username: str, password: str, allow: list[str],
                    max_bytes: int, max_connections: int, socket_dir: str) -> str:
        """Register a call and start listening on its own socket; returns the socket's path.

        `socket_dir` names a directory the host made for this call under `calls_dir`; the
        proxy never creates directories, so a grant cannot make it write anywhere else."""
        if not username or not password or ":" in username:
            raise ValueError("username and password are required; ':' is not allowed in a username")
        if username in self._grants:
            raise ValueError(f"username {username!r} is already granted")
        if max_bytes < 0 or max_connections < 0:
            raise ValueError("ceilings must not be negative")
        if not isinstance(socket_dir, str) or not _SOCKET_DIR.fullmatch(socket_dir):
            raise ValueError("socket_dir must be one name of 8-64 characters [A-Za-z0-9_-]")
        patterns = parse_patterns(allow)
        directory = os.path.join(self.cfg.calls_dir, socket_dir)
        if not os.path.isdir(directory) or os.path.islink(directory):
            raise ValueError(f"no call directory {socket_dir!r} under {self.cfg.calls_dir}")
        path = os.path.join(directory, SOCKET_NAME)
        if os.path.lexists(path) or any(g.socket_path == path for g in self._grants.values()):
            raise ValueError(f"call directory {socket_dir!r} is already in use")
        grant = Grant(
            call_id=str(call_id), username=username,
            password_sha256=hashlib.sha256(password.encode()).digest(), patterns=patterns,
            max_bytes=int(max_bytes), max_connections=int(max_connections), socket_path=path)
        grant.listener = await asyncio.start_unix_server(
            lambda r, w: self._handle(r, w, grant), path, limit=MAX_HEAD)
        # Anyone who can reach the path may connect: only this call's sandbox can (the directory
        # is bind-mounted into it alone; on the host it lies in the proxy's 0700 state dir),
        # and a sandbox may run as any non-root uid.
        os.chmod(path, 0o666)
        self._grants[username] = grant
        self._emit({"event": "grant", "call_id": call_id, "allow": [str(p) for p in patterns],
                    "max_bytes": max_bytes, "max_connections": max_connections})
        return path

    @staticmethod
    def _close_listener(g: Grant) -> None:
        if g.listener is not None:
            g.listener.close()
            g.listener = None
        if g.socket_path:
            try:
                os.unlink(g.socket_path)  # a later connect() finds nothing rather than a dead socket
            except OSError:
                pass

    async def revoke(self, username: str, wait_s: float = 5.0) -> dict:
        g = self._grants.pop(username, None)
        if g is None:
            raise KeyError(f"no grant for {username!r}")
        g.revoked = True
        self._close_listener(g)
        g.cut_all("revoked")
        pending = [t for t in g.tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=wait_s)
        self._emit({"event": "revoke", "call_id": g.call_id, "bytes": g.bytes_used,
                    "connections": g.connections})
        return self._summary(g)

    def events(self, username: str) -> dict:
        g = self._grants.get(username)
        if g is None:
            raise KeyError(f"no grant for {username!r}")
        return self._summary(g)

    @staticmethod
    def _summary(g: Grant) -> dict:
        return {"call_id": g.call_id, "events": list(g.events), "events_dropped": g.events_dropped,
                "bytes": g.bytes_used, "connections": g.connections}

    # -- events ------------------------------------------------------------------------

    def _emit(self, event: dict) -> None:
        try:
            self._log.write(json.dumps(event, sort_keys=True) + "\n")
            self._log.flush()
        except (OSError, ValueError):
            pass  # a closed stdout must not take the proxy down

    def _record(self, grant: Grant | None, event: dict) -> None:
        event = {"ts": round(time.time(), 3), "event": "request", **event}
        if grant is not None:
            event["call_id"] = grant.call_id
            if len(grant.events) < self.cfg.max_events_per_call:
                grant.events.append(event)
            else:
                grant.events_dropped += 1
        self._emit(event)

    # -- the proxy ---------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, arrived: Grant) -> None:
        """One connection accepted on `arrived`'s own socket: it is that call's, whatever it says."""
        grant: Grant | None = None
        ev: dict[str, Any] = {"method": None, "host": None, "port": None, "address": None,
                              "decision": "denied", "reason": None, "bytes_up": 0, "bytes_down": 0,
                              "cut": None}
        upstream: asyncio.StreamWriter | None = None
        answered = False
        task = asyncio.current_task()
        self._handlers.add(task)
        # Known from the first byte: revoking the call ends this connection even mid-head.
        arrived.tasks.add(task)
        arrived.transports[writer.transport] = ev
        try:
            if arrived.revoked:
                return
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.cfg.head_timeout_s)
            except asyncio.LimitOverrunError:
                raise _Deny(400, "bad_request", "request head too large")
            except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
                return
            req = _parse_head(head)
            ev["method"] = req.method
            grant = self._authenticate(req, arrived, ev)
            if grant is not arrived:  # only with the call_binding check off (tests)
                grant.tasks.add(task)
                grant.transports[writer.transport] = ev
            if req.method == "CONNECT":
                host, port = _split_hostport(req.target, None)
                ev["host"], ev["port"] = host, port
                name, address = await self._admit(grant, host, port, ev)
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
                answered = True
                first = await self._read_hello(reader, name, ev)
                ureader, upstream = await self._open_upstream(grant, address, port, ev)
                upstream.write(first)
                ev["bytes_up"] += len(first)
                self._charge(grant, len(first), ev)
                await self._tunnel(grant, reader, writer, ureader, upstream, ev)
            else:
                await self._forward_http(grant, req, reader, writer, ev)
                answered = True
        except _Deny as d:
            ev["decision"], ev["reason"] = "denied", d.reason
            if d.detail:
                ev["detail"] = d.detail
            if not answered:
                await self._refuse(writer, d)
        except _Cut:
            ev["cut"] = ev["cut"] or (grant.cut_reason if grant else "cut")
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, OSError) as e:
            if ev["decision"] == "allowed" and not ev["cut"]:
                ev["cut"] = "revoked" if grant is not None and grant.revoked else "connection_error"
                ev["detail"] = type(e).__name__
        finally:
            for w in (upstream, writer):
                if w is not None:
                    w.transport.abort() if ev["cut"] else w.close()
            for g in {arrived, grant} - {None}:
                g.tasks.discard(task)
                g.transports.pop(writer.transport, None)
                if upstream is not None:
                    g.transports.pop(upstream.transport, None)
            if ev["method"] is not None:
                # Attributed to the call whose socket it came in on, whatever credential it bore.
                self._record(arrived, ev)
            self._handlers.discard(task)

    def _authenticate(self, req: _Request, arrived: Grant, ev: dict) -> Grant:
        values = req.header_values("proxy-authorization")
        if len(values) != 1:
            raise _Deny(407, "credentials_missing")
        scheme, _, token = values[0].partition(" ")
        if scheme.lower() != "basic":
            raise _Deny(407, "credentials_invalid")
        try:
            user, sep, password = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise _Deny(407, "credentials_invalid") from None
        grant = self._grants.get(user)
        digest = hashlib.sha256(password.encode()).digest()
        # Compare even when the user is unknown, so timing does not say which usernames exist.
        expected = grant.password_sha256 if grant is not None else hashlib.sha256(b"\0").digest()
        if not sep or not hmac.compare_digest(digest, expected) or grant is None or grant.revoked:
            raise _Deny(407, "credentials_invalid")
        if grant is not arrived:
            if "call_binding" in self.cfg.disabled_checks:
                return grant  # TEST configuration: the credential's own call, as if bound
            ev["credential_of"], ev["target"] = grant.call_id, req.target
            self._misuse(owner=grant, arrived=arrived, req=req)
            raise _Deny(407, "credential_misuse",
                        f"a credential of call {grant.call_id} presented on call {arrived.call_id}'s socket")
        return grant

    def _misuse(self, *, owner: Grant, arrived: Grant, req: _Request) -> None:
        """A live credential came in on another call's socket: it leaked out of `owner` (its
        sandbox handed it on, or something read it) and `arrived` tried to use it. Both calls
        get an event naming the other (the one on `arrived` is its request event)."""
        self._record(owner, {"event": "credential_misuse", "method": req.method, "target": req.target,
                             "decision": "denied", "reason": "credential_misuse",
                             "presented_by": arrived.call_id})

    async def _admit(self, grant: Grant, host: str, port: int, ev: dict) -> tuple[str, str]:
        """All checks before any upstream packet; returns (canonical name, address to use)."""
        off = self.cfg.disabled_checks
        if is_ip_literal(host):
            if "ip_literal" not in off:
                raise _Deny(403, "ip_literal", "name the host; bare IP addresses are not allowlisted")
            name = host.strip("[]")
        else:
            try:
                name = normalize_host(host)
            except PatternError as e:
                raise _Deny(400, "bad_host", str(e)) from e
        ev["host"] = name
        if "allowlist" not in off and not any(p.matches(name, port) for p in grant.patterns):
            raise _Deny(403, "not_allowlisted", f"{name}:{port} is not on this call's allowlist")
        if grant.cut_reason == "byte_limit" or grant.bytes_used >= grant.max_bytes:
            raise _Deny(403, "byte_limit", "the call's byte budget is spent")
        if grant.connections >= grant.max_connections:
            raise _Deny(429, "connection_limit", "the call's connection budget is spent")
        addresses = await self._resolve(name, port)
        pinned = self.cfg.services.get(name)
        if pinned is not None:
            ev["service"] = True
        if "address" not in off:
            for a in addresses:
                if pinned is not None:
                    # A declared service: exactly its pinned addresses, for exactly this name.
                    if a not in pinned:
                        ev["address"] = a
                        raise _Deny(403, "address_refused", f"{a} is not a pinned address of service {name}")
                    continue
                owner = self.cfg.service_of(a)
                if owner is not None:
                    # Inside a test network or not: a service is reachable under its own name only,
                    # so an allowlisted name cannot be pointed at it.
                    ev["address"] = a
                    raise _Deny(403, "address_refused",
                                f"{name} resolves to {a}, the address of service {owner} (reachable as {owner} only)")
                ok, cls = address_permitted(a, self.cfg.test_networks)
                if not ok:
                    ev["address"] = a
                    raise _Deny(403, "address_refused", f"{name} resolves to {a} ({cls.value})")
        grant.connections += 1
        ev["address"] = addresses[0]
        ev["decision"] = "allowed"
        return name, addresses[0]

    async def _resolve(self, name: str, port: int) -> list[str]:
        if parse_address(name) is not None:  # only when the ip_literal check is off
            return [str(parse_address(name))]
        if name in self.cfg.services:
            # Pinned by the operator, never looked up: no resolver can redirect a service.
            return list(self.cfg.services[name])
        if self.cfg.resolver == "test":
            found = self.cfg.test_hosts.get(name)
            if not found:
                raise _Deny(502, "resolve_failed", f"{name} is not in the test resolver")
            return list(found)
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP),
                self.cfg.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as e:
            raise _Deny(502, "resolve_failed", f"{name}: {e}") from e
        out: list[str] = []
        for info in infos:
            a = info[4][0]
            if a not in out:
                out.append(a)
        if not out:
            raise _Deny(502, "resolve_failed", f"{name}: no addresses")
        return out

    async def _read_hello(self, reader: asyncio.StreamReader, name: str, ev: dict) -> bytes:
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
                ev["decision"] = "denied"
                raise _Deny(403, e.reason, str(e)) from None
            if hello is not None:
                break
            if len(buf) > MAX_HELLO + 5:
                ev["decision"] = "denied"
                raise _Deny(403, "bad_tls", "ClientHello too large")
            left = deadline - time.monotonic()
            if left <= 0:
                ev["decision"] = "denied"
                raise _Deny(403, "hello_timeout")
            try:
                chunk = await asyncio.wait_for(reader.read(16384), left)
            except asyncio.TimeoutError:
                if off and buf:
                    return buf
                ev["decision"] = "denied"
                raise _Deny(403, "hello_timeout") from None
            if not chunk:
                ev["decision"] = "denied"
                raise _Deny(403, "hello_missing", "the client closed the tunnel before a ClientHello")
            buf += chunk
        if off:
            return buf
        ev["sni"] = list(hello.server_names)
        if hello.offers_ech:
            ev["decision"] = "denied"
            raise _Deny(403, "ech_refused", "Encrypted Client Hello hides the real server name")
        if not hello.server_names:
            ev["decision"] = "denied"
            raise _Deny(403, "sni_missing", "the ClientHello names no server")
        for sni in hello.server_names:
            try:
                ok = normalize_host(sni) == name
            except PatternError:
                ok = False
            if not ok:
                ev["decision"] = "denied"
                raise _Deny(403, "sni_mismatch", f"SNI {sni!r} is not the CONNECT host {name!r}")
        return buf

    async def _open_upstream(self, grant: Grant, address: str, port: int, ev: dict):
        """Connect to the admitted address (never the name again: no second lookup)."""
        try:
            ureader, uwriter = await asyncio.wait_for(self._connect(address, port), self.cfg.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as e:
            ev["decision"] = "denied"
            raise _Deny(502, "connect_failed", f"{address}:{port}: {e}") from e
        if grant.revoked:
            uwriter.transport.abort()
            raise _Cut()
        grant.transports[uwriter.transport] = ev
        return ureader, uwriter

    def _charge(self, grant: Grant, n: int, ev: dict) -> None:
        grant.bytes_used += n
        if grant.bytes_used > grant.max_bytes:
            ev["cut"] = "byte_limit"
            grant.cut_all("byte_limit")
            raise _Cut()

    async def _pump(self, grant: Grant, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    key: str, ev: dict, limit: int | None = None, half_close: bool = True) -> None:
        remaining = limit
        while remaining is None or remaining > 0:
            if grant.revoked:
                raise _Cut()
            size = 65536 if remaining is None else min(65536, remaining)
            try:
                data = await asyncio.wait_for(src.read(size), self.cfg.idle_timeout_s)
            except asyncio.TimeoutError:
                ev["cut"] = ev["cut"] or "idle"
                raise _Cut() from None
            if not data:
                break
            if remaining is not None:
                remaining -= len(data)
            room = grant.max_bytes - grant.bytes_used
            if len(data) > room:
                # Deliver exactly up to the ceiling, then cut the whole call.
                if room > 0:
                    dst.write(data[:room])
                    ev[key] += room
                self._charge(grant, len(data), ev)
            grant.bytes_used += len(data)
            ev[key] += len(data)
            dst.write(data)
            await dst.drain()
        if half_close and dst.can_write_eof():
            try:
                dst.write_eof()
            except OSError:
                pass

    async def _tunnel(self, grant: Grant, creader, cwriter, ureader, uwriter, ev: dict) -> None:
        up = asyncio.ensure_future(self._pump(grant, creader, uwriter, "bytes_up", ev))
        down = asyncio.ensure_future(self._pump(grant, ureader, cwriter, "bytes_down", ev))
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if t.exception() is not None:
                    raise t.exception()
            await asyncio.gather(up, down)
        finally:
            for t in (up, down):
                if not t.done():
                    t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    async def _forward_http(self, grant: Grant, req: _Request, reader, writer, ev: dict) -> None:
        if req.method not in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
            raise _Deny(405, "method_refused", f"{req.method} is not forwarded")
        parts = urlsplit(req.target)
        if parts.scheme.lower() != "http" or not parts.netloc:
            raise _Deny(400, "bad_request", "a proxy request needs an absolute http:// URL "
                                            "(use CONNECT for https)")
        if "@" in parts.netloc:
            raise _Deny(400, "bad_request", "credentials in the URL are refused")
        host, port = _split_hostport(parts.netloc, 80)
        ev["host"], ev["port"] = host, port
        if req.header_values("transfer-encoding"):
            raise _Deny(501, "unsupported_body", "chunked request bodies are not forwarded")
        lengths = req.header_values("content-length")
        if len(lengths) > 1 or (lengths and not lengths[0].isdigit()):
            raise _Deny(400, "bad_request", "one numeric Content-Length at most")
        body_len = int(lengths[0]) if lengths else 0
        host_headers = req.header_values("host")
        if len(host_headers) > 1:
            raise _Deny(400, "bad_request", "more than one Host header")
        name, address = await self._admit_with_host(grant, host, port, host_headers, ev)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        host_field = name if port == 80 else f"{name}:{port}"
        lines = [f"{req.method} {path} HTTP/1.1", f"Host: {host_field}"]
        lines += [f"{k}: {v}" for k, v in req.headers if k.lower() not in _HOP_BY_HOP and k.lower() != "host"]
        lines += ["Connection: close", "", ""]
        head = "\r\n".join(lines).encode("latin-1")
        ureader, upstream = await self._open_upstream(grant, address, port, ev)
        try:
            upstream.write(head)
            ev["bytes_up"] += len(head)
            self._charge(grant, len(head), ev)
            if body_len:
                await self._pump(grant, reader, upstream, "bytes_up", ev, limit=body_len, half_close=False)
            await upstream.drain()
            await self._pump(grant, ureader, writer, "bytes_down", ev)
        finally:
            grant.transports.pop(upstream.transport, None)
            upstream.transport.abort() if ev["cut"] else upstream.close()

    async def _admit_with_host(self, grant, host, port, host_headers, ev):
        if host_headers and "host_header" not in self.cfg.disabled_checks:
            hh, hport = _split_hostport(host_headers[0], port)
            try:
                same = hport == port and (
                    hh.strip("[]") == host.strip("[]") if is_ip_literal(hh) or is_ip_literal(host)
                    else normalize_host(hh) == normalize_host(host))
            except PatternError:
                same = False
            if not same:
                raise _Deny(403, "host_mismatch", f"Host {host_headers[0]!r} is not the request target")
        return await self._admit(grant, host, port, ev)

    async def _refuse(self, writer: asyncio.StreamWriter, d: _Deny) -> None:
        body = f"ringfence egress proxy: denied ({d.reason})\n".encode()
        extra = 'Proxy-Authenticate: Basic realm="ringfence"\r\n' if d.status == 407 else ""
        head = (f"HTTP/1.1 {d.status} {_PHRASES.get(d.status, 'Error')}\r\n"
                f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                f"X-Ringfence-Reason: {d.reason}\r\n{extra}Connection: close\r\n\r\n")
        try:
            writer.write(head.encode() + body)
            await asyncio.wait_for(writer.drain(), 5)
        except (ConnectionError, asyncio.TimeoutError, OSError):
            pass

    # -- the control channel -----------------------------------------------------------

    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("a control request is a JSON object")
            op = req.get("op")
            if op == "ping":
                resp = {"ok": True, "version": PROTOCOL_VERSION, "grants": len(self._grants),
                        "listeners": sum(1 for g in self._grants.values() if g.listener is not None)}
            elif op == "grant":
                path = await self.grant(call_id=req["call_id"], username=req["username"],
                                        password=req["password"], allow=req["allow"],
                                        max_bytes=req["max_bytes"], max_connections=req["max_connections"],
                                        socket_dir=req["socket_dir"])
                resp = {"ok": True, "socket": path}
            elif op == "revoke":
                resp = {"ok": True, **(await self.revoke(req["username"]))}
            elif op == "events":
                resp = {"ok": True, **self.events(req["username"])}
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as e:  # noqa: BLE001 - every failure becomes an error reply
            resp = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        try:
            writer.write(json.dumps(resp).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


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
