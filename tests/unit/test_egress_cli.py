"""`--egress-allow` flags -> EgressGrant, and the proxy modules the image is built from."""

from __future__ import annotations

import argparse

import pytest

from ringfence_server.sandbox.egress.cli import add_exec_arguments, profile_egress_from_args
from ringfence_server.sandbox.egress.grant import EgressGrant
from ringfence_server.sandbox.errors import ProfileError


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


def test_the_image_is_built_from_these_very_proxy_modules():
    """The egress-proxy image lays the host's own modules (its spec's `files`), so the code the
    unit tests exercise is the code the proxy container runs; the lock pins their content."""
    from pathlib import Path

    from ringfence_server.imagebuild.spec import load_spec

    root = Path(__file__).resolve().parents[2]
    spec = load_spec(root / "images" / "egress-proxy")
    sources = {source for _, source in spec.files}
    egress = "ringfence_server/sandbox/egress"
    assert {f"{egress}/{m}.py" for m in ("addresses", "allowlist", "tlspeek", "server")} <= sources
    with spec.overlay() as tree:
        for target, source in spec.files:
            assert (tree / target).read_bytes() == (root / source).read_bytes()
