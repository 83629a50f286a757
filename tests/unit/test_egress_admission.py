"""Admission of the egress proxy, decided without a socket: ringfence_server.sandbox.egress.admission's pure checks
called directly with a configuration, a grant and a parsed request (or target, addresses,
ClientHello). Nothing here opens, resolves or connects anything; the last tests show that the
module could not, because it imports no networking at all.
"""

from __future__ import annotations

import ast
import base64
import inspect
import ipaddress
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from ringfence_server.sandbox.egress import admission
from ringfence_server.sandbox.egress.admission import (
    CredentialMisuse,
    authenticate,
    canonical_name,
    check_addresses,
    check_grant,
    check_hello,
    check_host_header,
    connect_target,
    fixed_addresses,
    forward_body,
    forward_target,
)
from ringfence_server.sandbox.egress.allowlist import HostPattern, parse_patterns
from ringfence_server.sandbox.egress.config import ProxyConfig
from ringfence_server.sandbox.egress.errors import Deny
from ringfence_server.sandbox.egress.grant_table import password_digest
from ringfence_server.sandbox.egress.http1 import Request, parse_head
from ringfence_server.sandbox.egress.tlspeek import ClientHello

CONFIG = ProxyConfig(control_socket=None, resolver="test",
                     test_hosts={"allowed.test": ("93.184.216.34",), "inside.test": ("10.1.2.3",),
                                 "meta.test": ("169.254.169.254",), "decoy.test": ("172.30.0.5",)},
                     test_networks=(ipaddress.ip_network("172.30.0.0/24"),),
                     services={"ledger.ringfence.internal": ("10.9.0.2",)})


@dataclass
class FakeGrant:
    """What admission reads of a grant (admission.GrantView), and nothing more."""

    call_id: str
    username: str
    password_sha256: bytes
    patterns: tuple[HostPattern, ...]
    max_bytes: int = 1000
    bytes_used: int = 0
    max_connections: int = 5
    connections: int = 0
    revoked: bool = False
    cut_reason: str | None = None


def grant(*allow: str, call_id: str = "call-1", username: str = "u1", password: str = "pw1", **kw) -> FakeGrant:
    return FakeGrant(call_id, username, password_digest(password), parse_patterns(allow), **kw)


def request(method: str, target: str, *headers: tuple[str, str]) -> Request:
    return Request(method, target, "HTTP/1.1", list(headers))


