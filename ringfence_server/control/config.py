"""Configuration: embedded defaults (ringfence_server/control/default_config.toml) with a user file merged over.

`load_config(path=None)` returns a validated, frozen `Config`. Every validation error is a
`ConfigError` naming the dotted key, so a typo in a deployment's file points at itself.
Merging: tables merge key by key, arrays replace, and a user `[tenants]` table replaces the
default demo tenant entirely (the dev tokens are public).
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ringfence.errors import ConfigError
from ringfence.model import Role
from ringfence_server.control.routing.config import RoutingConfig, parse_routing
from ringfence_server.sandbox.egress.allowlist import PatternError, parse_patterns
from ringfence_server.sandbox.profile import GiB, KiB, MiB
from ringfence_server.sandbox.workspace import MAX_BYTES as WORKSPACE_MAX_BYTES
from ringfence_server.sandbox.workspace import MAX_INODES as WORKSPACE_MAX_INODES
from ringfence_server.sandbox.workspace import MIN_BYTES as WORKSPACE_MIN_BYTES
from ringfence_server.sandbox.workspace import MIN_INODES as WORKSPACE_MIN_INODES

DEFAULT_CONFIG_PATH = Path(__file__).with_name("default_config.toml")
BUILTIN_TOOLS_DIR = Path(__file__).with_name("tools")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class Verdict(enum.StrEnum):
    """A policy rule's verdict, and the contextual policy's decision (ringfence_server.control.policy)."""

    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


VERDICTS = tuple(v.value for v in Verdict)
AUTONOMY = ("supervised", "standard", "autonomous")
PREDICATES = ("eq", "ne", "lt", "lte", "gt", "gte", "in", "not_in", "matches", "prefix")


@dataclass(frozen=True)
class TokenConfig:
    sha256: str
    """sha256 hex of the bearer token; the plaintext is never stored."""
    role: Role
    subject: str


@dataclass(frozen=True)
class TenantConfig:
    name: str
    tokens: tuple[TokenConfig, ...]


def tool_matches(pattern: str, tool: str) -> bool:
    """A rule's `tool`: "*" (every tool), "SERVER.*" (every tool of a declared MCP server,
    ringfence_server.control.mcp_servers), or one tool's exact name."""
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return tool.startswith(pattern[:-1])
    return pattern == tool


@dataclass(frozen=True)
class RuleConfig:
    tool: str
    """A tool name, "*" for every tool, or "SERVER.*" for every tool of a declared MCP server."""
    verdict: Verdict
    when: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """argument name -> {predicate: operand}; every predicate must hold for the rule to match."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", Verdict(self.verdict))


@dataclass(frozen=True)
class GrantConfig:
    """An exact-call grant: this tool with exactly these arguments is allowed."""

    tool: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class PolicyConfig:
    autonomy: str = "standard"
    rules: tuple[RuleConfig, ...] = ()
    grants: tuple[GrantConfig, ...] = ()
    egress: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Tool name (or "*" for every tool) -> host patterns policy lets it reach. A call's egress
    allowlist is the intersection of this grant and the hosts its tool declares: nothing
    granted, nothing reachable."""

    def egress_for(self, tool: str) -> tuple[str, ...]:
        """The hosts policy grants `tool`: every entry whose key matches it (`tool_matches`)."""
        return tuple(host for pattern, hosts in self.egress.items() if tool_matches(pattern, tool) for host in hosts)


@dataclass(frozen=True)
class Limits:
    """Ceilings of the core, from `[limits]`; every value must be finite and within its range in
    LIMIT_RANGES. The edge applies the request-shaped ones again before decoding
    (ringfence_server.control.api.servicer.EdgeOptions.from_config)."""

    max_steps: int = 10
    """Steps of an ExecutePlan that does not name max_steps; a longer plan is INVALID_ARGUMENT."""
    max_plan_steps: int = 100
    """Hard cap on a plan's max_steps (at least max_steps); a higher value is INVALID_ARGUMENT."""
    max_argument_bytes: int = 64 * 1024
    """Bytes of one call's arguments (and of a run's goal). Over gRPC a larger one makes the
    request INVALID_ARGUMENT and nothing runs; in the core a call whose canonical arguments are
    larger is observed denied (invalid_arguments)."""
    max_message_bytes: int = 1024 * 1024
    """Bytes of one gRPC request (at least max_argument_bytes); grpc refuses a larger one with
    RESOURCE_EXHAUSTED before any of our code reads it."""
    max_concurrent_batches: int = 32
    """SubmitBatch/ExecutePlan (and evidence plans, verifications, routings at the edge) in
    flight per tenant; one more is refused at once with RESOURCE_EXHAUSTED, never queued."""
    max_batch_calls: int = 32
    """Calls in one batch; a larger batch is refused whole (RESOURCE_EXHAUSTED) and nothing runs."""
    max_turns: int = 50
    """Batches per run; the batch that would exceed it is halted and the run ends budget_exhausted."""
    max_cost: float = 100.0
    """Summed tool cost per run; once reached, the next batch is halted and the run ends
    budget_exhausted."""
    run_deadline_s: float = 3600.0
    """Wall-clock seconds a run may live from its start; then its running sandboxes are killed,
    the next batch is halted and the run ends deadline_exceeded."""
    approval_ttl_s: float = 900.0
    """Seconds an approval request stays decidable; then it expires and its call is observed
    unresolved (approval_expired), never run."""
    loop_threshold: int = 3
    """The same canonical call proposed this many times in a run (at least 2) halts its whole
    batch before anything runs, and the run ends loop_detected."""
    max_attempts: int = 4
    """Tries of one call (at most 10), retrying transient failures only; the last failure is the result."""
    backoff_initial_s: float = 0.5
    """First retry's backoff ceiling; it doubles per attempt, with equal jitter (ringfence_server.control.retry)."""
    backoff_max_s: float = 30.0
    """Largest backoff ceiling between tries; a tool's retry-after hint may wait up to 4x this."""
    breaker_threshold: int = 5
    """Consecutive failures of a tool that open its circuit; while open its calls are denied
    (circuit_open) without a sandbox."""
    breaker_cooldown_s: float = 30.0
    """Seconds an open circuit waits before letting one probe call through (success closes it)."""
    max_parallel_reads: int = 4
    """Non-mutating calls of one batch run at once; the rest wait their turn (mutating calls run
    one by one)."""
    lease_ttl_s: float = 15.0
    """Seconds a run's write lease lives unrenewed (renewed every third of it); past it another
    instance may take the run over and recover it. Also how often orphaned runs are adopted."""
    store_timeout_s: float = 5.0
    """Seconds a call waits for a PostgreSQL connection (a free one from the pool, or a new one
    while the database is unreachable) before it is answered UNAVAILABLE; each caller waits
    once, whatever other callers of the same run do. 5: a healthy pool hands a connection out
    in milliseconds even under load, so 5 s only runs out in an outage, and a client with a
    deadline of a few seconds more still gets the retryable UNAVAILABLE (psycopg_pool's own
    default, 30 s, outlives most clients' deadlines: they saw DEADLINE_EXCEEDED instead).
    Also the health probe's connect timeout (libpq counts whole seconds, at least 2)."""
    health_interval_s: float = 1.0
    """Seconds between two rounds of health checks (the sandbox engine and the event store,
    ringfence_server.control.api.health). An outage is reported NOT_SERVING at the first round after it starts
    (the store's probe has a connection of its own and fails at once when the database is
    gone), so within about this long: 1 s reports outages of a few seconds, which a 2 s round
    behind the pool's 5 s wait reported only 5.6-6.6 s late or not at all. A round is two
    cheap requests (Docker's /_ping, SELECT 1)."""


