"""Which IP addresses the egress proxy may ever connect to. Stdlib only, opens no socket.

`classify_address(ip)` puts an address in one class; only `AddressClass.PUBLIC` is routable
for egress. Everything else (loopback, private, link-local, CGNAT, cloud metadata, multicast,
unspecified, reserved, documentation ranges) is refused by the proxy unless a *test*
configuration names the exact network a decoy lives on -- and metadata addresses are refused
even then.

IPv6 forms that carry an IPv4 address (IPv4-mapped ::ffff:a.b.c.d, IPv4-compatible ::a.b.c.d,
6to4 2002:AABB:CCDD::, NAT64 64:ff9b::/96 and 64:ff9b:1::/48, Teredo 2001::/32) are classified
by the IPv4 address they reach, so ::ffff:169.254.169.254 is metadata, not "some IPv6". A
transition form that embeds a *public* IPv4 is still refused (`TRANSITION`): the proxy speaks
IPv4 to IPv4 hosts itself and has no reason to go through a relay that a client picked.

This module is laid into the egress-proxy image as it is (image.json `files`), so it
imports nothing outside the standard library.
"""

from __future__ import annotations

import enum
import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressClass(enum.Enum):
    PUBLIC = "public"
    LOOPBACK = "loopback"
    PRIVATE = "private"  # RFC 1918, fc00::/7 unique-local, and other non-global IANA ranges
    LINK_LOCAL = "link_local"
    CGNAT = "cgnat"  # 100.64.0.0/10, shared address space
    METADATA = "metadata"  # cloud instance-metadata endpoints
    UNSPECIFIED = "unspecified"  # 0.0.0.0/8, ::
    MULTICAST = "multicast"
    BROADCAST = "broadcast"
    RESERVED = "reserved"  # 240/4, documentation and benchmarking ranges, site-local
    TRANSITION = "transition"  # 6to4/NAT64/Teredo forms of a public IPv4
    INVALID = "invalid"  # not an IP address at all


# Instance-metadata endpoints of the clouds (AWS/GCP/Azure/OCI/DO 169.254.169.254, AWS ECS
# task metadata 169.254.170.2, AWS IMDS over IPv6, Alibaba 100.100.100.200, AWS time sync).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",
        "169.254.170.2",
        "169.254.169.123",
        "169.254.169.253",
        "100.100.100.200",
        "fd00:ec2::254",
        "fd00:ec2::23",
    )
)

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_BROADCAST = ipaddress.ip_address("255.255.255.255")
_V4_RESERVED = tuple(
    ipaddress.ip_network(n)
    for n in (
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # TEST-NET-1
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # TEST-NET-2
        "203.0.113.0/24",  # TEST-NET-3
        "192.88.99.0/24",  # 6to4 relay anycast
        "240.0.0.0/4",
    )
)
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_SIXTOFOUR = ipaddress.ip_network("2002::/16")
_TEREDO = ipaddress.ip_network("2001::/32")
_V4_COMPAT = ipaddress.ip_network("::/96")
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_V6_DOC = (ipaddress.ip_network("2001:db8::/32"), ipaddress.ip_network("3fff::/20"))
_V6_SITE_LOCAL = ipaddress.ip_network("fec0::/10")


def parse_address(ip: object) -> IPAddress | None:
    """An address object, or None for anything that is not exactly one IP address.

    Zone ids (fe80::1%eth0) are stripped first: the zone picks an interface, not a range.
    """
    if isinstance(ip, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return ip
    if not isinstance(ip, str):
        return None
    text = ip.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _classify_v4(a: ipaddress.IPv4Address) -> AddressClass:
    if a in METADATA_ADDRESSES:
        return AddressClass.METADATA
    if a in _THIS_NETWORK:
        return AddressClass.UNSPECIFIED
    if a.is_loopback:
        return AddressClass.LOOPBACK
    if a.is_link_local:
        return AddressClass.LINK_LOCAL
    if a in _CGNAT:
        return AddressClass.CGNAT
    if a == _BROADCAST:
        return AddressClass.BROADCAST
    if a.is_multicast:
        return AddressClass.MULTICAST
    if any(a in n for n in _V4_RESERVED) or a.is_reserved:
        return AddressClass.RESERVED
    if a.is_private:
        return AddressClass.PRIVATE
    if not a.is_global:
        return AddressClass.RESERVED
    return AddressClass.PUBLIC


def embedded_ipv4(a: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 transition form reaches, if it is one."""
    if a.ipv4_mapped is not None:
        return a.ipv4_mapped
    if a in _NAT64[0]:
        return ipaddress.IPv4Address(int(a) & 0xFFFFFFFF)
    if a in _NAT64[1]:
        # RFC 6052 /48 prefix: the IPv4 address sits in bits 48..63 and 72..87 (u octet skipped).
        b = a.packed
        return ipaddress.IPv4Address(b[6:8] + b[9:11])
    if a.sixtofour is not None:
        return a.sixtofour
    if a.teredo is not None:
        # Teredo reaches the (obfuscated) client address through the server; either matters.
        server, client = a.teredo
        return client if _classify_v4(client) is not AddressClass.PUBLIC else server
    if a in _V4_COMPAT and int(a) > 1:
        return ipaddress.IPv4Address(int(a) & 0xFFFFFFFF)
    return None


def classify_address(ip: str | IPAddress) -> AddressClass:
    """The class of `ip`. Only `PUBLIC` may be connected to outside a test configuration."""
    a = parse_address(ip)
    if a is None:
        return AddressClass.INVALID
    if isinstance(a, ipaddress.IPv4Address):
        return _classify_v4(a)
    if a in METADATA_ADDRESSES:
        return AddressClass.METADATA
    if a.is_unspecified:
        return AddressClass.UNSPECIFIED
    if a.is_loopback:
        return AddressClass.LOOPBACK
    v4 = embedded_ipv4(a)
    if v4 is not None:
        inner = _classify_v4(v4)
        return AddressClass.TRANSITION if inner is AddressClass.PUBLIC else inner
    if a.is_link_local:
        return AddressClass.LINK_LOCAL
    if a.is_multicast:
        return AddressClass.MULTICAST
    if a in _UNIQUE_LOCAL:
        return AddressClass.PRIVATE
    if a in _V6_SITE_LOCAL or any(a in n for n in _V6_DOC) or a.is_reserved:
        return AddressClass.RESERVED
    if a.is_private or not a.is_global:
        return AddressClass.PRIVATE
    return AddressClass.PUBLIC


def address_permitted(
    ip: str | IPAddress, test_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
) -> tuple[bool, AddressClass]:
    """(may the proxy connect to `ip`, its class).

    `test_networks` are the decoy networks a test configuration names: an address inside one
    is permitted whatever its class -- except metadata, which no configuration can open.
    """
    cls = classify_address(ip)
    if cls is AddressClass.PUBLIC:
        return True, cls
    if cls in (AddressClass.METADATA, AddressClass.INVALID, AddressClass.UNSPECIFIED):
        return False, cls
    a = parse_address(ip)
    assert a is not None
    for net in test_networks:
        if a.version == net.version and a in net:
            return True, cls
    return False, cls
