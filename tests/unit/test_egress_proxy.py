"""The egress proxy itself, without Docker: every variant of case 29 refused, each shown to get
through when the one check that stops it is switched off (a TEST config flag); and case 46, a
call's credentials bound to the call's own socket.

Each grant gets its own unix socket in a temp directory, as the host makes them; a client
reaches the proxy only through the socket of some call.

Decoys listen on 127.0.0.2 (allowed.test, www.allowed.test; also a second-hop relay), 127.0.0.3
(private.test: allowlisted, but its network is not a configured test network), 127.0.0.4
(denied.test) and 127.0.0.5 (reachable only by IP). The proxy's test resolver maps the names;
nothing here resolves through the host. The connector opens sockets to loopback only and
records every attempt, so a metadata address can be "attempted" without a packet.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import pytest
from egress_support import ProxyHarness, basic, connect, http_get, make_cert, raw_request, tunnel
from egress_support.decoy import Decoy

from ringfence_server.sandbox.egress.channel import ControlChannel, EgressError
from ringfence_server.sandbox.egress.server import CHECKS, ConfigError, ProxyConfig

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
def make_proxy():
    made = []
    # Short paths: a unix socket's path must fit in 108 bytes.
    state = tempfile.mkdtemp(prefix="rfp-")

    def make(disabled=(), **overrides):
        settings = dict(control_socket=os.path.join(state, f"control-{len(made)}.sock"),
                        calls_dir=os.path.join(state, f"calls-{len(made)}"),
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
    shutil.rmtree(state, ignore_errors=True)


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
    call = proxy.grant(allow_for(decoys, "allowed.test"), call_id="call-a")
    reply = http_get(call.sock, f"http://allowed.test:{decoys['allowed'].port}/", call.auth)
    assert reply.status == 200 and reply.body == b"hello from allowed\n"
    assert [e["event"] for e in decoys["allowed"].connections()] == ["tcp"]
    [request] = [e for e in decoys["allowed"].events if e["event"] == "request"]
    assert request["line"] == "GET / HTTP/1.1" and request["proxy_auth"] is False  # creds stay here
    summary = proxy.channel.revoke(call.user)
    [event] = summary["events"]
    assert event["call_id"] == "call-a" and event["decision"] == "allowed"
    assert event["host"] == "allowed.test" and event["address"] == ALLOWED
    assert event["method"] == "GET" and event["bytes_down"] > len(b"hello from allowed\n")


def test_allowed_connect_with_matching_sni_reaches_the_decoy(proxy, decoys):
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    r = tunnel(call.sock, f"allowed.test:{decoys['allowed'].tls_port}", call.auth, sni="allowed.test")
    assert r.connect_status == 200 and r.error is None
    assert r.body.endswith(b"hello from allowed\n")
    assert {"decoy": "allowed", "event": "tls", "sni": "allowed.test"} in decoys["allowed"].events


# -- case 29, variant by variant, each with its red check -----------------------------------


@pytest.mark.parametrize("disabled, refused", [((), True), (("allowlist",), False)])
def test_host_off_the_allowlist(make_proxy, decoys, disabled, refused):
    proxy = make_proxy(disabled)
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    reply = http_get(call.sock, f"http://denied.test:{decoys['denied'].port}/", call.auth)
    r = tunnel(call.sock, f"denied.test:{decoys['denied'].tls_port}", call.auth, sni="denied.test")
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
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    reply = http_get(call.sock, f"http://www.allowed.test:{decoys['allowed'].port}/", call.auth)
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
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    d = decoys["iponly"]
    r = tunnel(call.sock, f"{IPONLY}:{d.tls_port}", call.auth, sni=None)
    plain = http_get(call.sock, f"http://{IPONLY}:{d.port}/", call.auth)
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
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    r = tunnel(call.sock, f"allowed.test:{decoys['allowed'].tls_port}", call.auth, sni="denied.test")
    assert r.connect_status == 200  # CONNECT itself was admitted; the ClientHello was not
    if refused:
        assert r.error is not None and r.body == b""
        assert decoys["allowed"].connections() == []
        [event] = proxy.channel.revoke(call.user)["events"]
        assert (event["decision"], event["reason"], event["sni"]) == ("denied", "sni_mismatch", ["denied.test"])
    else:
        assert r.error is None and wait_for(lambda: len(decoys["allowed"].connections()) == 1)
        assert {"decoy": "allowed", "event": "tls", "sni": "denied.test"} in decoys["allowed"].events


def test_tls_without_sni_is_refused(proxy, decoys):
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    r = tunnel(call.sock, f"allowed.test:{decoys['allowed'].tls_port}", call.auth, sni=None)
    assert r.error is not None and decoys["allowed"].connections() == []
    assert proxy.channel.revoke(call.user)["events"][0]["reason"] == "sni_missing"


@pytest.mark.parametrize("disabled, refused", [((), True), (("host_header",), False)])
def test_host_header_that_is_not_the_target(make_proxy, decoys, disabled, refused):
    proxy = make_proxy(disabled)
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    reply = http_get(call.sock, f"http://allowed.test:{decoys['allowed'].port}/", call.auth, host="denied.test")
    if refused:
        assert reply.status == 403 and reply.reason == "host_mismatch"
        assert decoys["allowed"].connections() == []
    else:
        # Red: forwarded, and (here) the proxy rewrites Host to the target; the request arrived.
        assert reply.status == 200 and len(decoys["allowed"].connections()) == 1


def test_the_proxy_resolves_names_itself(proxy, decoys):
    """A client's own name->IP idea (an /etc/hosts spoof) cannot steer the proxy: given the name
    it uses its own resolver; given the spoofed address it refuses a bare IP."""
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    # The client "believes" allowed.test is DENIED's address and says so in the only ways it can.
    spoofed = http_get(call.sock, f"http://{DENIED}:{decoys['allowed'].port}/", call.auth, host="allowed.test")
    spoofed_tls = tunnel(call.sock, f"{DENIED}:{decoys['denied'].tls_port}", call.auth, sni="allowed.test")
    by_name = http_get(call.sock, f"http://allowed.test:{decoys['allowed'].port}/", call.auth)
    assert spoofed.status == 403 and spoofed.reason in ("host_mismatch", "ip_literal")
    assert (spoofed_tls.connect_status, spoofed_tls.reason) == (403, "ip_literal")
    assert by_name.status == 200 and by_name.body == b"hello from allowed\n"
    assert proxy.connector.attempts == [(ALLOWED, decoys["allowed"].port)]
    assert decoys["denied"].connections() == []


@pytest.mark.parametrize("disabled, refused", [((), True), (("address",), False)])
def test_private_range_even_if_allowlisted(make_proxy, decoys, disabled, refused):
    proxy = make_proxy(disabled)
    call = proxy.grant([f"private.test:{decoys['private'].port}"])
    reply = http_get(call.sock, f"http://private.test:{decoys['private'].port}/", call.auth)
    if refused:
        assert reply.status == 403 and reply.reason == "address_refused"
        assert decoys["private"].connections() == [] and proxy.connector.attempts == []
    else:
        assert reply.status == 200 and len(decoys["private"].connections()) == 1


@pytest.mark.parametrize("name", ["metadata.test", "mapped-metadata.test", "nat64-metadata.test", "mixed.test"])
@pytest.mark.parametrize("disabled, refused", [((), True), (("address",), False)])
def test_metadata_addresses_never_get_a_connection_attempt(make_proxy, name, disabled, refused):
    proxy = make_proxy(disabled)
    call = proxy.grant([f"{name}:80"])
    reply = http_get(call.sock, f"http://{name}/latest/meta-data/", call.auth)
    if refused:
        assert reply.status == 403 and reply.reason == "address_refused"
        assert proxy.connector.attempts == []
    else:
        # Red: the proxy would have connected; the test connector refused to open the socket.
        assert reply.status == 502 and reply.reason == "connect_failed"
        assert len(proxy.connector.attempts) == 1


def test_metadata_stays_refused_even_inside_a_configured_test_network(make_proxy):
    proxy = make_proxy(test_networks=["169.254.0.0/16"])
    call = proxy.grant(["metadata.test:80"])
    reply = http_get(call.sock, "http://metadata.test/", call.auth)
    assert (reply.status, reply.reason) == (403, "address_refused") and proxy.connector.attempts == []


@pytest.mark.parametrize("disabled, refused", [((), True), (("sni",), False)])
def test_connect_relayed_through_a_second_hop(make_proxy, decoys, disabled, refused):
    """CONNECT to an allowlisted host that is itself a proxy, then CONNECT onwards inside the
    tunnel: the tunnel's first bytes are no TLS ClientHello, so nothing goes upstream."""
    proxy = make_proxy(disabled)
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    inner = f"CONNECT {DENIED}:{decoys['denied'].port} HTTP/1.1\r\n\r\nGET / HTTP/1.0\r\n\r\n".encode()
    r = tunnel(call.sock, f"allowed.test:{decoys['allowed'].port}", call.auth, sni=None, tls=False, payload=inner)
    assert r.connect_status == 200
    if refused:
        assert r.body == b""
        assert decoys["allowed"].connections() == [] and decoys["denied"].connections() == []
        assert proxy.channel.revoke(call.user)["events"][0]["reason"] == "not_tls"
    else:  # red: the second hop relays to a host the call was never granted
        assert b"hello from denied" in r.body
        assert wait_for(lambda: len(decoys["denied"].connections()) == 1)