# Each `[limits]` value's range, both ends included. The upper ends are not policy: they keep
# every value inside what the code computes with (deadlines added to a datetime, TTLs handed
# to timers, sizes handed to grpc as 32-bit options), so a typo of a few zeros is refused at
# start naming its key instead of answering INTERNAL on every call. TOML has inf and nan:
# neither passes (a nan compares false with everything, so `value <= 0` alone let it in, and
# max_cost = nan switched the cost ceiling off).
DAY_S = 86400.0
LIMIT_RANGES: Mapping[str, tuple[float, float]] = {
    "max_steps": (1, 10_000),
    "max_plan_steps": (1, 10_000),
    "max_argument_bytes": (1, 1 * GiB),
    "max_message_bytes": (1 * KiB, 1 * GiB),
    "max_concurrent_batches": (1, 10_000),
    "max_batch_calls": (1, 10_000),
    "max_turns": (1, 1_000_000),
    "max_cost": (1e-9, 1e12),
    "run_deadline_s": (1e-3, 30 * DAY_S),
    "approval_ttl_s": (1e-3, 30 * DAY_S),
    "loop_threshold": (2, 1_000_000),
    "max_attempts": (1, 10),
    "backoff_initial_s": (1e-3, 3600.0),
    "backoff_max_s": (1e-3, DAY_S),
    "breaker_threshold": (1, 1_000_000),
    "breaker_cooldown_s": (1e-3, DAY_S),
    "max_parallel_reads": (1, 256),
    "lease_ttl_s": (0.1, 3600.0),
    # A store timeout past a few minutes outlives every client's deadline (the point of it is
    # to answer UNAVAILABLE before); a health round past a minute reports nothing in time.
    "store_timeout_s": (0.1, 300.0),
    "health_interval_s": (0.05, 60.0),
}


@dataclass(frozen=True)
class EgressConfig:
    services: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Internal services the egress proxy may reach: host name -> its pinned addresses (never
    resolved). A call still needs the name in its allowlist (tool hosts AND policy grant)."""

    networks: tuple[str, ...] = ()
    """Docker networks the egress proxy joins to reach those services."""


@dataclass(frozen=True)
class PoolConfig:
    """Warm containers (ringfence_server.sandbox.pool): started ahead of the calls, one per call, never reused."""

    size: int = 2
    """Ready containers per container shape (image + settings) when it is quiet; 0 turns the
    pool off."""

    max_size: int = 8
    """Ready containers a shape may grow to under demand: each recent call that found none
    ready raises its shape's target by one, up to this (at least `size`)."""

    idle_s: float = 300.0
    """A ready container unused this long is replaced; a shape unused this long is let go."""

    max_shapes: int = 8
    """Shapes kept warm at once (least recently used let go first)."""

    exclude: tuple[str, ...] = ()
    """Tools that always get a container created for their call (opted out of the pool)."""


@dataclass(frozen=True)
class WorkspaceConfig:
    """Per-run workspaces (ringfence_server.sandbox.workspace), from `[workspace]`: a capped tmpfs volume a run
    asks for at StartRun, mounted at /workspace for its tools that declare one."""

    default_bytes: int = 64 * MiB
    """Bytes of file data a workspace holds when StartRun asks for 0 (at most max_bytes); past
    its cap a write in the workspace fails with ENOSPC (the tool sees a full disk)."""
    default_inodes: int = 4096
    """Files and directories a workspace holds when StartRun asks for 0 (at most max_inodes);
    past its cap creating one fails with ENOSPC."""
    max_bytes: int = 512 * MiB
    """The largest `workspace.bytes` a StartRun may ask for (at most 4 GiB: the workspace is
    memory); a larger one is refused with INVALID_ARGUMENT naming workspace.bytes and no run
    is started."""
    max_inodes: int = 65536
    """The largest `workspace.inodes` a StartRun may ask for (at most 1,000,000); a larger one is
    refused with INVALID_ARGUMENT naming workspace.inodes and no run is started."""
    reap_interval_s: float = 60.0
    """Seconds between two sweeps that remove workspaces whose run ended or is unknown (also
    done once at start-up); until a sweep, such a workspace holds its memory."""


