"""Host names and addresses as the command line gives them."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """`localhost`, or a loopback IP address (brackets of an IPv6 literal allowed); a name that
    would need resolving is not loopback (it could resolve anywhere)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
