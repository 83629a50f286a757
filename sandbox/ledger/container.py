"""The ledger's container, run and queried from the host.

    with Ledger(client, lock=lock) as ledger:           # its own internal network, or network=...
        settings = ProxySettings(services=ledger.services(), service_networks=(ledger.network,))
        ... credit calls reach http://ledger.ringfence.internal through the egress proxy ...
        ledger.stats()["credits"], ledger.credits("<key>"), ledger.balance("acme-9")

Where the records live: a tmpfs inside the container (size- and inode-capped, noexec, owned by
the ledger's uid), not a volume. The records then live exactly as long as the receiver a test
or a demo starts, nothing outlives the container for the reaper or the test session's cleanup
to miss (both know containers and networks, not volumes), and the root filesystem stays
read-only with no host mount. SQLite's synchronous=FULL still orders every commit before its
response, so a reply lost on the way (the case the ledger exists to show) never loses the
record. The limit: the records do not survive the container, so this is a receiver for tests
and demos; a deployment that needs them to outlive it mounts a volume at DB_DIR instead.

How the host talks to it: `docker exec` of a small stdlib client inside the ledger container,
which speaks HTTP to the ledger on the container's own loopback. The host sends no packet to
any address (it talks to the engine over its socket), so the ledger's network can be internal
with no host address on its bridge; and those look-ups are not counted as network requests by
the ledger, so a test can assert that nothing reached it through the proxy.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
from docker.types import LogConfig, Ulimit

from sandbox import labels as L
from sandbox import seccomp
from sandbox.errors import EngineError

LEDGER_HOST = "ledger.ringfence.internal"
"""The name tools use for the ledger (control/tools/credit.json declares it as an egress host);
the egress proxy maps it to the ledger's pinned address (ProxySettings.services)."""
# Port 80: manifests declare host names (the allowlist's default ports are 80 and 443).
LEDGER_PORT = 80
LEDGER_UID = 10001
DB_DIR = "/var/lib/ringfence-ledger"
# Network options of the ledger's own network: no IPv4 address for the host on its bridge.
_INHIBIT = {"com.docker.network.bridge.inhibit_ipv4": "true"}

# Runs inside the ledger container: one HTTP request to the ledger on loopback, one JSON line out.
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
    doc = data.decode("latin-1")
