"""Operator-declared services of the egress proxy (ProxySettings/ProxyConfig `services`): the
configuration's rules, and admission, without Docker.

A service is a host name pinned to the private addresses of a container ringfence runs (the
ledger). Admission is shown on the proxy's own `_admit` (no socket at all) and once through a
call's real unix socket with the recording connector, which opens sockets to loopback only: the
pinned address is *attempted* and recorded, no packet is sent to it.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import shutil
import socket
import tempfile

import pytest
from egress_support import ProxyHarness, http_get

from ringfence_server.sandbox.egress.allowlist import parse_patterns
from ringfence_server.sandbox.egress.config import ConfigError, ProxyConfig, parse_services
from ringfence_server.sandbox.egress.errors import Deny
from ringfence_server.sandbox.egress.events import RequestEvent
from ringfence_server.sandbox.egress.grant_table import Grant
from ringfence_server.sandbox.egress.proxy import ProxySettings
from ringfence_server.sandbox.egress.server import EgressProxyServer

LEDGER, LEDGER_IP, NEIGHBOUR_IP = "ledger.ringfence.internal", "10.9.0.2", "10.9.0.3"
SERVICES = {LEDGER: [LEDGER_IP]}


# -- configuration --------------------------------------------------------------------------


def test_services_are_canonical_and_round_trip_through_the_proxy_config():
    settings = ProxySettings(services={"Ledger.RingFence.Internal.": ("10.9.0.2", "10.9.0.2", "fd00:1::2")})
    assert settings.services == {LEDGER: ("10.9.0.2", "fd00:1::2")}
    doc = settings.proxy_config()
    assert doc["services"] == {LEDGER: ["10.9.0.2", "fd00:1::2"]}
    assert ProxyConfig.from_json(doc).services == {LEDGER: ("10.9.0.2", "fd00:1::2")}


def test_services_are_production_configuration():
    # Unlike test_hosts/test_networks, services need no test resolver: the system resolver
    # still resolves everything else, and a service is never resolved at all.
    assert ProxySettings(resolver="system", services=SERVICES).services == {LEDGER: (LEDGER_IP,)}
    assert ProxyConfig(resolver="system", services=SERVICES).service_of(LEDGER_IP) == LEDGER


@pytest.mark.parametrize("services, why", [
    ({LEDGER: ["127.0.0.1"]}, "loopback"),
    ({LEDGER: ["169.254.169.254"]}, "metadata"),
    ({LEDGER: ["169.254.10.1"]}, "link_local"),
    ({LEDGER: ["fd00:ec2::254"]}, "metadata"),
    ({LEDGER: ["0.0.0.0"]}, "unspecified"),
    ({LEDGER: ["8.8.8.8"]}, "public"),
    ({LEDGER: ["224.0.0.1"]}, "multicast"),
    ({LEDGER: ["::ffff:10.9.0.2"]}, "IPv6 form of 10.9.0.2"),
    ({LEDGER: ["fe80::1%eth0"]}, "not an IP address"),
    ({LEDGER: ["ledger"]}, "never resolved"),
    ({LEDGER: []}, "at least one"),
    ({LEDGER: "   "}, "not an IP address"),
    ({LEDGER: [10]}, "not an IP address"),
    ({"*.ringfence.internal": ["10.9.0.2"]}, "not a valid host name"),
    ({"10.9.0.9": ["10.9.0.2"]}, "is an IP address"),
    ({"": ["10.9.0.2"]}, "empty host name"),
    ({LEDGER: ["10.9.0.2"], "other.internal": ["10.9.0.2"]}, "already the address of service"),
    ({LEDGER: ["10.9.0.2"], "LEDGER.ringfence.internal.": ["10.9.0.4"]}, "declared twice"),
])
def test_a_bad_service_is_refused_naming_itself(services, why):
    with pytest.raises(ConfigError, match=why.replace("(", r"\(")):
        parse_services(services)
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):  # ConfigError is a ValueError
        ProxySettings(services=services)


def test_services_must_be_a_mapping():
    with pytest.raises(ConfigError, match="must map host names"):
        parse_services([LEDGER, LEDGER_IP])


def test_a_name_cannot_be_both_a_service_and_a_test_host():
    with pytest.raises(ValueError, match="both services and test_hosts"):
        ProxySettings(resolver="test", test_hosts={LEDGER: ["10.9.0.7"]}, services=SERVICES)


def test_service_of_knows_every_form_of_a_pinned_address():
    cfg = ProxyConfig(services=SERVICES)
    assert cfg.service_of(LEDGER_IP) == LEDGER
    assert cfg.service_of("::ffff:10.9.0.2") == LEDGER
    assert cfg.service_of(NEIGHBOUR_IP) is None and cfg.service_of("not an address") is None


# -- admission, without a socket --------------------------------------------------------------


def _grant(*allow: str) -> Grant:
    return Grant(call_id="call-1", username="u", password_sha256=hashlib.sha256(b"p").digest(),
                 patterns=parse_patterns(allow), max_bytes=1 << 20, max_connections=10)


def _admit(config: ProxyConfig, grant: Grant, host: str, port: int = 80):
    """(canonical name, address) or the Deny; plus the fields of the request's event it set."""
    server = EgressProxyServer(config, log=io.StringIO())
    ev = RequestEvent()
    try:
        result: tuple[str, str] | Deny = asyncio.run(server._admit(grant, host, port, ev))
    except Deny as d:
        result = d
    return result, {k: v for k, v in ev.to_json().items() if v is not None}


