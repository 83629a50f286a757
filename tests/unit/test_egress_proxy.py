"""The egress proxy itself, on loopback: every variant of case 29 refused, each shown to get
through when the one check that stops it is switched off (a TEST config flag).

Decoys listen on 127.0.0.2 (allowed.test, www.allowed.test; also a second-hop relay), 127.0.0.3
(private.test: allowlisted, but its network is not a configured test network), 127.0.0.4
(denied.test) and 127.0.0.5 (reachable only by IP). The proxy's test resolver maps the names;
nothing here resolves through the host. The connector opens sockets to loopback only and
records every attempt, so a metadata address can be "attempted" without a packet.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from sandbox.egress.channel import ControlChannel, EgressError
from sandbox.egress.decoy import Decoy
from sandbox.egress.server import ConfigError, ProxyConfig
from sandbox.egress.testing import ProxyHarness, http_get, make_cert, raw_request, tunnel, basic

ALLOWED, PRIVATE, DENIED, IPONLY = "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"
TEST_HOSTS = {
    "allowed.test": [ALLOWED],
    "www.allowed.test": [ALLOWED],
    "private.test": [PRIVATE],
    "denied.test": [DENIED],
    "metadata.test": ["169.254.169.254"],
    "mapped-metadata.test": ["::ffff:169.254.169.254"],
    "nat64-metadata.test": ["64:ff9b::a9fe:a9fe"],
    "mixed.test": [ALLOWED, "169.254.169.254"],
}
TEST_NETWORKS = [f"{ALLOWED}/32", f"{DENIED}/32", f"{IPONLY}/32"]


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return make_cert(tmp_path_factory.mktemp("cert"))


@pytest.fixture
def decoys(cert):
    made = {
        "allowed": Decoy("allowed", ALLOWED, tls_port=0, cert=cert[0], key=cert[1], relay=True),
        "private": Decoy("private", PRIVATE),
        "denied": Decoy("denied", DENIED, tls_port=0, cert=cert[0], key=cert[1]),
        "iponly": Decoy("iponly", IPONLY, tls_port=0, cert=cert[0], key=cert[1]),
    }
    yield made
    for d in made.values():
        d.close()


@pytest.fixture
def make_proxy(tmp_path):
    made = []

    def make(disabled=(), **overrides):
        settings = dict(listen_host="127.0.0.1", listen_port=0,
                        control_socket=str(tmp_path / f"control-{len(made)}.sock"),
                        resolver="test", test_hosts=TEST_HOSTS, test_networks=TEST_NETWORKS,
                        disabled_checks=frozenset(disabled))
        settings.update(overrides)
        config = ProxyConfig(**settings)
        h = ProxyHarness(config)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


@pytest.fixture
def proxy(make_proxy):
    return make_proxy()


def allow_for(decoys, *names):
    a = decoys["allowed"]
    return [f"{n}:{p}" for n in names for p in (a.port, a.tls_port)]


def wait_for(predicate, timeout=3.0):
    """Events are written by server threads; give them a moment (not a timing assertion)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# -- the allowed paths ----------------------------------------------------------------------


def test_allowed_plain_http_reaches_the_decoy_and_is_an_event(proxy, decoys):
    auth = proxy.grant(allow_for(decoys, "allowed.test"), call_id="call-a")
    reply = http_get(proxy.port, f"http://allowed.test:{decoys['allowed'].port}/", auth)
    assert reply.status == 200 and reply.body == b"hello from allowed\n"
    assert [e["event"] for e in decoys["allowed"].connections()] == ["tcp"]
    [request] = [e for e in decoys["allowed"].events if e["event"] == "request"]
    assert request["line"] == "GET / HTTP/1.1" and request["proxy_auth"] is False  # creds stay here
    summary = proxy.channel.revoke(auth[0])
    [event] = summary["events"]
    assert event["call_id"] == "call-a" and event["decision"] == "allowed"
    assert event["host"] == "allowed.test" and event["address"] == ALLOWED
    assert event["method"] == "GET" and event["bytes_down"] > len(b"hello from allowed\n")