def test_pipelined_second_request_does_not_ride_on_the_first(proxy, decoys):
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    port = decoys["allowed"].port
    first = (f"GET http://allowed.test:{port}/ HTTP/1.1\r\nHost: allowed.test:{port}\r\n"
             f"Proxy-Authorization: {basic(*call.auth)}\r\nContent-Length: 0\r\n\r\n")
    second = "GET /big?n=5 HTTP/1.1\r\nHost: denied.test\r\n\r\n"
    reply = raw_request(call.sock, (first + second).encode())
    assert reply.status == 200
    assert [e["line"] for e in decoys["allowed"].events if e["event"] == "request"] == ["GET / HTTP/1.1"]


def test_chunked_bodies_and_https_urls_are_refused(proxy, decoys):
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    port = decoys["allowed"].port
    chunked = http_get(call.sock, f"http://allowed.test:{port}/", call.auth, extra="Transfer-Encoding: chunked\r\n")
    https = http_get(call.sock, f"https://allowed.test:{port}/", call.auth)
    assert (chunked.status, chunked.reason) == (501, "unsupported_body")
    assert https.status == 400
    assert decoys["allowed"].connections() == []


# -- credentials, ceilings, revocation ------------------------------------------------------


@pytest.mark.parametrize("auth", [None, ("u1", "wrong"), ("nobody", "x")])
def test_requests_without_valid_credentials_get_407(proxy, decoys, auth):
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    reply = http_get(call.sock, f"http://allowed.test:{decoys['allowed'].port}/", auth)
    assert reply.status == 407 and "proxy-authenticate" in reply.headers
    assert reply.reason == ("credentials_missing" if auth is None else "credentials_invalid")
    assert decoys["allowed"].connections() == []
    # Refused requests are the call's too: they arrived on its socket.
    [event] = proxy.channel.events(call.user)["events"]
    assert (event["call_id"], event["decision"], event["reason"]) == (call.call_id, "denied", reply.reason)


