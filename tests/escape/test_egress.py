"""Egress-enabled tools (ESCAPE-BATTERY case 29, and cases 25-28 for tools that have egress).

Every request runs from inside a real sandbox (pinned tool image, DockerBackend with an egress
grant) through the real egress-proxy container. The decoys are `base` containers on this
test's own internal networks (sandbox.egress.testing.EgressTestbed) that log every TCP
connection at accept and every UDP datagram: "refused" is shown by the decoy's log staying
empty, never by the mere absence of an error. Each protection has a red check: the same
attack with exactly that protection removed (a proxy with one check switched off by its TEST
config, a backend that bypasses the proxy, a network whose bridge keeps its host address),
and the decoy then sees the connection.

No packet is ever aimed outside the test's networks: the metadata *address* is proven refused
by the classifier's unit tests; here a fake metadata server on a link-local test network
(169.254.250.0/24) stands in for it, and the proxy's test resolver maps every name.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest
from docker.types import Mount

from sandbox.backend import SandboxRequest
from sandbox.docker_backend import DockerBackend
from sandbox.egress.grant import MiB, EgressGrant
from sandbox.egress.proxy import EgressProxy
from sandbox.egress.testing import SANDBOX_CLIENT
from sandbox.profile import SandboxProfile
from sandbox.result import Outcome

pytestmark = pytest.mark.docker

ARGV = ("python3", "-I", "-S", "-B", "-c", SANDBOX_CLIENT)


class Runner:
    """Runs a list of client operations in one sandbox call; keeps the proxy's report."""

    def __init__(self, client, lock, proxy, backend_class=DockerBackend) -> None:
        self.reports = []
        self.backend = backend_class(client, lock=lock, egress_proxy=proxy,
                                     on_egress_report=lambda _req, rep: self.reports.append(rep))

    def __call__(self, ops, allow=("allowed.test",), **grant):
        profile = SandboxProfile(egress=EgressGrant(allow=tuple(allow), **grant), timeout_s=60)
        result = self.backend.run(SandboxRequest(profile=profile, argv=ARGV, stdin=json.dumps(ops).encode(),
                                                 run_id="escape-egress"))
        assert result.outcome is Outcome.OK, (result.outcome, result.message, result.stderr[-2000:])
        return json.loads(result.stdout)

    @property
    def events(self):
        return list(self.reports[-1].events)


@pytest.fixture
def run(docker_client, pinned_images, proxy):
    return Runner(docker_client, pinned_images, proxy)


@pytest.fixture
def run_with(docker_client, pinned_images, testbed):
    """run_with(disabled_checks=..., backend_class=..., proxy_class=...) -> a Runner whose
    proxy (a fresh one) or backend has exactly one protection removed."""

    def make(disabled_checks=(), backend_class=DockerBackend, proxy_class=None, proxy=None):
        p = proxy or testbed.proxy(disabled_checks, proxy_class=proxy_class)
        return Runner(docker_client, pinned_images, p, backend_class)

    return make


class Seen:
    """New connections a decoy logged since this object was made (decoys are shared)."""

    def __init__(self, decoy) -> None:
        self.decoy = decoy
        self.before = len(decoy.connections())

    def new(self) -> list[dict]:
        return self.decoy.connections()[self.before :]


# -- the allowed request ---------------------------------------------------------------------


def test_allowed_requests_succeed_and_are_events_of_the_call(run, testbed):
    seen = Seen(testbed.decoys["allowed"])
    http, https = run([{"op": "get", "url": "http://allowed.test/"}, {"op": "get", "url": "https://allowed.test/"}])
    assert http == {"status": 200, "body": "hello from allowed\n", "size": 19}
    assert https == {"status": 200, "body": "hello from allowed\n", "size": 19}
    assert [(c["port"], c["tls"]) for c in seen.new()] == [(80, False), (443, True)]
    assert [(e["method"], e["host"], e["port"], e["decision"]) for e in run.events] == [
        ("GET", "allowed.test", 80, "allowed"), ("CONNECT", "allowed.test", 443, "allowed")]
    assert all(e["bytes_down"] > 0 and e["address"] == testbed.decoys["allowed"].ip for e in run.events)


