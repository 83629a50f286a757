"""Group commit, as the database records it: the events a batch settles together are one
transaction. On PostgreSQL every row carries the id of the transaction that inserted it (xmin),
so the grouping of a run's log into durable writes can be read back exactly.

A one-call batch is three writes, not six: the batch with its verdicts, the dispatch intent
(durable before the tool may run), the last attempt with the completion and the observation.
An attempt that is retried is written before the next attempt starts (a crash during the
backoff keeps it). Reads that run in parallel have their observations written after all of them,
in batch order (their own write)."""

from __future__ import annotations

import sys
from itertools import groupby
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

import psycopg
from control_support import Harness, error_result

DURABLE_WRITES_OF_A_ONE_CALL_BATCH = [
    ["batch_started", "call_decided"],
    ["dispatch_started"],
    ["attempt", "call_completed", "observation"],
]


def writes(pg_url: str, run_id: str) -> list[list[str]]:
    """The run's events after run_started, grouped by the transaction that wrote them."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute("SELECT type, xmin::text FROM events WHERE run_id = %s AND seq > 1 ORDER BY seq",
                            (run_id,)).fetchall()
    return [[t for t, _ in group] for _, group in groupby(rows, key=lambda r: r[1])]


def test_a_one_call_batch_is_three_durable_writes(tmp_path, pg_url):
    h = Harness(tmp_path, store_url=pg_url, rules=[{"tool": "echo", "verdict": "allow"}])
    try:
        run = h.run(run_id="grouped")
        [obs] = h.submit(run, ("echo", {"text": "hi"}))
        assert obs.status.value == "executed"
        assert writes(pg_url, run) == DURABLE_WRITES_OF_A_ONE_CALL_BATCH
        # The batch's verdicts are one write however many calls it holds; two reads in parallel
        # complete in any order, and their observations follow in batch order.
        h.submit(run, ("nope", {}), ("echo", {"text": "a"}), ("echo", {"text": "b"}))
        second = writes(pg_url, run)[3:]
        assert second[0] == ["batch_started", "call_decided", "call_decided", "call_decided"]
        assert second[1] == ["observation"]  # the unknown tool's, at admission
        assert sorted(map(tuple, second[2:6])) == [("attempt", "call_completed")] * 2 + [("dispatch_started",)] * 2
        assert second[6:] == [["observation"], ["observation"]]
        observed = [e.data["call_id"] for e in h.events(run) if e.type == "observation"]
        assert observed[-3:] == ["c2", "c3", "c4"]
    finally:
        h.orch.close()
        h.store.close()


def test_a_retried_attempt_is_written_before_the_next_one_starts(tmp_path, pg_url):
    h = Harness(tmp_path, store_url=pg_url, rules=[{"tool": "fail", "verdict": "allow"}])
    flaky = iter(["transient", None])
    h.emulator.overrides["fail"] = lambda call: error_result(cls) if (cls := next(flaky)) else {"ok": 1}
    try:
        run = h.run(run_id="retried")
        [obs] = h.submit(run, ("fail", {"class": "transient"}))
        assert obs.status.value == "executed"
        assert writes(pg_url, run) == [
            ["batch_started", "call_decided"],
            ["dispatch_started"],
            ["attempt"],  # the first attempt, alone, before the second began
            ["attempt", "call_completed", "observation"],
        ]
        attempts = [e.data["attempt"] for e in h.events(run) if e.type == "attempt"]
        completed = [e.data for e in h.events(run) if e.type == "call_completed"]
        assert attempts == [1, 2] and completed[0]["attempts"] == 2
    finally:
        h.orch.close()
        h.store.close()