def test_a_service_on_the_allowlist_is_its_pinned_address_and_never_resolved(monkeypatch):
    def no_lookups(*a, **k):
        raise AssertionError("a service name was resolved")

    monkeypatch.setattr(socket, "getaddrinfo", no_lookups)
    for resolver in ("system", "test"):
        (name, address), ev = _admit(ProxyConfig(resolver=resolver, services=SERVICES), _grant(LEDGER), LEDGER)
        assert (name, address) == (LEDGER, LEDGER_IP)
        assert ev["service"] is True and ev["decision"] == "allowed"


def test_a_service_off_the_allowlist_is_refused_before_anything_else():
    denied, ev = _admit(ProxyConfig(services=SERVICES), _grant("api.example.com"), LEDGER)
    assert denied.reason == "not_allowlisted" and "address" not in ev
    # The allowlist's ports hold for a service as for any host.
    denied, _ = _admit(ProxyConfig(services=SERVICES), _grant(f"{LEDGER}:80"), LEDGER, 8080)
    assert denied.reason == "not_allowlisted"


@pytest.mark.parametrize("mapped", [LEDGER_IP, "::ffff:10.9.0.2"])
def test_the_pinned_address_under_another_name_is_refused_even_inside_a_test_network(mapped):
    config = ProxyConfig(resolver="test", services=SERVICES, test_hosts={"other.test": [mapped]},
                         test_networks=["10.9.0.0/24", "::ffff:10.9.0.0/120"])
    denied, ev = _admit(config, _grant("other.test"), "other.test")
    assert denied.reason == "address_refused" and f"service {LEDGER}" in denied.detail
    assert ev["address"] == mapped and "service" not in ev


def test_red_check_without_the_address_check_the_other_name_gets_through():
    config = ProxyConfig(resolver="test", services=SERVICES, test_hosts={"other.test": [LEDGER_IP]},
                         disabled_checks=frozenset({"address"}))
    (name, address), _ = _admit(config, _grant("other.test"), "other.test")
    assert (name, address) == ("other.test", LEDGER_IP)


def test_nothing_else_of_the_services_network_is_opened():
    # The service's neighbour is an ordinary private address: refused as one.
    config = ProxyConfig(resolver="test", services=SERVICES, test_hosts={"neighbour.test": [NEIGHBOUR_IP]})
    denied, _ = _admit(config, _grant("neighbour.test"), "neighbour.test")
    assert denied.reason == "address_refused" and "private" in denied.detail


def test_the_bare_pinned_address_is_refused_even_without_the_ip_literal_check():
    config = ProxyConfig(resolver="test", services=SERVICES, disabled_checks=frozenset({"ip_literal", "allowlist"}),
                         test_networks=["10.9.0.0/24"])
    denied, _ = _admit(config, _grant(LEDGER), LEDGER_IP)
    assert denied.reason == "address_refused" and f"service {LEDGER}" in denied.detail


# -- through a call's socket: the pinned address is what the proxy connects to -------------------


@pytest.fixture
def harness():
    state = tempfile.mkdtemp(prefix="rfs-")  # short: a unix socket path must fit in 108 bytes
    h = ProxyHarness(ProxyConfig(control_socket=os.path.join(state, "control.sock"),
                                 calls_dir=os.path.join(state, "calls"), resolver="test",
                                 test_hosts={"other.test": [LEDGER_IP]}, services=SERVICES))
    yield h
    h.close()
    shutil.rmtree(state, ignore_errors=True)


def test_the_proxy_connects_to_the_pinned_address_and_only_for_the_service_name(harness):
    call = harness.grant([LEDGER, "other.test"])
    reply = http_get(call.sock, f"http://{LEDGER}/stats", call.auth)
    # The recording connector opens nothing off loopback: it records the attempt and fails it.
    assert reply.status == 502 and reply.reason == "connect_failed"
    refused = http_get(call.sock, "http://other.test/stats", call.auth)
    assert refused.status == 403 and refused.reason == "address_refused"
    assert harness.connector.attempts == [(LEDGER_IP, 80)]
    events = {e["host"]: e for e in harness.channel.revoke(call.user)["events"]}
    assert events[LEDGER]["service"] is True and events[LEDGER]["address"] == LEDGER_IP
    assert events["other.test"]["reason"] == "address_refused"
