"""Allowlist matching (what the control plane's admission imports) and the EgressGrant field."""

from __future__ import annotations

import pytest

from ringfence_server.sandbox.egress.allowlist import (
    HostPattern,
    PatternError,
    host_allowed,
    intersect,
    normalize_host,
    parse_pattern,
)
from ringfence_server.sandbox.egress.grant import EgressGrant
from ringfence_server.sandbox.errors import ProfileError
from ringfence_server.sandbox.profile import SandboxProfile


@pytest.mark.parametrize("host, port, patterns, allowed", [
    ("api.example.com", 443, ["api.example.com"], True),
    ("api.example.com", 80, ["api.example.com"], True),
    ("api.example.com", 8443, ["api.example.com"], False),  # no port = web ports only
    ("api.example.com", 8443, ["api.example.com:8443"], True),
    ("api.example.com", 443, ["api.example.com:8443"], False),
    ("API.Example.COM.", 443, ["api.example.com"], True),  # case and trailing dot
    ("x.api.example.com", 443, ["api.example.com"], False),  # a subdomain of an exact entry
    ("evilapi.example.com", 443, ["api.example.com"], False),
    ("api.example.com.evil.test", 443, ["api.example.com"], False),
    ("a.example.com", 443, ["*.example.com"], True),
    ("a.b.example.com", 443, ["*.example.com"], True),
    ("example.com", 443, ["*.example.com"], False),  # the apex is not under the wildcard
    ("badexample.com", 443, ["*.example.com"], False),
    ("1.2.3.4", 443, ["*.example.com", "1.2.3.4.nip.io"], False),  # a bare IP matches nothing
    ("[::1]", 443, ["api.example.com"], False),
    ("bücher.example", 443, ["xn--bcher-kva.example"], True),  # IDNA
    ("", 443, ["api.example.com"], False),
    ("api.example.com", 0, ["api.example.com"], False),
    ("api.example.com", 65536, ["api.example.com"], False),
    ("api.example.com", 443, "api.example.com,other.test", True),
    ("api.example.com", 443, [], False),
    ("api..example.com", 443, ["*.example.com"], False),
    ("-api.example.com", 443, ["*.example.com"], False),
    ("api.example.com", 443, ["*.com:443", "api.example.com"], True),  # a bad entry spoils all
])
def test_host_allowed(host, port, patterns, allowed):
    if patterns and any(p.startswith("*.com") for p in patterns):
        allowed = False  # malformed allowlists allow nothing
    assert host_allowed(host, port, patterns) is allowed


@pytest.mark.parametrize("bad", ["", "*", "*.com", "a.*.com", "10.0.0.1", "[::1]:443", "::1",
                                 "host:0", "host:99999", "host:http", "exa mple.com", "a_b.com",
                                 "1.2.3", "x" * 64 + ".com"])
def test_malformed_patterns_are_refused(bad):
    with pytest.raises(PatternError):
        parse_pattern(bad)


def test_pattern_forms():
    assert parse_pattern("*.Example.com:8443") == HostPattern("example.com", True, (8443,))
    assert parse_pattern("api.example.com") == HostPattern("api.example.com", False, (80, 443))
    assert normalize_host("Bücher.Example.") == "xn--bcher-kva.example"


@pytest.mark.parametrize("tool, granted, expected", [
    (["api.example.com"], ["api.example.com"], ["api.example.com"]),
    (["api.example.com"], ["*.example.com"], ["api.example.com"]),
    (["*.example.com"], ["api.example.com"], ["api.example.com"]),
    (["*.example.com"], ["*.api.example.com"], ["*.api.example.com"]),
    (["*.example.com"], ["example.com"], []),
    (["api.example.com:8443"], ["api.example.com"], []),
    (["api.example.com"], ["api.example.com:443"], ["api.example.com:443"]),
    (["a.test", "b.test"], ["b.test", "c.test"], ["b.test"]),
    ([], ["a.test"], []),
])
def test_intersection_never_widens_either_side(tool, granted, expected):
    result = intersect(tool, granted)
    assert [str(p) for p in result] == expected
    for host in ["api.example.com", "x.api.example.com", "example.com", "a.test", "b.test", "c.test"]:
        for port in (80, 443, 8443):
            if host_allowed(host, port, result):
                assert host_allowed(host, port, tool) and host_allowed(host, port, granted)


def test_egress_grant_validates_and_canonicalizes():
    g = EgressGrant(allow=("B.test", "a.test:8443", "*.c.test"))
    assert g.allow == ("*.c.test", "a.test:8443", "b.test")
    assert EgressGrant(allow="a.test,b.test").allow == ("a.test", "b.test")
    with pytest.raises(ProfileError, match=r"egress\.allow"):
        EgressGrant(allow=())
    with pytest.raises(ProfileError, match=r"egress\.allow"):
        EgressGrant(allow=("169.254.169.254",))
    with pytest.raises(ProfileError, match=r"egress\.max_bytes"):
        EgressGrant(allow=("a.test",), max_bytes=0)
    with pytest.raises(ProfileError, match=r"egress\.max_connections"):
        EgressGrant(allow=("a.test",), max_connections=True)


def test_profile_takes_an_egress_grant_and_refuses_gvisor_with_it():
    grant = EgressGrant(allow=("a.test",))
    assert SandboxProfile(egress=grant).egress == grant
    assert SandboxProfile().egress is None
    with pytest.raises(ProfileError, match="egress"):
        SandboxProfile(runtime="gvisor", egress=grant)
    with pytest.raises(ProfileError, match="egress"):
        SandboxProfile(egress=("a.test",))


def test_public_exports_for_the_control_plane():
    import ringfence_server.sandbox.egress as egress
    from ringfence_server.sandbox.egress import allowlist

    for name in ("host_allowed", "classify_address", "AddressClass", "intersect", "parse_pattern"):
        assert hasattr(allowlist, name) and hasattr(egress, name)
    assert allowlist.classify_address("169.254.169.254") is allowlist.AddressClass.METADATA
    assert sorted(egress.__all__) == sorted([
        "AddressClass", "EgressGrant", "HostPattern", "PatternError", "address_permitted",
        "classify_address", "host_allowed", "intersect", "parse_pattern"])
