"""The ledger: a receiver of credits that applies each idempotency key exactly once.

It exists so that "effects happen once" is counted where the effect lands, not in a tool's
reply. A real process with its own SQLite file (WAL, synchronous=FULL): a credit is committed
before its response is written, so an effect whose reply is lost is still on record, and the
same key again is answered from the record instead of being applied twice.

HTTP/1.1, JSON bodies:

    POST /credits  {"account", "amount", "idempotency_key", "reason"?}
        201 {record..., "replayed": false}   applied now
        200 {record..., "replayed": true}    this key was applied before, with these arguments
        409 {"error": "idempotency_key_reused", "record": ...}   the key was applied with another
                                             account, amount or reason: nothing is applied
        400 {"error": "bad_request", ...}    no key, malformed body, bad account or amount
    GET /credits/<idempotency_key>           200 record | 404: the look-up reconciliation uses
    GET /credits                             200 {"credits": [record, ...]} in the order applied;
                                             on the container's loopback only (403 from the network):
                                             the operator's view (the demo reads it), not a tool's
    GET /accounts/<account>                  200 {"account", "balance", "credits"}
    GET /stats                               200 {"credits", "replays", "conflicts", "rejected",
                                             "dropped_replies", "network": {"connections", "requests"}}
    GET /healthz                             200 {"ok": true} once the database answers

A record: {"id", "idempotency_key", "account", "amount", "applied_at"}, plus "reason" when the
credit was given one (1-280 characters, no control characters: why it was issued, kept with
it). Amounts are decimal numbers with at most two fractional digits (money): 50 and 50.0 are
the same amount.

`network` in /stats counts only connections and requests that came over the network (through
the egress proxy); the host's own look-ups arrive on the container's loopback (`docker exec`,
sandbox.ledger.container) and are not counted there, so a test can assert that nothing reached
the ledger.

Fault injection, for tests only and never on by default: `--fail-after-commit N` makes the Nth
applied credit commit and then drop its connection (a TCP reset) without a response: the
effect happened and its reply was lost.

Stdlib only; laid into the ledger image as /opt/ringfence/ledger.py (images/ledger/image.json
`files`), so the host's unit tests run this very file. Run as
`python3 -I -S -B ledger.py --db FILE [--port 80] [--fail-after-commit N]`.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import ipaddress
import json
import re
import signal
import socket
import sqlite3
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn, TextIO

MAX_BODY = 64 * 1024
MAX_AMOUNT = decimal.Decimal(1_000_000_000)
ACCOUNT = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
# Keys travel in a URL path (GET /credits/<key>): no characters that would need quoting.
KEY = re.compile(r"[A-Za-z0-9._:-]{1,200}")
MAX_REASON = 280

SCHEMA = """
CREATE TABLE IF NOT EXISTS credits (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    account TEXT NOT NULL,
    amount TEXT NOT NULL,
    applied_at TEXT NOT NULL,
    reason TEXT
);
CREATE TABLE IF NOT EXISTS accounts (
    account TEXT PRIMARY KEY,
    balance TEXT NOT NULL,
    credits INTEGER NOT NULL
);
"""


class BadRequest(ValueError):
    pass


class Conflict(Exception):
    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__("idempotency key reused with other arguments")
        self.record = record


def _number(text: str) -> int | float:
    """A stored decimal as a JSON number (integral amounts stay integers)."""
    d = decimal.Decimal(text)
    return int(d) if d == d.to_integral_value() else float(d)


def parse_amount(value: Any) -> str:
    """The canonical decimal text of a credit amount, or BadRequest."""
    if isinstance(value, bool) or not isinstance(value, (int, decimal.Decimal)):
        raise BadRequest("amount must be a number")
    d = decimal.Decimal(value)
    if not d.is_finite() or not 0 < d <= MAX_AMOUNT:
        raise BadRequest(f"amount must be in (0, {MAX_AMOUNT}]")
    exponent = d.as_tuple().exponent  # an int: d is finite (the letters are for NaN and infinity)
    if isinstance(exponent, int) and exponent < -2 and d != d.quantize(decimal.Decimal("0.01")):
        raise BadRequest("amount has more than two fractional digits")
    return format(d.quantize(decimal.Decimal("0.01")).normalize(), "f")


def parse_reason(value: Any) -> str | None:
    """A credit's optional reason, or BadRequest."""
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_REASON:
        raise BadRequest(f"reason must be a string of 1-{MAX_REASON} characters")
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
        raise BadRequest("reason must not contain control characters")
    return value


