"""Demo services: a stdlib HTTP server of ours in its own pinned image, run and asked from the host.

    ServiceSettings     what every service container takes: its image, port and limits
    ServiceContainer    one container on a given network, or on an internal network of its own;
                        started on enter, removed on exit (also when it fails to come up)
    ServiceError        an EngineError: the container could not be started or asked, with its
                        status and recent logs

Subclasses: ringfence_server.demo_services.ledger.Ledger (credits, once per idempotency key) and
ringfence_server.demo_services.runbooks.Runbooks (fixed runbook documents). Each names its image, its purpose label,
the host name tools use for it, and its own tmpfs; the rest is here, so the two cannot drift
apart in how they are hardened, labelled, waited for or cleaned up.

Tools reach a service only through the egress proxy, which pins the service's name to the
container's address (ringfence_server.sandbox.egress.proxy.ProxySettings.services: `services()` is that entry,
`network` what goes into service_networks). Several services may share one network:
`Runbooks(client, network=ledger.network)`.

How the host talks to a service: `docker exec` of a small stdlib client inside its container,
which speaks HTTP to the service on the container's own loopback. The host sends no packet to
any address (it talks to the engine over its socket), so the service's network can be internal
with no host address on its bridge; and the services count only requests that came over the
network, so a test can assert exactly what reached a service through the proxy.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Self

import docker
import docker.errors
from docker.models.containers import Container
from docker.models.networks import Network
from docker.types import LogConfig, Ulimit

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox import seccomp
from ringfence_server.sandbox.errors import EngineError
from ringfence_server.sandbox.pinned_images import Lock, resolve_pinned

SERVICE_UID = 10001
# Network options of a service's own network: no IPv4 address for the host on its bridge.
INHIBIT = {"com.docker.network.bridge.inhibit_ipv4": "true"}

# Runs inside the service's container: one HTTP request to it on loopback, one JSON line out.
_CLIENT = r"""
import http.client, json, sys
method, path, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
body = sys.argv[4].encode() if len(sys.argv) > 4 else None
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
headers = {"Connection": "close"}
if body is not None:
    headers["Content-Type"] = "application/json"
c.request(method, path, body=body, headers=headers)
r = c.getresponse()
data = r.read()
try:
    doc = json.loads(data)
except ValueError:
    doc = data.decode("utf-8", "replace")
print(json.dumps({"status": r.status, "content_type": r.getheader("Content-Type"), "body": doc}))
"""


class ServiceError(EngineError):
    """A service container could not be started or asked (with its status and recent logs)."""


@dataclass(frozen=True)
class ServiceSettings:
    image: str = ""
    """Image name in images/images.lock."""

    port: int = 80
    """Port 80: manifests declare host names, and the allowlist's default ports are 80 and 443."""

    memory_bytes: int = 128 * 1024 * 1024
    cpus: float = 0.5
    pids: int = 64
    start_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError("port must be in 1..65535")

    def command(self) -> list[str]:
        """The container's command (the image's default would not name the port)."""
        raise NotImplementedError


