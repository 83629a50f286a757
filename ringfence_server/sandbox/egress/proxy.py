"""The egress proxy's lifecycle on the host: its container, each call's socket and credentials.

    proxy = EgressProxy(client, lock=lock, settings=ProxySettings(...))
    call = proxy.open_call(call_id, grant)    # the call's socket directory and credentials
    ... run the sandbox with network_mode=none, mounts += [call.mount()], environment +=
        call.env, and call.relay_argv() in front of its command ...
    report = proxy.close_call(call)           # credentials revoked, socket gone; report.events
    proxy.close()

Topology. One proxy container per EgressProxy, hardened like a sandbox (non-root, read-only,
no capabilities, no-new-privileges, seccomp, limits). It alone has a network: its own bridge
(or, in tests, the decoys' networks), for its way upstream, and it listens on no port. An
egress call's sandbox has no network at all, exactly like a call without egress (only `lo`):
no Docker network per call, hence no embedded resolver at 127.0.0.11 to ask, no gateway, no
other container, and no network to create and remove on every call.

A call's one way out is a unix socket of its own. The proxy's state directory (a host temp
dir, bind-mounted into the proxy container at /run/rfproxy) holds `calls/<random token>/`
for each live call; the host creates that directory, the proxy listens in it
(`proxy.sock`) for that call alone, and the host bind-mounts ONLY that directory into the
call's sandbox, read-only, at /run/ringfence/egress (connect() works through a read-only
bind). Inside the sandbox ringfence_server.sandbox.egress.relay listens on 127.0.0.1:3128 and splices each
connection to that socket, so tools see an ordinary HTTP proxy.

Credentials. At dispatch the host draws a random username and password for the call
(`secrets`), registers them with the proxy together with the call's socket directory,
allowlist and ceilings, and hands the sandbox `HTTP(S)_PROXY=http://user:password@127.0.0.1:3128`.
The proxy accepts them only on that call's own socket: presented on another call's socket they
are refused (407 `credential_misuse`) and reported on both calls. At completion the host
revokes them: the proxy forgets the grant, closes the socket, aborts the call's open
connections and returns the call's decision events; then the host removes the directory.

Control channel: a unix socket at the top of the state directory, which only the proxy
container mounts (see ringfence_server.sandbox.egress.channel for why not a port or `docker exec`). The
directory also holds the proxy's config file. A sandbox mounts only its own `calls/<token>`.

Services. An operator's internal receivers (the ledger) are declared with their pinned
addresses (`ProxySettings.services`) and the networks they sit on (`service_networks`, which
the proxy joins besides its way out); see ringfence_server.sandbox.egress.admission, step 6.

Cleanup. Everything of a call lives under the state directory, which close() removes; when the
owning process died instead, the reaper (`ringfence sandbox gc`, a running server's periodic
sweep) removes the proxy container and, with it, its state directory (ringfence_server.sandbox.reaper).
"""

from __future__ import annotations

import contextlib
import inspect
import ipaddress
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.models.networks import Network
from docker.types import LogConfig, Mount, Ulimit

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox import seccomp
from ringfence_server.sandbox.egress import relay
from ringfence_server.sandbox.egress.channel import ControlChannel, EgressError
from ringfence_server.sandbox.egress.config import CHECKS, ProxyConfig, parse_services
from ringfence_server.sandbox.egress.control import PROTOCOL_VERSION
from ringfence_server.sandbox.egress.events import JSONObject
from ringfence_server.sandbox.egress.grant import EgressGrant, MiB
from ringfence_server.sandbox.egress.grant_table import SOCKET_NAME
from ringfence_server.sandbox.pinned_images import Lock, resolve_pinned

PROXY_UID = 10001
CONTROL_DIR = "/run/rfproxy"
# The state directory's name on the host: the reaper recognises a dead proxy's by it.
STATE_PREFIX = "rf-egress-"
CALLS = "calls"
# Where a sandbox finds its call's directory (and in it, SOCKET_NAME).
SANDBOX_EGRESS_DIR = "/run/ringfence/egress"
RELAY_SOURCE = inspect.getsource(relay)


