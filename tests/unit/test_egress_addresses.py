"""The proxy's address classifier: every range it must refuse, without opening a socket.

This is where the metadata address, link-local, private and the IPv6 forms that smuggle them
are proven refused: the Docker tests never aim a packet at them (docs/escape-battery.md, Network).
"""

from __future__ import annotations

import ipaddress
import socket

import pytest

from ringfence_server.sandbox.egress.addresses import AddressClass as C
from ringfence_server.sandbox.egress.addresses import address_permitted, classify_address, embedded_ipv4

CASES = [
    ("169.254.169.254", C.METADATA),
    ("169.254.170.2", C.METADATA),
    ("100.100.100.200", C.METADATA),
    ("fd00:ec2::254", C.METADATA),
    ("169.254.1.1", C.LINK_LOCAL),
    ("10.0.0.1", C.PRIVATE),
    ("10.255.255.255", C.PRIVATE),
    ("172.16.0.1", C.PRIVATE),
    ("172.31.255.254", C.PRIVATE),
    ("192.168.0.1", C.PRIVATE),
    ("100.64.0.1", C.CGNAT),
    ("100.127.255.254", C.CGNAT),
    ("127.0.0.1", C.LOOPBACK),
    ("127.255.255.254", C.LOOPBACK),
    ("::1", C.LOOPBACK),
    ("fe80::1", C.LINK_LOCAL),
    ("fe80::1%eth0", C.LINK_LOCAL),
    ("febf::1", C.LINK_LOCAL),
    ("fc00::1", C.PRIVATE),
    ("fdff:ffff::1", C.PRIVATE),
    ("::ffff:169.254.169.254", C.METADATA),  # IPv4-mapped
    ("::ffff:a9fe:a9fe", C.METADATA),
    ("::ffff:10.1.1.1", C.PRIVATE),
    ("::ffff:127.0.0.1", C.LOOPBACK),
    ("::169.254.169.254", C.METADATA),  # IPv4-compatible (deprecated)
    ("2002:a9fe:a9fe::1", C.METADATA),  # 6to4 of 169.254.169.254
    ("2002:0a00:0001::", C.PRIVATE),  # 6to4 of 10.0.0.1
    ("64:ff9b::169.254.169.254", C.METADATA),  # NAT64 well-known prefix
    ("64:ff9b::a00:1", C.PRIVATE),
    ("64:ff9b:1:a9fe:a9:fe00::", C.METADATA),  # NAT64 local-use /48 (RFC 6052 layout)
    ("2001:0:4136:e378:8000:63bf:5601:5601", C.METADATA),  # Teredo, client = ~0x5601 -> 169.254...
    ("2002:0808:0808::1", C.TRANSITION),  # 6to4 of a public address: still not ours to use
    ("64:ff9b::8.8.8.8", C.TRANSITION),
    ("0.0.0.0", C.UNSPECIFIED),
    ("0.1.2.3", C.UNSPECIFIED),
    ("::", C.UNSPECIFIED),
    ("224.0.0.1", C.MULTICAST),
    ("ff02::1", C.MULTICAST),
    ("255.255.255.255", C.BROADCAST),
    ("240.0.0.1", C.RESERVED),
    ("192.0.2.10", C.RESERVED),
    ("198.18.0.1", C.RESERVED),
    ("2001:db8::1", C.RESERVED),
    ("fec0::1", C.RESERVED),
    ("8.8.8.8", C.PUBLIC),
    ("93.184.216.34", C.PUBLIC),
    ("2606:4700:4700::1111", C.PUBLIC),
    ("not an address", C.INVALID),
    ("169.254.169.254.nip.io", C.INVALID),
    ("", C.INVALID),
]


@pytest.fixture(autouse=True)
def no_sockets(monkeypatch):
    """Classification is pure: any socket use here is a bug (and could be a packet)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the classifier opened a socket")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.parametrize("ip, expected", CASES)
def test_classify(ip, expected):
    assert classify_address(ip) is expected


def test_teredo_case_really_embeds_the_metadata_address():
    # Teredo stores the client address XOR 0xffffffff; 0x5601 ^ 0xffff = 0xa9fe = 169.254.
    assert embedded_ipv4(ipaddress.IPv6Address("2001:0:4136:e378:8000:63bf:5601:5601")) == \
        ipaddress.IPv4Address("169.254.169.254")


@pytest.mark.parametrize("ip", [ip for ip, c in CASES if c is not C.PUBLIC])
def test_only_public_addresses_are_permitted(ip):
    assert address_permitted(ip)[0] is False


def test_a_test_network_opens_exactly_its_own_range():
    nets = (ipaddress.ip_network("172.30.7.0/24"),)
    assert address_permitted("172.30.7.9", nets) == (True, C.PRIVATE)
    assert address_permitted("172.30.8.9", nets) == (False, C.PRIVATE)
    assert address_permitted("::ffff:172.30.8.9", nets)[0] is False


def test_metadata_is_never_opened_by_a_test_network():
    nets = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("::/0"))
    assert address_permitted("169.254.169.254", nets) == (False, C.METADATA)
    assert address_permitted("::ffff:169.254.169.254", nets) == (False, C.METADATA)
    assert address_permitted("169.254.1.1", nets) == (True, C.LINK_LOCAL)