def test_allowed_connect_with_matching_sni_reaches_the_decoy(proxy, decoys):
    auth = proxy.grant(allow_for(decoys, "allowed.test"))
    r = tunnel(proxy.port, f"allowed.test:{decoys['allowed'].tls_port}", auth, sni="allowed.test")
    assert r.connect_status == 200 and r.error is None
    assert r.body.endswith(b"hello from allowed\n")
    assert {"decoy": "allowed", "event": "tls", "sni": "allowed.test"} in decoys["allowed"].events


# -- case 29, variant by variant, each with its red check -----------------------------------


@pytest.mark.parametrize("disabled, refused", [((), True), (("allowlist",), False)])
def test_host_off_the_allowlist(make_proxy, decoys, disabled, refused):
    proxy = make_proxy(disabled)
    auth = proxy.grant(allow_for(decoys, "allowed.test"))
    reply = http_get(proxy.port, f"http://denied.test:{decoys['denied'].port}/", auth)
    r = tunnel(proxy.port, f"denied.test:{decoys['denied'].tls_port}", auth, sni="denied.test")
    if refused:
        assert reply.status == 403 and reply.reason == "not_allowlisted"
        assert r.connect_status == 403 and r.reason == "not_allowlisted"
        assert decoys["denied"].connections() == []
    else:  # red: without the allowlist check the decoy is reached
        assert reply.status == 200 and r.connect_status == 200
        assert len(decoys["denied"].connections()) == 2


@pytest.mark.parametrize("disabled, refused", [((), True), (("allowlist",), False)])
def test_subdomain_of_an_exact_entry(make_proxy, decoys, disabled, refused):
    proxy = make_proxy(disabled)
    auth = proxy.grant(allow_for(decoys, "allowed.test"))
    reply = http_get(proxy.port, f"http://www.allowed.test:{decoys['allowed'].port}/", auth)
    if refused:
        assert reply.status == 403 and reply.reason == "not_allowlisted"
        assert decoys["allowed"].connections() == []
    else:
        assert reply.status == 200 and len(decoys["allowed"].connections()) == 1


@pytest.mark.parametrize("disabled, refused_by", [
    ((), "ip_literal"),
    (("ip_literal",), "not_allowlisted"),  # the allowlist alone also refuses: an IP is no name
    (("allowlist",), "ip_literal"),
    # Red: with both off the decoy is reached (the TLS check is off too: a client talking TLS to
    # a bare IP sends no SNI, which the SNI check refuses on its own -- a third layer).
    (("ip_literal", "allowlist", "sni"), None),
])
def test_https_to_a_bare_ip(make_proxy, decoys, disabled, refused_by):
    proxy = make_proxy(disabled)
    auth = proxy.grant(allow_for(decoys, "allowed.test"))
    d = decoys["iponly"]
    r = tunnel(proxy.port, f"{IPONLY}:{d.tls_port}", auth, sni=None)
    plain = http_get(proxy.port, f"http://{IPONLY}:{d.port}/", auth)
    if refused_by:
        assert (r.connect_status, r.reason) == (403, refused_by)
        assert (plain.status, plain.reason) == (403, refused_by)
        assert d.connections() == []
    else:
        assert r.connect_status == 200 and plain.status == 200
        assert wait_for(lambda: len(d.connections()) == 2)


@pytest.mark.parametrize("disabled, refused", [((), True), (("sni",), False)])
def test_sni_that_is_not_the_connect_host(make_proxy, decoys, disabled, refused):
    proxy = make_proxy(disabled)
    auth = proxy.grant(allow_for(decoys, "allowed.test"))
    r = tunnel(proxy.port, f"allowed.test:{decoys['allowed'].tls_port}", auth, sni="denied.test")
    assert r.connect_status == 200  # CONNECT itself was admitted; the ClientHello was not
    if refused:
        assert r.error is not None and r.body == b""
        assert decoys["allowed"].connections() == []
        [event] = proxy.channel.revoke(auth[0])["events"]
        assert (event["decision"], event["reason"], event["sni"]) == ("denied", "sni_mismatch", ["denied.test"])
    else:
        assert r.error is None and wait_for(lambda: len(decoys["allowed"].connections()) == 1)
        assert {"decoy": "allowed", "event": "tls", "sni": "denied.test"} in decoys["allowed"].events


