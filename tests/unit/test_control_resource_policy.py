"""Resource policy: no way out of a root through `..` or symlinks; egress only to the allowlist,
never to private, loopback, link-local or metadata addresses. Pure checks: no traffic is sent."""

from __future__ import annotations

import os

import pytest

from ringfence_server.control.registry import ToolManifest
from ringfence_server.control.resource_policy import check_resources

READER = ToolManifest("reader", "r", {"type": "object"}, mutates=False, reversible=True,
                      paths={"path": ("/input",)})
FETCH = ToolManifest("fetch", "f", {"type": "object"}, mutates=False, reversible=True,
                     egress_hosts=("api.example.com", "*.cdn.example.com"), url_arguments=("url",))


@pytest.mark.parametrize("path", ["a.txt", "/input/a.txt", "/input/x/../a.txt", "./a/b", "/input"])
def test_paths_inside_the_root(path):
    assert check_resources(READER, {"path": path}).allowed


@pytest.mark.parametrize("path", ["../etc/passwd", "/input/../etc/passwd", "/etc/passwd", "a/../../etc",
                                  "/inputs/a", "/input/../input2/a", "", "a\\..\\..\\etc"])
def test_paths_outside_the_root_are_denied(path):
    assert not check_resources(READER, {"path": path}).allowed


def test_symlinks_are_followed_where_the_root_exists_on_the_host(tmp_path):
    root = tmp_path / "input"
    (root / "sub").mkdir(parents=True)
    (root / "ok.txt").write_text("x")
    os.symlink(tmp_path, root / "up")  # a link inside the root pointing at its parent
    os.symlink("../ok.txt", root / "sub" / "fine")  # a link that stays inside
    host = {"/input": str(root)}
    assert check_resources(READER, {"path": "ok.txt"}, host).allowed
    assert check_resources(READER, {"path": "sub/fine"}, host).allowed
    assert not check_resources(READER, {"path": "up/secret"}, host).allowed
    assert not check_resources(READER, {"path": "/input/up"}, host).allowed
    # Without the host mapping the same text is only checked lexically (and passes): the
    # realpath check is what stops it.
    assert check_resources(READER, {"path": "up/secret"}, {}).allowed


def test_a_root_that_exists_on_the_host_is_checked_directly(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    os.symlink("/etc", root / "etc")
    tool = ToolManifest("r", "r", {"type": "object"}, mutates=False, reversible=True, paths={"p": (str(root),)})
    assert not check_resources(tool, {"p": "etc/passwd"}).allowed


@pytest.mark.parametrize("url", ["https://api.example.com/v1", "api.example.com", "http://a.cdn.example.com/x",
                                 "https://api.example.com:443/", "api.example.com:80"])
def test_allowed_hosts(url):
    assert check_resources(FETCH, {"url": url}).allowed


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data", "http://metadata.google.internal/", "http://127.0.0.1/",
    "http://localhost/", "http://10.1.2.3/", "http://192.168.0.1/", "http://[::1]/", "http://[fd00::1]/",
    "http://[::ffff:169.254.169.254]/", "http://0x7f000001/", "http://2130706433/", "http://100.64.0.1/",
    "http://evil.example.org/", "http://api.example.com.evil.org/", "http://cdn.example.com/",
    "file:///etc/passwd", "gopher://api.example.com/", "http://0.0.0.0/",
    # A name without a port opens 80 and 443 only, as at the egress proxy.
    "https://api.example.com:8443/", "api.example.com:22",
])
def test_denied_hosts(url):
    assert not check_resources(FETCH, {"url": url}).allowed


def test_private_addresses_are_denied_even_when_allowlisted():
    tool = ToolManifest("f", "f", {"type": "object"}, mutates=False, reversible=True,
                        egress_hosts=("169.254.169.254", "10.0.0.1"), url_arguments=("url",))
    assert not check_resources(tool, {"url": "http://169.254.169.254/"}).allowed
    assert not check_resources(tool, {"url": "10.0.0.1"}).allowed


def test_admission_matches_like_the_egress_proxy():
    """Admission uses ringfence_server.sandbox.egress.allowlist, the proxy's own matcher: every (host, port) the
    one refuses, the other refuses too."""
    from ringfence_server.sandbox.egress.allowlist import host_allowed

    for url, host, port in [("https://api.example.com/", "api.example.com", 443),
                            ("http://x.cdn.example.com/", "x.cdn.example.com", 80),
                            ("https://cdn.example.com/", "cdn.example.com", 443),
                            ("https://api.example.com:8443/", "api.example.com", 8443)]:
        assert check_resources(FETCH, {"url": url}).allowed == host_allowed(host, port, FETCH.egress_hosts)


@pytest.mark.parametrize("url, why", [
    ("http://169.254.169.254/", "metadata address"),
    ("http://[::ffff:10.0.0.1]/", "private address"),
    ("http://100.64.0.1/", "cgnat address"),
    ("http://[2002:a9fe:a9fe::1]/", "address"),  # 6to4 wrapping of the metadata address
    ("http://93.184.216.34/", "egress is allowlisted by host name only"),
])
def test_ip_literals_are_refused_with_the_proxys_classification(url, why):
    decision = check_resources(FETCH, {"url": url})
    assert not decision.allowed and why in decision.reason
