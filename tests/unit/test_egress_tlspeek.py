"""SNI extraction from real ClientHellos (made by Python's own TLS stack, in memory)."""

from __future__ import annotations

import ssl

import pytest

from ringfence_server.sandbox.egress.tlspeek import HelloError, NeedMore, parse_client_hello


def client_hello(server_hostname: str | None) -> bytes:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def test_sni_is_found():
    hello = parse_client_hello(client_hello("allowed.test"))
    assert hello.server_names == ("allowed.test",) and not hello.offers_ech


def test_no_sni():
    assert parse_client_hello(client_hello(None)).server_names == ()


def test_incomplete_hello_asks_for_more():
    data = client_hello("allowed.test")
    for cut in (1, 5, 40, len(data) - 1):
        with pytest.raises(NeedMore):
            parse_client_hello(data[:cut])


def test_hello_split_over_two_records():
    data = client_hello("allowed.test")
    body = data[5:]
    half = len(body) // 2
    two = (b"\x16\x03\x01" + half.to_bytes(2, "big") + body[:half]
           + b"\x16\x03\x01" + (len(body) - half).to_bytes(2, "big") + body[half:])
    assert parse_client_hello(two).server_names == ("allowed.test",)


@pytest.mark.parametrize("data, reason", [
    (b"CONNECT denied.test:443 HTTP/1.1\r\n\r\n", "not_tls"),
    (b"GET / HTTP/1.1\r\n\r\n", "not_tls"),
    (b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00", "bad_tls"),  # a ServerHello type
    (b"\x17\x03\x03\x00\x01x", "not_tls"),
])
def test_not_a_client_hello(data, reason):
    with pytest.raises(HelloError) as e:
        parse_client_hello(data)
    assert e.value.reason == reason


def test_ech_is_flagged():
    data = bytearray(client_hello("allowed.test"))
    # Append an ECH extension (type 0xfe0d, empty) and fix up the three lengths.
    ext = b"\xfe\x0d\x00\x00"
    rec_len = int.from_bytes(data[3:5], "big") + len(ext)
    hs_len = int.from_bytes(data[6:9], "big") + len(ext)
    # extensions length sits right before the extensions; find it by walking the hello.
    p = 9 + 2 + 32
    p += 1 + data[p]
    p += 2 + int.from_bytes(data[p:p + 2], "big")
    p += 1 + data[p]
    ext_len = int.from_bytes(data[p:p + 2], "big") + len(ext)
    data[3:5] = rec_len.to_bytes(2, "big")
    data[6:9] = hs_len.to_bytes(3, "big")
    data[p:p + 2] = ext_len.to_bytes(2, "big")
    data += ext
    hello = parse_client_hello(bytes(data))
    assert hello.offers_ech and hello.server_names == ("allowed.test",)
