"""The tool registry: manifests parsed, checked and looked up by name.

docs/TOOLS.md documents every field of a manifest (and tests/unit/test_toolpkg.py checks that
it names every key this parser accepts); ringfence_server.control.toolpkg loads manifests from tool packages
and from the built-in folder with these rules.

The registry describes tools; it never decides whether a call is permitted (it does not import
policy): a tool must not be able to describe itself as allowed. `ToolView`, what callers see,
carries the argument schema only, never risk metadata, roots or hosts; `ToolManifest.risk` is
that metadata for the people who judge calls (approvers, admins), never for agents.

A manifest may declare the run's workspace (see `ToolManifest.workspace` and `.outputs`):

    "workspace": "read" | "write"     mounted at /workspace read-only or read-write; absent:
                                      no workspace is mounted (the default). A call of such a
                                      tool in a run without a live workspace is refused at
                                      admission (denied, error_class "no_workspace"). A `write`
                                      tool is ordered like a mutation (serially, after the
                                      batch's reads) but is not one for idempotency or approval.
    "outputs": ["reports/x.txt"]      files (relative to /workspace, normalized, at most 16)
                                      collected into the run's artifacts after every successful
                                      call; requires "workspace".
"""

from __future__ import annotations

import json
import posixpath
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from ringfence.errors import ConfigError
from ringfence.model import ToolRisk, ToolView
from ringfence.workspace_paths import path_problem
from ringfence_server.sandbox.egress.allowlist import PatternError, parse_patterns

_TOOL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_HOST = re.compile(r"(\*\.)?[a-z0-9]([a-z0-9-]{0,62})(\.[a-z0-9]([a-z0-9-]{0,62}))*")
# ListTools narrows by query only past this many tools: a small set is cheaper to show whole.
NARROW_ABOVE = 12
_MANIFEST_KEYS = {
    "name", "description", "schema", "mutates", "reversible", "cost", "paths",
    "egress_hosts", "url_arguments", "limits", "runtime", "image", "reconcile", "workspace", "outputs",
}
WORKSPACE_MODES = ("read", "write")
MAX_OUTPUTS = 16
_RECONCILE_KEYS = {"tool", "key_argument"}
_LIMIT_KEYS = {"memory_bytes", "cpus", "pids", "timeout_s", "stdout_limit", "stderr_limit"}


@dataclass(frozen=True)
class ToolLimits:
    memory_bytes: int = 128 * 1024 * 1024
    cpus: float = 0.5
    pids: int = 64
    timeout_s: float = 10.0
    stdout_limit: int = 1024 * 1024
    stderr_limit: int = 64 * 1024


@dataclass(frozen=True)
class Reconcile:
    """How an effect of a mutating tool is looked up by its idempotency key, so recovery can ask
    the receiver whether a call that crashed between its effect and its record took effect."""

    tool: str
    """A registered tool that does not mutate: the look-up."""
    key_argument: str = "idempotency_key"
    """The look-up's (required) argument that takes the idempotency key."""


@dataclass(frozen=True)
class McpBinding:
    """A tool served by a declared MCP server (ringfence_server.control.mcp_servers): its calls
    go to the run's session sandbox of that server, not to a container of their own."""

    server: str
    """The declared server's name; the tool is registered as `server.tool`."""
    tool: str
    """The tool's name as the server lists it."""
    command: tuple[str, ...]
    """The server's command in its image (the session sandbox's argv)."""