def test_credentials_stop_working_when_the_call_is_revoked(proxy, decoys):
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    url = f"http://allowed.test:{decoys['allowed'].port}/"
    assert http_get(call.sock, url, call.auth).status == 200
    # An open tunnel is cut by the revocation, not left to run on.
    s = connect(call.sock)
    s.sendall(f"CONNECT allowed.test:{decoys['allowed'].tls_port} HTTP/1.1\r\n"
              f"Proxy-Authorization: {basic(*call.auth)}\r\n\r\n".encode())
    assert s.recv(100).startswith(b"HTTP/1.1 200")
    # ... and so is a connection that has not sent its request yet.
    idle = connect(call.sock)
    summary = proxy.channel.revoke(call.user)
    assert s.recv(100) == b""  # the proxy closed the tunnel
    assert idle.recv(100) == b""
    s.close()
    idle.close()
    assert [e["reason"] for e in summary["events"]] == [None, "hello_missing"]
    # The call's socket is gone with it: nothing is listening there any more ...
    assert not os.path.exists(call.sock)
    with pytest.raises(OSError):
        connect(call.sock)
    # ... and its credentials are refused from the socket of a live call.
    other = proxy.grant(allow_for(decoys, "allowed.test"))
    replay = http_get(other.sock, url, call.auth)
    assert (replay.status, replay.reason) == (407, "credentials_invalid")
    assert proxy.channel.ping()["listeners"] == 1
    with pytest.raises(EgressError):
        proxy.channel.revoke(call.user)


