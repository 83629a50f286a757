"""The incident-response demo's services and tools, for real: the tool image's fetch_url,
issue_credit and write_file, run by the real DockerBackend; the runbooks service and the ledger
in their own pinned images, side by side on one internal network of this test; the real egress
proxy in front, knowing both as declared services (ProxySettings.services).

Every assertion about what happened is made at the receiver (`Runbooks.stats()`,
`Ledger.stats()`, `credits(key)`, asked through `docker exec` on the service's own loopback),
never from a tool's reply alone. `network` counts only what reached a service over the network,
i.e. through the proxy.

Network: the sandboxes have no network at all (only their call's socket to the proxy); the
proxy sits on the services' network and on an internal "outside" network with nothing on it;
its test resolver maps one name (`other.test`) to the runbooks service's own address. No packet
leaves this test's networks, and nothing is resolved by the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from dataclasses import dataclass

import pytest
from egress_support import INHIBIT

from ringfence_server.control.registry import ToolManifest
from ringfence_server.control.resource_policy import call_allowlist
from ringfence_server.control.tools import load_builtin
from ringfence_server.demo_services.ledger import LEDGER_HOST, Ledger
from ringfence_server.demo_services.runbooks import RUNBOOKS_HOST, Runbooks, RunbooksError, RunbooksSettings
from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.egress.grant import EgressGrant
from ringfence_server.sandbox.egress.proxy import EgressProxy, ProxySettings
from ringfence_server.sandbox.profile import SandboxProfile
from ringfence_server.sandbox.result import Outcome, ToolErrorClass

pytestmark = pytest.mark.docker

TOOLS = load_builtin()


def builtin(name: str) -> ToolManifest:
    """The built-in tool `name`'s manifest."""
    manifest = TOOLS.get(name)
    assert manifest is not None, f"no built-in tool {name!r}"
    return manifest


# Each call's allowlist as dispatch computes it: the tool's declared hosts AND what policy grants
# (here policy grants exactly what the demo configures).
FETCH_GRANT = EgressGrant(allow=call_allowlist(builtin("fetch_url"), (RUNBOOKS_HOST,)))
CREDIT_GRANT = EgressGrant(allow=call_allowlist(builtin("issue_credit"), (LEDGER_HOST,)))
# A name the proxy's test resolver maps to the runbooks service's own address.
OTHER = "other.test"
NOTHING = {"connections": 0, "requests": 0}


@pytest.fixture
def outside(docker_client):
    """The proxy's way out in these tests: an internal network with nothing on it."""
    net = docker_client.networks.create(f"rf-test-demo-out-{uuid.uuid4().hex[:6]}", driver="bridge",
                                        internal=True, options=INHIBIT, labels=L.base_labels("test"))
    yield net.name
    net.remove()


@dataclass
class Stack:
    ledger: Ledger
    runbooks: Runbooks
    proxy: EgressProxy
    backend: DockerBackend

    def run_tool(self, tool: str, arguments: dict, key: str | None = None, grant: EgressGrant | None = None):
        call_id = f"c-{uuid.uuid4().hex[:8]}"
        body = json.dumps({"tool": tool, "arguments": arguments, "call_id": call_id, "idempotency_key": key})
        profile = SandboxProfile(egress=grant, timeout_s=30)
        return self.backend.run(SandboxRequest(profile=profile, argv=(), stdin=body.encode(), run_id="it-demo",
                                               call_id=call_id))

    def fetch(self, url: str, grant: EgressGrant = FETCH_GRANT):
        return self.run_tool("fetch_url", {"url": url}, grant=grant)

    def issue(self, key: str | None, **arguments):
        return self.run_tool("issue_credit", {"account": "acme-9", "amount": 50, **arguments}, key, CREDIT_GRANT)


@pytest.fixture
def stack(docker_client, pinned_images, outside):
    with contextlib.ExitStack() as es:
        ledger = es.enter_context(Ledger(docker_client, lock=pinned_images))
        # Beside the ledger, on its network: one service network for the proxy to join.
        runbooks = es.enter_context(Runbooks(docker_client, lock=pinned_images, network=ledger.network))
        subnet = docker_client.networks.get(ledger.network).attrs["IPAM"]["Config"][0]["Subnet"]
        settings = ProxySettings(
            outside_networks=(outside,), service_networks=(ledger.network,),
            services={**ledger.services(), **runbooks.services()},
            # The services' network is a *test* network here, where private addresses are otherwise
            # allowed: their addresses must still be refused under any other name.
            resolver="test", test_hosts={OTHER: [runbooks.address]}, test_networks=(subnet,))
        proxy = es.enter_context(EgressProxy(docker_client, lock=pinned_images, settings=settings))
        yield Stack(ledger, runbooks, proxy, DockerBackend(docker_client, lock=pinned_images, egress_proxy=proxy))