def parse_credit(body: bytes) -> tuple[str, str, str, str | None]:
    """(idempotency_key, account, canonical amount, reason or None) of a POST /credits body, or
    BadRequest."""
    def refuse_constant(name: str) -> NoReturn:
        raise BadRequest(f"{name} is not a number")

    try:
        doc = json.loads(body, parse_float=decimal.Decimal, parse_constant=refuse_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError too
        if isinstance(e, BadRequest):
            raise
        raise BadRequest(f"the body is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = set(doc) - {"account", "amount", "idempotency_key", "reason"}
    if unknown:
        raise BadRequest(f"unknown fields {sorted(unknown)}")
    key = doc.get("idempotency_key")
    if key is None or key == "":
        raise BadRequest("idempotency_key is required: a credit without one could be applied twice")
    if not isinstance(key, str) or not KEY.fullmatch(key):
        raise BadRequest("idempotency_key must be 1-200 characters of [A-Za-z0-9._:-]")
    account = doc.get("account")
    if not isinstance(account, str) or not ACCOUNT.fullmatch(account):
        raise BadRequest("account must be 1-64 characters of [a-z0-9-]")
    return key, account, parse_amount(doc.get("amount")), parse_reason(doc.get("reason"))


class LedgerStore:
    """The SQLite file: one connection, one writer at a time, every credit one transaction."""

    def __init__(self, path: str) -> None:
        # isolation_level=None: transactions are the explicit BEGIN IMMEDIATE ... COMMIT below.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk before the response that reports it is written.
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(credits)")}
            if "reason" not in columns:  # a file of a ledger from before reasons
                self._db.execute("ALTER TABLE credits ADD COLUMN reason TEXT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @staticmethod
    def _record(row: tuple[Any, ...]) -> dict[str, Any]:
        record: dict[str, Any] = {"id": row[0], "idempotency_key": row[1], "account": row[2], "amount": _number(row[3]),
                  "applied_at": row[4]}
        if row[5] is not None:
            record["reason"] = row[5]
        return record

    def _by_key(self, key: str) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._db.execute(
            "SELECT id, idempotency_key, account, amount, applied_at, reason FROM credits WHERE idempotency_key = ?",
            (key,)).fetchone()
        return row

    def apply(self, key: str, account: str, amount: str, reason: str | None = None) -> tuple[dict[str, Any], bool]:
        """(record, replayed). Applies the credit unless the key is on record; raises Conflict
        when it is on record with another account, amount or reason (nothing applied)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._by_key(key)
                if row is not None:
                    self._db.execute("ROLLBACK")
                    record = self._record(row)
                    if row[2] != account or row[3] != amount or row[5] != reason:
                        raise Conflict(record)
                    return record, True
                now = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
                self._db.execute("INSERT INTO credits (idempotency_key, account, amount, applied_at, reason) "
                                 "VALUES (?, ?, ?, ?, ?)", (key, account, amount, now, reason))
                acct = self._db.execute("SELECT balance, credits FROM accounts WHERE account = ?",
                                        (account,)).fetchone()
                balance = decimal.Decimal(acct[0] if acct else "0") + decimal.Decimal(amount)
                self._db.execute(
                    "INSERT INTO accounts (account, balance, credits) VALUES (?, ?, 1) "
                    "ON CONFLICT(account) DO UPDATE SET balance = excluded.balance, credits = credits + 1",
                    (account, format(balance, "f")))
                self._db.execute("COMMIT")
            except Conflict:
                raise
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            row = self._by_key(key)
            assert row is not None  # inserted and committed just above, under the lock
            return self._record(row), False

    def lookup(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._by_key(key)
        return self._record(row) if row is not None else None

    def account(self, account: str) -> dict[str, Any]:
        with self._lock:
            row = self._db.execute("SELECT balance, credits FROM accounts WHERE account = ?", (account,)).fetchone()
        balance, credits = row if row is not None else ("0", 0)
        return {"account": account, "balance": _number(balance), "credits": credits}

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT id, idempotency_key, account, amount, applied_at, reason "
                                    "FROM credits ORDER BY id").fetchall()
        return [self._record(row) for row in rows]

    def count(self) -> int:
        with self._lock:
            count: int = self._db.execute("SELECT count(*) FROM credits").fetchone()[0]
            return count


class Counters:
    """What the process saw; the credits themselves are counted from the file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values = {"replays": 0, "conflicts": 0, "rejected": 0, "dropped_replies": 0,
                       "network_connections": 0, "network_requests": 0, "commits": 0}

    def add(self, name: str, n: int = 1) -> int:
        with self._lock:
            self.values[name] += n
            return self.values[name]


class LedgerServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], store: LedgerStore, *, fail_after_commit: int | None = None,
                 log: TextIO | None = None) -> None:
        self.store = store
        self.counters = Counters()
        self.fail_after_commit = fail_after_commit
        self.log = log if log is not None else sys.stdout
        self._log_lock = threading.Lock()
        super().__init__(address, LedgerHandler)

    def emit(self, event: dict[str, Any]) -> None:
        with self._log_lock:
            try:
                self.log.write(json.dumps(event, sort_keys=True) + "\n")
                self.log.flush()
            except (OSError, ValueError):
                pass  # a closed stdout must not take the ledger down

    def stats(self) -> dict[str, Any]:
        v = dict(self.counters.values)
        return {"credits": self.store.count(), "replays": v["replays"], "conflicts": v["conflicts"],
                "rejected": v["rejected"], "dropped_replies": v["dropped_replies"],
                "network": {"connections": v["network_connections"], "requests": v["network_requests"]}}


def _reason_text(reason: str | None) -> str:
    return f" for {reason!r}" if reason is not None else ""


def _from_network(peer: str) -> bool:
    try:
        return not ipaddress.ip_address(peer).is_loopback
    except ValueError:
        return True


class LedgerHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ringfence-ledger"
    sys_version = ""
    # A client that stalls mid-request must not hold a thread for ever.
    timeout = 15
    server: LedgerServer

    def setup(self) -> None:
        super().setup()
        self.from_network = _from_network(self.client_address[0])
        if self.from_network:
            self.server.counters.add("network_connections")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one JSON line per request instead (see _reply)

    # -- routing -------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._count()
        path = self.path.split("?", 1)[0]
        store = self.server.store
        if path == "/healthz":
            store.count()  # the database answers
            return self._reply(200, {"ok": True})
        if path == "/stats":
            return self._reply(200, self.server.stats())
        if path == "/credits":
            # Every customer's credits: for the operator on loopback, never for a tool.
            if self.from_network:
                return self._reply(403, {"error": "forbidden", "message": "/credits answers on loopback only"})
            return self._reply(200, {"credits": store.all()})
        if path.startswith("/credits/"):
            key = path[len("/credits/"):]
            if not KEY.fullmatch(key):
                return self._reply(400, {"error": "bad_request", "message": "not an idempotency key"})
            record = store.lookup(key)
            if record is None:
                return self._reply(404, {"error": "not_found", "idempotency_key": key}, key=key)
            return self._reply(200, record, key=key)
        if path.startswith("/accounts/"):
            account = path[len("/accounts/"):]
            if not ACCOUNT.fullmatch(account):
                return self._reply(400, {"error": "bad_request", "message": "not an account"})
            return self._reply(200, store.account(account))
        return self._reply(404, {"error": "not_found"})

    def do_POST(self) -> None:  # noqa: N802 - http.server dispatches on this name
        self._count()
        if self.path.split("?", 1)[0] != "/credits":
            return self._reply(404, {"error": "not_found"})
        try:
            body = self._body()
            key, account, amount, reason = parse_credit(body)
        except BadRequest as e:
            self.server.counters.add("rejected")
            return self._reply(400, {"error": "bad_request", "message": str(e)})
        try:
            record, replayed = self.server.store.apply(key, account, amount, reason)
        except Conflict as c:
            self.server.counters.add("conflicts")
            return self._reply(409, {"error": "idempotency_key_reused",
                                     "message": f"idempotency key {key} was applied as a credit of "
                                                f"{c.record['amount']} to {c.record['account']}"
                                                f"{_reason_text(c.record.get('reason'))}; this request "
                                                f"({_number(amount)} to {account}{_reason_text(reason)}) "
                                                f"is refused and nothing is applied",
                                     "record": c.record}, key=key)
        if replayed:
            self.server.counters.add("replays")
            return self._reply(200, {**record, "replayed": True}, key=key)
        commits = self.server.counters.add("commits")
        if self.server.fail_after_commit is not None and commits == self.server.fail_after_commit:
            return self._drop(key)
        return self._reply(201, {**record, "replayed": False}, key=key)

    def do_PUT(self) -> None:  # noqa: N802 - http.server dispatches on this name
        self._count()
        self._reply(405, {"error": "method_not_allowed"})

    do_DELETE = do_PATCH = do_PUT  # noqa: N815 - http.server dispatches on these names

    # -- plumbing ------------------------------------------------------------------------

    def _count(self) -> None:
        if self.from_network:
            self.server.counters.add("network_requests")

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise BadRequest("chunked bodies are not accepted; send Content-Length")
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise BadRequest("Content-Length is required")
        if int(length) > MAX_BODY:
            raise BadRequest(f"the body is over {MAX_BODY} bytes")
        return self.rfile.read(int(length))

    def _reply(self, status: int, doc: dict[str, Any], key: str | None = None) -> None:
        body = json.dumps(doc, sort_keys=True).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self.server.emit({"event": "request", "method": self.command, "path": self.path.split("?", 1)[0],
                          "status": status, "key": key, "network": self.from_network})

    def _drop(self, key: str) -> None:
        """Committed, and now the reply is lost: reset the connection without a byte."""
        self.server.counters.add("dropped_replies")
        self.server.emit({"event": "dropped_reply", "key": key, "network": self.from_network})
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        # The base class flushes and closes wfile/rfile in finish(); the reset comes from close().
        self.connection.close()

    def finish(self) -> None:
        try:
            super().finish()
        except (OSError, ValueError):
            pass  # a dropped connection has nothing left to flush


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ledger")
    parser.add_argument("--db", required=True, help="the SQLite file")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=80)
    parser.add_argument("--fail-after-commit", type=int, default=None, metavar="N",
                        help="TESTS ONLY: the Nth applied credit commits, then its connection is reset unanswered")
    args = parser.parse_args(argv)
    if args.fail_after_commit is not None and args.fail_after_commit < 1:
        parser.error("--fail-after-commit must be at least 1")
    store = LedgerStore(args.db)
    server = LedgerServer((args.host, args.port), store, fail_after_commit=args.fail_after_commit)

    def stop(*_: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.emit({"event": "ready", "port": server.server_address[1], "db": args.db,
                 "fail_after_commit": args.fail_after_commit})
    try:
        server.serve_forever()
    finally:
        server.server_close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
