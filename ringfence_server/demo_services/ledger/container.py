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

How the host talks to it, how it is hardened, started, waited for and removed: the shared
service container (ringfence_server.demo_services.container.ServiceContainer); `docker exec` on its loopback, so the
host's look-ups are not counted as network requests by the ledger and a test can assert that
nothing reached it through the proxy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import docker

from ringfence_server.demo_services.container import SERVICE_UID, ServiceContainer, ServiceError, ServiceSettings

if TYPE_CHECKING:
    from ringfence_server.sandbox.pinned_images import Lock

LEDGER_HOST = "ledger.ringfence.internal"
"""The name tools use for the ledger (ringfence_server/control/tools/credit.json declares it as an egress host);
the egress proxy maps it to the ledger's pinned address (ProxySettings.services)."""
# Port 80: manifests declare host names (the allowlist's default ports are 80 and 443).
LEDGER_PORT = 80
LEDGER_UID = SERVICE_UID
DB_DIR = "/var/lib/ringfence-ledger"


class LedgerError(ServiceError):
    """The ledger container could not be started or asked (with its status and recent logs)."""


@dataclass(frozen=True)
class LedgerSettings(ServiceSettings):
    image: str = "ledger"
    """Image name in images/images.lock."""

    port: int = LEDGER_PORT

    fail_after_commit: int | None = None
    """TESTS ONLY: the Nth applied credit commits and then its connection is reset without a
    response (the ledger's `--fail-after-commit`). None: never."""

    db_bytes: int = 64 * 1024 * 1024
    """Size cap of the tmpfs that holds the SQLite file."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fail_after_commit is not None and (
            isinstance(self.fail_after_commit, bool) or not isinstance(self.fail_after_commit, int)
            or self.fail_after_commit < 1
        ):
            raise ValueError("fail_after_commit must be a positive integer or None")

    def command(self) -> list[str]:
        argv = ["python3", "-I", "-S", "-B", "/opt/ringfence/ledger.py", "--db", f"{DB_DIR}/ledger.sqlite3",
                "--port", str(self.port)]
        if self.fail_after_commit is not None:
            argv += ["--fail-after-commit", str(self.fail_after_commit)]
        return argv


class Ledger(ServiceContainer):
    """One ledger container on a Docker network, started on enter, removed on exit."""

    kind = "ledger"
    host = LEDGER_HOST
    error = LedgerError
    settings: LedgerSettings  # what __init__ gives the base class

    def __init__(self, client: docker.DockerClient, *, lock: Lock | None = None, network: str | None = None,
                 settings: LedgerSettings | None = None) -> None:
        super().__init__(client, settings or LedgerSettings(), lock=lock, network=network)

    def __enter__(self) -> Ledger:
        return super().__enter__()

    def _tmpfs(self) -> dict[str, str]:
        return {
            **super()._tmpfs(),
            DB_DIR: f"rw,noexec,nosuid,nodev,size={self.settings.db_bytes},nr_inodes=64,mode=0700,"
                    f"uid={LEDGER_UID},gid={LEDGER_UID}",
        }

    def services(self, name: str | None = LEDGER_HOST) -> dict[str, tuple[str, ...]]:
        """The ProxySettings.services entry that makes `name` the ledger."""
        return super().services(name)

    # -- asking it -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """{"credits", "replays", "conflicts", "rejected", "dropped_replies",
        "network": {"connections", "requests"}} (see ringfence_server.demo_services.ledger.server)."""
        stats: dict[str, Any] = self._get("/stats")
        return stats

    def credits(self, key: str) -> dict[str, Any] | None:
        """The record applied under `key`, or None."""
        record: dict[str, Any] | None = self._get(f"/credits/{key}", allow_404=True)
        return record

    def all_credits(self) -> list[dict[str, Any]]:
        """Every credit on record, in the order applied (asked on the ledger's loopback)."""
        records: list[dict[str, Any]] = self._get("/credits")["credits"]
        return records

    def balance(self, account: str) -> dict[str, Any]:
        """{"account", "balance", "credits"}."""
        balance: dict[str, Any] = self._get(f"/accounts/{account}")
        return balance