def content(result) -> dict:
    assert result.outcome is Outcome.OK, (result.outcome, result.message, result.stdout[-2000:], result.stderr[-2000:])
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert doc["ok"] is True
    return doc["content"]


def key() -> str:
    return "k-" + uuid.uuid4().hex


# -- the runbooks service ------------------------------------------------------------------------


def test_the_runbooks_service_is_hardened_and_shares_only_the_services_network(docker_client, stack):
    attrs = stack.runbooks.container.attrs
    host, config = attrs["HostConfig"], attrs["Config"]
    assert config["User"] == "10001:10001" and host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"] and host["Privileged"] is False
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert config["Entrypoint"] == ["/usr/bin/tini", "--"] and not host.get("Init")
    assert not host["PortBindings"] and not attrs["Mounts"]  # nothing published, no host path
    labels = config["Labels"]
    assert labels[L.PRODUCT_LABEL] == L.PRODUCT and labels[L.PURPOSE_LABEL] == "runbooks"
    assert labels[L.TEST_SESSION_LABEL] == os.environ[L.TEST_SESSION_ENV]
    assert set(attrs["NetworkSettings"]["Networks"]) == {stack.ledger.network}
    net = docker_client.networks.get(stack.ledger.network)
    assert net.attrs["Internal"] is True
    assert {c.name for c in net.containers} == {stack.ledger.name, stack.runbooks.name, stack.proxy.name}


# -- fetch_url -----------------------------------------------------------------------------------


def test_fetch_url_reads_a_runbook_through_the_proxy(stack):
    r = stack.fetch(f"http://{RUNBOOKS_HOST}/runbooks/credit-policy")
    got = content(r)
    assert got["status"] == 200 and got["content_type"] == "application/json" and got["truncated"] is False
    doc = json.loads(got["body"])
    assert doc["name"] == "credit-policy" and "up to $100" in doc["text"]
    # At the receiver: exactly one request, over the network, for that runbook.
    stats = stack.runbooks.stats()
    assert stats["network"] == {"connections": 1, "requests": 1}
    assert stats["served"] == {"credit-policy": 1} and stats["not_found"] == 0
    # The proxy admitted it as the declared service, at its pinned address.
    [event] = r.egress_events
    assert event["decision"] == "allowed" and event["service"] is True
    assert (event["host"], event["port"], event["address"]) == (RUNBOOKS_HOST, 80, stack.runbooks.address)
    assert stack.ledger.stats()["network"] == NOTHING


def test_fetch_url_reads_the_text_form(stack):
    got = content(stack.fetch(f"http://{RUNBOOKS_HOST}/runbooks/disk-full.txt"))
    assert got["content_type"].startswith("text/plain") and got["body"].startswith("Disk full on a host\n")
    assert stack.runbooks.stats()["served"] == {"disk-full": 1}


@pytest.mark.parametrize("url", [
    f"http://{OTHER}/runbooks/credit-policy",     # resolves (test resolver) to the runbooks' own address
    f"http://{LEDGER_HOST}/stats",               # a declared service, but not fetch_url's
    "http://example.com/",                       # not resolvable here at all: refused before any look-up
])
def test_fetch_url_to_any_other_host_is_refused_by_the_proxy(stack, url):
    r = stack.fetch(url)
    assert r.outcome is Outcome.TOOL_ERROR and r.error_class is ToolErrorClass.FATAL, (r.outcome, r.message)
    assert "not_allowlisted" in r.message
    [event] = r.egress_events
    assert event["decision"] != "allowed" and event["reason"] == "not_allowlisted"
    # Nothing reached either service.
    assert stack.runbooks.stats()["network"] == NOTHING
    assert stack.ledger.stats()["network"] == NOTHING


def test_the_runbooks_address_under_another_granted_name_is_refused(stack):
    # Even a grant that names OTHER does not make the service's address reachable under it.
    r = stack.fetch(f"http://{OTHER}/runbooks/credit-policy", grant=EgressGrant(allow=(OTHER, RUNBOOKS_HOST)))
    assert r.outcome is Outcome.TOOL_ERROR and r.error_class is ToolErrorClass.FATAL
    [event] = r.egress_events
    assert event["reason"] == "address_refused" and event["address"] == stack.runbooks.address
    assert stack.runbooks.stats()["network"] == NOTHING


def test_a_missing_runbook_is_invalid(stack):
    r = stack.fetch(f"http://{RUNBOOKS_HOST}/runbooks/no-such-runbook")
    assert r.outcome is Outcome.TOOL_ERROR and r.error_class is ToolErrorClass.INVALID, (r.outcome, r.message)
    assert "HTTP 404" in r.message and "no runbook at /runbooks/no-such-runbook" in r.message
    stats = stack.runbooks.stats()
    assert stats["network"]["requests"] == 1 and stats["not_found"] == 1 and stats["served"] == {}


