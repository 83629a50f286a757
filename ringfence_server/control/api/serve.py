"""`ringfence serve`: the control plane's gRPC server, until SIGINT or SIGTERM.

Builds the config (embedded defaults, then --config), the tools (the built-in ones and the
config's tool packages, ringfence_server.control.toolpkg.packages: a bad manifest, a limit over the caps or a
name defined twice exits 2 before anything else starts), the SQLite event store in the state
directory, the Docker sandbox backend, the runs' workspaces on the same engine
(ringfence_server.sandbox.workspace.DockerWorkspaces: reaped at start and every workspace.reap_interval_s) and
the Orchestrator; prints the address it listens on
(one line on stdout, so a supervisor or a test can read the port when --listen ends in :0)
and logs its version and the client versions it serves;
serves; and on SIGINT/SIGTERM reports NOT_SERVING, lets in-flight calls finish for a few
seconds, and closes everything.

With --mcp-listen it also serves the MCP front door over Streamable HTTP at http(s)://HOST:PORT/mcp
(ringfence_server.control.api.mcp_http), a client of the gRPC listener with each caller's token;
its address is printed on its own line after the gRPC one, and on SIGINT/SIGTERM it stops first
(its sessions' runs are finished over the gRPC listener, still up).

Exit codes: 0 after a clean shutdown, 2 for a bad configuration or arguments, 1 when the
engine, the state directory or the address is not usable.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this module: the server's dependencies load only to serve
    from opentelemetry.sdk.trace import TracerProvider

    from ringfence_server.console.server import ConsoleServer
    from ringfence_server.control.api.mcp_http import McpListener
    from ringfence_server.control.api.server import TlsOptions
    from ringfence_server.control.config import Config
    from ringfence_server.control.eventlog import EventHook
    from ringfence_server.control.metrics import Metrics
    from ringfence_server.control.orchestration import Orchestrator
    from ringfence_server.control.registry import Registry
    from ringfence_server.control.store.base import EventStore
    from ringfence_server.control.toolpkg.packages import ToolPackage
    from ringfence_server.control.workers.hub import WorkerHub
    from ringfence_server.control.workers.registry import WorkerRegistry
    from ringfence_server.sandbox.backend import SandboxBackend
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.egress.proxy import ProxySettings
    from ringfence_server.sandbox.mcp_session import McpSettings
    from ringfence_server.sandbox.pinned_images import Lock as ImageLock
    from ringfence_server.sandbox.pool import PoolSettings
    from ringfence_server.sandbox.workspace import DockerWorkspaces

log = logging.getLogger("ringfence.serve")

SHUTDOWN_GRACE_S = 5.0
REAP_INTERVAL_S = 30.0  # how often a running server removes orphans (past their deadline label)
MCP_IDLE_TIMEOUT_S = 30 * 60.0  # the MCP listener's defaults (mcp_http's, repeated: the CLI does not import it)
MCP_SESSIONS_PER_TOKEN = 16
# The plaintext dev tokens documented in ringfence_server/control/default_config.toml: public knowledge.
PUBLIC_DEMO_TOKENS = ("demo-agent-token", "demo-approver-token", "demo-admin-token")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the gRPC control plane",
        description=(
            "Serve ringfence.v1 (with grpc.health.v1 and server reflection) until SIGINT or SIGTERM. "
            "Without --config the embedded defaults are used: a demo tenant with public dev tokens."
        ),
    )
    p.add_argument("--listen", default=None,
                   help="host:port (default: the config's listen, 127.0.0.1:50051); port 0 picks one")
    p.add_argument("--config", default=None, type=Path, help="ringfence.toml merged over the embedded defaults")
    p.add_argument("--state-dir", default=None, type=Path,
                   help="directory of the event log (default: the config's state_dir)")
    p.add_argument("--database-url", default=None, metavar="postgresql://...",
                   help="keep the event log in PostgreSQL instead of SQLite (default: the config's database_url); "
                        "several `ringfence serve` processes may share one database and serve any run")
    p.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve TLS")
    p.add_argument("--tls-key", type=Path, help="PEM private key for --tls-cert")
    p.add_argument("--tls-client-ca", type=Path, help="PEM CA: require client certificates it signed (mTLS)")
    p.add_argument("--reap-every", default=REAP_INTERVAL_S, type=float, metavar="SECONDS",
                   help="how often to remove orphaned containers (past their deadline, or of a dead instance) "
                        f"(default {REAP_INTERVAL_S:g})")
    p.add_argument("--metrics-listen", default=None, metavar="HOST:PORT",
                   help="also serve Prometheus metrics at http://HOST:PORT/metrics (off by default)")
    p.add_argument("--mcp-listen", default=None, metavar="HOST:PORT",
                   help="also serve the MCP front door over Streamable HTTP at http://HOST:PORT/mcp (off by default; "
                        "port 0 picks one). Every request needs 'Authorization: Bearer TOKEN' (a token of the "
                        "config's tenants); each MCP session is one run. TLS with --tls-cert/--tls-key (required "
                        "off loopback). Needs the extra: pip install 'ringfence[mcp]'")
    p.add_argument("--mcp-idle-timeout", default=MCP_IDLE_TIMEOUT_S, type=float, metavar="SECONDS",
                   help="an MCP session without a request in flight for this long ends, and its run is finished "
                        f"(default {MCP_IDLE_TIMEOUT_S:g})")
    p.add_argument("--mcp-sessions-per-token", default=MCP_SESSIONS_PER_TOKEN, type=int, metavar="N",
                   help="open MCP sessions one token may hold at once; beyond, a new one is refused with 429 "
                        f"(default {MCP_SESSIONS_PER_TOKEN})")
    p.add_argument("--console", default=None, metavar="HOST:PORT",
                   help="also serve the reviewer's console (web pages for approvals, runs, traces and tools) at "
                        "http://HOST:PORT/ (off by default; port 0 picks one). It signs people in with their own "
                        "tokens and reaches this server over gRPC only, as `ringfence console` would. TLS with "
                        "--tls-cert/--tls-key (required off loopback)")
    p.add_argument("--otlp-endpoint", default=None, metavar="HOST:PORT",
                   help="export traces over OTLP/gRPC to this collector (plaintext to a loopback HOST:PORT or "
                        "http://..., TLS to any other host or https://...; off by default)")
    p.add_argument("--trace-console", action="store_true",
                   help="also print every finished span on stdout, one JSON object a line (for debugging)")
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="text (default), or json: one JSON object per log line on stderr, including one line "
                        "per event of every run (run id, call id, trace id; sizes and digests, never arguments "
                        "or tool output)")
    p.set_defaults(func=serve_command)


def _tls(args: argparse.Namespace) -> TlsOptions | None:
    from ringfence_server.control.api.server import TlsOptions

    if not args.tls_cert and not args.tls_key:
        if args.tls_client_ca:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if not (args.tls_cert and args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    for path in (args.tls_cert, args.tls_key, args.tls_client_ca):
        if path is not None and not path.is_file():
            raise ValueError(f"{path} is not a file")
    return TlsOptions(args.tls_cert, args.tls_key, args.tls_client_ca)


def _host_port(text: str, flag: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{flag} must be HOST:PORT (e.g. 127.0.0.1:9464), not {text!r}")
    return host.strip("[]"), int(port)


def _is_loopback(listen: str) -> bool:
    from ringfence_server.control.netloc import is_loopback_host

    return is_loopback_host(listen.rpartition(":")[0])


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What `ringfence serve` reads and checks before it touches the engine (a mistake in any of
    it is a configuration error: exit 2)."""

    config: Config
    listen: str
    tools: list[ToolPackage]
    registry: Registry
    tls: TlsOptions | None
    metrics_at: tuple[str, int] | None
    otlp_endpoint: str | None
    mcp: McpOptions | None = None
    console: tuple[str, int] | None = None
    """--console: where the reviewer's console listens (None: no console)."""


