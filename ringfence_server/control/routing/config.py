"""The `[routing]` table: taxonomy, router, specialists and the services each tenant may route.

    [routing]
    taxonomy = ["latency", "errors", "capacity"]   # the routes a router may answer
    taxonomy_version = "1"
    router = { tool = "route_symptom", version = "1" }

    [routing.specialists.latency]                 # one specialist per route; a route without
    tool = "latency_specialist"                   # one is `unavailable`
    version = "1"
    max_concurrent = 4                            # at once; past it RESOURCE_EXHAUSTED
    deadline_s = 10                               # then its sandbox is killed: worker_error
    max_payload_bytes = 4096                      # the envelope; past it INVALID_ARGUMENT

    [routing.services]                            # tenant -> services its tickets may name
    demo = ["checkout", "payments"]
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ringfence.errors import ConfigError

__all__ = ["RouterConfig", "RoutingConfig", "SpecialistConfig", "parse_routing"]

_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_VERSION = re.compile(r"[A-Za-z0-9_.:-]{1,40}")


@dataclass(frozen=True)
class RouterConfig:
    tool: str = ""
    """The sandboxed tool that maps a symptom to a route (a JSON string)."""
    version: str = "1"


@dataclass(frozen=True)
class SpecialistConfig:
    tool: str
    """The sandboxed tool that receives {incident, service} and answers a `fixture:` locator."""
    version: str = "1"
    max_concurrent: int = 4
    """Calls of this specialist at once, across the server; past it RESOURCE_EXHAUSTED."""
    deadline_s: float = 10.0
    """Wall time for the specialist's call; past it the call is killed and the ticket is worker_error."""
    max_payload_bytes: int = 4096
    """The envelope's JSON size; past it the ticket is refused (INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class RoutingConfig:
    taxonomy: tuple[str, ...] = ()
    taxonomy_version: str = "1"
    router: RouterConfig = field(default_factory=RouterConfig)
    specialists: Mapping[str, SpecialistConfig] = field(default_factory=dict)
    services: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """tenant -> the services its tickets may name (none: every ticket is denied)."""


def _known(key: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    for k in table:
        if k not in allowed:
            raise ConfigError(f"{key}.{k}", "unknown key")


def _get(key: str, table: Mapping[str, Any], name: str, default: Any, types: tuple[type, ...], what: str) -> Any:
    value = table.get(name, default)
    if isinstance(value, bool) or not isinstance(value, types):
        raise ConfigError(f"{key}.{name}", f"must be {what}")
    return value


def _version(key: str, table: Mapping[str, Any]) -> str:
    version: str = _get(key, table, "version", "1", (str,), "a version string")
    if not _VERSION.fullmatch(version):
        raise ConfigError(f"{key}.version", "must be 1-40 characters of [A-Za-z0-9_.:-]")
    return version


def _tool(key: str, table: Mapping[str, Any]) -> str:
    tool: str = _get(key, table, "tool", "", (str,), "a tool name")
    if not _NAME.fullmatch(tool):
        raise ConfigError(f"{key}.tool", "must be a tool name ([a-z][a-z0-9_]*)")
    return tool


def parse_routing(raw: Mapping[str, Any]) -> RoutingConfig:
    if not raw:
        return RoutingConfig()
    _known("routing", raw, {"taxonomy", "taxonomy_version", "router", "specialists", "services"})
    taxonomy = _get("routing", raw, "taxonomy", [], (list,), "a list of route names")
    if not all(isinstance(t, str) and _NAME.fullmatch(t) for t in taxonomy) or len(set(taxonomy)) != len(taxonomy):
        raise ConfigError("routing.taxonomy", "must be distinct route names ([a-z][a-z0-9_]*)")
    taxonomy_version = _get("routing", raw, "taxonomy_version", "1", (str,), "a version string")
    router_raw = _get("routing", raw, "router", {}, (Mapping,), "a table")
    _known("routing.router", router_raw, {"tool", "version"})
    router = RouterConfig(_tool("routing.router", router_raw), _version("routing.router", router_raw))
    specialists: dict[str, SpecialistConfig] = {}
    for route, table in _get("routing", raw, "specialists", {}, (Mapping,), "a table").items():
        key = f"routing.specialists.{route}"
        if route not in taxonomy:
            raise ConfigError(key, "is not a route of routing.taxonomy")
        if not isinstance(table, Mapping):
            raise ConfigError(key, "must be a table")
        _known(key, table, {"tool", "version", "max_concurrent", "deadline_s", "max_payload_bytes"})
        max_concurrent = _get(key, table, "max_concurrent", 4, (int,), "an integer")
        deadline_s = float(_get(key, table, "deadline_s", 10.0, (int, float), "seconds"))
        max_payload = _get(key, table, "max_payload_bytes", 4096, (int,), "an integer")
        if not 1 <= max_concurrent <= 256:
            raise ConfigError(f"{key}.max_concurrent", "must be 1 to 256")
        if not 0.5 <= deadline_s <= 3600:
            raise ConfigError(f"{key}.deadline_s", "must be 0.5 to 3600 seconds")
        if not 64 <= max_payload <= 1024 * 1024:
            raise ConfigError(f"{key}.max_payload_bytes", "must be 64 to 1048576")
        specialists[route] = SpecialistConfig(_tool(key, table), _version(key, table), max_concurrent,
                                              deadline_s, max_payload)
    services: dict[str, tuple[str, ...]] = {}
    for tenant, names in _get("routing", raw, "services", {}, (Mapping,), "a table").items():
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(f"routing.services.{tenant}", "must be a list of service names")
        services[tenant] = tuple(names)
    return RoutingConfig(tuple(taxonomy), taxonomy_version, router, specialists, services)