def test_fetch_url_without_a_grant_has_no_route(stack):
    r = stack.fetch(f"http://{RUNBOOKS_HOST}/runbooks/disk-full", grant=None)
    assert r.outcome is Outcome.TOOL_ERROR and r.error_class is ToolErrorClass.FATAL and "no route" in r.message
    assert stack.runbooks.stats()["network"] == NOTHING


# -- issue_credit --------------------------------------------------------------------------------


def test_issue_credit_applies_once_per_key_at_the_ledger(stack):
    k = key()
    first = content(stack.issue(k, reason="INC-7: double charge"))
    second = content(stack.issue(k, reason="INC-7: double charge"))
    assert first["applied"] is True and first["replayed"] is False and first["idempotency_key"] == k
    assert second["replayed"] is True and second["id"] == first["id"]
    stats = stack.ledger.stats()
    assert stats["credits"] == 1 and stats["replays"] == 1
    assert stats["network"]["requests"] == 2  # both calls reached it, through the proxy
    assert stack.ledger.balance("acme-9") == {"account": "acme-9", "balance": 50, "credits": 1}
    record = stack.ledger.credits(k)
    assert record["amount"] == 50 and record["reason"] == "INC-7: double charge"
    # Its reconcile look-up (credit_lookup) finds the effect by the same key.
    found = content(stack.run_tool("credit_lookup", {"idempotency_key": k}, grant=CREDIT_GRANT))
    assert found == {"found": True, "record": record}
    assert stack.runbooks.stats()["network"] == NOTHING


def test_issue_credit_the_same_key_with_another_reason_applies_nothing(stack):
    k = key()
    content(stack.issue(k, reason="INC-7"))
    r = stack.issue(k, reason="INC-8")
    assert r.outcome is Outcome.TOOL_ERROR and r.error_class is ToolErrorClass.INVALID
    stats = stack.ledger.stats()
    assert stats["credits"] == 1 and stats["conflicts"] == 1
    assert stack.ledger.credits(k)["reason"] == "INC-7"


def test_issue_credit_without_a_key_never_reaches_the_ledger(stack):
    r = stack.issue(None, reason="INC-7")
    assert r.outcome is Outcome.TOOL_ERROR and r.error_class is ToolErrorClass.INVALID
    assert "idempotency key" in r.message
    stats = stack.ledger.stats()
    assert stats["network"] == NOTHING and stats["credits"] == 0


# -- write_file ----------------------------------------------------------------------------------


def test_write_file_delivers_the_file_in_its_result(backend):
    text = "# INC-7\n\nCredited acme-9 with $50 (double charge).\n"

    def write(path):
        body = json.dumps({"tool": "write_file", "arguments": {"path": path, "content": text}, "call_id": "w",
                           "idempotency_key": key()})
        return backend.run(SandboxRequest(profile=SandboxProfile(timeout_s=30), argv=(), stdin=body.encode(),
                                          run_id="it-demo", call_id=f"w-{uuid.uuid4().hex[:8]}"))

    got = content(write("incident/INC-7.md"))
    assert got == {"path": "/output/incident/INC-7.md", "bytes": len(text.encode()), "content": text}
    # The tool refuses what resource policy refuses at admission, should a call ever get past it.
    bad = write("/output/../etc/cron.d/x")
    assert bad.outcome is Outcome.TOOL_ERROR and bad.error_class is ToolErrorClass.INVALID


# -- the helpers clean up ------------------------------------------------------------------------


def test_runbooks_on_its_own_network_leaves_nothing_behind(docker_client, pinned_images):
    with Runbooks(docker_client, lock=pinned_images) as runbooks:
        name, network = runbooks.name, runbooks.network
        assert network == f"{name}-net"
        net = docker_client.networks.get(network)
        assert net.attrs["Internal"] is True and net.attrs["Labels"][L.PRODUCT_LABEL] == L.PRODUCT
        assert runbooks.services() == {RUNBOOKS_HOST: (runbooks.address,)}
        assert runbooks.runbook("disk-full")["title"] == "Disk full on a host"
        assert runbooks.runbook("nope") is None
        assert runbooks.stats()["network"] == NOTHING  # the host's own asks are not network traffic
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    assert docker_client.networks.list(names=[network]) == []


class _Broken(RunbooksSettings):
    def command(self) -> list[str]:
        return [*super().command(), "--no-such-flag"]  # the service refuses to start


def test_a_runbooks_service_that_does_not_come_up_says_why_and_leaves_nothing(docker_client, pinned_images):
    runbooks = Runbooks(docker_client, lock=pinned_images, settings=_Broken())
    with pytest.raises(RunbooksError) as e:
        runbooks.start()
    assert "status exited" in str(e.value) and "unrecognized arguments: --no-such-flag" in str(e.value)
    assert docker_client.containers.list(all=True, filters={"name": runbooks.name}) == []
    assert docker_client.networks.list(names=[f"{runbooks.name}-net"]) == []
