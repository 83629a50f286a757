"""TLS and mTLS, with certificates made by openssl for the test (a CA, a server, a client)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from api_support import TOKENS, StubOrchestrator, make_config

from ringfence import Client, TlsConfig
from ringfence.errors import Unauthenticated, Unavailable
from ringfence.model import Role
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.api.server import TlsOptions

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
AGENT = TOKENS[("acme", Role.AGENT)]


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ringfence test CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)
    # A client certificate from a CA the server does not trust.
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=stranger",
             "-keyout", "stranger.key", "-out", "stranger.pem", cwd=d)
    return d


def credentials(pki, client: str | None) -> TlsConfig:
    if not client:
        return TlsConfig.from_files(pki / "ca.pem")
    return TlsConfig.from_files(pki / "ca.pem", certificate_chain=pki / f"{client}.pem",
                                private_key=pki / f"{client}.key")


def test_tls_serves_and_still_requires_the_token(pki, tmp_path):
    tls = TlsOptions(pki / "server.pem", pki / "server.key")
    with BackgroundServer(StubOrchestrator(), make_config(tmp_path), tls=tls) as s:
        with Client(s.address, AGENT, tls=credentials(pki, None)) as c:
            assert [t.name for t in c.list_tools()] == ["echo"]
        with Client(s.address, None, tls=credentials(pki, None)) as c, pytest.raises(Unauthenticated):
            c.list_tools()
        with Client(s.address, AGENT, timeout=5) as plaintext, \
                pytest.raises(Unavailable):  # no TLS handshake, no connection
            plaintext.list_tools()


def test_mtls_refuses_clients_without_a_certificate_from_the_ca(pki, tmp_path):
    tls = TlsOptions(pki / "server.pem", pki / "server.key", client_ca=pki / "ca.pem")
    stub = StubOrchestrator()
    with BackgroundServer(stub, make_config(tmp_path), tls=tls) as s:
        with Client(s.address, AGENT, tls=credentials(pki, "client")) as c:
            assert [t.name for t in c.list_tools()] == ["echo"]
        for client in (None, "stranger"):
            with Client(s.address, AGENT, tls=credentials(pki, client), timeout=5) as c, \
                    pytest.raises(Unavailable):  # the handshake fails: no call is made
                c.list_tools()
        assert len(stub.calls) == 1