@dataclass(frozen=True)
class ToolManifest:
    name: str
    description: str
    schema: Mapping[str, Any]
    mutates: bool
    """It changes the world: writes run serially after reads, and carry an idempotency key."""
    reversible: bool
    """False = irreversible: under every autonomy level an ALLOW becomes ASK."""
    cost: float = 0.0
    """Charged to the run's cost budget per dispatched call."""
    paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """argument name -> the container roots its value must stay under."""
    egress_hosts: tuple[str, ...] = ()
    """Hosts (or *.suffix) the tool may reach; empty = no network."""
    url_arguments: tuple[str, ...] = ()
    """Arguments whose value is a URL or host name, checked against egress_hosts."""
    limits: ToolLimits = field(default_factory=ToolLimits)
    runtime: str = "runc"
    image: str = "tool"
    reconcile: Reconcile | None = None
    """Only for a mutating tool: how its effects are looked up by key (None: they cannot be)."""
    workspace: str | None = None
    """"read" or "write": the run's workspace is mounted at /workspace, read-only or read-write
    (such calls always get a container of their own, never a warm one). None: no workspace."""
    outputs: tuple[str, ...] = ()
    """Paths relative to /workspace collected into the run's artifacts after every successful
    call (needs `workspace`); one that is absent is listed as missing, never an error."""
    mcp: McpBinding | None = None
    """Set for a tool of a declared MCP server (never from a manifest file: from the server's
    declaration, ringfence_server.control.mcp_servers)."""

    @property
    def irreversible(self) -> bool:
        return not self.reversible

    @property
    def serial(self) -> bool:
        """Runs one at a time after the batch's parallel reads: it mutates the world, or it
        writes the run's workspace (two writers, or a reader beside a writer, would race)."""
        return self.mutates or self.workspace == "write"

    def view(self) -> ToolView:
        return ToolView(self.name, self.description, json.loads(json.dumps(self.schema)))

    def risk(self, image_digest: str) -> ToolRisk:
        """The manifest's risk metadata as people who judge calls see it (`image_digest`: the
        pinned ID of `image`, which the registry does not know). Never for an agent."""
        limits = self.limits
        return ToolRisk(
            mutates=self.mutates, irreversible=self.irreversible, cost=self.cost, image_digest=image_digest,
            egress_hosts=self.egress_hosts, timeout_s=limits.timeout_s, memory_bytes=limits.memory_bytes,
            cpus=limits.cpus, pids=limits.pids, stdout_limit=limits.stdout_limit, stderr_limit=limits.stderr_limit,
            runtime=self.runtime, image=self.image, workspace=self.workspace or "", paths=self.paths,
        )


def _err(source: str, key: str, message: str) -> ConfigError:
    return ConfigError(f"{source}:{key}", message)


def parse_manifest(doc: Mapping[str, Any], source: str = "<manifest>") -> ToolManifest:
    """Check one manifest document; raise ConfigError naming the file and key."""
    # The checks run key by key in a fixed order, the first failure raising: a manifest with
    # several problems is always reported by the same one.
    _check_manifest_keys(doc, source)
    name, description, schema = _parse_identity(doc, source)
    _check_risk_flags(doc, source)
    cost = _parse_cost(doc, source)
    paths = _parse_paths(doc, source)
    hosts, url_args = _parse_egress(doc, source)
    limits = parse_limits(doc, source)
    runtime, image = _parse_runtime_image(doc, source, hosts)
    reconcile = _parse_reconcile(doc.get("reconcile"), source, name, doc["mutates"])
    workspace, outputs = _parse_workspace(doc, source)
    _check_profile(source, image, runtime, limits)
    return ToolManifest(
        name=name,
        description=description,
        schema=json.loads(json.dumps(schema)),
        mutates=doc["mutates"],
        reversible=doc["reversible"],
        cost=float(cost),
        paths=paths,
        egress_hosts=tuple(hosts),
        url_arguments=tuple(url_args),
        limits=limits,
        runtime=runtime,
        image=image,
        reconcile=reconcile,
        workspace=workspace,
        outputs=outputs,
    )


def _check_manifest_keys(doc: Mapping[str, Any], source: str) -> None:
    """The manifest is an object and has only the keys this parser knows."""
    if not isinstance(doc, Mapping):
        raise _err(source, "", "a manifest is an object")
    for key in doc:
        if key not in _MANIFEST_KEYS:
            raise _err(source, key, "unknown key")


def _parse_identity(doc: Mapping[str, Any], source: str) -> tuple[str, str, Mapping[str, Any]]:
    """`name`, `description` and `schema` (a valid JSON Schema of an object): what callers see."""
    name = doc.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise _err(source, "name", "must match [a-z][a-z0-9_]{0,63} (the runner's tool names)")
    description = doc.get("description", "")
    if not isinstance(description, str) or not description:
        raise _err(source, "description", "must be a non-empty string")
    schema = doc.get("schema")
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise _err(source, "schema", 'must be a JSON Schema with "type": "object"')
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        raise _err(source, "schema", f"invalid JSON Schema: {e.message}") from e
    return name, description, schema


def _check_risk_flags(doc: Mapping[str, Any], source: str) -> None:
    """`mutates` and `reversible` are given, and are booleans."""
    for flag in ("mutates", "reversible"):
        if not isinstance(doc.get(flag), bool):
            # Risk metadata is never defaulted: a manifest that forgets it must not pass as safe.
            raise _err(source, flag, "is required and must be true or false")


def _parse_cost(doc: Mapping[str, Any], source: str) -> int | float:
    """`cost`: a non-negative number (default 0)."""
    cost = doc.get("cost", 0.0)
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost < 0:
        raise _err(source, "cost", "must be a non-negative number")
    return cost