@dataclasses.dataclass(frozen=True)
class McpOptions:
    """--mcp-listen and its bounds, checked."""

    host: str
    port: int
    idle_timeout_s: float
    sessions_per_token: int

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.port}"


@dataclasses.dataclass
class _Running:
    """What serve_command has started so far; close() stops it all, whatever happened. Each
    part is recorded as soon as it exists, so that one which fails half-way is still closed."""

    backend: SandboxBackend
    """What runs the calls: this host's engine (`docker`), or the attached workers."""
    docker: DockerBackend | None = None
    """This host's engine, when it runs calls (without workers, or `[workers] run_here`)."""
    workers: WorkerRegistry | None = None
    """The attached sandbox workers, when `[workers] enabled`."""
    store: EventStore | None = None
    orchestrator: Orchestrator | None = None
    metrics: Metrics | None = None
    tracing: TracerProvider | None = None
    reaping: Periodic | None = None

    def close(self) -> None:
        """Stop what was started, users before what they use; tracing last."""
        if self.reaping is not None:
            self.reaping.stop()
        if self.metrics is not None:
            self.metrics.close()
        if self.orchestrator is not None:
            self.orchestrator.close()
        if self.store is not None:
            self.store.close()
        self.backend.close()
        if self.tracing is not None:
            from ringfence_server.control.telemetry import shutdown_tracing

            shutdown_tracing(self.tracing)  # after everything that may still end a span