def test_tls_without_sni_is_refused(proxy, decoys):
    auth = proxy.grant(allow_for(decoys, "allowed.test"))
    r = tunnel(proxy.port, f"allowed.test:{decoys['allowed'].tls_port}", auth, sni=None)
    assert r.error is not None and decoys["allowed"].connections() == []
    assert proxy.channel.revoke(auth[0])["events"][0]["reason"] == "sni_missing"


@pytest.mark.parametrize("disabled, refused", [((), True), (("host_header",), False)])
def test_host_header_that_is_not_the_target(make_proxy, decoys, disabled, refused):
    proxy = make_proxy(disabled)
    auth = proxy.grant(allow_for(decoys, "allowed.test"))
    reply = http_get(proxy.port, f"http://allowed.test:{decoys['allowed'].port}/", auth, host="denied.test")
    if refused:
        assert reply.status == 403 and reply.reason == "host_mismatch"
        assert decoys["allowed"].connections() == []
    else:
        # Red: forwarded, and (here) the proxy rewrites Host to the target; the request arrived.
        assert reply.status == 200 and len(decoys["allowed"].connections()) == 1


def test_the_proxy_resolves_names_itself(proxy, decoys):
    """A client's own name->IP idea (an /etc/hosts spoof) cannot steer the proxy: given the name
    it uses its own resolver; given the spoofed address it refuses a bare IP."""
    auth = proxy.grant(allow_for(decoys, "allowed.test"))
    # The client "believes" allowed.test is DENIED's address and says so in the only ways it can.
    spoofed = http_get(proxy.port, f"http://{DENIED}:{decoys['allowed'].port}/", auth, host="allowed.test")
    spoofed_tls = tunnel(proxy.port, f"{DENIED}:{decoys['denied'].tls_port}", auth, sni="allowed.test")
    by_name = http_get(proxy.port, f"http://allowed.test:{decoys['allowed'].port}/", auth)
    assert spoofed.status == 403 and spoofed.reason in ("host_mismatch", "ip_literal")
    assert (spoofed_tls.connect_status, spoofed_tls.reason) == (403, "ip_literal")
    assert by_name.status == 200 and by_name.body == b"hello from allowed\n"
    assert proxy.connector.attempts == [(ALLOWED, decoys["allowed"].port)]
    assert decoys["denied"].connections() == []


@pytest.mark.parametrize("disabled, refused", [((), True), (("address",), False)])
def test_private_range_even_if_allowlisted(make_proxy, decoys, disabled, refused):
    proxy = make_proxy(disabled)
    auth = proxy.grant([f"private.test:{decoys['private'].port}"])
    reply = http_get(proxy.port, f"http://private.test:{decoys['private'].port}/", auth)
    if refused:
        assert reply.status == 403 and reply.reason == "address_refused"
        assert decoys["private"].connections() == [] and proxy.connector.attempts == []
    else:
        assert reply.status == 200 and len(decoys["private"].connections()) == 1


@pytest.mark.parametrize("name", ["metadata.test", "mapped-metadata.test", "nat64-metadata.test", "mixed.test"])
@pytest.mark.parametrize("disabled, refused", [((), True), (("address",), False)])
def test_metadata_addresses_never_get_a_connection_attempt(make_proxy, name, disabled, refused):
    proxy = make_proxy(disabled)
    auth = proxy.grant([f"{name}:80"])
    reply = http_get(proxy.port, f"http://{name}/latest/meta-data/", auth)
    if refused:
        assert reply.status == 403 and reply.reason == "address_refused"
        assert proxy.connector.attempts == []
    else:
        # Red: the proxy would have connected; the test connector refused to open the socket.
        assert reply.status == 502 and reply.reason == "connect_failed"
        assert len(proxy.connector.attempts) == 1


def test_metadata_stays_refused_even_inside_a_configured_test_network(make_proxy):
    proxy = make_proxy(test_networks=["169.254.0.0/16"])
    auth = proxy.grant(["metadata.test:80"])
    reply = http_get(proxy.port, "http://metadata.test/", auth)
    assert (reply.status, reply.reason) == (403, "address_refused") and proxy.connector.attempts == []


