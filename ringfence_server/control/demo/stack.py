"""The reference demo's world, started for real and removed afterwards, whatever happens.

    with DemoStack(workdir) as stack:
        stack.address                  the control plane (a real gRPC server on a loopback port)
        stack.ledger, stack.runbooks   the two internal services (containers of pinned images)

    runbooks.internal.corp ─┐  one internal Docker network: the services and the egress proxy,
    ledger.ringfence.internal┘ nothing else (no route out)
    the egress proxy        ── knows the two names at their pinned addresses ([egress] services)
    each tool call          ── a fresh sandbox with no network, its egress through its own socket
    the control plane       ── the embedded defaults + ringfence_server/control/demo/reference.toml + what is only
                               known at run time (state dir, /input, the services' addresses)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.api.serve import egress_settings, pool_settings
from ringfence_server.control.config import Config, load_config
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.store import open_store
from ringfence_server.demo_services.ledger import Ledger
from ringfence_server.demo_services.runbooks import Runbooks
from ringfence_server.sandbox.docker_backend import DockerBackend

if TYPE_CHECKING:
    from ringfence_server.sandbox.egress.proxy import ProxySettings

# ringfence_server.control.api.serve.egress_settings carries no annotations; this says what it takes and gives.
_egress_settings: Callable[[Config], ProxySettings | None] = egress_settings

REFERENCE_CONFIG = Path(__file__).with_name("reference.toml")

# What the agent finds in its read-only /input folder.
INCIDENT = """\
INC-4471  customer acme-9  severity 3

acme-9 was charged twice for order 7731 ($50 each) after a payment timeout.
The second charge went through; the order failed. The customer asks for the money back.
Runbook: payment-failed.
"""


class DemoStack:
    """The services, the proxy, the sandbox backend, the store and the server of one demo."""

    def __init__(self, workdir: Path, *, docker_client: Any = None, lock: Any = None) -> None:
        self.workdir = Path(workdir)
        self._docker = docker_client
        self._lock = lock
        self._exit = contextlib.ExitStack()
        self.config: Config | None = None
        self.ledger: Ledger | None = None
        self.runbooks: Runbooks | None = None
        self.backend: DockerBackend | None = None
        self.server: BackgroundServer | None = None

    @property
    def address(self) -> str:
        assert self.server is not None, "the stack is not started"
        return self.server.address

    def __enter__(self) -> DemoStack:
        try:
            self._start()
        except BaseException:
            self._exit.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._exit.close()

    def container_names(self) -> set[str]:
        """The long-lived containers of this stack: the two services and the egress proxy."""
        names = {s.name for s in (self.ledger, self.runbooks) if s is not None}
        proxy = self.backend.egress_proxy if self.backend is not None else None
        if proxy is not None:
            names.add(proxy.name)
        return names

    def _start(self) -> None:
        import docker

        es = self._exit
        client = self._docker or es.enter_context(contextlib.closing(docker.from_env(timeout=60)))
        self.ledger = es.enter_context(Ledger(client, lock=self._lock))
        # Beside the ledger, on its network: one internal network for the proxy to join.
        self.runbooks = es.enter_context(Runbooks(client, lock=self._lock, network=self.ledger.network))
        inputs = self.workdir / "input"
        inputs.mkdir(parents=True, exist_ok=True)
        # Readable by the sandbox user (the folder is bind-mounted read-only at /input).
        inputs.chmod(0o755)
        (inputs / "incident.md").write_text(INCIDENT)
        (inputs / "incident.md").chmod(0o644)
        self.config = load_config(REFERENCE_CONFIG, overrides={
            "state_dir": str(self.workdir / "state"),
            "inputs": {"/input": str(inputs)},
            "egress": {"services": {name: list(addresses) for name, addresses in
                                    {**self.ledger.services(), **self.runbooks.services()}.items()},
                       "networks": [self.ledger.network]},
        })
        # Its own engine client: the backend closes the client it holds.
        self.backend = DockerBackend(lock=self._lock, egress_settings=_egress_settings(self.config),
                                     pool=pool_settings(self.config))
        es.callback(self.backend.close)  # the egress proxy goes with it
        store = open_store(self.config.db_path)
        es.callback(store.close)
        orchestrator = Orchestrator.from_config(self.config, self.backend, store)
        es.callback(orchestrator.close)
        self.server = BackgroundServer(orchestrator, self.config).start()
        es.callback(self.server.stop)
