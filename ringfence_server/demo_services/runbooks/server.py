"""The runbooks service: a few fixed runbook documents over HTTP, for the incident-response demo.

A tool reaches it as runbooks.internal.corp through the egress proxy (ringfence_server/control/tools/fetch_url.json
declares that host), so what an agent reads is a real request to a real receiver, counted here.

    GET /runbooks                   200 {"runbooks": [{"name", "title"}, ...]}
    GET /runbooks/<name>            200 {"name", "title", "text"}        (application/json)
    GET /runbooks/<name>.txt        200 "<title>\n\n<text>"              (text/plain)
    anything else under GET         404 {"error": "not_found"}
    GET /healthz                    200 {"ok": true}
    GET /stats                      200 {"network": {"connections", "requests"},
                                         "served": {name: n}, "not_found": n}
                                    on the container's loopback only (403 from the network)
    other methods                   405

`network` counts only what came over the network (through the egress proxy); the host asks on
the container's loopback (`docker exec`, sandbox.runbooks.container), which is not counted, so
a test can assert exactly what reached the service. /stats answers only there: the counts are
for the operator, not for tools.

Stdlib only; laid into the runbooks image as /opt/ringfence/runbooks.py (images/runbooks/image.json
`files`), so the host's unit tests run this very file. Run as
`python3 -I -S -B runbooks.py [--host 0.0.0.0] [--port 80]`.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TextIO

NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")

# The documents: fixed, short, plain ASCII. (title, text)
RUNBOOKS: dict[str, tuple[str, str]] = {
    "disk-full": (
        "Disk full on a host",
        "1. Find the largest directories: du -xh / | sort -h | tail.\n"
        "2. Rotate or truncate logs under /var/log; never delete database files.\n"
        "3. If the disk fills again within an hour, page the owning team.",
    ),
    "payment-failed": (
        "A customer's payment failed",
        "1. Look the payment up in the ledger by its idempotency key.\n"
        "2. If the customer was charged and the order failed, apply a credit (see credit-policy)\n"
        "   with a reason that names the incident.\n"
        "3. Never credit the same incident twice: reuse its idempotency key.",
    ),
    "credit-policy": (
        "Credit policy",
        "Credits up to $100 are fine for a known customer: issue them with a reason.\n"
        "Larger credits need a manager's approval.",
    ),
}


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.connections = 0
        self.requests = 0
        self.not_found = 0
        self.served: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def serve(self, runbook: str) -> None:
        with self._lock:
            self.served[runbook] = self.served.get(runbook, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"network": {"connections": self.connections, "requests": self.requests},
                    "served": dict(sorted(self.served.items())), "not_found": self.not_found}


class RunbookServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], *, log: TextIO | None = None) -> None:
        self.counters = Counters()
        self.log = log if log is not None else sys.stdout
        self._log_lock = threading.Lock()
        super().__init__(address, RunbookHandler)

    def emit(self, event: dict[str, Any]) -> None:
        with self._log_lock:
            try:
                self.log.write(json.dumps(event, sort_keys=True) + "\n")
                self.log.flush()
            except (OSError, ValueError):
                pass  # a closed stdout must not take the service down


def _from_network(peer: str) -> bool:
    try:
        return not ipaddress.ip_address(peer).is_loopback
    except ValueError:
        return True


class RunbookHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ringfence-runbooks"
    sys_version = ""
    # A client that stalls mid-request must not hold a thread for ever.
    timeout = 15
    server: RunbookServer

    def setup(self) -> None:
        super().setup()
        self.from_network = _from_network(self.client_address[0])
        if self.from_network:
            self.server.counters.add("connections")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one JSON line per request instead (see _reply)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.from_network:
            self.server.counters.add("requests")
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            return self._json(200, {"ok": True})
        if path == "/stats":
            if self.from_network:
                return self._json(403, {"error": "forbidden", "message": "/stats answers on loopback only"})
            return self._json(200, self.server.counters.snapshot())
        if path in ("/runbooks", "/runbooks/"):
            return self._json(200, {"runbooks": [{"name": n, "title": t} for n, (t, _) in sorted(RUNBOOKS.items())]})
        if path.startswith("/runbooks/"):
            name = path[len("/runbooks/"):]
            text = name.endswith(".txt")
            if text:
                name = name[:-len(".txt")]
            if NAME.fullmatch(name) and name in RUNBOOKS:
                self.server.counters.serve(name)
                title, body = RUNBOOKS[name]
                if text:
                    return self._reply(200, f"{title}\n\n{body}\n".encode(), "text/plain; charset=utf-8", name)
                return self._json(200, {"name": name, "title": title, "text": body}, name)
        self.server.counters.add("not_found")
        return self._json(404, {"error": "not_found", "message": f"no runbook at {path}"})

    def _not_allowed(self) -> None:
        if self.from_network:
            self.server.counters.add("requests")
        self._json(405, {"error": "method_not_allowed"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed  # noqa: N815 - http.server dispatches on these names

    def _json(self, status: int, doc: dict[str, Any], runbook: str | None = None) -> None:
        self._reply(status, json.dumps(doc, sort_keys=True).encode(), "application/json", runbook)

    def _reply(self, status: int, body: bytes, content_type: str, runbook: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self.server.emit({"event": "request", "method": self.command, "path": self.path.split("?", 1)[0],
                          "status": status, "runbook": runbook, "network": self.from_network})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="runbooks")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=80)
    args = parser.parse_args(argv)
    server = RunbookServer((args.host, args.port))

    def stop(*_: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.emit({"event": "ready", "port": server.server_address[1], "runbooks": sorted(RUNBOOKS)})
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
