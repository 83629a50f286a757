"""The egress proxy's lifecycle on the host: its container, the per-call networks, credentials.

    proxy = EgressProxy(client, lock=lock, settings=ProxySettings(...))
    call = proxy.open_call(call_id, grant)     # network + credentials; call.env for the sandbox
    ... run the sandbox with network_mode=call.network, environment += call.env ...
    report = proxy.close_call(call)            # credentials revoked; report.events
    proxy.close()

Topology. One proxy container per EgressProxy, hardened like a sandbox (non-root, read-only,
no capabilities, no-new-privileges, seccomp, limits). It alone joins the outside network. Each
egress call gets its *own* Docker network, `internal=True` and with
`com.docker.network.bridge.inhibit_ipv4` (the host gets no address on it: an internal bridge
otherwise carries the gateway address on the host, and a container reaches every host service
through it, no default route needed); the only members are that call's sandbox and the proxy.
Calls therefore never share a network, and the sandbox reaches nothing but the proxy.

Credentials. At dispatch the host draws a random username and password for the call
(`secrets`), registers them with the proxy together with the call's allowlist and ceilings,
and hands the sandbox `HTTP(S)_PROXY=http://user:password@<proxy ip on the call network>:3128`.
At completion it revokes them: the proxy forgets the grant, aborts the call's open
connections and returns the call's decision events. A credential copied out of one call is
worthless in the next (and in any case names a network that no longer exists).

Control channel: a unix socket in a host directory bind-mounted into the proxy container only
(see sandbox.egress.channel for why not a port or `docker exec`). The directory also holds the
proxy's config file. No sandbox mounts it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

import docker
import docker.errors
from docker.types import LogConfig, Mount, Ulimit

from sandbox import labels as L
from sandbox import seccomp
from sandbox.egress.channel import ControlChannel, EgressError
from sandbox.egress.grant import MiB, EgressGrant
from sandbox.egress.server import CHECKS, ProxyConfig

PROXY_UID = 10001
CONTROL_DIR = "/run/rfproxy"
# Docker bridge option: no IPv4 address for the host on the bridge (Engine >= 1.13).
INHIBIT_IPV4 = "com.docker.network.bridge.inhibit_ipv4"


@dataclass(frozen=True)
class ProxySettings:
    image: str = "egress-proxy"
    """Image name in images/images.lock."""

    port: int = 3128

    outside_networks: tuple[str, ...] = ()
    """Existing networks the proxy joins for its way out (tests: the decoys' networks). Empty:
    the proxy gets a bridge network of its own, created and removed with it."""

    resolver: str = "system"
    """`system`: the proxy resolves through its own container's resolver. `test`: only
    `test_hosts` resolve, and the proxy container gets no usable DNS at all."""

    test_hosts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    test_networks: tuple[str, ...] = ()
    """Networks (CIDR) of decoys a test allows although private. Only with resolver=test."""

    disabled_checks: frozenset[str] = frozenset()
    """TESTS ONLY, to prove each check matters. Only with resolver=test."""

    memory_bytes: int = 256 * MiB
    cpus: float = 1.0
    pids: int = 256
    start_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        if self.resolver not in ("system", "test"):
            raise ValueError("resolver must be 'system' or 'test'")
        object.__setattr__(self, "disabled_checks", frozenset(self.disabled_checks))
        object.__setattr__(self, "outside_networks", tuple(self.outside_networks))
        object.__setattr__(self, "test_networks", tuple(str(n) for n in self.test_networks))
        object.__setattr__(self, "test_hosts", {k: tuple([v] if isinstance(v, str) else v)
                                                for k, v in dict(self.test_hosts).items()})
        if self.resolver != "test" and (self.disabled_checks or self.test_networks or self.test_hosts):
            # A configuration that weakens the proxy must never be a production one.
            raise ValueError("test_hosts, test_networks and disabled_checks need resolver='test'")
        if set(self.disabled_checks) - CHECKS:
            raise ValueError(f"unknown checks: {sorted(set(self.disabled_checks) - CHECKS)}")

    def proxy_config(self) -> dict[str, Any]:
        doc = {
            "listen_host": "0.0.0.0",
            "listen_port": self.port,
            "control_socket": f"{CONTROL_DIR}/control.sock",
            "resolver": self.resolver,
            "test_hosts": {k: list(v) for k, v in self.test_hosts.items()},
            "test_networks": list(self.test_networks),
            "disabled_checks": sorted(self.disabled_checks),
        }
        ProxyConfig.from_json(doc)  # the proxy would refuse it: refuse it here, with the cause
        return doc


@dataclass(frozen=True)
class CallEgress:
    """One call's way out: its network and the environment that points it at the proxy."""

    call_id: str
    network: str
    network_id: str
    proxy_ip: str
    username: str
    env: Mapping[str, str] = field(repr=False)  # holds the password


@dataclass(frozen=True)
class EgressReport:
    """What the proxy saw of one call, handed back when its credentials were revoked."""

    call_id: str
    events: tuple[dict, ...]
    bytes: int
    connections: int
    events_dropped: int = 0
    error: str | None = None


class EgressProxy:
    def __init__(self, client: docker.DockerClient, *, lock: Any = None,
                 settings: ProxySettings | None = None, state_root: str | None = None) -> None:
        self.client = client
        self.settings = settings or ProxySettings()
        self._lock = lock
        self._state_root = state_root
        self._mutex = threading.Lock()
        self._container = None
        self._own_network = None
        self._dir: str | None = None
        self.channel: ControlChannel | None = None
        self.name = f"rf-egress-proxy-{uuid.uuid4().hex[:8]}"

    # -- the proxy container ------------------------------------------------------------

    @property
    def container(self):
        self.start()
        return self._container

    def start(self) -> None:
        with self._mutex:
            if self._container is not None:
                return
            try:
                self._start()
            except BaseException:
                self._teardown()
                raise

    def _image_id(self) -> str:
        from sandbox.images import resolve_pinned

        return resolve_pinned(self.client, self.settings.image, self._lock)

    def _start(self) -> None:
        s = self.settings
        image_id = self._image_id()
        self._dir = tempfile.mkdtemp(prefix="rf-egress-", dir=self._state_root)
        with open(os.path.join(self._dir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(s.proxy_config(), f)
        self._own_dir_for_proxy()
        try:
            networks = list(s.outside_networks)
            if not networks:
                self._own_network = self.client.networks.create(
                    f"{self.name}-out", driver="bridge", labels=L.base_labels("network"))
                networks = [self._own_network.name]
            self._container = self.client.containers.create(
                image_id, name=self.name, labels=L.base_labels("proxy"), network=networks[0],
                **self._container_settings())
            for extra in networks[1:]:
                self.client.networks.get(extra).connect(self._container)
            self._container.start()
        except docker.errors.DockerException as e:
            raise EgressError(f"cannot start the egress proxy: {e}") from e
        self.channel = ControlChannel(os.path.join(self._dir, "control.sock"))
        deadline = time.monotonic() + s.start_timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                self.channel.ping()
                return
            except EgressError as e:
                last = e
                self._container.reload()
                if self._container.status not in ("created", "running"):
                    break
                time.sleep(0.05)
        logs = self._logs()
        raise EgressError(f"the egress proxy did not come up ({last}); status "
                          f"{self._container.status}; recent logs:\n{logs}")

    def _own_dir_for_proxy(self) -> None:
        # The proxy runs as PROXY_UID and must create its socket here; nobody else needs in.
        assert self._dir is not None
        for path in (self._dir, os.path.join(self._dir, "config.json")):
            try:
                os.chown(path, PROXY_UID, PROXY_UID)
            except PermissionError:
                # Not root: leave the directory open to the proxy's uid via mode bits instead.
                os.chmod(self._dir, 0o777)
                os.chmod(os.path.join(self._dir, "config.json"), 0o644)
                return
        os.chmod(self._dir, 0o700)
        os.chmod(os.path.join(self._dir, "config.json"), 0o400)

    def _container_settings(self) -> dict[str, Any]:
        s = self.settings
        kwargs: dict[str, Any] = dict(
            user=f"{PROXY_UID}:{PROXY_UID}",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true", f"seccomp={seccomp.profile_json()}"],
            privileged=False,
            ipc_mode="private",
            mem_limit=s.memory_bytes,
            memswap_limit=s.memory_bytes,
            nano_cpus=int(s.cpus * 1e9),
            pids_limit=s.pids,
            ulimits=[Ulimit(name="nofile", soft=8192, hard=8192), Ulimit(name="core", soft=0, hard=0)],
            tmpfs={"/tmp": "rw,noexec,nosuid,nodev,size=1m,mode=1777"},
            mounts=[Mount(target=CONTROL_DIR, source=self._dir, type="bind", read_only=False)],
            hostname="egress-proxy",
            init=False,
            # The proxy's decision lines also go to its log, bounded, for an operator.
            log_config=LogConfig(type="json-file", config={"max-size": "10m", "max-file": "2"}),
            detach=True,
        )
        if s.resolver == "test":
            # A test proxy resolves only through its test mapping; give its container no
            # resolver either, so a slip could not send a name to the host's.
            kwargs["dns"] = ["127.0.0.1"]
            kwargs["dns_search"] = ["."]
        return kwargs

    def _logs(self, tail: int = 30) -> str:
        try:
            return self._container.logs(tail=tail).decode(errors="replace") if self._container else ""
        except docker.errors.DockerException:
            return "(logs unavailable)"

    def logs(self) -> list[dict]:
        """The proxy's JSON log lines (every decision of every call)."""
        out = []
        for line in self._logs(tail=100000).splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def close(self) -> None:
        with self._mutex:
            self._teardown()

    def _teardown(self) -> None:
        if self._container is not None:
            try:
                self._container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.DockerException:
                pass  # the reaper removes it by label
            self._container = None
        if self._own_network is not None:
            try:
                self._own_network.remove()
            except docker.errors.DockerException:
                pass
            self._own_network = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self.channel = None

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- per-call networks and credentials ---------------------------------------------

    def _call_network_options(self) -> dict[str, Any]:
        # One place, so a test can remove exactly one protection (the inhibited host address).
        return dict(driver="bridge", internal=True, enable_ipv6=False, options={INHIBIT_IPV4: "true"})

    def open_call(self, call_id: str, grant: EgressGrant, *, run_id: str = "adhoc",
                  deadline_s: float = 3600) -> CallEgress:
        if not isinstance(grant, EgressGrant):
            raise TypeError("grant must be an EgressGrant")
        self.start()
        assert self.channel is not None
        labels = L.base_labels("network", deadline_s=deadline_s)
        labels.update({L.RUN_LABEL: run_id, L.CALL_LABEL: call_id})
        name = f"rf-egress-{call_id[:20]}-{uuid.uuid4().hex[:6]}".replace(":", "_")
        network = None
        try:
            network = self.client.networks.create(name, labels=labels, **self._call_network_options())
            network.connect(self._container)
            self._container.reload()
            ip = (self._container.attrs["NetworkSettings"]["Networks"].get(name) or {}).get("IPAddress")
            if not ip:
                raise EgressError(f"the proxy got no address on {name}")
            username, password = "c" + secrets.token_hex(8), secrets.token_urlsafe(24)
            self.channel.grant(call_id=call_id, username=username, password=password, allow=list(grant.allow),
                               max_bytes=grant.max_bytes, max_connections=grant.max_connections)
        except (docker.errors.DockerException, EgressError) as e:
            if network is not None:
                self._remove_network(network)
            if isinstance(e, EgressError):
                raise
            raise EgressError(f"cannot prepare the egress network for call {call_id}: {e}") from e
        url = f"http://{username}:{password}@{ip}:{self.settings.port}"
        env = {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
               "ALL_PROXY": url, "NO_PROXY": "", "no_proxy": ""}
        return CallEgress(call_id, name, network.id, ip, username, env)

    def close_call(self, call: CallEgress) -> EgressReport:
        """Revoke the call's credentials (its open connections end) and remove its network."""
        error = None
        summary: dict = {"events": [], "bytes": 0, "connections": 0, "events_dropped": 0}
        try:
            assert self.channel is not None
            summary = self.channel.revoke(call.username)
        except (EgressError, AssertionError) as e:
            error = str(e)
        try:
            self._remove_network(self.client.networks.get(call.network_id))
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as e:
            error = error or f"network {call.network} not removed (the reaper will): {e}"
        return EgressReport(call.call_id, tuple(summary.get("events", ())), int(summary.get("bytes", 0)),
                            int(summary.get("connections", 0)), int(summary.get("events_dropped", 0)), error)

    def _remove_network(self, network) -> None:
        try:
            network.reload()
            for member in network.containers:
                try:
                    network.disconnect(member, force=True)
                except docker.errors.DockerException:
                    pass
        except docker.errors.NotFound:
            return
        try:
            network.remove()
        except docker.errors.NotFound:
            pass
