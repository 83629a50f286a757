"""The runbooks service itself (ringfence_server/demo_services/runbooks/server.py, the very file the runbooks image
runs), without Docker: a RunbookServer on 127.0.0.1.

On loopback every request is the operator's, so nothing is counted as network traffic here;
`_from_network` is what tells the two apart (the Docker test shows the proxy's requests counted).
"""

from __future__ import annotations

import http.client
import io
import json
import threading

import pytest

from ringfence_server.demo_services.runbooks import server as rb


@pytest.fixture
def service():
    s = rb.RunbookServer(("127.0.0.1", 0), log=io.StringIO())
    thread = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield s
    s.shutdown()
    s.server_close()
    thread.join(5)


def get(service, path: str, method: str = "GET"):
    c = http.client.HTTPConnection("127.0.0.1", service.server_address[1], timeout=10)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.getheader("Content-Type"), r.read()
    finally:
        c.close()


def test_a_runbook_as_json_and_as_text(service):
    status, ctype, body = get(service, "/runbooks/credit-policy")
    doc = json.loads(body)
    assert status == 200 and ctype == "application/json"
    assert doc["name"] == "credit-policy" and "up to $100" in doc["text"] and "manager" in doc["text"]
    status, ctype, body = get(service, "/runbooks/disk-full.txt")
    assert status == 200 and ctype.startswith("text/plain") and body.startswith(b"Disk full on a host\n\n")
    status, _, body = get(service, "/runbooks")
    assert [r["name"] for r in json.loads(body)["runbooks"]] == ["credit-policy", "disk-full", "payment-failed"]


@pytest.mark.parametrize("path", ["/runbooks/nope", "/runbooks/../stats", "/runbooks/Disk-Full", "/", "/etc/passwd",
                                  "/runbooks/disk-full/x", "/runbooks/.txt"])
def test_anything_else_is_404(service, path):
    status, _ctype, body = get(service, path)
    assert status == 404 and json.loads(body)["error"] == "not_found"


def test_stats_count_what_was_served_and_only_loopback_may_ask(service, monkeypatch):
    get(service, "/runbooks/disk-full")
    get(service, "/runbooks/disk-full.txt")
    get(service, "/runbooks/nope")
    assert get(service, "/runbooks/x", method="POST")[0] == 405
    status, _, body = get(service, "/stats")
    assert status == 200 and json.loads(body) == {"network": {"connections": 0, "requests": 0},
                                                  "served": {"disk-full": 2}, "not_found": 1}
    # A peer from the network: counted, and /stats refused to it.
    monkeypatch.setattr(rb, "_from_network", lambda peer: True)
    status, _, body = get(service, "/stats")
    assert status == 403
    monkeypatch.undo()
    assert json.loads(get(service, "/stats")[2])["network"] == {"connections": 1, "requests": 1}


def test_healthz(service):
    assert get(service, "/healthz")[:2] == (200, "application/json")
    assert rb._from_network("127.0.0.1") is False and rb._from_network("::1") is False
    assert rb._from_network("172.18.0.3") is True
