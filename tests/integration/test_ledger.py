"""Effects happen once, counted at the receiver: the `credit` tool of the real tool image, run by
the real DockerBackend, reaches the real ledger (its own container on the test's own internal
network) only through the real egress proxy, which knows the ledger as a declared service
(ProxySettings.services: the name pinned to the ledger's address).

Every assertion about an effect is made at the ledger (`Ledger.stats()`, `credits(key)`,
`balance(account)`, asked through `docker exec` inside its container), never from the tool's
reply alone. `network.requests` counts only what reached the ledger over the network, i.e.
through the proxy; the host's own look-ups come over the container's loopback.

Network: the sandboxes have no network at all (only their call's socket to the proxy); the
proxy sits on two internal networks of this test (its "outside" one, and the ledger's, joined
as a service network); its test resolver maps one name, to the ledger's own address, to show
that address is refused under any name but the service's. No packet leaves those networks.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid

import pytest
from egress_support import INHIBIT, SANDBOX_CLIENT

from ringfence_server.demo_services.ledger import LEDGER_HOST, Ledger, LedgerError, LedgerSettings
from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.egress.channel import EgressError
from ringfence_server.sandbox.egress.grant import EgressGrant
from ringfence_server.sandbox.egress.proxy import EgressProxy, ProxySettings
from ringfence_server.sandbox.profile import SandboxProfile
from ringfence_server.sandbox.result import Outcome, ToolErrorClass

pytestmark = pytest.mark.docker

LEDGER_GRANT = EgressGrant(allow=(LEDGER_HOST,))
# A name the proxy's test resolver maps to the ledger's own address.
OTHER = "other.test"


@pytest.fixture
def outside(docker_client):
    """The proxy's way out in these tests: an internal network with nothing on it."""
    net = docker_client.networks.create(f"rf-test-ledger-out-{uuid.uuid4().hex[:6]}", driver="bridge",
                                        internal=True, options=INHIBIT, labels=L.base_labels("test"))
    yield net.name
    net.remove()


class Stack:
    """A ledger, a proxy that knows it as a service, and a backend whose calls go through them."""

    def __init__(self, docker_client, lock, ledger: Ledger, proxy: EgressProxy) -> None:
        self.ledger, self.proxy = ledger, proxy
        self.backend = DockerBackend(docker_client, lock=lock, egress_proxy=proxy)
        self._n = 0

    def run_tool(self, tool: str, arguments: dict, key: str | None = None, grant: EgressGrant | None = LEDGER_GRANT):
        self._n += 1
        body = json.dumps({"tool": tool, "arguments": arguments, "call_id": f"c{self._n}", "idempotency_key": key})
        profile = SandboxProfile(egress=grant, timeout_s=30)
        return self.backend.run(SandboxRequest(profile=profile, argv=(), stdin=body.encode(), run_id="it-ledger",
                                               call_id=f"c{self._n}"))

    def credit(self, account: str, amount, key: str, **kw):
        return self.run_tool("credit", {"account": account, "amount": amount}, key, **kw)

    def probe(self, ops: list[dict], grant: EgressGrant):
        """The stdlib client of tests/egress_support, run in a sandbox behind the proxy."""
        profile = SandboxProfile(egress=grant, timeout_s=30)
        r = self.backend.run(SandboxRequest(profile=profile, argv=("python3", "-I", "-S", "-B", "-c", SANDBOX_CLIENT),
                                            stdin=json.dumps(ops).encode(), run_id="it-ledger"))
        assert r.outcome is Outcome.OK, (r.outcome, r.stderr[-2000:])
        return json.loads(r.stdout), r


@pytest.fixture
def make_stack(docker_client, pinned_images, outside):
    with contextlib.ExitStack() as stack:

        def make(ledger_settings: LedgerSettings | None = None) -> Stack:
            ledger = stack.enter_context(Ledger(docker_client, lock=pinned_images, settings=ledger_settings))
            subnet = docker_client.networks.get(ledger.network).attrs["IPAM"]["Config"][0]["Subnet"]
            settings = ProxySettings(
                outside_networks=(outside,), service_networks=(ledger.network,), services=ledger.services(),
                # The ledger's whole network is a *test* network here, where private addresses are
                # otherwise allowed: the service's address must still be refused under other names.
                resolver="test", test_hosts={OTHER: (ledger.address,)}, test_networks=(subnet,))
            proxy = stack.enter_context(EgressProxy(docker_client, lock=pinned_images, settings=settings))
            return Stack(docker_client, pinned_images, ledger, proxy)

        yield make