@pytest.mark.parametrize("disabled, refused", [((), True), (("sni",), False)])
def test_connect_relayed_through_a_second_hop(make_proxy, decoys, disabled, refused):
    """CONNECT to an allowlisted host that is itself a proxy, then CONNECT onwards inside the
    tunnel: the tunnel's first bytes are no TLS ClientHello, so nothing goes upstream."""
    proxy = make_proxy(disabled)
    auth = proxy.grant(allow_for(decoys, "allowed.test"))
    inner = f"CONNECT {DENIED}:{decoys['denied'].port} HTTP/1.1\r\n\r\nGET / HTTP/1.0\r\n\r\n".encode()
    r = tunnel(proxy.port, f"allowed.test:{decoys['allowed'].port}", auth, sni=None, tls=False, payload=inner)
    assert r.connect_status == 200
    if refused:
        assert r.body == b""
        assert decoys["allowed"].connections() == [] and decoys["denied"].connections() == []
        assert proxy.channel.revoke(auth[0])["events"][0]["reason"] == "not_tls"
    else:  # red: the second hop relays to a host the call was never granted
        assert b"hello from denied" in r.body
        assert wait_for(lambda: len(decoys["denied"].connections()) == 1)


def test_pipelined_second_request_does_not_ride_on_the_first(proxy, decoys):
    auth = proxy.grant(allow_for(decoys, "allowed.test"))
    port = decoys["allowed"].port
    first = (f"GET http://allowed.test:{port}/ HTTP/1.1\r\nHost: allowed.test:{port}\r\n"
             f"Proxy-Authorization: {basic(*auth)}\r\nContent-Length: 0\r\n\r\n")
    second = f"GET /big?n=5 HTTP/1.1\r\nHost: denied.test\r\n\r\n"
    reply = raw_request(proxy.port, (first + second).encode())
    assert reply.status == 200
    assert [e["line"] for e in decoys["allowed"].events if e["event"] == "request"] == ["GET / HTTP/1.1"]


def test_chunked_bodies_and_https_urls_are_refused(proxy, decoys):
    auth = proxy.grant(allow_for(decoys, "allowed.test"))
    port = decoys["allowed"].port
    chunked = http_get(proxy.port, f"http://allowed.test:{port}/", auth, extra="Transfer-Encoding: chunked\r\n")
    https = http_get(proxy.port, f"https://allowed.test:{port}/", auth)
    assert (chunked.status, chunked.reason) == (501, "unsupported_body")
    assert https.status == 400
    assert decoys["allowed"].connections() == []


# -- credentials, ceilings, revocation ------------------------------------------------------


@pytest.mark.parametrize("auth", [None, ("u1", "wrong"), ("nobody", "x")])
def test_requests_without_valid_credentials_get_407(proxy, decoys, auth):
    proxy.grant(allow_for(decoys, "allowed.test"))
    reply = http_get(proxy.port, f"http://allowed.test:{decoys['allowed'].port}/", auth)
    assert reply.status == 407 and "proxy-authenticate" in reply.headers
    assert decoys["allowed"].connections() == []


def test_credentials_stop_working_when_the_call_is_revoked(proxy, decoys):
    auth = proxy.grant(allow_for(decoys, "allowed.test"))
    url = f"http://allowed.test:{decoys['allowed'].port}/"
    assert http_get(proxy.port, url, auth).status == 200
    # An open tunnel is cut by the revocation, not left to run on.
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    s.sendall(f"CONNECT allowed.test:{decoys['allowed'].tls_port} HTTP/1.1\r\n"
              f"Proxy-Authorization: {basic(*auth)}\r\n\r\n".encode())
    assert s.recv(100).startswith(b"HTTP/1.1 200")
    summary = proxy.channel.revoke(auth[0])
    assert s.recv(100) == b""  # the proxy closed the tunnel
    s.close()
    assert [e["reason"] for e in summary["events"]] == [None, "hello_missing"]
    assert http_get(proxy.port, url, auth).status == 407
    with pytest.raises(EgressError):
        proxy.channel.revoke(auth[0])