class ServiceContainer:
    """One service container on a Docker network, started on enter, removed on exit."""

    kind = "service"
    """Its purpose label and the middle of its name (rf-<kind>-<random>)."""
    host = ""
    """The name tools use for it, which the egress proxy pins to its address."""
    error: type[ServiceError] = ServiceError

    def __init__(self, client: docker.DockerClient, settings: ServiceSettings, *, lock: Lock | None = None,
                 network: str | None = None) -> None:
        self.client = client
        self.settings = settings
        self._lock = lock
        self._network_name = network
        self._own_network: Network | None = None
        self._container: Container | None = None
        self._address: str | None = None
        self.name = f"rf-{self.kind}-{uuid.uuid4().hex[:8]}"

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        if self._container is not None:
            return
        try:
            self._start()
        except BaseException:
            # Like testcontainers: a service that failed to come up leaves nothing behind.
            self.close()
            raise

    def _image_id(self) -> str:
        return resolve_pinned(self.client, self.settings.image, self._lock)

    def _start(self) -> None:
        s = self.settings
        image_id = self._image_id()
        try:
            if self._network_name is None:
                own_network = self._own_network = self.client.networks.create(
                    f"{self.name}-net", driver="bridge", internal=True, options=INHIBIT,
                    labels=L.base_labels("network"))
                self._network_name = own_network.name
            container = self._container = self.client.containers.create(
                image_id, s.command(), name=self.name, labels=L.base_labels(self.kind),
                network=self._network_name, **self._container_settings())
            container.start()
        except docker.errors.DockerException as e:
            raise self.error(f"cannot start the {self.kind}: {e}") from e
        deadline = time.monotonic() + s.start_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            container.reload()
            if container.status not in ("created", "running"):
                break
            try:
                status, body = self.request("GET", "/healthz")
            except ServiceError as e:
                last = str(e).splitlines()[0]
            else:
                if status == 200:
                    networks = container.attrs["NetworkSettings"]["Networks"]
                    self._address = networks[self._network_name]["IPAddress"]
                    return
                last = f"/healthz answered {status}: {body}"
            time.sleep(0.1)
        raise self.error(f"the {self.kind} did not become healthy ({last}); status {container.status}; "
                         f"recent logs:\n{self._logs()}")

    def _tmpfs(self) -> dict[str, str]:
        """Its writable filesystems, each capped in bytes and inodes, noexec, nosuid, nodev."""
        return {"/tmp": "rw,noexec,nosuid,nodev,size=1m,nr_inodes=64,mode=1777"}

    def _container_settings(self) -> dict[str, Any]:
        s = self.settings
        return dict(
            user=f"{SERVICE_UID}:{SERVICE_UID}",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true", f"seccomp={seccomp.profile_json()}"],
            privileged=False,
            ipc_mode="private",
            mem_limit=s.memory_bytes,
            memswap_limit=s.memory_bytes,
            nano_cpus=int(s.cpus * 1e9),
            pids_limit=s.pids,
            ulimits=[Ulimit(name="nofile", soft=1024, hard=1024), Ulimit(name="core", soft=0, hard=0)],
            tmpfs=self._tmpfs(),
            # Its only name is the one the proxy pins; it resolves nothing itself.
            dns=["127.0.0.1"],
            dns_search=["."],
            hostname=self.kind,
            # Port 80 as uid 10001 with no capabilities (the engine's default too, made explicit).
            sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
            init=False,  # tini is the image's entrypoint: Docker's --init would mount a host binary
            log_config=LogConfig(type="json-file", config={"max-size": "10m", "max-file": "2"}),
            detach=True,
        )

    def close(self) -> None:
        if self._container is not None:
            try:
                self._container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.DockerException:
                pass  # the reaper, or the test session's cleanup, removes it by label
            self._container = None
        if self._own_network is not None:
            with contextlib.suppress(docker.errors.DockerException):
                self._own_network.remove()
            self._own_network = None
            self._network_name = None
        self._address = None

    # -- where it is -----------------------------------------------------------------------

    @property
    def container(self) -> Container | None:
        return self._container

    @property
    def network(self) -> str:
        """The Docker network the service sits on (the proxy joins it: service_networks)."""
        if self._network_name is None:
            raise self.error(f"the {self.kind} is not started")
        return self._network_name

    @property
    def address(self) -> str:
        """The service's address on its network: what the proxy pins for its host name."""
        if self._address is None:
            raise self.error(f"the {self.kind} is not started")
        return self._address

    def services(self, name: str | None = None) -> dict[str, tuple[str, ...]]:
        """The ProxySettings.services entry that makes `name` (default: its host) this service."""
        return {name or self.host: (self.address,)}

    # -- asking it -------------------------------------------------------------------------

    def exchange(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """{"status", "content_type", "body"} of one request made inside its container; the body
        is the reply's JSON, or its text when it is not JSON."""
        if self._container is None:
            raise self.error(f"the {self.kind} is not started")
        argv = ["python3", "-I", "-S", "-B", "-c", _CLIENT, method, path, str(self.settings.port)]
        if body is not None:
            argv.append(json.dumps(body))
        try:
            code, output = self._container.exec_run(argv, user=f"{SERVICE_UID}:{SERVICE_UID}")
        except docker.errors.DockerException as e:
            raise self.error(f"cannot ask the {self.kind} {method} {path}: {e}") from e
        assert isinstance(output, bytes)  # stream=False: the whole output at once
        text = output.decode(errors="replace").strip()
        if code != 0:
            raise self.error(f"asking the {self.kind} {method} {path} failed (exit {code}): {text[-500:]}")
        try:
            reply: dict[str, Any] = json.loads(text.splitlines()[-1])
            return reply
        except (ValueError, IndexError) as e:
            raise self.error(f"the {self.kind}'s reply to {method} {path} is not JSON: {text[-500:]}") from e

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, JSON body) of one request to the service, made inside its container."""
        reply = self.exchange(method, path, body)
        return reply["status"], reply["body"]

    def _get(self, path: str, *, allow_404: bool = False) -> Any:
        status, body = self.request("GET", path)
        if status == 404 and allow_404:
            return None
        if status != 200:
            raise self.error(f"GET {path}: {status} {body}")
        return body

    def events(self) -> list[dict[str, Any]]:
        """The service's JSON log lines (one per request, plus ready)."""
        out: list[dict[str, Any]] = []
        for line in self._logs(tail=100000).splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def _logs(self, tail: int = 30) -> str:
        try:
            return self._container.logs(tail=tail).decode(errors="replace") if self._container else ""
        except docker.errors.DockerException:
            return "(logs unavailable)"