def content(result) -> dict:
    assert result.outcome is Outcome.OK, (result.outcome, result.message, result.stdout[-2000:], result.stderr[-2000:])
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert doc["ok"] is True
    return doc["content"]


def key() -> str:
    return "k-" + uuid.uuid4().hex


def test_the_ledger_is_hardened_and_alone_on_an_internal_network(docker_client, make_stack):
    s = make_stack()
    attrs = s.ledger.container.attrs
    host, config = attrs["HostConfig"], attrs["Config"]
    assert config["User"] == "10001:10001" and host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"] and host["Privileged"] is False
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert not host["PortBindings"] and not attrs["Mounts"]  # nothing published, no host path
    assert "/var/lib/ringfence-ledger" in host["Tmpfs"]
    labels = config["Labels"]
    assert labels[L.PRODUCT_LABEL] == L.PRODUCT and labels[L.PURPOSE_LABEL] == "ledger"
    assert labels[L.TEST_SESSION_LABEL] == os.environ[L.TEST_SESSION_ENV]
    net = docker_client.networks.get(s.ledger.network)
    assert net.attrs["Internal"] is True
    assert net.attrs["Options"].get("com.docker.network.bridge.inhibit_ipv4") == "true"
    # On it: the ledger and the proxy that reaches it, nothing else.
    net.reload()
    assert {c.name for c in net.containers} == {s.ledger.name, s.proxy.name}


def test_the_same_key_twice_is_one_credit_at_the_ledger(make_stack):
    s = make_stack()
    k = key()
    first = content(s.credit("acme-9", 50, k))
    second = content(s.credit("acme-9", 50, k))
    assert first["applied"] is True and first["replayed"] is False and first["idempotency_key"] == k
    assert second["replayed"] is True and second["id"] == first["id"]
    stats = s.ledger.stats()
    assert stats["credits"] == 1 and stats["replays"] == 1
    assert stats["network"]["requests"] == 2  # both calls reached it, through the proxy
    assert s.ledger.balance("acme-9") == {"account": "acme-9", "balance": 50, "credits": 1}
    assert s.ledger.credits(k)["amount"] == 50


def test_two_keys_are_two_credits(make_stack):
    s = make_stack()
    content(s.credit("acme-9", 50, key()))
    content(s.credit("acme-9", 25, key()))
    assert s.ledger.stats()["credits"] == 2
    assert s.ledger.balance("acme-9") == {"account": "acme-9", "balance": 75, "credits": 2}


def test_the_same_key_with_another_amount_is_invalid_and_applies_nothing(make_stack):
    s = make_stack()
    k = key()
    content(s.credit("acme-9", 50, k))
    r = s.credit("acme-9", 500, k)
    assert r.outcome is Outcome.TOOL_ERROR and r.error_class is ToolErrorClass.INVALID
    assert "applied as a credit of 50" in r.message
    stats = s.ledger.stats()
    assert stats["credits"] == 1 and stats["conflicts"] == 1
    assert s.ledger.balance("acme-9")["balance"] == 50
    assert s.ledger.credits(k)["amount"] == 50


def test_a_credit_without_a_key_never_reaches_the_ledger(make_stack):
    s = make_stack()
    r = s.credit("acme-9", 50, None)
    assert r.outcome is Outcome.TOOL_ERROR and r.error_class is ToolErrorClass.INVALID
    assert s.ledger.stats()["network"]["requests"] == 0
    # The ledger itself refuses one too (asked from the host, on its loopback).
    status, body = s.ledger.request("POST", "/credits", {"account": "acme-9", "amount": 50})
    assert status == 400 and "idempotency_key is required" in body["message"]
    assert s.ledger.stats()["credits"] == 0


def test_credit_lookup_finds_an_applied_key_and_not_an_unknown_one(make_stack):
    s = make_stack()
    k = key()
    applied = content(s.credit("acme-7", 12.5, k))
    found = content(s.run_tool("credit_lookup", {"idempotency_key": k}))
    assert found == {"found": True, "record": {f: applied[f] for f in
                                               ("id", "idempotency_key", "account", "amount", "applied_at")}}
    assert content(s.run_tool("credit_lookup", {"idempotency_key": key()})) == {"found": False}
    stats = s.ledger.stats()
    assert stats["credits"] == 1 and stats["network"]["requests"] == 3


