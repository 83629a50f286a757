"""Egress-enabled tools (docs/escape-battery.md case 29, cases 25-28 for tools that have egress, 46 and 47).

Every request runs from inside a real sandbox (pinned tool image, DockerBackend with an egress
grant) through the real egress-proxy container: the sandbox has no network (only lo); the
relay in it listens on 127.0.0.1:3128 and splices to the call's own unix socket, on which the
proxy serves that call alone. The decoys are `base` containers on this test's own internal
networks (egress_support.EgressTestbed) that log every TCP connection at accept and
every UDP datagram: "refused" is shown by the decoy's log staying empty, never by the mere
absence of an error. Each protection has a red check: the same attack with exactly that
protection removed (a proxy with one check switched off by its TEST config, a sandbox attached
to a Docker network or to the host's network namespace), and the attack then succeeds.

No packet is ever aimed outside the test's networks: the metadata *address* is probed only
from a sandbox whose own view has just shown no interface but lo and no route (connect() fails
locally, nothing is sent), and proven refused by the proxy's classifier in its unit tests;
here a fake metadata server on a link-local test network (169.254.250.0/24) stands in for it,
and the proxy's test resolver maps every name. DNS probes go to loopback addresses only.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from docker.types import Mount
from egress_support import SANDBOX_CLIENT, connect, http_get

from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.egress.grant import EgressGrant, MiB
from ringfence_server.sandbox.profile import SandboxProfile
from ringfence_server.sandbox.result import Outcome

pytestmark = pytest.mark.docker

ARGV = ("python3", "-I", "-S", "-B", "-c", SANDBOX_CLIENT)


class Runner:
    """Runs a list of client operations in one sandbox call; keeps the proxy's reports."""

    def __init__(self, client, lock, proxy, backend_class=DockerBackend) -> None:
        self.reports: list[Any] = []
        self.backend = backend_class(client, lock=lock, egress_proxy=proxy,
                                     on_egress_report=lambda _req, rep: self.reports.append(rep))

    def __call__(self, ops, allow=("allowed.test",), **grant):
        profile = SandboxProfile(egress=EgressGrant(allow=tuple(allow), **grant), timeout_s=60)
        result = self.backend.run(SandboxRequest(profile=profile, argv=ARGV, stdin=json.dumps(ops).encode(),
                                                 run_id="escape-egress"))
        self.result = result
        assert result.outcome is Outcome.OK, (result.outcome, result.message, result.stderr[-2000:])
        return json.loads(result.stdout)

    @property
    def events(self):
        return list(self.reports[-1].events)

    @property
    def call_id(self) -> str:
        return self.reports[-1].call_id


class Seen:
    """New connections a decoy logged since this object was made (decoys are shared)."""

    def __init__(self, decoy) -> None:
        self.decoy = decoy
        self.before = len(decoy.connections())

    def new(self) -> list[dict]:
        return self.decoy.connections()[self.before :]


def loosened(change: Callable[[dict], None]):
    """An egress backend whose settings `change(settings)` alters. Red checks only."""

    class Loosened(DockerBackend):
        def _apply_egress(self, settings, call):
            settings = super()._apply_egress(settings, call)
            change(settings)
            return settings

    return Loosened


def on_network(name: str):
    """An egress backend whose sandbox is also attached to Docker network `name` (a test's own),
    as egress sandboxes were before they lost their per-call network. Red checks only."""

    def change(settings: dict) -> None:
        settings["network_mode"] = name

    return loosened(change)


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


def egress_dir(result) -> str:
    """The host directory that was bind-mounted as the call's way out (from `applied`)."""
    [source] = [m["source"] for m in result.applied["mounts"] if m["target"] == "/run/ringfence/egress"]
    return source