def serve_command(args: argparse.Namespace) -> int:
    from ringfence.errors import ConfigError
    from ringfence_server.control.eventlog import configure_logging

    configure_logging(getattr(args, "log_format", "text"))
    try:
        setup = _setup(args)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if _refuses_exposure(setup):
        return 2
    started = _start_backend(setup.config, args)
    if started is None:
        return 1
    running, lock = started
    try:
        return _run(args, setup, lock, running)
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        running.close()


def _setup(args: argparse.Namespace) -> _Setup:
    """The config (with the command line's overrides), the tools and the listening options;
    ConfigError or ValueError for a bad one, before anything starts."""
    from ringfence_server.control.config import load_config

    config = _configured(load_config(args.config), args)
    listen = args.listen or config.listen
    # The built-in tools and the config's tool packages, checked now (a bad manifest, a
    # limit over the caps or a name defined twice is a configuration error: exit 2).
    from ringfence_server.control.registry import Registry
    from ringfence_server.control.toolpkg.packages import load_all

    tools = load_all(config)
    registry = Registry(t.manifest for t in tools)
    tls = _tls(args)
    metrics_at = _host_port(args.metrics_listen, "--metrics-listen") if args.metrics_listen else None
    otlp_endpoint = getattr(args, "otlp_endpoint", None)
    _check_otlp_endpoint(otlp_endpoint)
    _warn_crash_point()
    mcp = _mcp_options(args, tls)
    console = _console_at(args, tls)
    return _Setup(config, listen, tools, registry, tls, metrics_at, otlp_endpoint, mcp, console)


def _console_at(args: argparse.Namespace, tls: TlsOptions | None) -> tuple[str, int] | None:
    """--console's host and port (None: no console); ValueError for a bad one."""
    if getattr(args, "console", None) is None:
        return None
    if tls is not None and tls.client_ca is not None:
        # The console is a client of the gRPC listener, with no client certificate of its own.
        raise ValueError("--console cannot be combined with --tls-client-ca (mTLS) yet")
    return _host_port(args.console, "--console")


def _mcp_options(args: argparse.Namespace, tls: TlsOptions | None) -> McpOptions | None:
    """--mcp-listen and its bounds (None: no MCP listener); ValueError for a bad one."""
    if getattr(args, "mcp_listen", None) is None:
        return None
    host, port = _host_port(args.mcp_listen, "--mcp-listen")
    idle = args.mcp_idle_timeout
    if not (idle > 0 and idle != float("inf")):
        raise ValueError("--mcp-idle-timeout must be a positive number of seconds")
    if args.mcp_sessions_per_token <= 0:
        raise ValueError("--mcp-sessions-per-token must be at least 1")
    if tls is not None and tls.client_ca is not None:
        # The listener is a client of the gRPC listener, and has no client certificate of its own.
        raise ValueError("--mcp-listen cannot be combined with --tls-client-ca (mTLS) yet")
    try:
        import mcp  # noqa: F401 - only checked for: the error names the extra
    except ImportError:
        raise ValueError("--mcp-listen needs the MCP Python SDK: pip install 'ringfence[mcp]'") from None
    return McpOptions(host, port, idle, args.mcp_sessions_per_token)