def test_byte_ceiling_cuts_a_large_download_and_then_refuses(proxy, decoys):
    call = proxy.grant(allow_for(decoys, "allowed.test"), max_bytes=100_000)
    url = f"http://allowed.test:{decoys['allowed'].port}/big?n=5000000"
    reply = http_get(call.sock, url, call.auth)
    assert reply.status == 200 and len(reply.body) < 100_000
    again = http_get(call.sock, f"http://allowed.test:{decoys['allowed'].port}/", call.auth)
    assert (again.status, again.reason) == (403, "byte_limit")
    summary = proxy.channel.revoke(call.user)
    assert summary["events"][0]["cut"] == "byte_limit"
    assert summary["bytes"] >= 100_000


def test_connection_ceiling(proxy, decoys):
    call = proxy.grant(allow_for(decoys, "allowed.test"), max_connections=2)
    url = f"http://allowed.test:{decoys['allowed'].port}/"
    statuses = [http_get(call.sock, url, call.auth).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert len(decoys["allowed"].connections()) == 2


def test_calls_cannot_use_each_others_grants(proxy, decoys):
    a = proxy.grant(allow_for(decoys, "allowed.test"))
    b = proxy.grant([f"denied.test:{decoys['denied'].port}"])
    assert http_get(a.sock, f"http://denied.test:{decoys['denied'].port}/", a.auth).status == 403
    assert http_get(b.sock, f"http://denied.test:{decoys['denied'].port}/", b.auth).status == 200
    assert http_get(b.sock, f"http://allowed.test:{decoys['allowed'].port}/", b.auth).status == 403


# -- case 46: a call's credentials work only on the call's own socket -------------------------


def two_calls(proxy, decoys):
    """A may reach allowed.test and denied.test; B only allowed.test. Both live."""
    a = proxy.grant([*allow_for(decoys, "allowed.test"), f"denied.test:{decoys['denied'].port}",
                     f"denied.test:{decoys['denied'].tls_port}"], call_id="call-a")
    b = proxy.grant(allow_for(decoys, "allowed.test"), call_id="call-b")
    return a, b


def misuse(b, a, decoys):
    """From B's socket, with A's credentials, to the host only A may reach: HTTP and CONNECT."""
    d = decoys["denied"]
    plain = http_get(b.sock, f"http://denied.test:{d.port}/", a.auth)
    tls = tunnel(b.sock, f"denied.test:{d.tls_port}", a.auth, sni="denied.test")
    return plain, tls


@pytest.mark.parametrize("disabled, refused", [((), True), (("call_binding",), False)])
def test_a_credential_is_refused_on_another_calls_socket(make_proxy, decoys, disabled, refused):
    proxy = make_proxy(disabled)
    a, b = two_calls(proxy, decoys)
    plain, tls = misuse(b, a, decoys)
    if refused:
        assert (plain.status, plain.reason) == (407, "credential_misuse")
        assert (tls.connect_status, tls.reason) == (407, "credential_misuse")
        assert decoys["denied"].connections() == [] and proxy.connector.attempts == []
    else:
        # Red: without the binding, B reaches what only A may reach, with A's credentials.
        assert plain.status == 200 and plain.body == b"hello from denied\n"
        assert tls.connect_status == 200 and tls.body.endswith(b"hello from denied\n")
        assert wait_for(lambda: len(decoys["denied"].connections()) == 2)


def test_a_misused_credential_is_an_event_of_both_calls_and_a_log_line(proxy, decoys):
    a, b = two_calls(proxy, decoys)
    misuse(b, a, decoys)
    # On B, whose socket the requests came in on: attributed to B, naming A.
    on_b = proxy.channel.events(b.user)["events"]
    assert [(e["event"], e["call_id"], e["method"], e["reason"], e["credential_of"]) for e in on_b] == [
        ("request", "call-b", "GET", "credential_misuse", "call-a"),
        ("request", "call-b", "CONNECT", "credential_misuse", "call-a")]
    assert on_b[1]["target"] == f"denied.test:{decoys['denied'].tls_port}"
    # On A, whose credential it was: naming B.
    on_a = proxy.channel.revoke(a.user)["events"]
    assert [(e["event"], e["call_id"], e["method"], e["presented_by"]) for e in on_a] == [
        ("credential_misuse", "call-a", "GET", "call-b"), ("credential_misuse", "call-a", "CONNECT", "call-b")]
    lines = [json.loads(x) for x in proxy.log.getvalue().splitlines()]
    assert sum(1 for e in lines if e.get("reason") == "credential_misuse" and e.get("call_id") == "call-a") == 2
    assert sum(1 for e in lines if e.get("reason") == "credential_misuse" and e.get("call_id") == "call-b") == 2
    # B's own credentials still work on B's socket, and A's on A's.
    assert http_get(b.sock, f"http://allowed.test:{decoys['allowed'].port}/", b.auth).status == 200


def test_a_credential_works_on_its_own_socket(proxy, decoys):
    a, b = two_calls(proxy, decoys)
    assert http_get(a.sock, f"http://denied.test:{decoys['denied'].port}/", a.auth).status == 200
    assert http_get(b.sock, f"http://allowed.test:{decoys['allowed'].port}/", b.auth).status == 200
    assert [e["call_id"] for e in proxy.channel.events(a.user)["events"]] == ["call-a"]
    assert [e["call_id"] for e in proxy.channel.events(b.user)["events"]] == ["call-b"]


def test_the_proxy_has_no_tcp_listener_and_grants_need_a_call_directory(proxy):
    assert "listen_port" not in ProxyConfig.__dataclass_fields__
    with pytest.raises(EgressError, match="no call directory"):
        proxy.channel.grant(call_id="x", username="ux", password="p", allow=["a.test"], max_bytes=1,
                            max_connections=1, socket_dir="0123456789abcdef")
    for bad in ("../../etc", "a/b", "..", "short"):
        with pytest.raises(EgressError, match="socket_dir"):
            proxy.channel.grant(call_id="x", username="ux", password="p", allow=["a.test"], max_bytes=1,
                                max_connections=1, socket_dir=bad)
    c = proxy.grant(["a.test"])
    oct_mode = oct(os.stat(c.sock).st_mode & 0o777)
    assert oct_mode == "0o666"  # any sandbox uid; the directory's bind mount is the access control
    with pytest.raises(EgressError, match="already in use"):
        proxy.channel.grant(call_id="y", username="uy", password="p", allow=["a.test"], max_bytes=1,
                            max_connections=1, socket_dir=os.path.basename(os.path.dirname(c.sock)))


def test_the_binding_check_can_be_switched_off_only_as_a_named_test_check():
    assert "call_binding" in CHECKS
    from ringfence_server.sandbox.egress.proxy import ProxySettings

    with pytest.raises(ValueError):
        ProxySettings(disabled_checks={"call_binding"})  # the system resolver: a production config
    assert ProxySettings(resolver="test", disabled_checks={"call_binding"}).proxy_config()["disabled_checks"] == [
        "call_binding"]


# -- control channel and configuration ------------------------------------------------------


def test_control_channel_errors_are_replies(proxy):
    with pytest.raises(EgressError, match="unknown op"):
        proxy.channel.request("launch")
    proxy.grant(["a.test"])
    os.mkdir(os.path.join(proxy.calls_dir, "0123456789abcdef"))
    with pytest.raises(EgressError, match="already granted"):
        proxy.channel.grant(call_id="x", username="u1", password="p", allow=["a.test"], max_bytes=1,
                            max_connections=1, socket_dir="0123456789abcdef")
    with pytest.raises(EgressError, match="IP address"):
        proxy.channel.grant(call_id="x", username="u9", password="p", allow=["10.0.0.1"], max_bytes=1,
                            max_connections=1, socket_dir="0123456789abcdef")
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
    call = proxy.grant(allow_for(decoys, "allowed.test"), call_id="call-log")
    http_get(call.sock, f"http://allowed.test:{decoys['allowed'].port}/", call.auth)
    http_get(call.sock, f"http://denied.test:{decoys['denied'].port}/", call.auth)
    lines = [json.loads(x) for x in proxy.log.getvalue().splitlines()]
    requests = [e for e in lines if e.get("event") == "request"]
    assert [(e["host"], e["decision"], e["reason"]) for e in requests] == [
        ("allowed.test", "allowed", None), ("denied.test", "denied", "not_allowlisted")]
    assert all(e["call_id"] == "call-log" for e in requests)


def test_oversized_or_malformed_heads_are_refused_before_anything_else(proxy, decoys):
    call = proxy.grant(allow_for(decoys, "allowed.test"))
    huge = raw_request(call.sock, b"GET http://allowed.test/ HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
    folded = raw_request(call.sock, b"GET http://allowed.test/ HTTP/1.1\r\n folded\r\n\r\n")
    assert (huge.status, huge.reason) == (400, "bad_request")
    assert (folded.status, folded.reason) == (400, "bad_request")
    assert decoys["allowed"].connections() == []
