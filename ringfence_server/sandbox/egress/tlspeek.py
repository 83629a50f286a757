"""Read a TLS ClientHello off a CONNECT tunnel and find its SNI, before anything goes upstream.

The proxy only opens the upstream connection after the client's first flight has been read
and its server_name checked against the CONNECT host; the bytes read are then forwarded
unchanged. A tunnel whose first bytes are not a TLS handshake (a plain-text request, a second
CONNECT for another proxy further on) is refused: a tunnel carries TLS to the host it named.

A ClientHello offering Encrypted Client Hello is refused as well: with ECH the visible SNI is a
front's public name and the real one is hidden, which is domain fronting by another name.

Stdlib only; laid into the egress-proxy image as it is (images/egress-proxy/image.json, `files`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAX_HELLO = 64 * 1024  # a ClientHello with big post-quantum key shares is still far below this
_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_EXT_SNI = 0x0000
_EXT_ECH = 0xFE0D


class HelloError(ValueError):
    """The bytes are not (or not yet) a well-formed ClientHello. `reason` is a short code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class NeedMore(Exception):
    """The ClientHello is incomplete; read more bytes and try again."""


@dataclass(frozen=True)
class ClientHello:
    server_names: tuple[str, ...]
    offers_ech: bool
    size: int  # bytes of the records that carried it


def _records(data: bytes) -> tuple[bytes, int]:
    """The handshake bytes carried by the leading TLS records, and how many bytes they used."""
    handshake = bytearray()
    pos = 0
    while True:
        if len(data) - pos < 5:
            raise NeedMore()
        ctype, major, _minor = data[pos], data[pos + 1], data[pos + 2]
        length = struct.unpack(">H", data[pos + 3 : pos + 5])[0]
        if ctype != _HANDSHAKE or major != 3:
            raise HelloError("not_tls", "the tunnel did not start with a TLS handshake record")
        if length == 0 or length > 16384 + 2048:
            raise HelloError("bad_tls", f"TLS record length {length} is invalid")
        if len(data) - pos - 5 < length:
            raise NeedMore()
        handshake += data[pos + 5 : pos + 5 + length]
        pos += 5 + length
        if len(handshake) >= 4:
            if handshake[0] != _CLIENT_HELLO:
                raise HelloError("bad_tls", "the first handshake message is not a ClientHello")
            need = 4 + int.from_bytes(handshake[1:4], "big")
            if need > MAX_HELLO:
                raise HelloError("bad_tls", "ClientHello is too large")
            if len(handshake) >= need:
                return bytes(handshake[:need]), pos
        if pos > MAX_HELLO:
            raise HelloError("bad_tls", "ClientHello is too large")


def parse_client_hello(data: bytes) -> ClientHello:
    """Parse the ClientHello at the start of `data`; NeedMore when it is still incomplete."""
    if data and data[0] != _HANDSHAKE:
        raise HelloError("not_tls", "the tunnel did not start with a TLS handshake record")
    msg, used = _records(data)
    body = memoryview(msg)[4:]
    try:
        p = 2 + 32  # client_version, random
        sid_len = body[p]
        p += 1 + sid_len
        cs_len = struct.unpack(">H", body[p : p + 2])[0]
        p += 2 + cs_len
        comp_len = body[p]
        p += 1 + comp_len
        names: list[str] = []
        ech = False
        if p < len(body):
            ext_total = struct.unpack(">H", body[p : p + 2])[0]
            p += 2
            end = p + ext_total
            if end > len(body):
                raise HelloError("bad_tls", "ClientHello extensions overrun the message")
            while p + 4 <= end:
                etype, elen = struct.unpack(">HH", body[p : p + 4])
                p += 4
                ext = body[p : p + elen]
                if len(ext) != elen:
                    raise HelloError("bad_tls", "ClientHello extension overruns the message")
                p += elen
                if etype == _EXT_ECH:
                    ech = True
                elif etype == _EXT_SNI:
                    names.extend(_server_names(bytes(ext)))
    except (IndexError, struct.error) as e:
        raise HelloError("bad_tls", f"malformed ClientHello: {e}") from e
    return ClientHello(tuple(names), ech, used)


def _server_names(ext: bytes) -> list[str]:
    if len(ext) < 2:
        raise HelloError("bad_tls", "empty server_name extension")
    total = struct.unpack(">H", ext[:2])[0]
    if total != len(ext) - 2:
        raise HelloError("bad_tls", "server_name list length mismatch")
    out, p = [], 2
    while p < len(ext):
        if p + 3 > len(ext):
            raise HelloError("bad_tls", "truncated server_name entry")
        ntype, nlen = ext[p], struct.unpack(">H", ext[p + 1 : p + 3])[0]
        p += 3
        name = ext[p : p + nlen]
        if len(name) != nlen:
            raise HelloError("bad_tls", "truncated server_name entry")
        p += nlen
        if ntype == 0:
            try:
                out.append(name.decode("ascii"))
            except UnicodeDecodeError as e:
                raise HelloError("bad_tls", "server_name is not ASCII") from e
    return out