def test_credentials_stop_working_after_the_call(run, testbed):
    [first] = run([{"op": "env"}])
    old = first["proxy"].split("//", 1)[1].split("@", 1)[0]
    user, password = old.split(":", 1)
    first_report, first_dir = run.reports[-1], egress_dir(run.result)
    assert first_report.error is None
    # The first call's directory is gone, and with it its socket: nothing listens there.
    assert not os.path.exists(first_dir)
    with pytest.raises(OSError):
        connect(os.path.join(first_dir, "proxy.sock"))
    seen = Seen(testbed.decoys["allowed"])
    # A later call presents the first call's credentials to the proxy: refused.
    replay, own = run([
        {"op": "http_raw", "url": "http://allowed.test/", "host": "allowed.test", "user": user, "password": password},
        {"op": "http_raw", "url": "http://allowed.test/", "host": "allowed.test"},
    ])
    assert (replay["status"], replay["reason"]) == (407, "credentials_invalid")
    assert own["status"] == 200 and len(seen.new()) == 1
    # Both are the second call's requests: they came in on its socket.
    assert [(e["call_id"], e["reason"]) for e in run.events] == [(run.call_id, "credentials_invalid"),
                                                                 (run.call_id, None)]


def test_tools_without_egress_still_have_only_lo(attack, proxy):
    r = attack(list(ARGV), stdin=json.dumps([{"op": "netinfo"}]).encode())
    [info] = json.loads(r.stdout)
    assert info["interfaces"] == ["lo"] and info["routes"] == []


# -- case 46: a call's credentials work only from the call's own socket --------------------------
# A call's proxy credentials are useless from any other call, and every proxied request is
# attributed to the call whose socket it came in on.
#
# The attack, as the review ran it: call A's credentials leak out (A posted them to a host it may
# reach); call B, allowed only that host, fetches them and presents them to the proxy to reach a
# host only A may reach. Here A is a live grant opened with the proxy API and kept open for the
# whole attack (the test hands its credentials to B's probe); B is a real sandbox on the same
# real proxy. Both may reach allowed.test (decoy X); only A may reach denied.test (decoy Y), whose
# log shows whether anything arrived. The red check runs the same attack on a proxy whose
# TEST config switches exactly the binding check off ("call_binding"): Y then sees it.


def credentials(call) -> tuple[str, str]:
    url = urllib.parse.urlsplit(call.env["HTTP_PROXY"])
    return url.username, url.password


def attack(user: str, password: str) -> list[dict]:
    """B's probe: its own request first (its channel works), then A's credentials, plain HTTP
    and CONNECT, to the host only A may reach."""
    return [
        {"op": "http_raw", "url": "http://allowed.test/", "host": "allowed.test"},
        {"op": "http_raw", "url": "http://denied.test/", "host": "denied.test", "user": user, "password": password},
        {"op": "connect", "target": "denied.test:443", "sni": "denied.test", "user": user, "password": password},
    ]


@pytest.fixture
def call_a():
    """open(proxy) -> A's live grant on `proxy` (allowed.test and denied.test); closed after the test."""
    opened = []

    def open_(proxy):
        a = proxy.open_call(f"case46-a-{uuid.uuid4().hex[:6]}", EgressGrant(allow=("allowed.test", "denied.test")))
        opened.append((proxy, a))
        return a

    yield open_
    for proxy, a in opened:
        proxy.close_call(a)


def test_46_a_credential_is_refused_from_another_calls_socket_and_reported_on_both(
        docker_client, pinned_images, proxy, testbed, call_a):
    a = call_a(proxy)
    user, password = credentials(a)
    x, y = Seen(testbed.decoys["allowed"]), Seen(testbed.decoys["denied"])
    b = Runner(docker_client, pinned_images, proxy)
    own, plain, tls = b(attack(user, password), allow=("allowed.test",))
    assert own["status"] == 200  # B's own channel and credentials work
    assert (plain["status"], plain["reason"]) == (407, "credential_misuse")
    assert (tls["status"], tls["reason"]) == (407, "credential_misuse")
    assert y.new() == []  # the host only A may reach never saw a connection
    assert len(x.new()) == 1  # only B's own request
    # B's events: all three requests are B's, the two with A's credential naming A.
    assert [(e["call_id"], e["method"], e["reason"], e.get("credential_of")) for e in b.events] == [
        (b.call_id, "GET", None, None),
        (b.call_id, "GET", "credential_misuse", a.call_id),
        (b.call_id, "CONNECT", "credential_misuse", a.call_id)]
    # A's events (A is still live): the attempts, naming B.
    on_a = proxy.channel.events(a.username)["events"]
    assert [(e["event"], e["call_id"], e["method"], e["presented_by"]) for e in on_a] == [
        ("credential_misuse", a.call_id, "GET", b.call_id), ("credential_misuse", a.call_id, "CONNECT", b.call_id)]
    # And the proxy's JSON log has them, as lines of each call.
    logged = [e for e in proxy.logs() if e.get("reason") == "credential_misuse"]
    assert sorted((e["call_id"], e.get("credential_of") or e.get("presented_by")) for e in logged) == sorted(
        [(b.call_id, a.call_id)] * 2 + [(a.call_id, b.call_id)] * 2)
    # Positive control: the credential is live and works on A's own socket.
    reply = http_get(a.socket_path, "http://denied.test/", (user, password))
    assert reply.status == 200 and reply.body == b"hello from denied\n"
    assert len(y.new()) == 1