# -- case 29 ---------------------------------------------------------------------------------


def test_host_off_the_allowlist(run, run_with, testbed):
    ops = [{"op": "get", "url": "http://denied.test/"}, {"op": "get", "url": "https://denied.test/"}]
    seen = Seen(testbed.decoys["denied"])
    plain, tls = run(ops)
    assert (plain["status"], plain["reason"]) == (403, "not_allowlisted")
    assert "error" in tls and "403" in tls["error"]  # urllib: "Tunnel connection failed: 403"
    assert [(e["host"], e["reason"]) for e in run.events] == [("denied.test", "not_allowlisted")] * 2
    assert seen.new() == []
    # Red: the same requests through a proxy whose allowlist check is off reach the decoy.
    red = run_with(disabled_checks={"allowlist"})
    plain, tls = red(ops)
    assert plain["status"] == 200 and tls["status"] == 200
    assert len(seen.new()) == 2


def test_subdomain_of_an_exact_entry(run, run_with, testbed):
    ops = [{"op": "get", "url": "http://www.allowed.test/"}, {"op": "get", "url": "https://www.allowed.test/"}]
    seen = Seen(testbed.decoys["allowed"])
    plain, tls = run(ops, allow=("allowed.test",))
    assert (plain["status"], plain["reason"]) == (403, "not_allowlisted") and "403" in tls["error"]
    assert seen.new() == []
    plain, _ = run_with(disabled_checks={"allowlist"})(ops, allow=("allowed.test",))
    assert plain["status"] == 200 and len(seen.new()) == 2


def test_https_to_a_bare_ip(run, run_with, testbed):
    ip = testbed.decoys["iponly"].ip
    ops = [{"op": "get", "url": f"https://{ip}/"}, {"op": "connect", "target": f"{ip}:443", "sni": None},
           {"op": "get", "url": f"http://{ip}/"}]
    seen = Seen(testbed.decoys["iponly"])
    tls, connect, plain = run(ops)
    assert "403" in tls["error"] and (connect["status"], connect["reason"]) == (403, "ip_literal")
    assert (plain["status"], plain["reason"]) == (403, "ip_literal")
    assert {e["reason"] for e in run.events} == {"ip_literal"}
    assert seen.new() == []
    # Red: three checks stand in the way of TLS to a bare IP (the IP is no name, no allowlist
    # entry matches it, and the ClientHello carries no SNI); with all three off it goes through.
    tls, connect, plain = run_with(disabled_checks={"ip_literal", "allowlist", "sni"})(ops)
    assert tls["status"] == 200 and connect["status"] == 200 and plain["status"] == 200
    assert len(seen.new()) == 3


def test_sni_or_host_that_is_not_the_connect_target(run, run_with, testbed):
    ops = [{"op": "connect", "target": "allowed.test:443", "sni": "denied.test"},
           {"op": "http_raw", "url": "http://allowed.test/", "host": "denied.test"}]
    seen_allowed, seen_denied = Seen(testbed.decoys["allowed"]), Seen(testbed.decoys["denied"])
    sni, host = run(ops)
    assert sni["status"] == 200 and "error" in sni  # the tunnel closed on the ClientHello
    assert (host["status"], host["reason"]) == (403, "host_mismatch")
    assert [e["reason"] for e in run.events] == ["sni_mismatch", "host_mismatch"]
    assert run.events[0]["sni"] == ["denied.test"]
    assert seen_allowed.new() == [] and seen_denied.new() == []
    # Red: without the SNI check the ClientHello for denied.test goes to allowed.test's address.
    red = run_with(disabled_checks={"sni", "host_header"})
    sni, host = red(ops)
    assert "error" not in sni and host["status"] == 200
    assert len(seen_allowed.new()) == 2
    assert {"decoy": "allowed", "event": "tls", "sni": "denied.test"} in testbed.decoys["allowed"].events()