def _configured(config: Config, args: argparse.Namespace) -> Config:
    """The config with --state-dir and --database-url applied over it."""
    if args.state_dir is not None:
        config = dataclasses.replace(config, state_dir=args.state_dir.resolve())
    if args.database_url is not None:
        if not args.database_url.startswith(("postgresql://", "postgres://")):
            raise ValueError("--database-url must be a postgresql:// URL")
        config = dataclasses.replace(config, database_url=args.database_url)
    return config


def _check_otlp_endpoint(otlp_endpoint: str | None) -> None:
    """--otlp-endpoint is HOST:PORT or a URL (ValueError otherwise)."""
    if otlp_endpoint is not None and "://" not in otlp_endpoint:
        try:
            _host_port(otlp_endpoint, "--otlp-endpoint")
        except ValueError:
            # The URL form is allowed here, so the message names it (not _host_port's own).
            raise ValueError(f"--otlp-endpoint must be HOST:PORT (e.g. 127.0.0.1:4317) or an http(s):// URL, "
                             f"not {otlp_endpoint!r}") from None


def _warn_crash_point() -> None:
    """A warning on stderr when a crash point (a test's fault injection) is armed."""
    from ringfence_server.control.orchestration.crashpoints import configured as crash_point_configured

    if crash_point_configured():
        print(f"warning: crash point {crash_point_configured()} armed: this process will kill itself there",
              file=sys.stderr)


def _refuses_exposure(setup: _Setup) -> bool:
    """Past loopback: True (after an error on stderr) when the public demo tokens would be
    served (on either listener), or the MCP listener would take bearer tokens in clear text (it
    is HTTP: no mTLS or proxy in front is assumed); a warning when the gRPC listener's would."""
    if setup.mcp is not None and _listener_refused(setup, setup.mcp.listen, "--mcp-listen"):
        return True
    if setup.console is not None and _listener_refused(setup, f"{setup.console[0]}:{setup.console[1]}", "--console"):
        return True
    if _is_loopback(setup.listen):
        return False
    if _public_tokens_refused(setup, setup.listen):
        return True
    if setup.tls is None:
        print(f"warning: bearer tokens travel in clear text on {setup.listen}; use --tls-cert/--tls-key",
              file=sys.stderr)
    return False


def _listener_refused(setup: _Setup, listen: str, flag: str) -> bool:
    """The MCP listener's rule: off loopback, neither the public demo tokens nor clear text."""
    if _is_loopback(listen):
        return False
    if _public_tokens_refused(setup, listen):
        return True
    if setup.tls is None:
        print(f"error: refusing {flag} {listen} without TLS: bearer tokens would travel in clear text; "
              "use --tls-cert/--tls-key, or listen on 127.0.0.1", file=sys.stderr)
        return True
    return False


def _public_tokens_refused(setup: _Setup, listen: str) -> bool:
    """True (after an error on stderr) when the config holds a public demo token."""
    public = [t for t in PUBLIC_DEMO_TOKENS if setup.config.principal_for_token(t) is not None]
    if public:
        print(f"error: refusing to serve the public demo tokens ({', '.join(public)}) on {listen}; "
              "configure [tenants] in --config, or listen on 127.0.0.1", file=sys.stderr)
        return True
    return False