def test_byte_ceiling_cuts_a_large_download_and_then_refuses(proxy, decoys):
    auth = proxy.grant(allow_for(decoys, "allowed.test"), max_bytes=100_000)
    url = f"http://allowed.test:{decoys['allowed'].port}/big?n=5000000"
    reply = http_get(proxy.port, url, auth)
    assert reply.status == 200 and len(reply.body) < 100_000
    again = http_get(proxy.port, f"http://allowed.test:{decoys['allowed'].port}/", auth)
    assert (again.status, again.reason) == (403, "byte_limit")
    summary = proxy.channel.revoke(auth[0])
    assert summary["events"][0]["cut"] == "byte_limit"
    assert 100_000 <= summary["bytes"]


def test_connection_ceiling(proxy, decoys):
    auth = proxy.grant(allow_for(decoys, "allowed.test"), max_connections=2)
    url = f"http://allowed.test:{decoys['allowed'].port}/"
    statuses = [http_get(proxy.port, url, auth).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert len(decoys["allowed"].connections()) == 2


def test_calls_cannot_use_each_others_grants(proxy, decoys):
    a = proxy.grant(allow_for(decoys, "allowed.test"))
    b = proxy.grant([f"denied.test:{decoys['denied'].port}"])
    assert http_get(proxy.port, f"http://denied.test:{decoys['denied'].port}/", a).status == 403
    assert http_get(proxy.port, f"http://denied.test:{decoys['denied'].port}/", b).status == 200
    assert http_get(proxy.port, f"http://allowed.test:{decoys['allowed'].port}/", b).status == 403


# -- control channel and configuration ------------------------------------------------------


def test_control_channel_errors_are_replies(proxy):
    with pytest.raises(EgressError, match="unknown op"):
        proxy.channel.request("launch")
    proxy.grant(["a.test"])
    with pytest.raises(EgressError, match="already granted"):
        proxy.channel.grant(call_id="x", username="u1", password="p", allow=["a.test"], max_bytes=1,
                            max_connections=1)
    with pytest.raises(EgressError, match="IP address"):
        proxy.channel.grant(call_id="x", username="u9", password="p", allow=["10.0.0.1"], max_bytes=1,
                            max_connections=1)
    assert oct(os.stat(proxy.channel.path).st_mode & 0o777) == "0o600"


def test_unreachable_control_socket_is_an_egress_error(tmp_path):
    with pytest.raises(EgressError):
        ControlChannel(str(tmp_path / "nothing.sock"), timeout_s=1).ping()


def test_config_rejects_unknown_checks_and_keys():
    with pytest.raises(ConfigError):
        ProxyConfig(disabled_checks=frozenset({"everything"}))
    with pytest.raises(ConfigError):
        ProxyConfig.from_json({"listen_port": 1, "open_sesame": True})
    with pytest.raises(ConfigError):
        ProxyConfig(resolver="host")


def test_every_decision_is_a_json_line_on_the_log(proxy, decoys):
    auth = proxy.grant(allow_for(decoys, "allowed.test"), call_id="call-log")
    http_get(proxy.port, f"http://allowed.test:{decoys['allowed'].port}/", auth)
    http_get(proxy.port, f"http://denied.test:{decoys['denied'].port}/", auth)
    lines = [json.loads(x) for x in proxy.log.getvalue().splitlines()]
    requests = [e for e in lines if e.get("event") == "request"]
    assert [(e["host"], e["decision"], e["reason"]) for e in requests] == [
        ("allowed.test", "allowed", None), ("denied.test", "denied", "not_allowlisted")]
    assert all(e["call_id"] == "call-log" for e in requests)


def test_oversized_or_malformed_heads_are_refused_before_anything_else(proxy, decoys):
    huge = raw_request(proxy.port, b"GET http://allowed.test/ HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
    folded = raw_request(proxy.port, b"GET http://allowed.test/ HTTP/1.1\r\n folded\r\n\r\n")
    assert (huge.status, huge.reason) == (400, "bad_request")
    assert (folded.status, folded.reason) == (400, "bad_request")
    assert decoys["allowed"].connections() == []