def _with_spoofed_hosts(ip: str, directory):
    hosts = directory / "spoofed-hosts"
    hosts.write_text(f"127.0.0.1\tlocalhost\n{ip}\tallowed.test\n")
    hosts.chmod(0o444)

    class SpoofedHosts(DockerBackend):
        """A sandbox whose /etc/hosts maps allowed.test to the denied decoy (what a tool that
        could write /etc/hosts would do). Exists only in this test."""

        def _apply_egress(self, settings, call):
            settings = super()._apply_egress(settings, call)
            settings["mounts"] = [m for m in settings["mounts"] if m["Target"] != "/etc/hosts"] + [
                Mount(target="/etc/hosts", source=str(hosts), type="bind", read_only=True)]
            return settings

    return SpoofedHosts


def loosened(change):
    """An egress backend whose settings `change(settings)` alters. Red checks only."""

    class Loosened(DockerBackend):
        def _apply_egress(self, settings, call):
            settings = super()._apply_egress(settings, call)
            change(settings)
            return settings

    return Loosened


def test_etc_hosts_spoof(run, run_with, testbed, proxy, tmp_path):
    denied = testbed.decoys["denied"]
    # 1. The sandbox cannot write /etc/hosts: it is a read-only bind of a 0444 file, on a
    # read-only root, and the sandbox is not root.
    [write] = run([{"op": "write_hosts"}])
    assert write["written"] is False
    # Red: as root, with a writable root and Docker's own (0644, root's) /etc/hosts instead of
    # ours, the same write succeeds -- still without capabilities.
    def writable_hosts(settings):
        settings.update(user="0:0", read_only=False)
        settings["mounts"] = [m for m in settings["mounts"] if m["Target"] != "/etc/hosts"]

    [write] = run_with(backend_class=loosened(writable_hosts), proxy=proxy)([{"op": "write_hosts"}])
    assert write["written"] is True, write
    # 2. And were the mapping there, the proxy ignores it: it resolves names itself.
    seen_denied, seen_allowed = Seen(denied), Seen(testbed.decoys["allowed"])
    spoofed = run_with(backend_class=_with_spoofed_hosts(denied.ip, tmp_path), proxy=proxy)
    local, by_name, by_ip = spoofed([
        {"op": "resolve", "name": "allowed.test"},
        {"op": "get", "url": "http://allowed.test/"},
        {"op": "connect", "target": f"{denied.ip}:443", "sni": "allowed.test"},
    ])
    assert local == {"addresses": [denied.ip]}  # the sandbox believes the spoof ...
    assert by_name["body"] == "hello from allowed\n"  # ... the proxy does not
    assert (by_ip["status"], by_ip["reason"]) == (403, "ip_literal")
    assert spoofed.events[0]["address"] == testbed.decoys["allowed"].ip
    assert len(seen_allowed.new()) == 1 and seen_denied.new() == []


@pytest.mark.parametrize("name, decoy", [("private.test", "private"), ("metadata.test", "metadata")])
def test_private_and_link_local_ranges_even_if_allowlisted(run, run_with, testbed, name, decoy):
    if decoy not in testbed.decoys:
        pytest.fail("the engine refused the link-local test network; the fake metadata decoy is missing")
    ops = [{"op": "get", "url": f"http://{name}/latest/meta-data/"}, {"op": "get", "url": f"https://{name}/"}]
    seen = Seen(testbed.decoys[decoy])
    plain, tls = run(ops, allow=(name,))
    assert (plain["status"], plain["reason"]) == (403, "address_refused") and "403" in tls["error"]
    assert all(e["reason"] == "address_refused" and e["address"] == testbed.decoys[decoy].ip for e in run.events)
    assert seen.new() == []
    # Red: with the address check off the proxy connects to the private/link-local decoy.
    plain, _ = run_with(disabled_checks={"address"})(ops, allow=(name,))
    assert plain["status"] == 200 and plain["body"] == f"hello from {decoy}\n"
    assert len(seen.new()) >= 1


