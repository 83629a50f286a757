"""The host's end of the proxy's control channel: one JSON line each way over a unix socket.

Why a unix socket in a host directory bind-mounted only into the proxy container:
- nothing on any network can reach it, and a sandbox mounts only its own call's directory
  further down (never this one), so no sandbox can register itself a grant or read another
  call's events (a control *port* would be one more listener, guarded only by a secret);
- it costs one local connect per operation (`docker exec` would cost a process and ~100 ms per
  grant and per revoke, on the dispatch path of every call);
- the file is the proxy's own (mode 0600, its uid) in a directory no sandbox mounts.
"""

from __future__ import annotations

import json
import socket

from ringfence_server.sandbox.egress.events import JSONObject
from ringfence_server.sandbox.errors import EngineError

MAX_REPLY = 64 * 1024 * 1024


class EgressError(EngineError):
    """The egress proxy could not be started, reached or told about a call (transient)."""


class ControlChannel:
    def __init__(self, path: str, timeout_s: float = 10.0) -> None:
        self.path = path
        self.timeout_s = timeout_s

    def request(self, op: str, **fields: object) -> JSONObject:
        body = json.dumps({"op": op, **fields}).encode() + b"\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout_s)
                s.connect(self.path)
                s.sendall(body)
                chunks, size = [], 0
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_REPLY:
                        raise EgressError(f"egress proxy reply to {op} is larger than {MAX_REPLY} bytes")
        except OSError as e:
            raise EgressError(f"egress proxy control channel {self.path}: {op}: {e}") from e
        try:
            reply = json.loads(b"".join(chunks))
        except ValueError as e:
            raise EgressError(f"egress proxy sent a malformed reply to {op}") from e
        if not isinstance(reply, dict) or not reply.get("ok"):
            raise EgressError(f"egress proxy refused {op}: {reply.get('error') if isinstance(reply, dict) else reply}")
        return reply

    def ping(self) -> JSONObject:
        return self.request("ping")

    def grant(self, *, call_id: str, username: str, password: str, allow: list[str],
              max_bytes: int, max_connections: int, socket_dir: str) -> str:
        """Register the call; the proxy listens for it in `<calls_dir>/<socket_dir>/` (a
        directory the caller made) and returns the socket's path as the proxy sees it."""
        reply = self.request("grant", call_id=call_id, username=username, password=password, allow=list(allow),
                             max_bytes=max_bytes, max_connections=max_connections, socket_dir=socket_dir)
        return str(reply.get("socket", ""))

    def revoke(self, username: str) -> JSONObject:
        return self.request("revoke", username=username)

    def events(self, username: str) -> JSONObject:
        return self.request("events", username=username)