def test_46_red_check_without_the_binding_the_credential_reaches_the_other_calls_host(
        docker_client, pinned_images, testbed, call_a):
    red_proxy = testbed.proxy({"call_binding"})
    a = call_a(red_proxy)
    y = Seen(testbed.decoys["denied"])
    own, plain, tls = Runner(docker_client, pinned_images, red_proxy)(attack(*credentials(a)), allow=("allowed.test",))
    assert own["status"] == 200
    assert plain["status"] == 200 and plain["body"] == "hello from denied\n"
    assert tls["status"] == 200 and tls["body"].endswith("hello from denied\n")
    assert [c["port"] for c in y.new()] == [80, 443]  # B, allowed only allowed.test, reached Y


# -- cases 25-28 for egress-enabled tools: the same empty network as tools without egress -------


def only_loopback(info) -> bool:
    v6 = [line.split()[-1] for line in info["if_inet6"].splitlines() if line.strip()]
    return info["interfaces"] == ["lo"] and info["routes"] == [] and set(v6) <= {"lo"}


def test_25_only_lo_and_no_direct_path_to_decoys(run, run_with, testbed, proxy):
    d = testbed.decoys["allowed"]
    ops = [{"op": "netinfo"}, {"op": "direct", "ip": d.ip, "port": 80}, {"op": "udp", "ip": d.ip, "port": 9999},
           {"op": "direct", "ip": testbed.decoys["private"].ip, "port": 80},
           {"op": "get", "url": "http://allowed.test/"}]
    seen = Seen(d)
    info, tcp, udp, tcp_private, fetched = run(ops)
    assert only_loopback(info), info
    # No route: connect() and sendto() fail in the sandbox itself; nothing is sent.
    assert tcp["connected"] is False and tcp["errno"] == "ENETUNREACH"
    assert udp["sent"] is False and udp["errno"] == "ENETUNREACH"
    assert tcp_private["connected"] is False
    # The one way out is the proxy, through the relay: the fetch is the decoy's only connection.
    assert fetched["status"] == 200
    assert [c["event"] for c in seen.new()] == ["tcp"]
    # Red: attached to the decoys' network (what a per-call network shared with them would be),
    # the same probes arrive.
    seen = Seen(d)
    _, tcp, udp, _, _ = run_with(backend_class=on_network(testbed.networks["outside"].name), proxy=proxy)(ops)
    assert tcp["connected"] is True and udp["sent"] is True
    assert {"tcp", "udp"} <= {c["event"] for c in seen.new()}


