"""The egress proxy's end of its control channel: how the host adds and removes grants.

One JSON request line and one JSON reply line per connection on a unix socket
(`control_socket`), which lives at the top of the state directory that only the host and the
proxy container mount (the host's end is ringfence_server.sandbox.egress.channel):

    {"op": "ping"}                          -> {"ok": true, "version", "grants", "listeners"}
    {"op": "grant", "call_id", "username", "password", "allow", "max_bytes",
     "max_connections", "socket_dir"}       -> {"ok": true, "socket": path}
    {"op": "revoke", "username"}            -> {"ok": true, the call's summary and events}
    {"op": "events", "username"}            -> {"ok": true, the call's summary and events}

Any failure is {"ok": false, "error": "<type>: <message>"}.

Stdlib only; runs inside the egress-proxy image as rfegress.control.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Protocol

from .events import JSONObject

# 2: grants carry the call's socket directory; no TCP listener. 3: the config declares services.
PROTOCOL_VERSION = 3
MAX_CONTROL = 1024 * 1024
READ_TIMEOUT_S = 10


class Controlled(Protocol):
    """What the control channel drives (ringfence_server.sandbox.egress.server.EgressProxyServer)."""

    def status(self) -> JSONObject: ...

    async def grant(self, *, call_id: str, username: str, password: str, allow: list[str],
                    max_bytes: int, max_connections: int, socket_dir: str) -> str: ...

    async def revoke(self, username: str, wait_s: float = ...) -> JSONObject: ...

    def events(self, username: str) -> JSONObject: ...


async def answer(target: Controlled, request: object) -> JSONObject:
    """The reply to one decoded request (KeyError, ValueError, ...: the caller's error reply)."""
    if not isinstance(request, dict):
        raise ValueError("a control request is a JSON object")
    op = request.get("op")
    if op == "ping":
        return {"ok": True, "version": PROTOCOL_VERSION, **target.status()}
    if op == "grant":
        path = await target.grant(call_id=request["call_id"], username=request["username"],
                                  password=request["password"], allow=request["allow"],
                                  max_bytes=request["max_bytes"], max_connections=request["max_connections"],
                                  socket_dir=request["socket_dir"])
        return {"ok": True, "socket": path}
    if op == "revoke":
        return {"ok": True, **(await target.revoke(request["username"]))}
    if op == "events":
        return {"ok": True, **target.events(request["username"])}
    raise ValueError(f"unknown op {op!r}")


async def serve_connection(target: Controlled, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One control connection: a request line in, a reply line out, closed."""
    resp: JSONObject
    try:
        line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
        resp = await answer(target, json.loads(line))
    except Exception as e:  # noqa: BLE001 - every failure becomes an error reply
        resp = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    try:
        writer.write(json.dumps(resp).encode() + b"\n")
        await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def start(target: Controlled, path: str) -> asyncio.AbstractServer:
    """Listen on `path` (mode 0600: the host and the proxy's own uid only)."""
    if os.path.exists(path):
        os.unlink(path)
    server = await asyncio.start_unix_server(lambda r, w: serve_connection(target, r, w), path, limit=MAX_CONTROL)
    os.chmod(path, 0o600)
    return server