@dataclass(frozen=True)
class FilesConfig:
    """Files in and out of a workspace (ringfence_server.control.files), from `[files]`."""

    max_upload_bytes: int = 16 * MiB
    """Bytes of one UploadFiles archive (the tar, received whole); past it the upload is refused
    with RESOURCE_EXHAUSTED and nothing reaches the workspace."""
    max_download_bytes: int = 16 * MiB
    """Bytes of the files one DownloadFiles (or one collection of a tool's outputs) may carry;
    past it the download is refused with RESOURCE_EXHAUSTED (the outputs are listed missing)."""
    max_artifact_bytes: int = 4 * MiB
    """Bytes of one collected output file (an artifact, kept in the store); a larger output is
    not kept and is listed in its `artifact_collected` event's `missing` (at most
    max_download_bytes)."""
    max_files: int = 1000
    """Files (archive members, or paths asked for) in one upload or download; more is refused
    with INVALID_ARGUMENT (upload, paths) or RESOURCE_EXHAUSTED (a download that finds more)."""


@dataclass(frozen=True)
class EdgeConfig:
    """How the gRPC edge shares the server between tenants (ringfence_server.control.api.servicer), from `[edge]`.

    Every limit is per tenant and role (agent, approver, admin, verifier), never server-wide:
    one tenant's burst cannot refuse or slow another tenant, and a tenant's agents cannot use
    up what its approvers need. The numbers (bench/bench_fairness.py, tenant A's 100 agents
    starting runs as fast as the server answers, tenant B's GetRun p50 idle about 0.9 ms): a
    GetRun or a StartRun holds a worker thread for about a millisecond, mostly waiting for the
    event log's one writer (SQLite), so a few threads already keep that writer busy, and each more
    thread of A's is one more append B's read waits behind. `worker_share` 4: B's p50 3.8 ms
    while A started 4,680 runs in 10 s; with 8, 5.6 ms and 5,205 runs; with 2, 2.7 ms and
    4,507 runs; with 32 and A's 1,000 agents, 500 ms. `worker_threads` 64 lets sixteen tenants'
    agents run at full tilt side by side before any call waits for a thread at all, and a
    tenant whose four roles all burst holds a quarter of the pool at most. `max_in_flight` 128
    (4 running, the rest waiting their turn) bounds what one tenant and role keeps waiting,
    lets a dashboard's 100 concurrent GetRuns through, and refuses the rest at once. Batches,
    plans and file transfers are not in the pool: they wait on containers for seconds, so each
    runs on a thread of its own, bounded per tenant by `limits.max_concurrent_batches` (and
    the edge's transfer limit)."""

    max_in_flight: int = 128
    """Core calls of one tenant and role admitted at once: running on a worker thread or waiting
    their turn for one. One more is refused at once with RESOURCE_EXHAUSTED naming this limit
    ("retry later"), never queued. A call stays counted until its work really ends, even if its
    client gave up; one that was still waiting for a thread leaves at once. Streams are counted
    apart (max_watch_streams, limits.max_concurrent_batches)."""
    max_watch_streams: int = 16
    """WatchRun and WatchApprovals streams one tenant and role may hold open at once; one more
    is refused with RESOURCE_EXHAUSTED. Per role, so an agent holding all of its streams never
    stops its approvers from opening WatchApprovals."""
    worker_threads: int = 64
    """Threads running core calls (all but batches, plans and transfers), for all tenants
    together; bounded so a flood queues instead of spawning threads."""
    worker_share: int = 4
    """Of worker_threads, at most this many run one tenant's and role's calls at once (at most
    worker_threads); its other admitted calls wait for one of its own threads, in their own
    queue, never in front of another tenant's or role's calls. A larger share buys one tenant
    little throughput (SQLite has one writer) and costs every other tenant latency."""


@dataclass(frozen=True)
class ToolsConfig:
    """Tool packages and the ceilings a tool's manifest may ask for, from `[tools]`
    (ringfence_server.control.toolpkg; docs/TOOLS.md). A manifest whose limits are over a cap is refused when
    the server starts (a ConfigError naming the manifest and the limit) and by `ringfence tools
    check`. The defaults admit every built-in tool."""

    packages: tuple[Path, ...] = ()
    """Folders of tool packages, relative to the config file: every sub-folder holding a
    manifest.json is a package (a folder that holds one itself is a single package). Loaded
    beside the built-in tools (`tools_dir`); a tool name defined twice is a ConfigError naming
    both places."""
    max_memory_bytes: int = 1 * GiB
    """The largest `limits.memory_bytes` a manifest may ask for (at most 8 GiB, the sandbox's own)."""
    max_cpus: float = 2.0
    """The largest `limits.cpus` (at most 2, the sandbox's own)."""
    max_pids: int = 256
    """The largest `limits.pids` (at most 4096)."""
    max_timeout_s: float = 300.0
    """The largest `limits.timeout_s`, seconds (at most 3600)."""
    max_stdout_limit: int = 16 * MiB
    """The largest `limits.stdout_limit`, bytes (at most 64 MiB)."""
    max_stderr_limit: int = 16 * MiB
    """The largest `limits.stderr_limit`, bytes (at most 64 MiB)."""

    def caps(self) -> dict[str, float]:
        """manifest limit name -> its cap (`memory_bytes` -> max_memory_bytes, ...)."""
        return {name: float(getattr(self, f"max_{name}")) for name in TOOL_LIMIT_CAPS}