def _start_backend(config: Config, args: argparse.Namespace) -> tuple[_Running, ImageLock] | None:
    """What runs the calls, and the image lock: the Docker sandbox backend (reaping orphans every
    --reap-every seconds), or with `[workers] enabled` the attached workers (and this host's
    engine only with `run_here`); None (after an error on stderr) when it cannot start."""
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.errors import SandboxError
    from ringfence_server.sandbox.pinned_images import load_lock
    from ringfence_server.worker.errors import WorkerError

    try:
        # One image lock for the backend and the workspaces' keepers: both run pinned images.
        # The config's images dir (its own lock over the built-in one), else the built-in lock.
        if config.images_dir is not None:
            from ringfence_server.sandbox.pinned_images import lock_for

            lock = lock_for(config.images_dir)
        else:
            lock = load_lock()
        docker = None
        if not config.workers.enabled or config.workers.run_here:
            docker = DockerBackend(lock=lock, egress_settings=egress_settings(config), pool=pool_settings(config),
                                   mcp=mcp_settings(config))
            # A killed predecessor's containers go now; anything past its deadline label, while we run.
            docker.start_reaper(args.reap_every)
    except SandboxError as e:
        print(f"error: the sandbox engine is not usable: {e}", file=sys.stderr)
        return None
    if not config.workers.enabled:
        assert docker is not None
        return _Running(docker, docker=docker), lock
    from ringfence_server.control.workers.registry import WorkerRegistry
    from ringfence_server.control.workers.remote import RemoteBackend
    from ringfence_server.control.workers.sealing import Sealer

    w = config.workers
    try:
        assert w.signing_key is not None  # the config requires it when enabled
        sealer = Sealer.from_file(w.signing_key, clock=time.time)
    except (WorkerError, OSError) as e:
        if docker is not None:
            docker.close()
        print(f"error: [workers] signing_key: {e}", file=sys.stderr)
        return None
    registry = WorkerRegistry()
    remote = RemoteBackend(registry, sealer, lock, place_timeout_s=w.place_timeout_s,
                           start_allowance_s=w.start_allowance_s, local=docker, tenant_labels=w.tenant_labels)
    print(f"ringfence: calls run on sandbox workers (key {sealer.key_id}; {len(w.tokens)} worker token(s))"
          + ("; what workers cannot run yet runs here" if docker is not None else ""), flush=True)
    return _Running(remote, docker=docker, workers=registry), lock


def _run(args: argparse.Namespace, setup: _Setup, lock: ImageLock, running: _Running) -> int:
    """Tracing, the event store, the Orchestrator on `running.backend`, its event hooks and
    workspace reaper, then the gRPC server until SIGINT/SIGTERM; the exit code. What it starts
    is recorded in `running` for the caller to close."""
    from ringfence_server.control.orchestration import Orchestrator
    from ringfence_server.control.telemetry import configure_tracing

    config = setup.config
    # Always recording, exporting only when asked: a run's trace id is then in its log and
    # its JSON log lines whether or not a collector is configured.
    running.tracing = configure_tracing(setup.otlp_endpoint, getattr(args, "trace_console", False), record=True)
    if setup.otlp_endpoint:
        print(f"ringfence: exporting traces to {setup.otlp_endpoint} (OTLP/gRPC)", flush=True)
    where = config.database_url or config.db_path
    running.store = _open_event_store(config, where)
    if running.store is None:
        return 1
    own = [f"{t.name} ({t.folder})" for t in setup.tools if t.folder is not None]
    if own:
        print(f"ringfence: tool packages: {', '.join(own)}", file=sys.stderr, flush=True)
    orchestrator = running.orchestrator = Orchestrator.from_config(
        config, running.backend, running.store, registry=setup.registry,
        workspaces=workspaces(running.docker, lock, str(where)) if running.docker is not None else None)
    _attach_event_hooks(args, setup, running, orchestrator)
    # Runs whose writer (another instance) died mid-way are taken over when its lease expires;
    # after the hooks, so that what adoption appends is counted and logged too.
    orchestrator.start_adopting(config.limits.lease_ttl_s)
    # Workspaces whose run ended (or is unknown: a predecessor's) go now and on a timer.
    running.reaping = Periodic("rf-ws-reaper", config.workspace.reap_interval_s, orchestrator.reap_workspaces,
                               "reaping workspaces")
    running.reaping.start()
    hub = None
    if running.workers is not None:
        from ringfence_server.control.workers.hub import WorkerHub
        from ringfence_server.sandbox.labels import instance_id

        hub = WorkerHub(running.workers, running.store, config.workers, instance_id())
    return asyncio.run(_serve(setup.listen, orchestrator, config, setup.tls, setup.mcp, setup.console, hub))


def _open_event_store(config: Config, where: str | Path) -> EventStore | None:
    """The event log at `where` (the database URL, else the SQLite file); None (after an error on
    stderr) when it cannot be opened."""
    from ringfence_server.control.store import open_store

    try:
        # PostgreSQL: a call waits this long for a connection, then is told UNAVAILABLE.
        return (open_store(where, timeout_s=config.limits.store_timeout_s) if config.database_url
                else open_store(where))
    except Exception as e:  # noqa: BLE001 - sqlite3/psycopg/OSError: report, do not trace back
        print(f"error: cannot open the event log at {_redact_url(str(where))}: {e}", file=sys.stderr)
        return None


