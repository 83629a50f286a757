"""The ledger service itself (ringfence_server/demo_services/ledger/server.py, the very file the ledger image runs),
without Docker: a LedgerServer on 127.0.0.1 with its SQLite file in a temp directory.

What it promises: a credit is applied once per idempotency key, the record is committed
(synchronous=FULL) before the response, a key reused with other arguments applies nothing,
and with fault injection the effect can happen while its reply is lost.
"""

from __future__ import annotations

import decimal
import http.client
import io
import json
import sqlite3
import threading

import pytest

from ringfence_server.demo_services.ledger.server import (
    BadRequest,
    LedgerServer,
    LedgerStore,
    parse_amount,
    parse_credit,
)


class Running:
    def __init__(self, db: str, **kw) -> None:
        self.store = LedgerStore(db)
        self.server = LedgerServer(("127.0.0.1", 0), self.store, log=io.StringIO(), **kw)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def request(self, method: str, path: str, body=None, raw: bytes | None = None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            c.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            r = c.getresponse()
            return r.status, json.loads(r.read())
        finally:
            c.close()

    def credit(self, account="acme-9", amount=50, key="k1"):
        return self.request("POST", "/credits", {"account": account, "amount": amount, "idempotency_key": key})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        self.store.close()


@pytest.fixture
def ledger(tmp_path):
    r = Running(str(tmp_path / "ledger.sqlite3"))
    yield r
    r.close()


def test_a_credit_is_applied_once_per_key(ledger):
    status, first = ledger.credit()
    assert status == 201 and first["replayed"] is False
    assert {k: first[k] for k in ("id", "idempotency_key", "account", "amount")} == {
        "id": 1, "idempotency_key": "k1", "account": "acme-9", "amount": 50}
    status, again = ledger.credit(amount=50.0)  # the same amount, written differently
    assert status == 200 and again == {**first, "replayed": True}
    assert ledger.request("GET", "/accounts/acme-9") == (200, {"account": "acme-9", "balance": 50, "credits": 1})
    status, stats = ledger.request("GET", "/stats")
    assert stats["credits"] == 1 and stats["replays"] == 1


def test_two_keys_are_two_credits(ledger):
    ledger.credit(key="a", amount=10)
    ledger.credit(key="b", amount=2.5)
    assert ledger.request("GET", "/accounts/acme-9")[1] == {"account": "acme-9", "balance": 12.5, "credits": 2}
    assert ledger.request("GET", "/stats")[1]["credits"] == 2


@pytest.mark.parametrize("change", [{"amount": 51}, {"account": "acme-10"}])
def test_a_key_reused_with_other_arguments_is_409_and_applies_nothing(ledger, change):
    ledger.credit()
    status, body = ledger.credit(**change)
    assert status == 409 and body["error"] == "idempotency_key_reused"
    assert body["record"]["amount"] == 50 and "nothing is applied" in body["message"]
    assert ledger.request("GET", "/accounts/acme-9")[1]["balance"] == 50
    assert ledger.request("GET", "/accounts/acme-10")[1] == {"account": "acme-10", "balance": 0, "credits": 0}
    stats = ledger.request("GET", "/stats")[1]
    assert stats["credits"] == 1 and stats["conflicts"] == 1


@pytest.mark.parametrize("raw, why", [
    (b'{"account": "acme-9", "amount": 50}', "idempotency_key is required"),
    (b'{"account": "acme-9", "amount": 50, "idempotency_key": ""}', "idempotency_key is required"),
    (b'{"account": "acme-9", "amount": 50, "idempotency_key": "a/b"}', "idempotency_key must be"),
    (b'{"account": "acme-9", "amount": 50, "idempotency_key": 7}', "idempotency_key must be"),
    (b'{"account": "Acme 9", "amount": 50, "idempotency_key": "k"}', "account must be"),
    (b'{"account": "acme-9", "amount": true, "idempotency_key": "k"}', "amount must be a number"),
    (b'{"account": "acme-9", "amount": "50", "idempotency_key": "k"}', "amount must be a number"),
    (b'{"account": "acme-9", "amount": NaN, "idempotency_key": "k"}', "NaN is not a number"),
    (b'{"account": "acme-9", "amount": 0, "idempotency_key": "k"}', "amount must be in"),
    (b'{"account": "acme-9", "amount": 1e30, "idempotency_key": "k"}', "amount must be in"),
    (b'{"account": "acme-9", "amount": 1.005, "idempotency_key": "k"}', "two fractional digits"),
    (b'{"account": "acme-9", "amount": 5, "idempotency_key": "k", "memo": "x"}', "unknown fields"),
    (b'[1, 2]', "JSON object"),
    (b'not json', "not JSON"),
])
def test_a_bad_credit_is_400_and_applies_nothing(ledger, raw, why):
    status, body = ledger.request("POST", "/credits", raw=raw)
    assert status == 400 and why in body["message"]
    stats = ledger.request("GET", "/stats")[1]
    assert stats["credits"] == 0 and stats["rejected"] == 1


def test_a_chunked_or_unsized_body_is_refused(ledger):
    c = http.client.HTTPConnection("127.0.0.1", ledger.port, timeout=10)
    c.request("POST", "/credits", body=iter([b'{"account": "acme-9", "amount": 5, "idempotency_key": "k"}']),
              encode_chunked=True, headers={"Transfer-Encoding": "chunked"})
    r = c.getresponse()
    assert r.status == 400 and b"chunked" in r.read()
    c.close()
    assert ledger.request("GET", "/stats")[1]["credits"] == 0


def test_lookup_by_key(ledger):
    _, applied = ledger.credit(key="look-me-up")
    status, record = ledger.request("GET", "/credits/look-me-up")
    assert status == 200 and record == {k: v for k, v in applied.items() if k != "replayed"}
    assert ledger.request("GET", "/credits/never-applied") == (404, {"error": "not_found",
                                                                     "idempotency_key": "never-applied"})
    assert ledger.request("GET", "/credits/a%2Fb")[0] == 400
    assert ledger.request("GET", "/nothing-here")[0] == 404
    assert ledger.request("DELETE", "/credits/look-me-up")[0] == 405
    assert ledger.request("GET", "/healthz") == (200, {"ok": True})


def test_the_record_is_in_the_file_and_outlives_the_process(tmp_path):
    db = str(tmp_path / "ledger.sqlite3")
    first = Running(db)
    try:
        assert first.credit(key="durable")[0] == 201
        raw = sqlite3.connect(db)
        assert raw.execute("SELECT idempotency_key, account, amount FROM credits").fetchall() == [
            ("durable", "acme-9", "50")]
        raw.close()
        assert first.store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert first.store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        first.close()
    second = Running(db)  # a new process on the same file: the key is still on record
    try:
        status, again = second.credit(key="durable")
        assert status == 200 and again["replayed"] is True
        assert second.request("GET", "/stats")[1]["credits"] == 1
    finally:
        second.close()


def test_fail_after_commit_applies_the_credit_and_loses_the_reply(tmp_path):
    ledger = Running(str(tmp_path / "ledger.sqlite3"), fail_after_commit=2)
    try:
        assert ledger.credit(key="one")[0] == 201
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
            ledger.credit(key="two")  # the 2nd applied credit: committed, then the connection reset
        assert ledger.request("GET", "/credits/two")[0] == 200  # the effect happened
        status, again = ledger.credit(key="two")  # the retry: answered from the record
        assert status == 200 and again["replayed"] is True
        assert ledger.credit(key="three")[0] == 201  # only the Nth is lost
        stats = ledger.request("GET", "/stats")[1]
        assert stats["credits"] == 3 and stats["dropped_replies"] == 1 and stats["replays"] == 1
    finally:
        ledger.close()


def test_concurrent_posts_of_one_key_apply_it_once(ledger):
    statuses: list[int] = []
    lock = threading.Lock()

    def post():
        status, _ = ledger.credit(key="race")
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(statuses) == [200] * 7 + [201]
    assert ledger.request("GET", "/stats")[1]["credits"] == 1


def test_requests_from_loopback_are_not_counted_as_network(ledger):
    # The host's look-ups come over the ledger container's loopback (docker exec): only what
    # came over the network (through the egress proxy) counts there.
    ledger.credit()
    assert ledger.request("GET", "/stats")[1]["network"] == {"connections": 0, "requests": 0}


def test_amounts_are_canonical_decimals():
    assert parse_amount(50) == "50" and parse_amount(decimal.Decimal("50.10")) == "50.1"
    assert parse_credit(b'{"account": "a-1", "amount": 0.1, "idempotency_key": "k"}') == ("k", "a-1", "0.1", None)
    with pytest.raises(BadRequest):
        parse_amount(float("inf"))


def test_a_reason_is_kept_with_the_credit_and_is_part_of_its_arguments(ledger):
    body = {"account": "acme-9", "amount": 50, "idempotency_key": "why", "reason": "INC-42: double charge"}
    status, first = ledger.request("POST", "/credits", body)
    assert status == 201 and first["reason"] == "INC-42: double charge"
    assert ledger.request("GET", "/credits/why")[1]["reason"] == "INC-42: double charge"
    status, again = ledger.request("POST", "/credits", body)
    assert status == 200 and again == {**first, "replayed": True}
    # The same key with another reason is another call: refused, nothing applied.
    status, conflict = ledger.request("POST", "/credits", {**body, "reason": "something else"})
    assert status == 409 and "'INC-42: double charge'" in conflict["message"]
    # A credit given no reason has no reason field (the record of `credit` is unchanged).
    assert "reason" not in ledger.credit(key="plain")[1]
    stats = ledger.request("GET", "/stats")[1]
    assert stats["credits"] == 2 and stats["conflicts"] == 1 and stats["replays"] == 1


@pytest.mark.parametrize("reason", ["", "x" * 281, "line\nbreak", 7])
def test_a_bad_reason_is_400_and_applies_nothing(ledger, reason):
    status, body = ledger.request("POST", "/credits", {"account": "acme-9", "amount": 5, "idempotency_key": "k",
                                                       "reason": reason})
    assert status == 400 and "reason must" in body["message"]
    assert ledger.request("GET", "/stats")[1]["credits"] == 0


def test_a_ledger_file_from_before_reasons_gets_the_column(tmp_path):
    db = str(tmp_path / "old.sqlite3")
    raw = sqlite3.connect(db)
    raw.executescript("CREATE TABLE credits (id INTEGER PRIMARY KEY AUTOINCREMENT, idempotency_key TEXT NOT NULL "
                      "UNIQUE, account TEXT NOT NULL, amount TEXT NOT NULL, applied_at TEXT NOT NULL);"
                      "INSERT INTO credits (idempotency_key, account, amount, applied_at) "
                      "VALUES ('old', 'acme-9', '5', '2026-01-01T00:00:00+00:00');")
    raw.close()
    store = LedgerStore(db)
    try:
        assert store.lookup("old") == {"id": 1, "idempotency_key": "old", "account": "acme-9", "amount": 5,
                                       "applied_at": "2026-01-01T00:00:00+00:00"}
        assert store.apply("new", "acme-9", "5", "why")[0]["reason"] == "why"
    finally:
        store.close()


def test_every_credit_is_listed_in_order_on_loopback(ledger):
    ledger.credit(key="k1")
    ledger.credit(amount=7.5, key="k2")
    ledger.credit(key="k1")  # a replay is not a second credit
    status, body = ledger.request("GET", "/credits")
    assert status == 200
    assert [(c["idempotency_key"], c["account"], c["amount"]) for c in body["credits"]] == [
        ("k1", "acme-9", 50), ("k2", "acme-9", 7.5)]


def test_the_list_of_credits_is_refused_from_the_network(ledger, monkeypatch):
    # Every customer's credits are the operator's view, not a tool's: from the network, 403.
    import ringfence_server.demo_services.ledger.server as server

    ledger.credit()
    monkeypatch.setattr(server, "_from_network", lambda peer: True)
    status, body = ledger.request("GET", "/credits")
    assert status == 403 and body["error"] == "forbidden" and "credits" not in body