@dataclass(frozen=True)
class McpConfig:
    """`[mcp]`: MCP servers run in session sandboxes (ringfence_server.control.mcp_servers,
    docs/mcp-servers.md). Each server's tools are registered as `SERVER.TOOL`, with the risk
    metadata and the exposure its declaration (the operator's) gives them."""

    servers: tuple[Path, ...] = ()
    """Folders of server declarations, relative to the config file: every sub-folder holding a
    server.toml is one (a folder that holds one itself is a single server). A server's limits
    are held to the `[tools]` caps like any tool's."""
    max_sessions_per_tenant: int = 16
    """Session sandboxes one tenant may hold at once on this instance (1-1024). A session lives
    for its run, and a tenant's open runs are not otherwise bounded: past this, a call that
    would start one more fails, saying so, until the tenant's runs end."""
    idle_s: float = 600.0
    """A session unused this long is closed (seconds; its next call starts a fresh one)."""


# A manifest's limits with a cap in `[tools]`, and the sandbox's own ceiling of each
# (ringfence_server.sandbox.profile.SandboxProfile), past which no config may set a cap.
TOOL_LIMIT_CAPS: dict[str, float] = {
    "memory_bytes": 8 * GiB, "cpus": 2.0, "pids": 4096, "timeout_s": 3600.0,
    "stdout_limit": 64 * MiB, "stderr_limit": 64 * MiB,
}


@dataclass(frozen=True)
class WorkersConfig:
    """`[workers]`: sandbox workers on other hosts (docs/workers.md). Off by default: the calls
    run on this host's own Docker engine, as they always did."""

    enabled: bool = False
    """Place the calls on attached workers (`ringfence worker`), never on this host's engine.
    The Attach service is then served on `listen` beside the API."""

    run_here: bool = False
    """What workers cannot run yet (a call with a workspace, input folders or an MCP server, a
    file transfer): false (the default) refuses such a call, saying why; true runs it on this
    host's own engine, which then runs tool code beside this process's secrets again (a
    transition, not a deployment)."""

    signing_key: Path | None = None
    """The Ed25519 private key (PEM, mode 0600) this control plane seals envelopes with
    (`ringfence worker keygen`); its public key is what the workers trust. Required when enabled;
    relative to the config file."""

    tokens: Mapping[str, str] = field(default_factory=dict)
    """worker id -> sha256 hex of its token (`ringfence worker token`): the only credential a
    worker holds, naming that worker alone."""

    lease_s: float = 10.0
    """A worker's lease past each heartbeat: one not renewed for this long is lost (its reads
    run again elsewhere, its mutations become uncertain) and the worker, fenced, stops."""

    heartbeat_s: float = 2.0
    """How often a worker sends a heartbeat (less than a third of lease_s, so one lost
    heartbeat does not cost the lease)."""

    tenant_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """tenant -> placement labels its calls need (`[workers.tenant_labels.acme] pool = "acme"`):
    a tenant's calls run only on workers that advertise every one of them (`ringfence worker run
    --label pool=acme`), e.g. to keep one tenant's tool code off the hosts others share. A tenant
    not named runs on any worker that can run the call."""

    place_timeout_s: float = 10.0
    """How long a call waits for a worker that can run it (all busy, or none attached yet)
    before it fails as not started (transient: the retry policy tries again)."""

    start_allowance_s: float = 30.0
    """Time an envelope gives a call to start on its worker, on top of its own timeout: the
    envelope's deadline is now + the tool's timeout + this."""