@dataclass(frozen=True)
class ProxySettings:
    image: str = "egress-proxy"
    """Image name in images/images.lock."""

    port: int = 3128
    """The relay's port on each sandbox's own loopback (what HTTP(S)_PROXY names)."""

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

    services: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Internal services the operator runs beside ringfence (e.g. the ledger): exact host name
    -> the pinned private addresses of its container. The proxy never resolves these names and
    permits each address for its own name only; a call still reaches a service only when its
    allowlist names it (policy must grant it, as for any host). Production configuration:
    valid with either resolver (ringfence_server.sandbox.egress.config.parse_services has the rules)."""

    service_networks: tuple[str, ...] = ()
    """Existing networks the proxy joins, besides its way out, to reach those services (the
    networks their containers sit on; nothing else of those networks is reachable through it:
    their addresses are private)."""

    memory_bytes: int = 256 * MiB
    cpus: float = 1.0
    pids: int = 256
    start_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        if self.resolver not in ("system", "test"):
            raise ValueError("resolver must be 'system' or 'test'")
        object.__setattr__(self, "disabled_checks", frozenset(self.disabled_checks))
        object.__setattr__(self, "outside_networks", tuple(self.outside_networks))
        object.__setattr__(self, "service_networks", tuple(self.service_networks))
        object.__setattr__(self, "services", parse_services(dict(self.services)))
        object.__setattr__(self, "test_networks", tuple(str(n) for n in self.test_networks))
        object.__setattr__(self, "test_hosts", {k: _addresses(v) for k, v in dict(self.test_hosts).items()})
        if self.resolver != "test" and (self.disabled_checks or self.test_networks or self.test_hosts):
            # A configuration that weakens the proxy must never be a production one.
            raise ValueError("test_hosts, test_networks and disabled_checks need resolver='test'")
        if set(self.disabled_checks) - CHECKS:
            raise ValueError(f"unknown checks: {sorted(set(self.disabled_checks) - CHECKS)}")
        self.proxy_config()  # what the proxy would refuse (a service also in test_hosts, ...) fails here

    def proxy_config(self) -> JSONObject:
        """The proxy container's config.json (ringfence_server.sandbox.egress.config.ProxyConfig.from_json)."""
        doc: JSONObject = {
            "control_socket": f"{CONTROL_DIR}/control.sock",
            "calls_dir": f"{CONTROL_DIR}/{CALLS}",
            "resolver": self.resolver,
            "test_hosts": {k: list(v) for k, v in self.test_hosts.items()},
            "test_networks": list(self.test_networks),
            "disabled_checks": sorted(self.disabled_checks),
            "services": {k: list(v) for k, v in self.services.items()},
        }
        ProxyConfig.from_json(doc)  # the proxy would refuse it: refuse it here, with the cause
        return doc


def _addresses(value: object) -> tuple[str, ...]:
    """A test host's addresses: one address or a sequence of them (checked by ProxyConfig)."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"test host addresses must be a list, not {value!r}")
    return tuple(str(a) for a in value)


def egress_mount(socket_dir: str) -> Mount:
    """A call's directory at SANDBOX_EGRESS_DIR, read-only (a warm container gets its directory
    at creation, empty; the proxy's socket appears in it when a call claims the container)."""
    return Mount(target=SANDBOX_EGRESS_DIR, source=socket_dir, type="bind", read_only=True)


@dataclass(frozen=True)
class CallEgress:
    """One call's way out: its own socket directory, the relay in front of its command, and the
    environment that points its tools at the relay."""

    call_id: str
    username: str
    socket_dir: str
    """Host path of the call's directory (`<state dir>/calls/<token>`), holding SOCKET_NAME."""
    env: Mapping[str, str] = field(repr=False)  # holds the password
    port: int = 3128

    @property
    def socket_path(self) -> str:
        """The call's socket as the host sees it."""
        return os.path.join(self.socket_dir, SOCKET_NAME)

    def mount(self) -> Mount:
        """The call's directory, and nothing above it, read-only in its sandbox."""
        return egress_mount(self.socket_dir)

    def relay_argv(self) -> list[str]:
        """The command prefix that starts the relay and then execs the tool (ringfence_server.sandbox.egress.relay)."""
        return ["python3", "-I", "-S", "-B", "-c", RELAY_SOURCE,
                f"{SANDBOX_EGRESS_DIR}/{SOCKET_NAME}", str(self.port), "--"]


@dataclass(frozen=True)
class EgressReport:
    """What the proxy saw of one call, handed back when its credentials were revoked."""

    call_id: str
    events: tuple[JSONObject, ...]
    bytes: int
    connections: int
    events_dropped: int = 0
    error: str | None = None


