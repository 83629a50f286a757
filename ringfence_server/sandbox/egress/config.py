"""The egress proxy's configuration: ProxyConfig (the container's config.json) and services.

    ProxyConfig.from_json(doc)   the file the host writes (ringfence_server.sandbox.egress.proxy.ProxySettings)
    parse_services(raw)          operator-declared services, checked and canonical
    CHECKS                       the checks a TEST configuration may switch off

Stdlib only; runs inside the egress-proxy image as rfegress.config.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

from .addresses import AddressClass, classify_address, embedded_ipv4, parse_address
from .allowlist import PatternError, normalize_host

# Checks a TEST configuration may switch off to prove that each one matters (red checks).
# A production configuration never carries any (ringfence_server.sandbox.egress.proxy refuses to write one).
CHECKS = frozenset({"allowlist", "address", "ip_literal", "sni", "host_header", "call_binding"})

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# What a service's pinned address may be: the private ranges Docker gives its networks. Never
# loopback (that is the proxy itself), link-local or metadata (the cloud's), nor a public
# address (a service is a container ringfence runs on the proxy's own networks, not the internet).
SERVICE_ADDRESS_CLASSES = frozenset({AddressClass.PRIVATE, AddressClass.CGNAT})


class ConfigError(ValueError):
    pass


def address_key(ip: IPAddress) -> IPAddress:
    """The address a connection to `ip` reaches: an IPv6 form of an IPv4 address is that IPv4."""
    if isinstance(ip, ipaddress.IPv6Address):
        return embedded_ipv4(ip) or ip
    return ip


def parse_services(raw: object) -> dict[str, tuple[str, ...]]:
    """Operator-declared services, `{host name: [address, ...]}`, checked and canonical.

    Each name is an exact host name (no wildcard, no IP literal); each address a literal
    private address (never resolved: the operator pins the addresses of containers it runs);
    no address belongs to two names, so a name stands for its addresses and for nothing else.
    """
    if not isinstance(raw, dict):
        raise ConfigError("services must map host names to lists of IP addresses")
    out: dict[str, tuple[str, ...]] = {}
    owner: dict[IPAddress, str] = {}
    for name, addrs in raw.items():
        try:
            canon = normalize_host(name)
        except PatternError as e:
            raise ConfigError(f"services[{name!r}]: {e}") from None
        if canon in out:
            raise ConfigError(f"services[{name!r}]: {canon} is declared twice")
        if isinstance(addrs, str):
            addrs = (addrs,)
        if not isinstance(addrs, (list, tuple)) or not addrs:
            raise ConfigError(f"services[{name!r}]: needs at least one IP address")
        pinned: list[str] = []
        for a in addrs:
            ip = parse_address(a) if isinstance(a, str) and "%" not in a else None
            if ip is None:
                raise ConfigError(f"services[{name!r}]: {a!r} is not an IP address (services are never resolved)")
            if address_key(ip) != ip:
                raise ConfigError(f"services[{name!r}]: {a} is an IPv6 form of {address_key(ip)}: pin that address")
            cls = classify_address(ip)
            if cls not in SERVICE_ADDRESS_CLASSES:
                raise ConfigError(f"services[{name!r}]: {a} is a {cls.value} address; a service is pinned to "
                                  f"the private address of a container on the proxy's own networks")
            other = owner.setdefault(address_key(ip), canon)
            if other != canon:
                raise ConfigError(f"services[{name!r}]: {a} is already the address of service {other}")
            if str(ip) not in pinned:
                pinned.append(str(ip))
        out[canon] = tuple(pinned)
    return out


def _test_hosts(raw: object) -> dict[str, tuple[str, ...]]:
    """`{name: address | [address, ...]}` -> canonical names, each address checked."""
    hosts: dict[str, tuple[str, ...]] = {}
    for name, addrs in dict(raw).items():  # type: ignore[call-overload]  # a mapping, as the field says; dict() refuses anything else
        if isinstance(addrs, str):
            addrs = (addrs,)
        for a in addrs:
            if parse_address(a) is None:
                raise ConfigError(f"test_hosts[{name!r}]: {a!r} is not an IP address")
        hosts[normalize_host(name)] = tuple(addrs)
    return hosts


def _network(n: object) -> Network:
    if isinstance(n, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
        return n
    return ipaddress.ip_network(n)  # type: ignore[arg-type]  # ip_network raises ValueError for what it cannot read


@dataclass(frozen=True)
class ProxyConfig:
    """What the proxy runs with. The constructor also takes the JSON forms (lists for tuples,
    CIDR strings for networks, a single address for a test host) and stores the canonical ones."""

    control_socket: str | None = "/run/rfproxy/control.sock"
    calls_dir: str = "/run/rfproxy/calls"
    """Where the host creates one directory per call; the proxy listens in it for that call."""
    resolver: str = "system"
    """`system` (getaddrinfo in the proxy's own network namespace) or `test`."""
    test_hosts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Test resolver: name -> addresses of decoys. With `resolver: test` nothing else resolves."""
    test_networks: tuple[Network, ...] = ()
    """Decoy networks whose (private) addresses a test allows. Metadata addresses never."""
    disabled_checks: frozenset[str] = frozenset()
    """Tests only: checks switched off to show that the attack they stop then gets through."""
    services: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Operator-declared internal services: exact host name -> the pinned private addresses of
    a container ringfence runs (see parse_services). Never resolved; each address is permitted
    for its own name only. Valid with either resolver: this is production configuration."""
    head_timeout_s: float = 10.0
    hello_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 120.0
    max_events_per_call: int = 1000

    def __post_init__(self) -> None:
        if self.resolver not in ("system", "test"):
            raise ConfigError(f"resolver must be 'system' or 'test', not {self.resolver!r}")
        unknown = set(self.disabled_checks) - CHECKS
        if unknown:
            raise ConfigError(f"unknown checks {sorted(unknown)}; known: {sorted(CHECKS)}")
        hosts = _test_hosts(self.test_hosts)
        object.__setattr__(self, "test_hosts", hosts)
        object.__setattr__(self, "test_networks", tuple(_network(n) for n in self.test_networks))
        object.__setattr__(self, "disabled_checks", frozenset(self.disabled_checks))
        services = parse_services(dict(self.services))
        both = sorted(set(services) & set(hosts))
        if both:
            raise ConfigError(f"{both} are both services and test_hosts: a service's addresses are its pinned ones")
        object.__setattr__(self, "services", services)

    def service_of(self, address: str) -> str | None:
        """The service whose pinned address `address` is (in any of its forms), or None."""
        ip = parse_address(address)
        if ip is None:
            return None
        key = address_key(ip)
        for name, pinned in self.services.items():
            if any(_pinned_key(p) == key for p in pinned):
                return name
        return None

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> ProxyConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(doc) - known
        if unknown:
            raise ConfigError(f"unknown config keys {sorted(unknown)}")
        values = dict(doc)
        hosts = values.get("test_hosts")
        if isinstance(hosts, dict):
            values["test_hosts"] = {k: tuple(v) if isinstance(v, list) else v for k, v in hosts.items()}
        if "test_networks" in values:
            values["test_networks"] = tuple(_items("test_networks", values["test_networks"]))
        if "disabled_checks" in values:
            values["disabled_checks"] = frozenset(_items("disabled_checks", values["disabled_checks"]))
        # Each field's JSON value is checked by __post_init__ (or fails there with TypeError/ValueError).
        return cls(**values)  # type: ignore[arg-type]  # JSON values: checked by __post_init__, not by the signature


def _items(key: str, value: object) -> Iterable[object]:
    if not isinstance(value, Iterable):
        raise ConfigError(f"{key} must be a list")
    return value


def _pinned_key(address: str) -> IPAddress | None:
    ip = parse_address(address)
    return address_key(ip) if ip is not None else None
