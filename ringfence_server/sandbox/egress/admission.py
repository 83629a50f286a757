"""Admission: every decision the egress proxy makes about a request, and nothing else.

Pure and socket-free: each check takes the configuration, the call's grant and the parsed
request (or its target, its resolved addresses, its ClientHello) and returns what was
admitted or raises errors.Deny with the status and reason the client gets. No I/O, no clock,
no resolver: the server (ringfence_server.sandbox.egress.server) does those between the checks, in this order,
and opens the upstream connection only after the last one:

1. credentials   authenticate(): Proxy-Authorization Basic user:password of a live grant (407
                 "credentials_missing"/"credentials_invalid"), and that grant must be the one
                 of the socket the connection arrived on (407 "credential_misuse", raised as
                 CredentialMisuse so the server can record it on the credential's own call too)
   request form  connect_target() for CONNECT; forward_target() and forward_body() for plain
                 HTTP (methods, absolute http:// URL, no userinfo, no chunked body, one numeric
                 Content-Length, one Host header)
4. Host header   check_host_header(): plain HTTP's Host names the target ("host_mismatch")
2. target        canonical_name(): a host *name*; a bare IP is refused ("ip_literal")
3./5. grant      check_grant(): the allowlist ("not_allowlisted"), then the byte and connection
                 ceilings ("byte_limit", "connection_limit")
6. resolution    fixed_addresses() says which names are never looked up (IP literals when that
                 check is off, services, the test resolver); check_addresses() refuses any
                 address that is not permitted ("address_refused"); a service is exactly its
                 pinned addresses and a pinned address is reachable under its service's name only
7. TLS           check_hello(): CONNECT's first flight names the CONNECT host by SNI, without ECH

(The numbers are those of the proxy's documented check order; 4 runs before 2 for plain HTTP.)
Checks named in `config.disabled_checks` (TEST configurations only) are skipped where noted.

Stdlib only; runs inside the egress-proxy image as rfegress.admission.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

from .addresses import address_permitted, parse_address
from .allowlist import HostPattern, PatternError, is_ip_literal, normalize_host
from .config import ProxyConfig
from .errors import Deny
from .grant_table import password_digest
from .http1 import Request, split_hostport
from .tlspeek import ClientHello

FORWARDED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# Compared against when the username is unknown, so timing does not say which usernames exist.
_NO_DIGEST = password_digest("\0")


class GrantView(Protocol):
    """What admission reads of a call's grant (ringfence_server.sandbox.egress.grant_table.Grant)."""

    @property
    def call_id(self) -> str: ...
    @property
    def username(self) -> str: ...
    @property
    def password_sha256(self) -> bytes: ...
    @property
    def revoked(self) -> bool: ...
    @property
    def patterns(self) -> tuple[HostPattern, ...]: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def bytes_used(self) -> int: ...
    @property
    def max_connections(self) -> int: ...
    @property
    def connections(self) -> int: ...
    @property
    def cut_reason(self) -> str | None: ...


G = TypeVar("G", bound=GrantView)


class CredentialMisuse(Deny):
    """A live credential of one call presented on another call's socket."""

    def __init__(self, owner: GrantView, arrived: GrantView) -> None:
        super().__init__(407, "credential_misuse",
                         f"a credential of call {owner.call_id} presented on call {arrived.call_id}'s socket")
        self.owner_username = owner.username
        self.owner_call_id = owner.call_id


# -- 1. credentials ----------------------------------------------------------------------------


def authenticate(config: ProxyConfig, grants: Mapping[str, G], arrived: G, request: Request) -> G:
    """The grant whose credential the request bears, which must be `arrived`'s (the grant of
    the socket it came in on)."""
    values = request.header_values("proxy-authorization")
    if len(values) != 1:
        raise Deny(407, "credentials_missing")
    scheme, _, token = values[0].partition(" ")
    if scheme.lower() != "basic":
        raise Deny(407, "credentials_invalid")
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise Deny(407, "credentials_invalid") from None
    grant = grants.get(user)
    digest = password_digest(password)
    # Compare even when the user is unknown, so timing does not say which usernames exist.
    expected = grant.password_sha256 if grant is not None else _NO_DIGEST
    if not sep or not hmac.compare_digest(digest, expected) or grant is None or grant.revoked:
        raise Deny(407, "credentials_invalid")
    if grant is not arrived:
        if "call_binding" in config.disabled_checks:
            return grant  # TEST configuration: the credential's own call, as if bound
        raise CredentialMisuse(owner=grant, arrived=arrived)
    return grant


# -- the request's form ------------------------------------------------------------------------


def connect_target(request: Request) -> tuple[str, int]:
    """CONNECT host:port (the port is required)."""
    return split_hostport(request.target, None)


@dataclass(frozen=True)
class ForwardTarget:
    """Where a plain HTTP request goes: the URL's host and port, and its origin-form path."""

    host: str
    port: int
    path: str