class EgressProxy:
    def __init__(self, client: docker.DockerClient, *, lock: Lock | None = None,
                 settings: ProxySettings | None = None, state_root: str | None = None) -> None:
        self.client = client
        self.settings = settings or ProxySettings()
        self._lock = lock
        self._state_root = state_root
        self._mutex = threading.Lock()
        self._container: Container | None = None
        self._own_network: Network | None = None
        self._dir: str | None = None
        self.channel: ControlChannel | None = None
        self.name = f"rf-egress-proxy-{uuid.uuid4().hex[:8]}"

    # -- the proxy container ------------------------------------------------------------

    @property
    def container(self) -> Container:
        self.start()
        assert self._container is not None
        return self._container

    @property
    def state_dir(self) -> str | None:
        """The host directory mounted at CONTROL_DIR (config, control socket, `calls/`)."""
        return self._dir

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
        return resolve_pinned(self.client, self.settings.image, self._lock)

    def _start(self) -> None:
        s = self.settings
        image_id = self._image_id()
        self._dir = tempfile.mkdtemp(prefix=STATE_PREFIX, dir=self._state_root)
        with open(os.path.join(self._dir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(s.proxy_config(), f)
        os.mkdir(os.path.join(self._dir, CALLS))
        self._own_dir_for_proxy()
        try:
            networks = list(s.outside_networks)
            if not networks:
                own = f"{self.name}-out"
                self._own_network = self.client.networks.create(own, driver="bridge", labels=L.base_labels("network"))
                networks = [own]
            networks += [n for n in s.service_networks if n not in networks]
            self._container = self.client.containers.create(
                image_id, name=self.name, labels=L.base_labels("proxy"), network=networks[0],
                **self._container_settings())
            for extra in networks[1:]:
                self.client.networks.get(extra).connect(self._container)
            self._container.start()
            self._container.reload()
        except docker.errors.DockerException as e:
            raise EgressError(f"cannot start the egress proxy: {e}") from e
        self._check_services_on_own_networks()
        self.channel = ControlChannel(os.path.join(self._dir, "control.sock"))
        deadline = time.monotonic() + s.start_timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                version = self.channel.ping().get("version")
            except EgressError as e:
                last = e
                self._container.reload()
                if self._container.status not in ("created", "running"):
                    break
                time.sleep(0.05)
                continue
            if version != PROTOCOL_VERSION:
                # The image lays ringfence_server/sandbox/egress/server.py at build time: a proxy speaking another
                # protocol was built from other sources than this host's.
                raise EgressError(f"the egress-proxy image speaks control protocol {version}, this host "
                                  f"{PROTOCOL_VERSION}: rebuild it (`ringfence images build --update-lock "
                                  f"egress-proxy`)")
            return
        logs = self._logs()
        raise EgressError(f"the egress proxy did not come up ({last}); status "
                          f"{self._container.status}; recent logs:\n{logs}")

    def _check_services_on_own_networks(self) -> None:
        """Every pinned service address must lie on a network the proxy itself is attached to:
        one that does not would be reached (if at all) through a gateway, i.e. some other host
        that happens to hold that private address, not the operator's container."""
        if not self.settings.services:
            return
        assert self._container is not None
        subnets = []
        for net in (self._container.attrs.get("NetworkSettings") or {}).get("Networks", {}).values():
            for addr, prefix in ((net.get("IPAddress"), net.get("IPPrefixLen")),
                                 (net.get("GlobalIPv6Address"), net.get("GlobalIPv6PrefixLen"))):
                if addr and prefix:
                    subnets.append(ipaddress.ip_interface(f"{addr}/{prefix}").network)
        for name, pinned in self.settings.services.items():
            for a in pinned:
                ip = ipaddress.ip_address(a)
                if not any(ip.version == n.version and ip in n for n in subnets):
                    raise EgressError(f"service {name}: {a} is on none of the proxy's networks "
                                      f"({', '.join(map(str, subnets)) or 'none'}); add the service's "
                                      f"network to service_networks")

    def _own_dir_for_proxy(self) -> None:
        # The proxy runs as PROXY_UID and must create its sockets here; nobody else needs in.
        assert self._dir is not None
        calls = os.path.join(self._dir, CALLS)
        for path in (self._dir, os.path.join(self._dir, "config.json"), calls):
            try:
                os.chown(path, PROXY_UID, PROXY_UID)
            except PermissionError:
                # Not root: leave the directories open to the proxy's uid via mode bits instead.
                os.chmod(self._dir, 0o777)
                os.chmod(os.path.join(self._dir, "config.json"), 0o644)
                os.chmod(calls, 0o711)
                return
        os.chmod(self._dir, 0o700)
        os.chmod(os.path.join(self._dir, "config.json"), 0o400)
        os.chmod(calls, 0o700)

    def _make_call_dir(self) -> tuple[str, str]:
        """A fresh `calls/<token>` the proxy (PROXY_UID) can create its socket in and the sandbox
        (any uid) can reach the socket through: 0711, the proxy's; no one can list it."""
        assert self._dir is not None
        token = secrets.token_hex(16)
        path = os.path.join(self._dir, CALLS, token)
        os.mkdir(path, 0o700)
        try:
            os.chown(path, PROXY_UID, PROXY_UID)
            os.chmod(path, 0o711)
        except PermissionError:
            os.chmod(path, 0o733)  # not root: the proxy's uid creates its socket as "other"
        return token, path

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

    def logs(self) -> list[JSONObject]:
        """The proxy's JSON log lines (every decision of every call)."""
        out: list[JSONObject] = []
        for line in self._logs(tail=100000).splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
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
            with contextlib.suppress(docker.errors.DockerException):
                self._own_network.remove()
            self._own_network = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self.channel = None

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- per-call sockets and credentials -----------------------------------------------

    def reserve_call_dir(self) -> tuple[str, str]:
        """(token, host path) of a fresh, empty call directory, for a warm container created
        before its call: `open_call(..., reserved=...)` binds a call to it at the claim, and
        `release_call_dir` removes one no call used."""
        self.start()
        try:
            return self._make_call_dir()
        except OSError as e:
            raise EgressError(f"cannot make an egress directory: {e}") from e

    def release_call_dir(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def open_call(self, call_id: str, grant: EgressGrant, reserved: tuple[str, str] | None = None) -> CallEgress:
        """The call's directory and credentials, registered with the proxy, which then listens
        for this call alone on `<directory>/proxy.sock`. `reserved`: a directory from
        reserve_call_dir (a warm container's), used instead of a new one."""
        if not isinstance(grant, EgressGrant):
            raise TypeError("grant must be an EgressGrant")
        self.start()
        assert self.channel is not None
        if reserved is not None:
            token, directory = reserved
        else:
            try:
                token, directory = self._make_call_dir()
            except OSError as e:
                raise EgressError(f"cannot make the egress directory of call {call_id}: {e}") from e
        username, password = "c" + secrets.token_hex(8), secrets.token_urlsafe(24)
        try:
            self.channel.grant(call_id=call_id, username=username, password=password, allow=list(grant.allow),
                               max_bytes=grant.max_bytes, max_connections=grant.max_connections,
                               socket_dir=token)
        except EgressError:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        url = f"http://{username}:{password}@127.0.0.1:{self.settings.port}"
        env = {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
               "ALL_PROXY": url, "NO_PROXY": "", "no_proxy": ""}
        return CallEgress(call_id, username, directory, env, self.settings.port)

    def close_call(self, call: CallEgress) -> EgressReport:
        """Revoke the call's credentials (its socket closes, its open connections end) and
        remove its directory."""
        error = None
        summary: JSONObject = {"events": [], "bytes": 0, "connections": 0, "events_dropped": 0}
        try:
            assert self.channel is not None
            summary = self.channel.revoke(call.username)
        except (EgressError, AssertionError) as e:
            error = str(e)
        shutil.rmtree(call.socket_dir, ignore_errors=True)
        if os.path.exists(call.socket_dir):
            error = error or f"{call.socket_dir} not removed (the proxy's close removes it)"
        events = summary.get("events")
        kept = tuple(e for e in events if isinstance(e, dict)) if isinstance(events, list) else ()
        return EgressReport(call.call_id, kept, _count(summary, "bytes"), _count(summary, "connections"),
                            _count(summary, "events_dropped"), error)


def _count(summary: JSONObject, key: str) -> int:
    value = summary.get(key, 0)
    return int(value) if isinstance(value, (int, float, str)) else 0
