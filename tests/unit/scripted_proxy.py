"""A scripted HTTP proxy on 127.0.0.1 for the tool image's network tools, run in-process by the
image's own runner (tests/unit/test_ledger_tools.py, tests/unit/test_demo_tools.py): each test
says what the "egress proxy" (or the receiver behind it) answers next, and reads what it saw.

    script.answer = (status, body, headers)   body: bytes, a JSON-able value, or None
    script.answer = (status, body, "reason")  the proxy's refusal: X-Ringfence-Reason, and when
                                              body is None the proxy's own text body
    script.answer = "reset"                   the connection dropped unanswered
    script.seen                               every request: method, target, auth, accept, body
"""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "images/tool/rootfs/opt/ringfence/runner.py"
PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy")


def load_runner(module_name: str) -> Iterator[Any]:
    """The image's runner.py as a module (a fixture body: `yield from load_runner(...)`)."""
    spec = importlib.util.spec_from_file_location(module_name, RUNNER)
    assert spec is not None and spec.loader is not None, f"no module loader for {RUNNER}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("ringfence_tool", None)


class Script:
    def __init__(self) -> None:
        self.answer: tuple | str = (200, {}, {})
        self.seen: list[dict] = []


def _encode(status_body_extra: tuple) -> tuple[int, bytes, dict[str, str]]:
    status, body, extra = status_body_extra
    headers: dict[str, str] = {}
    if isinstance(extra, str):  # the proxy's refusal, with its reason
        headers["X-Ringfence-Reason"] = extra
        if body is None:
            return status, b"refused\n", headers
    elif extra:
        headers.update(extra)
    if isinstance(body, bytes):
        return status, body, headers
    if body is None:
        return status, b"", headers
    return status, json.dumps(body).encode(), {"Content-Type": "application/json", **headers}


def scripted_proxy(monkeypatch) -> Iterator[Script]:
    """Start the proxy and point the proxy variables at it (a fixture body: `yield from`)."""
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            script.seen.append({"method": self.command, "target": self.path,
                                "auth": self.headers.get("Proxy-Authorization"),
                                "accept": self.headers.get("Accept"),
                                "body": json.loads(body) if body else None})
            if script.answer == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                self.close_connection = True
                return
            status, data, headers = _encode(script.answer)
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    url = f"http://u:secret@127.0.0.1:{server.server_address[1]}"
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, url)
    monkeypatch.setenv("NO_PROXY", "")
    try:
        yield script
    finally:
        server.shutdown()
        server.server_close()