def auth(user: str, password: str) -> tuple[str, str]:
    return ("Proxy-Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())


def denied(call: Callable[..., object], *args: object) -> Deny:
    """The Deny that `call(*args)` raises."""
    with pytest.raises(Deny) as info:
        call(*args)
    return info.value


# -- 1. credentials ------------------------------------------------------------------------------


def test_the_credential_of_the_socket_s_own_call_is_admitted():
    g = grant("allowed.test")
    assert authenticate(CONFIG, {"u1": g}, g, request("CONNECT", "allowed.test:443", auth("u1", "pw1"))) is g


@pytest.mark.parametrize("headers, reason", [
    ((), "credentials_missing"),
    ((auth("u1", "pw1"), auth("u1", "pw1")), "credentials_missing"),
    ((auth("u1", "wrong"),), "credentials_invalid"),
    ((auth("nobody", "pw1"),), "credentials_invalid"),
    ((("Proxy-Authorization", "Bearer abc"),), "credentials_invalid"),
    ((("Proxy-Authorization", "Basic !!not-base64!!"),), "credentials_invalid"),
    ((("Proxy-Authorization", "Basic " + base64.b64encode(b"u1pw1").decode()),), "credentials_invalid"),
])
def test_wrong_or_missing_credentials_are_refused_with_407(headers, reason):
    g = grant("allowed.test")
    d = denied(authenticate, CONFIG, {"u1": g}, g, request("GET", "http://allowed.test/", *headers))
    assert (d.status, d.reason) == (407, reason)


def test_a_revoked_grant_s_credential_is_refused():
    g = grant("allowed.test", revoked=True)
    d = denied(authenticate, CONFIG, {"u1": g}, g, request("GET", "http://allowed.test/", auth("u1", "pw1")))
    assert (d.status, d.reason) == (407, "credentials_invalid")


def test_another_call_s_live_credential_is_misuse_naming_both_calls():
    mine, theirs = grant("allowed.test"), grant("allowed.test", call_id="call-2", username="u2", password="pw2")
    grants = {"u1": mine, "u2": theirs}
    with pytest.raises(CredentialMisuse) as info:
        authenticate(CONFIG, grants, mine, request("GET", "http://allowed.test/", auth("u2", "pw2")))
    misuse = info.value
    assert (misuse.status, misuse.reason) == (407, "credential_misuse")
    assert (misuse.owner_username, misuse.owner_call_id) == ("u2", "call-2")
    assert "call call-2" in misuse.detail and "call call-1's socket" in misuse.detail
    # Red check: with call_binding off the credential's own grant is used, as if bound.
    off = replace(CONFIG, disabled_checks=frozenset({"call_binding"}))
    assert authenticate(off, grants, mine, request("GET", "http://allowed.test/", auth("u2", "pw2"))) is theirs


# -- CONNECT and plain HTTP: the request's form ----------------------------------------------------


def test_connect_needs_host_and_port():
    assert connect_target(request("CONNECT", "allowed.test:443")) == ("allowed.test", 443)
    assert connect_target(request("CONNECT", "[2001:db8::1]:443")) == ("[2001:db8::1]", 443)
    assert denied(connect_target, request("CONNECT", "allowed.test")).detail == "CONNECT needs host:port"
    assert denied(connect_target, request("CONNECT", "allowed.test:99999")).reason == "bad_port"


def test_plain_http_needs_an_absolute_http_url_and_a_forwarded_method():
    t = forward_target(request("GET", "http://allowed.test:8080/a/b?c=d"))
    assert (t.host, t.port, t.path) == ("allowed.test", 8080, "/a/b?c=d")
    assert forward_target(request("POST", "http://allowed.test")).path == "/"
    assert forward_target(request("POST", "http://allowed.test")).port == 80
    d = denied(forward_target, request("TRACE", "http://allowed.test/"))
    assert (d.status, d.reason) == (405, "method_refused")
    assert denied(forward_target, request("GET", "https://allowed.test/")).reason == "bad_request"
    assert denied(forward_target, request("GET", "/relative")).reason == "bad_request"
    assert "credentials in the URL" in denied(forward_target, request("GET", "http://a:b@allowed.test/")).detail


def test_plain_http_bodies_are_bounded_by_one_content_length():
    assert forward_body(request("POST", "http://x/", ("Content-Length", "12"), ("Host", "x"))) == \
        admission.ForwardBody(12, ("x",))
    assert forward_body(request("GET", "http://x/")).length == 0
    assert denied(forward_body, request("POST", "http://x/", ("Transfer-Encoding", "chunked"))).status == 501
    assert denied(forward_body, request("POST", "http://x/", ("Content-Length", "1"), ("Content-Length", "1"))).reason \
        == "bad_request"
    assert denied(forward_body, request("POST", "http://x/", ("Content-Length", "-1"))).reason == "bad_request"
    assert denied(forward_body, request("GET", "http://x/", ("Host", "x"), ("Host", "y"))).detail == \
        "more than one Host header"


def test_the_host_header_must_name_the_target():
    check_host_header(CONFIG, "allowed.test", 80, ("Allowed.Test.",))
    check_host_header(CONFIG, "allowed.test", 8080, ("allowed.test:8080",))
    check_host_header(CONFIG, "allowed.test", 80, ())
    assert denied(check_host_header, CONFIG, "allowed.test", 80, ("denied.test",)).reason == "host_mismatch"
    # A Host without a port means the target's port; another port is another target.
    check_host_header(CONFIG, "allowed.test", 8080, ("allowed.test",))
    assert denied(check_host_header, CONFIG, "allowed.test", 8080, ("allowed.test:80",)).reason == "host_mismatch"
    check_host_header(replace(CONFIG, disabled_checks=frozenset({"host_header"})), "allowed.test", 80, ("denied.test",))


def test_a_parsed_head_feeds_the_checks():
    req = parse_head(b"GET http://allowed.test/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
    assert forward_target(req).path == "/x" and forward_body(req).host_headers == ("allowed.test",)


# -- 2., 3., 5. the target against the grant ------------------------------------------------------


def test_host_names_are_canonical_and_bare_ips_refused():
    assert canonical_name(CONFIG, "Allowed.TEST.") == "allowed.test"
    for ip in ("93.184.216.34", "[2001:db8::1]"):
        d = denied(canonical_name, CONFIG, ip)
        assert (d.status, d.reason) == (403, "ip_literal")
    assert denied(canonical_name, CONFIG, "bad_host!").reason == "bad_host"
    assert canonical_name(replace(CONFIG, disabled_checks=frozenset({"ip_literal"})), "[2001:db8::1]") == "2001:db8::1"


def test_allowed_and_denied_hosts_and_port_rules():
    g = grant("allowed.test", "*.wild.test:8443")
    check_grant(CONFIG, g, "allowed.test", 443)
    check_grant(CONFIG, g, "allowed.test", 80)
    check_grant(CONFIG, g, "a.wild.test", 8443)
    for name, port in (("denied.test", 443), ("allowed.test", 8080), ("a.wild.test", 443), ("wild.test", 8443)):
        d = denied(check_grant, CONFIG, g, name, port)
        assert (d.status, d.reason) == (403, "not_allowlisted")
        assert d.detail == f"{name}:{port} is not on this call's allowlist"
    check_grant(replace(CONFIG, disabled_checks=frozenset({"allowlist"})), g, "denied.test", 443)


def test_ceilings_come_after_the_allowlist():
    spent = grant("allowed.test", bytes_used=1000)
    assert denied(check_grant, CONFIG, spent, "allowed.test", 443).reason == "byte_limit"
    assert denied(check_grant, CONFIG, grant("allowed.test", cut_reason="byte_limit", bytes_used=1), "allowed.test",
                  443).reason == "byte_limit"
    d = denied(check_grant, CONFIG, grant("allowed.test", connections=5), "allowed.test", 443)
    assert (d.status, d.reason) == (429, "connection_limit")
    assert denied(check_grant, CONFIG, grant("x.test", connections=5), "allowed.test", 443).reason == "not_allowlisted"


# -- 6. addresses ------------------------------------------------------------------------------------


def test_which_names_are_never_looked_up():
    assert fixed_addresses(CONFIG, "allowed.test") == ["93.184.216.34"]
    assert fixed_addresses(CONFIG, "ledger.ringfence.internal") == ["10.9.0.2"]
    assert fixed_addresses(CONFIG, "10.0.0.1") == ["10.0.0.1"]
    assert denied(fixed_addresses, CONFIG, "unknown.test").status == 502
    system = ProxyConfig(control_socket=None, services={"ledger.ringfence.internal": ["10.9.0.2"]})
    assert fixed_addresses(system, "example.com") is None  # the server asks its resolver
    assert fixed_addresses(system, "ledger.ringfence.internal") == ["10.9.0.2"]


def test_a_public_address_is_admitted_and_private_ones_refused_naming_the_address():
    assert check_addresses(CONFIG, "allowed.test", ["93.184.216.34"]) == "93.184.216.34"
    for name, address, why in (("inside.test", "10.1.2.3", "private"), ("meta.test", "169.254.169.254", "metadata"),
                               ("x.test", "127.0.0.1", "loopback"), ("x.test", "::ffff:127.0.0.1", "loopback")):
        d = denied(check_addresses, CONFIG, name, [address])
        assert (d.status, d.reason, d.address) == (403, "address_refused", address)
        assert why in d.detail
    # Any refused address refuses the name, even when another one is fine.
    assert denied(check_addresses, CONFIG, "allowed.test", ["93.184.216.34", "10.1.2.3"]).address == "10.1.2.3"


def test_a_test_network_is_permitted_and_a_service_only_under_its_own_name():
    assert check_addresses(CONFIG, "decoy.test", ["172.30.0.5"]) == "172.30.0.5"
    assert check_addresses(CONFIG, "ledger.ringfence.internal", ["10.9.0.2"]) == "10.9.0.2"
    d = denied(check_addresses, CONFIG, "other.test", ["10.9.0.2"])
    assert "service ledger.ringfence.internal" in d.detail
    assert "not a pinned address" in denied(check_addresses, CONFIG, "ledger.ringfence.internal", ["10.9.0.3"]).detail
    off = replace(CONFIG, disabled_checks=frozenset({"address"}))
    assert check_addresses(off, "inside.test", ["10.1.2.3"]) == "10.1.2.3"


# -- 7. TLS ----------------------------------------------------------------------------------------


def test_the_client_hello_must_name_the_connect_host_in_the_clear():
    check_hello("allowed.test", ClientHello(("Allowed.Test",), False, 100))
    for hello, reason in ((ClientHello(("allowed.test",), True, 100), "ech_refused"),
                          (ClientHello((), False, 100), "sni_missing"),
                          (ClientHello(("denied.test",), False, 100), "sni_mismatch"),
                          (ClientHello(("allowed.test", "denied.test"), False, 100), "sni_mismatch"),
                          (ClientHello(("bad name",), False, 100), "sni_mismatch")):
        assert denied(check_hello, "allowed.test", hello).reason == reason


# -- no socket ---------------------------------------------------------------------------------------

NETWORKING = {"socket", "ssl", "selectors", "asyncio"}


def test_admission_imports_no_networking_itself():
    tree = ast.parse(inspect.getsource(admission))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    assert imported, "no imports found: the check is not looking at the module"
    assert not imported & NETWORKING


def test_importing_admission_loads_no_networking_at_all():
    code = ("import sys; import ringfence_server.sandbox.egress.admission; "
            f"print(sorted(m for m in {sorted(NETWORKING)!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