def test_a_lost_reply_fails_transient_and_the_retry_is_answered_from_the_record(make_stack):
    s = make_stack(LedgerSettings(fail_after_commit=1))
    k = key()
    lost = s.credit("acme-9", 50, k)
    # The effect happened (committed), the reply did not come back: the runner says transient.
    assert lost.outcome is Outcome.TOOL_ERROR and lost.error_class is ToolErrorClass.TRANSIENT, lost.message
    stats = s.ledger.stats()
    assert stats["credits"] == 1 and stats["dropped_replies"] == 1
    assert s.ledger.credits(k)["amount"] == 50
    # The retry the transient class allows, with the same key: answered from the ledger's record.
    retry = content(s.credit("acme-9", 50, k))
    assert retry["replayed"] is True and retry["idempotency_key"] == k
    stats = s.ledger.stats()
    assert stats["credits"] == 1 and stats["replays"] == 1
    assert s.ledger.balance("acme-9") == {"account": "acme-9", "balance": 50, "credits": 1}


def test_the_ledgers_address_is_refused_under_any_other_name(make_stack):
    s = make_stack()
    grant = EgressGrant(allow=(OTHER, LEDGER_HOST))
    results, r = s.probe([
        {"op": "get", "url": f"http://{OTHER}/stats"},                     # its address, another name
        {"op": "http_raw", "url": f"http://{s.ledger.address}/stats", "host": s.ledger.address},  # bare IP
    ], grant)
    assert results[0] == {"status": 403, "reason": "address_refused"}
    assert results[1]["status"] == 403 and results[1]["reason"] == "ip_literal"
    [refused] = [e for e in r.egress_events if e.get("host") == OTHER]
    assert refused["address"] == s.ledger.address and "service" not in refused
    stats = s.ledger.stats()
    assert stats["network"] == {"connections": 0, "requests": 0}  # nothing reached the ledger


def test_a_service_not_on_the_calls_allowlist_is_refused(make_stack):
    s = make_stack()
    r = s.credit("acme-9", 50, key(), grant=EgressGrant(allow=(OTHER,)))
    assert r.outcome is Outcome.TOOL_ERROR and r.error_class is ToolErrorClass.FATAL
    assert "not_allowlisted" in r.message
    [event] = r.egress_events
    assert event["host"] == LEDGER_HOST and event["reason"] == "not_allowlisted"
    assert s.ledger.stats()["network"] == {"connections": 0, "requests": 0}
    assert s.ledger.stats()["credits"] == 0


def test_the_proxy_admits_the_service_by_its_pinned_address(make_stack):
    s = make_stack()
    r = s.credit("acme-9", 1, key())
    content(r)
    [event] = r.egress_events
    assert event["decision"] == "allowed" and event["service"] is True
    assert (event["host"], event["port"], event["address"]) == (LEDGER_HOST, 80, s.ledger.address)


def test_without_a_route_the_credit_fails_and_nothing_is_applied(make_stack):
    s = make_stack()
    k = key()
    result = s.credit("acme-9", 50, k, grant=None)
    assert result.outcome is Outcome.TOOL_ERROR and result.error_class.value == "fatal"
    assert "no route" in result.message
    assert s.ledger.stats()["credits"] == 0 and s.ledger.credits(k) is None


def test_a_proxy_not_on_the_services_network_refuses_to_start(docker_client, pinned_images, outside):
    # The operator forgot service_networks: the pinned address would be reached, if at all,
    # through a gateway (whatever else holds that private address), so the proxy never starts.
    with Ledger(docker_client, lock=pinned_images) as ledger:
        settings = ProxySettings(outside_networks=(outside,), services=ledger.services(), resolver="test")
        proxy = EgressProxy(docker_client, lock=pinned_images, settings=settings)
        with pytest.raises(EgressError, match="on none of the proxy's networks"):
            proxy.start()
        assert docker_client.containers.list(all=True, filters={"name": proxy.name}) == []
        assert ledger.stats()["network"] == {"connections": 0, "requests": 0}


class _Broken(LedgerSettings):
    def command(self) -> list[str]:
        return [*super().command(), "--fail-after-commit", "0"]  # the ledger refuses to start


def test_a_ledger_that_does_not_come_up_says_why_and_leaves_nothing(docker_client, pinned_images):
    ledger = Ledger(docker_client, lock=pinned_images, settings=_Broken())
    with pytest.raises(LedgerError) as e:
        ledger.start()
    # Like testcontainers: the status and the container's recent logs are in the error.
    assert "status exited" in str(e.value) and "--fail-after-commit must be at least 1" in str(e.value)
    assert docker_client.containers.list(all=True, filters={"name": ledger.name}) == []
    assert docker_client.networks.list(names=[f"{ledger.name}-net"]) == []