def _attach_event_hooks(args: argparse.Namespace, setup: _Setup, running: _Running,
                        orchestrator: Orchestrator) -> None:
    """The Prometheus metrics (served at --metrics-listen) and the JSON event log lines
    (--log-format json), as the orchestrator's event hooks."""
    hooks: list[EventHook] = []
    if setup.metrics_at is not None:
        from ringfence_server.control.metrics import Metrics

        metrics = running.metrics = Metrics()  # recorded before it serves: closed if that fails
        hooks.append(metrics.observe)
        bound = metrics.serve(*setup.metrics_at)
        print(f"ringfence: metrics on http://{setup.metrics_at[0]}:{bound}/metrics", flush=True)
    if getattr(args, "log_format", "text") == "json":
        from ringfence_server.control.eventlog import EventLogger

        hooks.append(EventLogger().observe)
    if hooks:
        from ringfence_server.control.eventlog import fan_out

        orchestrator.on_event = hooks[0] if len(hooks) == 1 else fan_out(*hooks)


async def _serve(listen: str, orchestrator: Orchestrator, config: Config, tls: TlsOptions | None,
                 mcp: McpOptions | None = None, console_at: tuple[str, int] | None = None,
                 worker_hub: WorkerHub | None = None) -> int:
    from ringfence._version import __version__
    from ringfence.wire import version
    from ringfence_server.control.api.server import create_server

    server, port = await create_server(listen, orchestrator, config, tls=tls, worker_hub=worker_hub)
    await server.start()
    host = listen.rpartition(":")[0]
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    mcp_listener: McpListener | None = None
    console: ConsoleServer | None = None
    try:
        if mcp is not None:
            # Bound before any address is announced: a port in use is said before the first line.
            mcp_listener = _mcp_listener(mcp, host, port, tls)
            mcp_listener.bind()
        if console_at is not None:
            console = _console(console_at, host, port, tls)  # bound here, served below
        # The handlers go in before the address is announced: a supervisor that reads the line and
        # stops us at once must find them (a SIGTERM in between would be swallowed and the server hang).
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        print(f"ringfence: serving ringfence.v1 on {host}:{port}{' (TLS)' if tls else ''}", flush=True)
        if mcp_listener is not None:
            await mcp_listener.start()
            print(f"ringfence: MCP (Streamable HTTP) on {mcp_listener.url}{' (TLS)' if tls else ''}", flush=True)
        if console is not None:
            # Its own thread and event loop: a slow page never holds up the gRPC listener's loop.
            await asyncio.to_thread(console.start_in_thread)
            print(f"ringfence: console on {console.url}/", flush=True)
        # A log line of its own (stderr): the lines above are parsed by supervisors and tests.
        log.info("ringfence-server %s, serving clients %s", __version__, version.served_clients(__version__))
        await stopping.wait()
        if console is not None:  # its live pages hold gRPC streams: closed before the listener
            await asyncio.to_thread(console.stop)
            console = None
        if mcp_listener is not None:
            # Before the gRPC server: the MCP sessions' runs are finished over it.
            await mcp_listener.stop()
            mcp_listener = None
        # Nothing of ours outlives us unwatched: the running calls' containers are killed first
        # (each call is recorded `killed`, with why), then in-flight RPCs get the grace period.
        killed = await asyncio.to_thread(orchestrator.backend.kill_all, "the control plane is shutting down")
        log.info("shutting down: NOT_SERVING, %d running call(s) killed, %gs for in-flight RPCs",
                 killed, SHUTDOWN_GRACE_S)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if console is not None:
            await asyncio.to_thread(console.stop)
        if mcp_listener is not None:  # it failed to start, or serving failed: still stopped first
            await mcp_listener.stop()
        await server.stop(SHUTDOWN_GRACE_S)
    print("ringfence: stopped", flush=True)
    return 0