def test_connect_relayed_through_a_second_hop(run, run_with, testbed):
    """allowed.test runs a forward proxy of its own. A CONNECT to it followed by a CONNECT for
    the denied decoy inside the tunnel would relay the call anywhere: the tunnel's first bytes
    are not a TLS ClientHello, so nothing goes upstream at all."""
    denied = testbed.decoys["denied"]
    inner = f"CONNECT {denied.ip}:80 HTTP/1.1\r\n\r\nGET / HTTP/1.0\r\nHost: denied.test\r\n\r\n"
    ops = [{"op": "connect", "target": "allowed.test:80", "tls": False, "payload": inner}]
    seen_allowed, seen_denied = Seen(testbed.decoys["allowed"]), Seen(denied)
    [hop] = run(ops)
    assert hop["status"] == 200 and hop["size"] == 0
    assert run.events[0]["reason"] == "not_tls"
    assert seen_allowed.new() == [] and seen_denied.new() == []
    [hop] = run_with(disabled_checks={"sni"})(ops)  # red: the TLS-only tunnel check off
    assert "hello from denied" in hop["body"]
    assert len(seen_denied.new()) == 1
    assert any(e.get("event") == "relayed" for e in testbed.decoys["allowed"].events())


# -- ceilings and credentials ----------------------------------------------------------------


def test_byte_ceiling_cuts_a_large_download(run):
    [big] = run([{"op": "http_raw", "url": "http://allowed.test/big?n=8388608", "host": "allowed.test"}],
                max_bytes=1 * MiB)
    assert big["status"] == 200 and big["size"] < 1 * MiB
    [event] = run.events
    assert event["cut"] == "byte_limit" and event["bytes_down"] <= 1 * MiB
    assert run.reports[-1].bytes > 1 * MiB  # what was offered; what got through is capped


def test_credentials_stop_working_after_the_call(run, docker_client, testbed):
    [first] = run([{"op": "env"}])
    old = first["proxy"].split("//", 1)[1].split("@", 1)[0]
    user, password = old.split(":", 1)
    first_network = run.reports[-1]
    seen = Seen(testbed.decoys["allowed"])
    # A later call presents the first call's credentials to the proxy: refused.
    replay, own = run([
        {"op": "http_raw", "url": "http://allowed.test/", "host": "allowed.test", "user": user, "password": password},
        {"op": "http_raw", "url": "http://allowed.test/", "host": "allowed.test"},
    ])
    assert (replay["status"], replay["reason"]) == (407, "credentials_invalid")
    assert own["status"] == 200 and len(seen.new()) == 1
    assert first_network.error is None
    # The first call's network is gone as well.
    assert not [n for n in docker_client.networks.list() if n.name.startswith(f"rf-egress-{first_network.call_id[:20]}")]


def test_tools_without_egress_still_have_only_lo(attack, proxy):
    r = attack(list(ARGV), stdin=json.dumps([{"op": "netinfo"}]).encode())
    [info] = json.loads(r.stdout)
    assert info["interfaces"] == ["lo"] and info["routes"] == []


# -- cases 25-28 for egress-enabled tools ------------------------------------------------------


class BypassProxy(DockerBackend):
    """Puts the sandbox straight on the decoys' network instead of its own (red check only)."""

    network: str = ""

    def _apply_egress(self, settings, call):
        settings = super()._apply_egress(settings, call)
        settings["network_mode"] = self.network
        return settings


