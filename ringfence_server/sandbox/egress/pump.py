"""The egress proxy's relay: bytes between an admitted client and its upstream, each one
charged to the call's byte budget; past the budget every connection of the call is cut.

(Not ringfence_server.sandbox.egress.relay, which is the sandbox's own end: loopback TCP to the call's socket.)

    charge(grant, n, ev)                  count n bytes sent outside the pumps (a request head)
    pump(grant, src, dst, direction, ...) copy until EOF, a limit, the idle timeout or a cut
    tunnel(grant, client, upstream, ...)  both directions at once (CONNECT)

Stdlib only; runs inside the egress-proxy image as rfegress.pump.
"""

from __future__ import annotations

import asyncio
import contextlib

from .errors import Cut
from .events import Direction, RequestEvent
from .grant_table import Grant

CHUNK = 65536


def charge(grant: Grant, n: int, ev: RequestEvent) -> None:
    grant.bytes_used += n
    if grant.bytes_used > grant.max_bytes:
        ev.cut = "byte_limit"
        grant.cut_all("byte_limit")
        raise Cut()


async def pump(grant: Grant, src: asyncio.StreamReader, dst: asyncio.StreamWriter, direction: Direction,
               ev: RequestEvent, *, idle_timeout_s: float, limit: int | None = None,
               half_close: bool = True) -> None:
    remaining = limit
    while remaining is None or remaining > 0:
        if grant.revoked:
            raise Cut()
        size = CHUNK if remaining is None else min(CHUNK, remaining)
        try:
            data = await asyncio.wait_for(src.read(size), idle_timeout_s)
        except TimeoutError:
            ev.cut = ev.cut or "idle"
            raise Cut() from None
        if not data:
            break
        if remaining is not None:
            remaining -= len(data)
        room = grant.max_bytes - grant.bytes_used
        if len(data) > room:
            # Deliver exactly up to the ceiling, then cut the whole call.
            if room > 0:
                dst.write(data[:room])
                ev.count(direction, room)
            charge(grant, len(data), ev)
        grant.bytes_used += len(data)
        ev.count(direction, len(data))
        dst.write(data)
        await dst.drain()
    if half_close and dst.can_write_eof():
        with contextlib.suppress(OSError):
            dst.write_eof()


async def tunnel(grant: Grant, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter,
                 ureader: asyncio.StreamReader, uwriter: asyncio.StreamWriter, ev: RequestEvent,
                 *, idle_timeout_s: float) -> None:
    up = asyncio.ensure_future(pump(grant, creader, uwriter, "up", ev, idle_timeout_s=idle_timeout_s))
    down = asyncio.ensure_future(pump(grant, ureader, cwriter, "down", ev, idle_timeout_s=idle_timeout_s))
    try:
        done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            error = t.exception()
            if error is not None:
                raise error
        await asyncio.gather(up, down)
    finally:
        for t in (up, down):
            if not t.done():
                t.cancel()
        await asyncio.gather(up, down, return_exceptions=True)