def _mcp_listener(mcp: McpOptions, grpc_host: str, grpc_port: int, tls: TlsOptions | None) -> McpListener:
    """The MCP listener of --mcp-listen, a client of the gRPC listener at grpc_host:grpc_port."""
    from ringfence_server.control.api.mcp_http import McpListener, McpSettings, connect_target

    return McpListener(McpSettings(
        mcp.host, mcp.port, connect_target(grpc_host, grpc_port),
        tls_cert=tls.cert_chain if tls else None, tls_key=tls.private_key if tls else None,
        idle_timeout_s=mcp.idle_timeout_s, sessions_per_token=mcp.sessions_per_token,
    ), shutdown_grace_s=SHUTDOWN_GRACE_S)


def _console(at: tuple[str, int], grpc_host: str, grpc_port: int, tls: TlsOptions | None) -> ConsoleServer:
    """The console of --console (bound, not serving yet), a client of the gRPC listener at
    grpc_host:grpc_port: over TLS with serve's own certificate as its root, as the MCP listener."""
    from ringfence.options import TlsConfig
    from ringfence_server.console.app import ConsoleSettings, create_app
    from ringfence_server.console.server import ConsoleServer
    from ringfence_server.control.api.mcp_http import connect_target

    client_tls = TlsConfig.from_files(tls.cert_chain) if tls is not None else None
    settings = ConsoleSettings(server=connect_target(grpc_host, grpc_port), tls=client_tls, https=tls is not None)
    return ConsoleServer(create_app(settings), at[0], at[1], tls_cert=tls.cert_chain if tls else None,
                         tls_key=tls.private_key if tls else None)


def workspaces(backend: DockerBackend, lock: ImageLock, store_address: str) -> DockerWorkspaces:
    """The runs' workspaces on the backend's engine, their keepers from the same pinned images,
    in the deployment scope of the event store at `store_address` (`deployment_scope`)."""
    from ringfence_server.sandbox.workspace import DockerWorkspaces

    return DockerWorkspaces(backend.client, lock, scope=deployment_scope(store_address))


def deployment_scope(store_address: str) -> str:
    """The deployment a server belongs to on a shared engine: a digest of its event store's
    address (a PostgreSQL URL without its password; the SQLite file's path, which the config
    makes absolute, so two state directories are two deployments).

    Two deployments with different stores may each hold a run of the same key (tenant A's run
    X): the scope is in their workspaces' names and labels, so neither finds, removes nor reaps
    the other's. Every instance given the same address shares it, and so each other's
    workspaces."""
    import hashlib

    return hashlib.sha256(_redact_url(store_address).encode()).hexdigest()[:16]


class Periodic:
    """`fn()` at once and then every `interval_s` on a daemon thread, until stop(). A failure is
    logged and the next round tries again (the engine or the store may be down for a while)."""

    def __init__(self, name: str, interval_s: float, fn: Callable[[], object], what: str) -> None:
        self._fn = fn
        self._what = what
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                self._fn()
            except Exception as e:  # noqa: BLE001 - logged; the next round retries
                log.warning("%s: %s", self._what, e)
            if self._stopping.wait(self._interval_s):
                return

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)


def pool_settings(config: Config) -> PoolSettings | None:
    """The warm pool's settings from the config's [pool] table (None: off)."""
    if config.pool.size == 0:
        return None
    from ringfence_server.sandbox.pool import PoolSettings

    return PoolSettings(size=config.pool.size, max_size=config.pool.max_size, idle_s=config.pool.idle_s,
                        max_shapes=config.pool.max_shapes)


def mcp_settings(config: Config) -> McpSettings:
    """The MCP session sandboxes' bounds from the config's [mcp] table."""
    from ringfence_server.sandbox.mcp_session import McpSettings

    return McpSettings(max_per_owner=config.mcp.max_sessions_per_tenant, idle_s=config.mcp.idle_s)


def egress_settings(config: Config) -> ProxySettings | None:
    """The egress proxy's settings from the config's [egress] table (None: the defaults)."""
    if not config.egress.services and not config.egress.networks:
        return None
    from ringfence_server.sandbox.egress.proxy import ProxySettings

    return ProxySettings(services=dict(config.egress.services), service_networks=tuple(config.egress.networks))


def _redact_url(text: str) -> str:
    """A database URL without its password, for messages."""
    scheme, sep, rest = text.partition("://")
    if sep and "@" in rest:
        userinfo, _, hostpart = rest.rpartition("@")
        return f"{scheme}://{userinfo.split(':', 1)[0]}@{hostpart}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ringfence")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