def test_25_only_the_call_network_and_no_direct_path_to_decoys(run, run_with, testbed, proxy):
    d = testbed.decoys["allowed"]
    ops = [{"op": "netinfo"}, {"op": "direct", "ip": d.ip, "port": 80}, {"op": "udp", "ip": d.ip, "port": 9999},
           {"op": "direct", "ip": testbed.decoys["private"].ip, "port": 80}]
    seen = Seen(d)
    info, tcp, udp, tcp_private = run(ops)
    assert info["interfaces"] == ["lo", "eth0"] and info["if_inet6"] == ""
    # One on-link route (the call's own network, none of the decoys'), plus the default route
    # whose gateway no one holds (test_26_27).
    on_link = {r["dest"] for r in info["routes"] if r["dest"] != "0.0.0.0"}
    assert len(on_link) == 1 and on_link.isdisjoint(s.split("/")[0] for s in testbed.subnets.values())
    assert tcp["connected"] is False and tcp_private["connected"] is False
    assert seen.new() == []  # neither the TCP connect nor the datagram arrived
    # Red: joined to the decoys' network directly, the same probes arrive.
    BypassProxy.network = testbed.networks["outside"].name
    _, tcp, udp, _ = run_with(backend_class=BypassProxy, proxy=proxy)(ops)
    assert tcp["connected"] is True
    new = seen.new()
    assert {"tcp", "udp"} <= {c["event"] for c in new}


class ExposedGateway(EgressProxy):
    """Per-call networks whose bridge keeps the host's gateway address (red check only)."""

    def _call_network_options(self):
        options = super()._call_network_options()
        options["options"] = {}
        return options


@pytest.fixture
def host_listener():
    """A listener on the host (all addresses, ephemeral port) that records who connected."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("0.0.0.0", 0))
    s.listen(16)
    s.settimeout(0.2)
    peers: list[str] = []
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                conn, peer = s.accept()
                peers.append(peer[0])
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield s.getsockname()[1], peers
    stop.set()
    t.join(2)
    s.close()


def test_26_27_host_and_gateway_unreachable(run, run_with, host_listener):
    port, peers = host_listener
    info, probe = run([{"op": "netinfo"}, {"op": "direct_gateway", "port": port}])
    gateway = next(r["gateway"] for r in info["routes"] if r["dest"] == "0.0.0.0")
    assert probe["gateway"] == gateway and probe["connected"] is False
    assert peers == []
    # The route to the metadata address (and everything else) is only this gateway, which no
    # host interface holds: nothing on the path answers, and the proxy refuses the range itself.
    assert {r["gateway"] for r in info["routes"]} <= {gateway, "0.0.0.0"}
    # Red: with the host's address left on the call network's bridge, the host answers.
    red = run_with(proxy_class=ExposedGateway)
    _, probe = red([{"op": "netinfo"}, {"op": "direct_gateway", "port": port}])
    assert probe["connected"] is True and len(peers) == 1  # the host saw the sandbox connect
    assert peers[0].rsplit(".", 2)[0] == probe["gateway"].rsplit(".", 2)[0]  # from the call network


def test_28_dns_gets_no_answer_and_queries_stay_in_the_sandbox(run):
    """The sandbox's resolv.conf names only 127.0.0.1 (its own loopback, where nothing listens).
    Docker's embedded resolver (127.0.0.11, present on every user-defined network) can still
    be queried directly; it answers nothing useful -- decoy names do not resolve -- and it
    forwards an unknown name to the configured DNS, 127.0.0.1 *in the sandbox's own
    namespace*: shown by the query arriving at a listener the sandbox itself holds there. A
    red check would need the engine to forward to the host's resolver, i.e. a packet off the
    machine: deliberately not done."""
    resolved, probe, info = run([{"op": "resolve", "name": "allowed.test"},
                                 {"op": "dns_forward", "name": "rfexfil-probe.invalid"}, {"op": "netinfo"}])
    assert "error" in resolved
    assert probe["listener"] == "bound" and probe["forwarded_to_own_loopback"] is True
    assert probe["answer"] is None or probe["answer"]["answers"] == 0
    # The sandbox's own resolver configuration names only its own loopback.
    nameservers = [line.split()[1] for line in info["resolv_conf"].splitlines() if line.startswith("nameserver")]
    assert nameservers == ["127.0.0.1"]