def _parse_paths(doc: Mapping[str, Any], source: str) -> dict[str, tuple[str, ...]]:
    """`paths`: argument name -> the absolute roots (normalized; a single string is one root)."""
    paths_raw = doc.get("paths", {})
    if not isinstance(paths_raw, Mapping):
        raise _err(source, "paths", "must map argument names to arrays of roots")
    paths = {}
    for arg, roots in paths_raw.items():
        if isinstance(roots, str):
            roots = [roots]
        if not isinstance(roots, list) or not roots:
            raise _err(source, f"paths.{arg}", "must be a non-empty array of absolute roots")
        paths[arg] = _normalized_roots(roots, source, arg)
    return paths


def _normalized_roots(roots: list[Any], source: str, arg: str) -> tuple[str, ...]:
    """The roots of the argument `arg`, normalized; each must be absolute and not / itself."""
    norm = []
    for root in roots:
        if not isinstance(root, str) or not root.startswith("/") or posixpath.normpath(root) == "/":
            raise _err(source, f"paths.{arg}", f"{root!r} must be an absolute path other than /")
        norm.append(posixpath.normpath(root))
    return tuple(norm)


def _parse_egress(doc: Mapping[str, Any], source: str) -> tuple[list[str], list[str]]:
    """`egress_hosts` (by the egress proxy's own rules) and `url_arguments`."""
    hosts = doc.get("egress_hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) and _HOST.fullmatch(h) for h in hosts):
        raise _err(source, "egress_hosts", "must be an array of lowercase host names (or *.suffix)")
    try:
        parse_patterns(hosts)  # the egress proxy's own rules: no IP literals, no `*.com`
    except PatternError as e:
        raise _err(source, "egress_hosts", str(e)) from e
    url_args = doc.get("url_arguments", [])
    if not isinstance(url_args, list) or not all(isinstance(a, str) for a in url_args):
        raise _err(source, "url_arguments", "must be an array of argument names")
    return hosts, url_args


def parse_limits(doc: Mapping[str, Any], source: str) -> ToolLimits:
    """`limits`: known limits, positive numbers; the others keep ToolLimits' defaults."""
    limits_raw = doc.get("limits", {})
    if not isinstance(limits_raw, Mapping):
        raise _err(source, "limits", "must be an object")
    for key, value in limits_raw.items():
        if key not in _LIMIT_KEYS:
            raise _err(source, f"limits.{key}", "unknown limit")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise _err(source, f"limits.{key}", "must be a positive number")
    defaults = ToolLimits()
    return ToolLimits(
        memory_bytes=int(limits_raw.get("memory_bytes", defaults.memory_bytes)),
        cpus=float(limits_raw.get("cpus", defaults.cpus)),
        pids=int(limits_raw.get("pids", defaults.pids)),
        timeout_s=float(limits_raw.get("timeout_s", defaults.timeout_s)),
        stdout_limit=int(limits_raw.get("stdout_limit", defaults.stdout_limit)),
        stderr_limit=int(limits_raw.get("stderr_limit", defaults.stderr_limit)),
    )


def _parse_runtime_image(doc: Mapping[str, Any], source: str, hosts: list[str]) -> tuple[str, str]:
    """`runtime` (runc, or gvisor for a tool without egress hosts) and `image`."""
    runtime = doc.get("runtime", "runc")
    if runtime not in ("runc", "gvisor"):
        raise _err(source, "runtime", "must be runc or gvisor")
    if runtime == "gvisor" and hosts:
        raise _err(source, "runtime", "gVisor here runs with --network=none: no egress hosts")
    image = doc.get("image", "tool")
    if not isinstance(image, str) or not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", image):
        raise _err(source, "image", "must be an image name from images/images.lock")
    return runtime, image


def _check_profile(source: str, image: str, runtime: str, limits: ToolLimits) -> None:
    """The sandbox profile the tool's calls will run under can be built (its limits within the caps)."""
    # The sandbox profile validates the limits for real; build one now so a bad manifest fails
    # at load time rather than on its first call.
    from ringfence_server.sandbox.errors import ProfileError
    from ringfence_server.sandbox.profile import SandboxProfile

    try:
        SandboxProfile(image=image, runtime=runtime, memory_bytes=limits.memory_bytes, cpus=limits.cpus,
                       pids=limits.pids, timeout_s=limits.timeout_s, stdout_limit=limits.stdout_limit,
                       stderr_limit=limits.stderr_limit)
    except ProfileError as e:
        raise _err(source, f"limits.{e.field}", e.message) from e


def _parse_workspace(doc: Mapping[str, Any], source: str) -> tuple[str | None, tuple[str, ...]]:
    """`"workspace": "read" | "write"` and `"outputs": [paths]` (which need a workspace)."""
    workspace = doc.get("workspace")
    if workspace is not None and workspace not in WORKSPACE_MODES:
        raise _err(source, "workspace", 'must be "read" or "write" (absent: no workspace)')
    outputs = doc.get("outputs", [])
    if not isinstance(outputs, list):
        raise _err(source, "outputs", "must be an array of paths relative to /workspace")
    if outputs and workspace is None:
        raise _err(source, "outputs", 'needs "workspace": the outputs are collected from it')
    if len(outputs) > MAX_OUTPUTS:
        raise _err(source, "outputs", f"at most {MAX_OUTPUTS} paths")
    for i, path in enumerate(outputs):
        problem = path_problem(path)
        if problem is not None:
            raise _err(source, f"outputs[{i}]", f"{path!r} {problem}")
    if len(set(outputs)) != len(outputs):
        raise _err(source, "outputs", "lists a path twice")
    return workspace, tuple(outputs)


def _parse_reconcile(raw: Any, source: str, name: str, mutates: bool) -> Reconcile | None:
    """`"reconcile": {"tool": "<look-up tool>", "key_argument": "idempotency_key"}`. Which tool it
    names is checked when the registry is built (it must exist and must not mutate)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise _err(source, "reconcile", 'must be an object: {"tool": ..., "key_argument": ...}')
    for key in raw:
        if key not in _RECONCILE_KEYS:
            raise _err(source, f"reconcile.{key}", "unknown key")
    if not mutates:
        raise _err(source, "reconcile", "only a mutating tool has effects to look up")
    tool = raw.get("tool")
    if not isinstance(tool, str) or not _TOOL_NAME.fullmatch(tool):
        raise _err(source, "reconcile.tool", "must name a tool")
    if tool == name:
        raise _err(source, "reconcile.tool", "a tool cannot look up its own effects (it mutates)")
    key_argument = raw.get("key_argument", "idempotency_key")
    if not isinstance(key_argument, str) or not key_argument:
        raise _err(source, "reconcile.key_argument", "must be an argument name")
    return Reconcile(tool, key_argument)


def _check_reconcile(manifest: ToolManifest, tools: Mapping[str, ToolManifest]) -> None:
    assert manifest.reconcile is not None
    where = f"tools.{manifest.name}.reconcile"
    lookup = tools.get(manifest.reconcile.tool)
    if lookup is None:
        raise ConfigError(where, f"names {manifest.reconcile.tool!r}, which is not a registered tool")
    if lookup.mutates:
        # Recovery runs the look-up to decide whether an effect happened: it must not be one.
        raise ConfigError(where, f"{lookup.name} mutates: a look-up must be read-only")
    arg = manifest.reconcile.key_argument
    if arg not in (lookup.schema.get("properties") or {}) or arg not in (lookup.schema.get("required") or ()):
        raise ConfigError(where, f"{lookup.name} does not take {arg!r} as a required argument")


def load_manifest_file(path: Path) -> ToolManifest:
    try:
        if path.suffix == ".toml":
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        else:
            doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(str(path), f"cannot load manifest: {e}") from e
    manifest = parse_manifest(doc, source=path.name)
    if manifest.name != path.stem:
        raise _err(path.name, "name", f"{manifest.name!r} differs from the file name")
    return manifest


class Registry:
    """Tools by name. Immutable after construction."""

    def __init__(self, manifests: Iterable[ToolManifest]) -> None:
        self._tools: dict[str, ToolManifest] = {}
        for m in manifests:
            if m.name in self._tools:
                raise ConfigError(f"tools.{m.name}", "registered twice")
            self._tools[m.name] = m
        for m in self._tools.values():
            if m.reconcile is not None:
                _check_reconcile(m, self._tools)

    @classmethod
    def from_dir(cls, directory: str | Path) -> Registry:
        from ringfence_server.control.tools import manifest_files

        return cls(load_manifest_file(p) for p in manifest_files(directory))

    def get(self, name: str) -> ToolManifest | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._tools))

    def list(self, query: str = "") -> list[ToolView]:
        """All tools (by name) — or, past NARROW_ABOVE tools and given a query, the best matches.

        A match counts query words found in the tool's name and description; only tools with at
        least one match are returned, best first, at most NARROW_ABOVE of them.
        """
        tools = [self._tools[n] for n in self.names]
        words = [w for w in re.split(r"[^a-z0-9_]+", query.lower()) if w]
        if len(tools) <= NARROW_ABOVE or not words:
            return [t.view() for t in tools]
        scored = []
        for t in tools:
            text = f"{t.name} {t.name.replace('_', ' ')} {t.description}".lower()
            score = sum(3 if w == t.name else 1 for w in words if w in text)
            if score:
                scored.append((-score, t.name, t))
        return [t.view() for _, _, t in sorted(scored)[:NARROW_ABOVE]]
