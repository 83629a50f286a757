"""`--egress-allow` flags -> EgressGrant, and the image copy of the proxy modules."""

from __future__ import annotations

import argparse

import pytest

from sandbox.egress import sync
from sandbox.egress.cli import add_exec_arguments, profile_egress_from_args
from sandbox.egress.grant import EgressGrant
from sandbox.errors import ProfileError


def parse(*argv):
    p = argparse.ArgumentParser()
    add_exec_arguments(p)
    return profile_egress_from_args(p.parse_args(list(argv)))


def test_no_flag_means_no_egress():
    assert parse() is None


def test_flags_make_a_grant():
    g = parse("--egress-allow", "api.example.com,*.cdn.test:8443", "--egress-allow", "b.test",
              "--egress-max-bytes", "2m", "--egress-max-connections", "3")
    assert g == EgressGrant(allow=("*.cdn.test:8443", "api.example.com", "b.test"), max_bytes=2 * 1024 * 1024,
                            max_connections=3)


def test_bad_hosts_are_profile_errors():
    with pytest.raises(ProfileError):
        parse("--egress-allow", "169.254.169.254")
    with pytest.raises(argparse.ArgumentTypeError):
        parse("--egress-max-bytes", "1m")


def test_the_image_carries_exactly_these_proxy_modules():
    assert sync.differences() == [], "run `python -m sandbox.egress.sync` and rebuild egress-proxy"