@dataclass(frozen=True)
class Config:
    state_dir: Path
    listen: str
    tools_dir: Path
    tenants: Mapping[str, TenantConfig]
    policy: PolicyConfig
    limits: Limits
    inputs: Mapping[str, str] = field(default_factory=dict)
    """container root -> host directory, mounted read-only for tools whose roots name it."""

    egress: EgressConfig = field(default_factory=EgressConfig)

    pool: PoolConfig = field(default_factory=PoolConfig)

    routing: RoutingConfig = field(default_factory=RoutingConfig)
    """Supervisor routing of tickets to specialists (ringfence_server.control.routing)."""

    workspace: WorkspaceConfig = field(default_factory=WorkspaceConfig)
    """Per-run workspaces: their default and maximum caps, and how often orphans are reaped."""

    files: FilesConfig = field(default_factory=FilesConfig)
    """Caps of files moved in and out of workspaces, and of collected artifacts."""

    edge: EdgeConfig = field(default_factory=EdgeConfig)
    """How the gRPC edge shares worker threads and admission between tenants and roles."""

    database_url: str = ""
    """postgresql://... to keep the event log in PostgreSQL (several instances may share it);
    empty: SQLite under state_dir."""

    tools: ToolsConfig = field(default_factory=ToolsConfig)
    """`[tools]`: folders of tool packages, and the caps of a tool's limits."""

    mcp: McpConfig = field(default_factory=McpConfig)
    """`[mcp]`: the declared MCP servers (their folders)."""

    images_dir: Path | None = None
    """`[images] dir`: the user's images dir (image specs and their images.lock), relative to
    the config file; dispatch resolves an image name in its lock first, then in the built-in
    one (ringfence_server.imagebuild.spec). None (the default, `dir = ""`): the built-in images only."""

    workers: WorkersConfig = field(default_factory=WorkersConfig)
    """`[workers]`: sandbox workers on other hosts, their tokens and leases, the sealing key."""

    @property
    def db_path(self) -> Path:
        return self.state_dir / "events.sqlite3"

    def principal_for_token(self, token: str) -> tuple[str, TokenConfig] | None:
        """Convenience for the edge and tests: the (tenant, TokenConfig) of a plaintext token."""
        import hmac

        digest = hashlib.sha256(token.encode()).hexdigest()
        for tenant in self.tenants.values():
            for t in tenant.tokens:
                if hmac.compare_digest(t.sha256, digest):
                    return tenant.name, t
        return None


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if key == "tenants":
            out[key] = value  # replace: never keep the public demo tokens under a real config
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError("<file>", f"cannot read {path}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("<file>", f"{path} is not valid TOML: {e}") from e


def load_config(path: str | Path | None = None, *, overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults, then the file at `path` (if any), then `overrides` (tests), validated."""
    raw = _load_toml(DEFAULT_CONFIG_PATH)
    base_dir = Path.cwd()
    if path is not None:
        raw = _merge(raw, _load_toml(Path(path)))
        base_dir = Path(path).resolve().parent
    if overrides:
        raw = _merge(raw, overrides)
    return parse_config(raw, base_dir=base_dir)


def _expect(key: str, value: Any, types: type | tuple[type, ...], what: str) -> Any:
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ConfigError(key, f"must be {what}")
    if not isinstance(value, types):
        raise ConfigError(key, f"must be {what}, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        # TOML spells inf and nan; no setting of ours means either.
        raise ConfigError(key, f"must be {what}, finite (not {value})")
    return value


def _known(key: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    for k in table:
        if k not in allowed:
            raise ConfigError(f"{key}.{k}" if key else k, "unknown key")


def parse_config(raw: Mapping[str, Any], *, base_dir: Path | None = None) -> Config:
    base_dir = base_dir or Path.cwd()
    _known("", raw, {"state_dir", "listen", "tools_dir", "tenants", "policy", "limits", "inputs", "egress",
                     "pool", "database_url", "routing", "workspace", "files", "images", "tools", "edge",
                     "mcp", "workers"})
    state_dir = Path(_expect("state_dir", raw.get("state_dir", "./.state"), str, "a path"))
    if not state_dir.is_absolute():
        state_dir = base_dir / state_dir
    listen = _expect("listen", raw.get("listen", "127.0.0.1:50051"), str, "host:port")
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError("listen", f"{listen!r} is not host:port")
    tools_raw = _expect("tools_dir", raw.get("tools_dir", ""), str, "a path")
    tools_dir = Path(tools_raw) if tools_raw else BUILTIN_TOOLS_DIR
    if not tools_dir.is_absolute():
        tools_dir = base_dir / tools_dir
    if not tools_dir.is_dir():
        raise ConfigError("tools_dir", f"{tools_dir} is not a directory")

    inputs_raw = _expect("inputs", raw.get("inputs", {}), Mapping, "a table")
    inputs: dict[str, str] = {}
    for root, host_dir in inputs_raw.items():
        key = f"inputs.{root}"
        if not root.startswith("/") or root.rstrip("/") in ("", "/tmp", "/proc", "/sys", "/dev"):
            raise ConfigError(key, "the container root must be an absolute path, not a reserved one")
        host_dir = _expect(key, host_dir, str, "a host directory")
        hp = Path(host_dir)
        if not hp.is_absolute():
            hp = base_dir / hp
        inputs[root.rstrip("/")] = str(hp)

    tenants = _parse_tenants(_expect("tenants", raw.get("tenants", {}), Mapping, "a table"))
    policy = _parse_policy(_expect("policy", raw.get("policy", {}), Mapping, "a table"))
    limits = _parse_limits(_expect("limits", raw.get("limits", {}), Mapping, "a table"))
    egress = _parse_egress(_expect("egress", raw.get("egress", {}), Mapping, "a table"))
    pool = _parse_pool(_expect("pool", raw.get("pool", {}), Mapping, "a table"))
    routing = parse_routing(_expect("routing", raw.get("routing", {}), Mapping, "a table"))
    workspace = _parse_workspace(_expect("workspace", raw.get("workspace", {}), Mapping, "a table"))
    files = _parse_files(_expect("files", raw.get("files", {}), Mapping, "a table"))
    edge = _parse_edge(_expect("edge", raw.get("edge", {}), Mapping, "a table"))
    images_dir = _parse_images(_expect("images", raw.get("images", {}), Mapping, "a table"), base_dir)
    tools = _parse_tools(_expect("tools", raw.get("tools", {}), Mapping, "a table"), base_dir)
    mcp = _parse_mcp(_expect("mcp", raw.get("mcp", {}), Mapping, "a table"), base_dir)
    workers = _parse_workers(_expect("workers", raw.get("workers", {}), Mapping, "a table"), base_dir)
    database_url = _expect("database_url", raw.get("database_url", ""), str, "a postgresql:// URL")
    if database_url and not database_url.startswith(("postgresql://", "postgres://")):
        raise ConfigError("database_url", "must be a postgresql:// URL (or empty for SQLite)")
    return Config(
        state_dir=state_dir,
        listen=listen,
        tools_dir=tools_dir,
        tenants=tenants,
        policy=policy,
        limits=limits,
        inputs=inputs,
        egress=egress,
        pool=pool,
        database_url=database_url,
        routing=routing,
        workspace=workspace,
        files=files,
        edge=edge,
        images_dir=images_dir,
        tools=tools,
        mcp=mcp,
        workers=workers,
    )


def _folders(key: str, raw: Any, base_dir: Path) -> tuple[Path, ...]:
    folders = _expect(key, raw, list, "a list of folders")
    out = []
    for i, value in enumerate(folders):
        item = f"{key}[{i}]"
        path = Path(_expect(item, value, str, "a folder"))
        if not path.is_absolute():
            path = base_dir / path
        if not path.is_dir():
            raise ConfigError(item, f"{path} is not a directory")
        out.append(path)
    return tuple(out)


def _parse_mcp(raw: Mapping[str, Any], base_dir: Path) -> McpConfig:
    _known("mcp", raw, {f.name for f in fields(McpConfig)})
    d = McpConfig()
    cap = _int_in("mcp.max_sessions_per_tenant", raw.get("max_sessions_per_tenant", d.max_sessions_per_tenant),
                  1, 1024)
    idle = float(_expect("mcp.idle_s", raw.get("idle_s", d.idle_s), (int, float), "a number of seconds"))
    if not 1 <= idle <= 86400:
        raise ConfigError("mcp.idle_s", "must be 1 to 86400 seconds")
    return McpConfig(servers=_folders("mcp.servers", raw.get("servers", []), base_dir),
                     max_sessions_per_tenant=cap, idle_s=idle)


def _seconds(key: str, value: Any, low: float, high: float) -> float:
    seconds = float(_expect(key, value, (int, float), "a number of seconds"))
    if not low <= seconds <= high:
        raise ConfigError(key, f"must be {low:g} to {high:g} seconds")
    return seconds


def _parse_workers(raw: Mapping[str, Any], base_dir: Path) -> WorkersConfig:
    _known("workers", raw, {f.name for f in fields(WorkersConfig)})
    d = WorkersConfig()
    enabled = _expect("workers.enabled", raw.get("enabled", d.enabled), bool, "true or false")
    run_here = _expect("workers.run_here", raw.get("run_here", d.run_here), bool, "true or false")
    key_raw = _expect("workers.signing_key", raw.get("signing_key", ""), str, "a path")
    signing_key = None
    if key_raw:
        signing_key = Path(key_raw) if Path(key_raw).is_absolute() else base_dir / key_raw
        if not signing_key.is_file():
            raise ConfigError("workers.signing_key",
                              f"{signing_key} is not a file (`ringfence worker keygen` makes one)")
    elif enabled:
        raise ConfigError("workers.signing_key", "required when workers are enabled (`ringfence worker keygen`)")
    tokens: dict[str, str] = {}
    for worker_id, digest in _expect("workers.tokens", raw.get("tokens", {}), Mapping, "a table").items():
        key = f"workers.tokens.{worker_id}"
        if not _NAME.fullmatch(worker_id):
            raise ConfigError(key, "a worker id is 1-64 characters of [A-Za-z0-9_.-]")
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise ConfigError(key, "must be the sha256 hex of the worker's token (`ringfence worker token`)")
        tokens[worker_id] = digest
    tenant_labels: dict[str, dict[str, str]] = {}
    for tenant, labels in _expect("workers.tenant_labels", raw.get("tenant_labels", {}), Mapping,
                                  "a table of tenants").items():
        key = f"workers.tenant_labels.{tenant}"
        _expect(key, labels, Mapping, "a table of label = value")
        for name, value in labels.items():
            if not _NAME.fullmatch(name) or not isinstance(value, str) or len(value) > 256:
                raise ConfigError(f"{key}.{name}", "a label is a name of [A-Za-z0-9_.-] = a string")
        tenant_labels[tenant] = dict(labels)
    if enabled and not tokens:
        raise ConfigError("workers.tokens", "no worker could attach: add one (`ringfence worker token ID`)")
    lease = _seconds("workers.lease_s", raw.get("lease_s", d.lease_s), 1, 3600)
    heartbeat = _seconds("workers.heartbeat_s", raw.get("heartbeat_s", d.heartbeat_s), 0.05, 600)
    if heartbeat * 3 > lease:
        raise ConfigError("workers.heartbeat_s", f"must be at most a third of workers.lease_s ({lease:g})")
    return WorkersConfig(enabled=enabled, run_here=run_here, signing_key=signing_key, tokens=tokens,
                         tenant_labels=tenant_labels, lease_s=lease,
                         heartbeat_s=heartbeat,
                         place_timeout_s=_seconds("workers.place_timeout_s",
                                                  raw.get("place_timeout_s", d.place_timeout_s), 0.1, 3600),
                         start_allowance_s=_seconds("workers.start_allowance_s",
                                                    raw.get("start_allowance_s", d.start_allowance_s), 1, 3600))


def _parse_tools(raw: Mapping[str, Any], base_dir: Path) -> ToolsConfig:
    _known("tools", raw, {f.name for f in fields(ToolsConfig)})
    packages = _folders("tools.packages", raw.get("packages", []), base_dir)
    d = ToolsConfig()
    caps: dict[str, Any] = {}
    for name, ceiling in TOOL_LIMIT_CAPS.items():
        key = f"max_{name}"
        value = raw.get(key, getattr(d, key))
        if name in ("cpus", "timeout_s"):
            value = float(_expect(f"tools.{key}", value, (int, float), "a number"))
        else:
            _expect(f"tools.{key}", value, int, "an integer")
        if not 0 < value <= ceiling:
            raise ConfigError(f"tools.{key}", f"must be positive and at most {ceiling:g} (the sandbox's own ceiling)")
        caps[key] = value
    return ToolsConfig(packages=tuple(packages), **caps)


def _parse_images(raw: Mapping[str, Any], base_dir: Path) -> Path | None:
    _known("images", raw, {"dir"})
    value = _expect("images.dir", raw.get("dir", ""), str, "a path")
    if not value:
        return None
    path = Path(value)
    if not path.is_absolute():
        path = base_dir / path
    if not path.is_dir():
        raise ConfigError("images.dir", f"{path} is not a directory")
    return path


def _int_in(key: str, value: Any, low: int, high: int, high_from: str = "") -> int:
    _expect(key, value, int, "an integer")
    if not low <= value <= high:
        raise ConfigError(key, f"must be {low} to {high}" + (f" ({high_from})" if high_from else ""))
    return int(value)


def _parse_workspace(raw: Mapping[str, Any]) -> WorkspaceConfig:
    _known("workspace", raw, {f.name for f in fields(WorkspaceConfig)})
    d = WorkspaceConfig()
    max_bytes = _int_in("workspace.max_bytes", raw.get("max_bytes", d.max_bytes),
                        WORKSPACE_MIN_BYTES, WORKSPACE_MAX_BYTES, "what a workspace may be")
    max_inodes = _int_in("workspace.max_inodes", raw.get("max_inodes", d.max_inodes),
                         WORKSPACE_MIN_INODES, WORKSPACE_MAX_INODES, "what a workspace may be")
    # A default the server would refuse if asked for it explicitly makes no sense.
    default_bytes = _int_in("workspace.default_bytes", raw.get("default_bytes", d.default_bytes),
                            WORKSPACE_MIN_BYTES, max_bytes, "workspace.max_bytes")
    default_inodes = _int_in("workspace.default_inodes", raw.get("default_inodes", d.default_inodes),
                             WORKSPACE_MIN_INODES, max_inodes, "workspace.max_inodes")
    interval = _expect("workspace.reap_interval_s", raw.get("reap_interval_s", d.reap_interval_s), (int, float),
                       "seconds")
    if not 1 <= interval <= 86400:
        raise ConfigError("workspace.reap_interval_s", "must be 1 to 86400 seconds")
    return WorkspaceConfig(default_bytes=default_bytes, default_inodes=default_inodes, max_bytes=max_bytes,
                           max_inodes=max_inodes, reap_interval_s=float(interval))


def _parse_edge(raw: Mapping[str, Any]) -> EdgeConfig:
    _known("edge", raw, {f.name for f in fields(EdgeConfig)})
    d = EdgeConfig()
    in_flight = _int_in("edge.max_in_flight", raw.get("max_in_flight", d.max_in_flight), 1, 100_000)
    watches = _int_in("edge.max_watch_streams", raw.get("max_watch_streams", d.max_watch_streams), 1, 10_000)
    # Threads are real: a few thousand is already more than one process should start.
    workers = _int_in("edge.worker_threads", raw.get("worker_threads", d.worker_threads), 1, 4096)
    share = _int_in("edge.worker_share", raw.get("worker_share", d.worker_share), 1, workers, "edge.worker_threads")
    return EdgeConfig(max_in_flight=in_flight, max_watch_streams=watches, worker_threads=workers, worker_share=share)


def _parse_files(raw: Mapping[str, Any]) -> FilesConfig:
    _known("files", raw, {f.name for f in fields(FilesConfig)})
    d = FilesConfig()
    upload = _int_in("files.max_upload_bytes", raw.get("max_upload_bytes", d.max_upload_bytes), 1 * KiB, 1 * GiB)
    download = _int_in("files.max_download_bytes", raw.get("max_download_bytes", d.max_download_bytes),
                       1 * KiB, 1 * GiB)
    artifact = _int_in("files.max_artifact_bytes", raw.get("max_artifact_bytes", d.max_artifact_bytes),
                       1, download, "files.max_download_bytes")
    max_files = _int_in("files.max_files", raw.get("max_files", d.max_files), 1, 100_000)
    return FilesConfig(max_upload_bytes=upload, max_download_bytes=download, max_artifact_bytes=artifact,
                       max_files=max_files)


def _parse_pool(raw: Mapping[str, Any]) -> PoolConfig:
    _known("pool", raw, {"size", "max_size", "idle_s", "max_shapes", "exclude"})
    size = _expect("pool.size", raw.get("size", PoolConfig.size), int, "an integer")
    if not 0 <= size <= 64:
        raise ConfigError("pool.size", "must be 0 (off) to 64")
    max_size = _expect("pool.max_size", raw.get("max_size", PoolConfig.max_size), int, "an integer")
    if not size <= max_size <= 64:
        raise ConfigError("pool.max_size", f"must be at least pool.size ({size}) and at most 64")
    idle_s = float(_expect("pool.idle_s", raw.get("idle_s", PoolConfig.idle_s), (int, float), "seconds"))
    if not 1 <= idle_s <= 86400:
        raise ConfigError("pool.idle_s", "must be 1 to 86400 seconds")
    max_shapes = _expect("pool.max_shapes", raw.get("max_shapes", PoolConfig.max_shapes), int, "an integer")
    if not 1 <= max_shapes <= 64:
        raise ConfigError("pool.max_shapes", "must be 1 to 64")
    exclude = _expect("pool.exclude", raw.get("exclude", []), list, "a list of tool names")
    if not all(isinstance(t, str) and t for t in exclude):
        raise ConfigError("pool.exclude", "must be a list of tool names")
    return PoolConfig(size=size, max_size=max_size, idle_s=idle_s, max_shapes=max_shapes, exclude=tuple(exclude))


def _parse_egress(raw: Mapping[str, Any]) -> EgressConfig:
    _known("egress", raw, {"services", "networks"})
    services: dict[str, tuple[str, ...]] = {}
    for name, addresses in _expect("egress.services", raw.get("services", {}), Mapping, "a table").items():
        key = f"egress.services.{name}"
        if isinstance(addresses, str):
            addresses = [addresses]
        addresses = _expect(key, addresses, list, "an address or a list of addresses")
        if not addresses or not all(isinstance(a, str) and a for a in addresses):
            raise ConfigError(key, "must name at least one address")
        services[name] = tuple(addresses)
    networks = _expect("egress.networks", raw.get("networks", []), list, "a list of Docker network names")
    if not all(isinstance(n, str) and n for n in networks):
        raise ConfigError("egress.networks", "must be a list of Docker network names")
    if services:
        # The proxy's own rules (exact names, private addresses only, ...), reported here.
        from ringfence_server.sandbox.egress.server import ConfigError as ProxyConfigError
        from ringfence_server.sandbox.egress.server import parse_services

        try:
            parse_services({k: list(v) for k, v in services.items()})
        except (ProxyConfigError, ValueError) as e:
            raise ConfigError("egress.services", str(e)) from e
    return EgressConfig(services=services, networks=tuple(networks))


def _parse_tenants(raw: Mapping[str, Any]) -> dict[str, TenantConfig]:
    tenants = {}
    seen_digests: set[str] = set()
    for name, table in raw.items():
        key = f"tenants.{name}"
        if not _NAME.fullmatch(name):
            raise ConfigError(key, "tenant names are 1-64 characters of [A-Za-z0-9_.-]")
        _expect(key, table, Mapping, "a table")
        _known(key, table, {"tokens"})
        tokens = []
        for i, tok in enumerate(_expect(f"{key}.tokens", table.get("tokens", []), list, "an array")):
            tkey = f"{key}.tokens[{i}]"
            _expect(tkey, tok, Mapping, "a table")
            _known(tkey, tok, {"sha256", "role", "subject"})
            digest = _expect(f"{tkey}.sha256", tok.get("sha256"), str, "sha256 hex")
            if not _HEX64.fullmatch(digest):
                raise ConfigError(f"{tkey}.sha256", "must be 64 lowercase hex characters (sha256 of the token)")
            if digest in seen_digests:
                raise ConfigError(f"{tkey}.sha256", "the same token is configured twice")
            seen_digests.add(digest)
            role = tok.get("role")
            if role not in {r.value for r in Role}:
                raise ConfigError(f"{tkey}.role", f"must be one of {', '.join(r.value for r in Role)}")
            subject = _expect(f"{tkey}.subject", tok.get("subject", f"{name}-{role}"), str, "a string")
            tokens.append(TokenConfig(digest, Role(role), subject))
        tenants[name] = TenantConfig(name, tuple(tokens))
    return tenants


def _parse_policy(raw: Mapping[str, Any]) -> PolicyConfig:
    _known("policy", raw, {"autonomy", "rules", "grants", "egress"})
    autonomy = raw.get("autonomy", "standard")
    if autonomy not in AUTONOMY:
        raise ConfigError("policy.autonomy", f"must be one of {', '.join(AUTONOMY)}")
    rules = []
    for i, rule in enumerate(_expect("policy.rules", raw.get("rules", []), list, "an array")):
        key = f"policy.rules[{i}]"
        _expect(key, rule, Mapping, "a table")
        _known(key, rule, {"tool", "verdict", "when"})
        tool = _expect(f"{key}.tool", rule.get("tool"), str, "a tool name or *")
        verdict = rule.get("verdict")
        if verdict not in VERDICTS:
            raise ConfigError(f"{key}.verdict", f"must be one of {', '.join(VERDICTS)}")
        when = _expect(f"{key}.when", rule.get("when", {}), Mapping, "a table")
        for arg, preds in when.items():
            pkey = f"{key}.when.{arg}"
            _expect(pkey, preds, Mapping, "a table of predicates")
            if not preds:
                raise ConfigError(pkey, "needs at least one predicate")
            for op, operand in preds.items():
                if op not in PREDICATES:
                    raise ConfigError(f"{pkey}.{op}", f"unknown predicate; one of {', '.join(PREDICATES)}")
                if op in ("lt", "lte", "gt", "gte"):
                    _expect(f"{pkey}.{op}", operand, (int, float), "a number")
                if op in ("in", "not_in") and not isinstance(operand, list):
                    raise ConfigError(f"{pkey}.{op}", "must be an array")
                if op in ("matches", "prefix") and not isinstance(operand, str):
                    raise ConfigError(f"{pkey}.{op}", "must be a string")
                if op == "matches":
                    try:
                        re.compile(operand)
                    except re.error as e:
                        raise ConfigError(f"{pkey}.{op}", f"bad regular expression: {e}") from e
        rules.append(RuleConfig(tool, Verdict(verdict), {k: dict(v) for k, v in when.items()}))
    grants = []
    for i, grant in enumerate(_expect("policy.grants", raw.get("grants", []), list, "an array")):
        key = f"policy.grants[{i}]"
        _expect(key, grant, Mapping, "a table")
        _known(key, grant, {"tool", "arguments"})
        tool = _expect(f"{key}.tool", grant.get("tool"), str, "a tool name")
        arguments = _expect(f"{key}.arguments", grant.get("arguments", {}), Mapping, "a table")
        grants.append(GrantConfig(tool, dict(arguments)))
    egress: dict[str, tuple[str, ...]] = {}
    for tool, patterns in _expect("policy.egress", raw.get("egress", {}), Mapping, "a table").items():
        key = f"policy.egress.{tool}"
        _expect(key, patterns, list, "an array of host patterns")
        try:
            egress[tool] = tuple(str(p) for p in parse_patterns(patterns))
        except (PatternError, TypeError) as e:
            raise ConfigError(key, str(e)) from e
    return PolicyConfig(autonomy=autonomy, rules=tuple(rules), grants=tuple(grants), egress=egress)


def _parse_limits(raw: Mapping[str, Any]) -> Limits:
    names = {f.name: f for f in fields(Limits)}
    _known("limits", raw, set(names))
    values = {}
    for name, value in raw.items():
        key = f"limits.{name}"
        is_int = names[name].type in ("int", int)
        if is_int:
            _expect(key, value, int, "an integer")
        else:
            _expect(key, value, (int, float), "a number")
            value = float(value)
        low, high = LIMIT_RANGES[name]
        if not low <= value <= high:
            raise ConfigError(key, f"must be {low:g} to {high:g}")
        values[name] = value
    limits = Limits(**values)
    if limits.max_steps > limits.max_plan_steps:
        raise ConfigError("limits.max_steps", f"is over limits.max_plan_steps ({limits.max_plan_steps})")
    if limits.max_argument_bytes > limits.max_message_bytes:
        raise ConfigError("limits.max_argument_bytes", "is over limits.max_message_bytes")
    if limits.backoff_initial_s > limits.backoff_max_s:
        raise ConfigError("limits.backoff_initial_s", "is over limits.backoff_max_s")
    return limits


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