@pytest.fixture
def host_listener():
    """A listener on the host's loopback (ephemeral port) that records who connected."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
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


def in_the_host_network_namespace(settings: dict) -> None:
    for key in ("dns", "dns_search", "hostname"):  # the engine refuses them with the host's network
        settings.pop(key, None)
    settings["network_mode"] = "host"


def test_26_27_metadata_host_and_gateway_unreachable(run, run_with, host_listener, proxy):
    """No gateway and no route at all, so the metadata address (probed only once the sandbox's
    own view shows nothing but lo) and every host address fail in the sandbox; 127.0.0.1 is the
    sandbox's own loopback, not the host's."""
    port, peers = host_listener
    info, meta, own_loopback, gateway = run([
        {"op": "netinfo"}, {"op": "metadata"}, {"op": "direct", "ip": "127.0.0.1", "port": port},
        {"op": "direct_gateway", "port": port}])
    assert only_loopback(info)
    assert meta == {"probed": True, "169.254.169.254": "ENETUNREACH", "fd00:ec2::254": "EADDRNOTAVAIL"}
    assert own_loopback["connected"] is False and own_loopback["errno"] == "ECONNREFUSED"
    assert gateway == {"gateway": None, "connected": False}
    assert peers == []
    # Red: the same sandbox in the host's network namespace reaches the host's listener.
    [own_loopback] = run_with(backend_class=loosened(in_the_host_network_namespace), proxy=proxy)(
        [{"op": "direct", "ip": "127.0.0.1", "port": port}])
    assert own_loopback["connected"] is True and peers == ["127.0.0.1"]


def test_28_dns_lookups_get_no_answer_and_queries_stay_in_the_sandbox(run):
    """resolv.conf names only 127.0.0.1, the sandbox's own loopback: a lookup's query goes there
    and nowhere else, shown by a listener the sandbox itself holds on 127.0.0.1:53 receiving it.
    (The red check, a resolver that carries the query name out, is test_network's: for this
    sandbox it is the same resolv.conf and the same empty network.)"""
    local, info = run([{"op": "dns_local", "name": "rfexfil-probe.invalid"}, {"op": "netinfo"}])
    assert local["listener"] == "bound" and local["query_seen_locally"] is True
    assert local["lookup"].startswith("error")
    nameservers = [line.split()[1] for line in info["resolv_conf"].splitlines() if line.startswith("nameserver")]
    assert nameservers == ["127.0.0.1"]


# -- case 47: no resolver at all, the engine's embedded one included ----------------------------


def dns_probe(proxy, testbed):
    """Docker's embedded resolver (127.0.0.11) and the configured nameserver, over UDP and TCP, for
    names it would know: the proxy's container and a decoy's, both on the test's network; then
    the same names through the system resolver; the interfaces; and a fetch through the proxy."""
    ops = [{"op": "dns", "name": n, "servers": ["127.0.0.11"], "resolv_conf": True}
           for n in (proxy.name, testbed.decoys["allowed"].container.name)]
    ops += [{"op": "resolve", "name": proxy.name}, {"op": "netinfo"}, {"op": "get", "url": "http://allowed.test/"}]
    return ops


def test_47_no_resolver_answers_not_even_the_engines_embedded_one(run, run_with, proxy, testbed):
    by_proxy, by_decoy, lookup, info, fetched = run(dns_probe(proxy, testbed))
    for asked in (by_proxy, by_decoy):
        assert set(asked) == {"udp:127.0.0.11", "tcp:127.0.0.11", "udp:127.0.0.1", "tcp:127.0.0.1"}
        # Nothing listens on any of them: refused in the sandbox's own loopback, no reply at all.
        assert all(a == {"error": "ECONNREFUSED"} for a in asked.values()), asked
    assert lookup["error"].startswith("gaierror")
    assert info["interfaces"] == ["lo"]
    assert fetched["status"] == 200 and fetched["body"] == "hello from allowed\n"  # name resolution: the proxy's
    # Red: the same probe in a sandbox also attached to a Docker network (the test's own, which
    # the proxy and the decoys are on): the engine's resolver answers with their addresses.
    red = run_with(backend_class=on_network(testbed.networks["outside"].name), proxy=proxy)
    by_proxy, by_decoy, _, info, fetched = red(dns_probe(proxy, testbed))
    proxy.container.reload()
    proxy_ip = proxy.container.attrs["NetworkSettings"]["Networks"][testbed.networks["outside"].name]["IPAddress"]
    for asked, ip in ((by_proxy, proxy_ip), (by_decoy, testbed.decoys["allowed"].ip)):
        for proto in ("udp", "tcp"):
            assert asked[f"{proto}:127.0.0.11"]["reply"]["addresses"] == [ip], asked
    assert info["interfaces"] == ["lo", "eth0"] and fetched["status"] == 200