print(json.dumps({"status": r.status, "body": doc}))
"""


class LedgerError(EngineError):
    """The ledger container could not be started or asked (with its status and recent logs)."""


@dataclass(frozen=True)
class LedgerSettings:
    image: str = "ledger"
    """Image name in images/images.lock."""

    port: int = LEDGER_PORT

    fail_after_commit: int | None = None
    """TESTS ONLY: the Nth applied credit commits and then its connection is reset without a
    response (the ledger's `--fail-after-commit`). None: never."""

    memory_bytes: int = 128 * 1024 * 1024
    cpus: float = 0.5
    pids: int = 64
    db_bytes: int = 64 * 1024 * 1024
    """Size cap of the tmpfs that holds the SQLite file."""
    start_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        if self.fail_after_commit is not None and (
            isinstance(self.fail_after_commit, bool) or not isinstance(self.fail_after_commit, int)
            or self.fail_after_commit < 1
        ):
            raise ValueError("fail_after_commit must be a positive integer or None")
        if not 0 < self.port < 65536:
            raise ValueError("port must be in 1..65535")

    def command(self) -> list[str]:
        argv = ["python3", "-I", "-S", "-B", "/opt/ringfence/ledger.py", "--db", f"{DB_DIR}/ledger.sqlite3",
                "--port", str(self.port)]
        if self.fail_after_commit is not None:
            argv += ["--fail-after-commit", str(self.fail_after_commit)]
        return argv


class Ledger:
    """One ledger container on a Docker network, started on enter, removed on exit."""

    def __init__(self, client: docker.DockerClient, *, lock: Any = None, network: str | None = None,
                 settings: LedgerSettings | None = None) -> None:
        self.client = client
        self.settings = settings or LedgerSettings()
        self._lock = lock
        self._network_name = network
        self._own_network = None
        self._container = None
        self._address: str | None = None
        self.name = f"rf-ledger-{uuid.uuid4().hex[:8]}"

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Ledger:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        if self._container is not None:
            return
        try:
            self._start()
        except BaseException:
            # Like testcontainers: a ledger that failed to come up leaves nothing behind.
            self.close()
            raise

    def _image_id(self) -> str:
        from sandbox.images import resolve_pinned

        return resolve_pinned(self.client, self.settings.image, self._lock)

    def _start(self) -> None:
        s = self.settings
        image_id = self._image_id()
        try:
            if self._network_name is None:
                self._own_network = self.client.networks.create(
                    f"{self.name}-net", driver="bridge", internal=True, options=_INHIBIT,
                    labels=L.base_labels("network"))
                self._network_name = self._own_network.name
            self._container = self.client.containers.create(
                image_id, s.command(), name=self.name, labels=L.base_labels("ledger"),
                network=self._network_name, **self._container_settings())
            self._container.start()
        except docker.errors.DockerException as e:
            raise LedgerError(f"cannot start the ledger: {e}") from e
        deadline = time.monotonic() + s.start_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            self._container.reload()
            if self._container.status not in ("created", "running"):
                break
            try:
                status, body = self.request("GET", "/healthz")
            except LedgerError as e:
                last = str(e).splitlines()[0]
            else:
                if status == 200:
                    networks = self._container.attrs["NetworkSettings"]["Networks"]
                    self._address = networks[self._network_name]["IPAddress"]
                    return
                last = f"/healthz answered {status}: {body}"
            time.sleep(0.1)
        raise LedgerError(f"the ledger did not become healthy ({last}); status {self._container.status}; "
                          f"recent logs:\n{self._logs()}")

    def _container_settings(self) -> dict[str, Any]:
        s = self.settings
        return dict(
            user=f"{LEDGER_UID}:{LEDGER_UID}",
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
            tmpfs={
                DB_DIR: f"rw,noexec,nosuid,nodev,size={s.db_bytes},nr_inodes=64,mode=0700,"
                        f"uid={LEDGER_UID},gid={LEDGER_UID}",
                "/tmp": "rw,noexec,nosuid,nodev,size=1m,nr_inodes=64,mode=1777",
            },
            # Its only name is the one the proxy pins; it resolves nothing itself.
            dns=["127.0.0.1"],
            dns_search=["."],
            hostname="ledger",
            # Port 80 as uid 10001 with no capabilities (the engine's default too, made explicit).
            sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
            init=False,
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
                pass  # the reaper removes it by label
            self._container = None
        if self._own_network is not None:
            try:
                self._own_network.remove()
            except docker.errors.DockerException:
                pass
            self._own_network = None
            self._network_name = None
        self._address = None

    # -- where it is -----------------------------------------------------------------------

    @property
    def container(self):
        return self._container

    @property
    def network(self) -> str:
        """The Docker network the ledger sits on (the proxy joins it: service_networks)."""
        if self._network_name is None:
            raise LedgerError("the ledger is not started")
        return self._network_name

    @property
    def address(self) -> str:
        """The ledger's address on its network: what the proxy pins for LEDGER_HOST."""
        if self._address is None:
            raise LedgerError("the ledger is not started")
        return self._address

    def services(self, name: str = LEDGER_HOST) -> dict[str, tuple[str, ...]]:
        """The ProxySettings.services entry that makes `name` the ledger."""
        return {name: (self.address,)}

    # -- asking it -------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, JSON body) of one request to the ledger, made inside its container."""
        if self._container is None:
            raise LedgerError("the ledger is not started")
        argv = ["python3", "-I", "-S", "-B", "-c", _CLIENT, method, path, str(self.settings.port)]
        if body is not None:
            argv.append(json.dumps(body))
        try:
            code, output = self._container.exec_run(argv, user=f"{LEDGER_UID}:{LEDGER_UID}")
        except docker.errors.DockerException as e:
            raise LedgerError(f"cannot ask the ledger {method} {path}: {e}") from e
        text = output.decode(errors="replace").strip()
        if code != 0:
            raise LedgerError(f"asking the ledger {method} {path} failed (exit {code}): {text[-500:]}")
        try:
            reply = json.loads(text.splitlines()[-1])
        except (ValueError, IndexError) as e:
            raise LedgerError(f"the ledger's reply to {method} {path} is not JSON: {text[-500:]}") from e
        return reply["status"], reply["body"]

    def _get(self, path: str, *, allow_404: bool = False) -> Any:
        status, body = self.request("GET", path)
        if status == 404 and allow_404:
            return None
        if status != 200:
            raise LedgerError(f"GET {path}: {status} {body}")
        return body

    def stats(self) -> dict:
        """{"credits", "replays", "conflicts", "rejected", "dropped_replies",
        "network": {"connections", "requests"}} (see sandbox.ledger.server)."""
        return self._get("/stats")

    def credits(self, key: str) -> dict | None:
        """The record applied under `key`, or None."""
        return self._get(f"/credits/{key}", allow_404=True)

    def balance(self, account: str) -> dict:
        """{"account", "balance", "credits"}."""
        return self._get(f"/accounts/{account}")

    def events(self) -> list[dict]:
        """The ledger's JSON log lines (one per request, plus ready and dropped_reply)."""
        out = []
        for line in self._logs(tail=100000).splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def _logs(self, tail: int = 30) -> str:
        try:
            return self._container.logs(tail=tail).decode(errors="replace") if self._container else ""
        except docker.errors.DockerException:
            return "(logs unavailable)"