def forward_target(request: Request) -> ForwardTarget:
    if request.method not in FORWARDED_METHODS:
        raise Deny(405, "method_refused", f"{request.method} is not forwarded")
    parts = urlsplit(request.target)
    if parts.scheme.lower() != "http" or not parts.netloc:
        raise Deny(400, "bad_request", "a proxy request needs an absolute http:// URL "
                                       "(use CONNECT for https)")
    if "@" in parts.netloc:
        raise Deny(400, "bad_request", "credentials in the URL are refused")
    host, port = split_hostport(parts.netloc, 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return ForwardTarget(host, port, path)


@dataclass(frozen=True)
class ForwardBody:
    """A plain HTTP request's body length and its Host header (at most one)."""

    length: int
    host_headers: tuple[str, ...]


def forward_body(request: Request) -> ForwardBody:
    if request.header_values("transfer-encoding"):
        raise Deny(501, "unsupported_body", "chunked request bodies are not forwarded")
    lengths = request.header_values("content-length")
    if len(lengths) > 1 or (lengths and not lengths[0].isdigit()):
        raise Deny(400, "bad_request", "one numeric Content-Length at most")
    host_headers = request.header_values("host")
    if len(host_headers) > 1:
        raise Deny(400, "bad_request", "more than one Host header")
    return ForwardBody(int(lengths[0]) if lengths else 0, tuple(host_headers))


# -- 4. the Host header --------------------------------------------------------------------------


def check_host_header(config: ProxyConfig, host: str, port: int, host_headers: tuple[str, ...]) -> None:
    if not host_headers or "host_header" in config.disabled_checks:
        return
    hh, hport = split_hostport(host_headers[0], port)
    try:
        same = hport == port and (
            hh.strip("[]") == host.strip("[]") if is_ip_literal(hh) or is_ip_literal(host)
            else normalize_host(hh) == normalize_host(host))
    except PatternError:
        same = False
    if not same:
        raise Deny(403, "host_mismatch", f"Host {host_headers[0]!r} is not the request target")


# -- 2., 3., 5. the target against the grant ----------------------------------------------------


def canonical_name(config: ProxyConfig, host: str) -> str:
    """The target as a canonical host name (a bare IP only when that check is off)."""
    if is_ip_literal(host):
        if "ip_literal" not in config.disabled_checks:
            raise Deny(403, "ip_literal", "name the host; bare IP addresses are not allowlisted")
        return host.strip("[]")
    try:
        return normalize_host(host)
    except PatternError as e:
        raise Deny(400, "bad_host", str(e)) from e


def check_grant(config: ProxyConfig, grant: GrantView, name: str, port: int) -> None:
    """The call's allowlist, then its ceilings."""
    if "allowlist" not in config.disabled_checks and not any(p.matches(name, port) for p in grant.patterns):
        raise Deny(403, "not_allowlisted", f"{name}:{port} is not on this call's allowlist")
    if grant.cut_reason == "byte_limit" or grant.bytes_used >= grant.max_bytes:
        raise Deny(403, "byte_limit", "the call's byte budget is spent")
    if grant.connections >= grant.max_connections:
        raise Deny(429, "connection_limit", "the call's connection budget is spent")


# -- 6. addresses ------------------------------------------------------------------------------


def fixed_addresses(config: ProxyConfig, name: str) -> list[str] | None:
    """The addresses of `name` when no lookup is made (None: ask the system resolver)."""
    literal = parse_address(name)
    if literal is not None:  # only when the ip_literal check is off
        return [str(literal)]
    if name in config.services:
        # Pinned by the operator, never looked up: no resolver can redirect a service.
        return list(config.services[name])
    if config.resolver == "test":
        found = config.test_hosts.get(name)
        if not found:
            raise Deny(502, "resolve_failed", f"{name} is not in the test resolver")
        return list(found)
    return None


def check_addresses(config: ProxyConfig, name: str, addresses: list[str]) -> str:
    """The address to connect to, once every address `name` resolved to is permitted.
    A refusal names the address (Deny.address)."""
    pinned = config.services.get(name)
    if "address" not in config.disabled_checks:
        for a in addresses:
            if pinned is not None:
                # A declared service: exactly its pinned addresses, for exactly this name.
                if a not in pinned:
                    raise Deny(403, "address_refused", f"{a} is not a pinned address of service {name}", address=a)
                continue
            owner = config.service_of(a)
            if owner is not None:
                # Inside a test network or not: a service is reachable under its own name only,
                # so an allowlisted name cannot be pointed at it.
                raise Deny(403, "address_refused",
                           f"{name} resolves to {a}, the address of service {owner} (reachable as {owner} only)",
                           address=a)
            ok, cls = address_permitted(a, config.test_networks)
            if not ok:
                raise Deny(403, "address_refused", f"{name} resolves to {a} ({cls.value})", address=a)
    return addresses[0]


# -- 7. TLS ------------------------------------------------------------------------------------


def check_hello(name: str, hello: ClientHello) -> None:
    """CONNECT's ClientHello must name exactly the CONNECT host, in the clear."""
    if hello.offers_ech:
        raise Deny(403, "ech_refused", "Encrypted Client Hello hides the real server name")
    if not hello.server_names:
        raise Deny(403, "sni_missing", "the ClientHello names no server")
    for sni in hello.server_names:
        try:
            ok = normalize_host(sni) == name
        except PatternError:
            ok = False
        if not ok:
            raise Deny(403, "sni_mismatch", f"SNI {sni!r} is not the CONNECT host {name!r}")
