"""The worker's durable results store (ringfence_server.worker.results) on real SQLite files: every
state change and every refused one, N threads claiming one call (exactly one wins), a restart
(claims, start marks, results and releases still there), and a child process killed with SIGKILL
right after a change returned (the change is there when the file is opened again). And admission
over it: a call runs once across a restart, and a call that never started runs on the retry.
Restart recovery (claimed → released, started → uncertain, idempotent, after a real kill -9, and a
red check without the uncertain step) and pruning (what goes, what stays, the minimum horizon), on
an injected clock."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from worker_support import CONTROL_KEY, DIGEST, NOW, TRUSTED, WORKER, envelope

from ringfence_server.worker import results as results_module
from ringfence_server.worker.admission import (
    Decision,
    InProgress,
    RecordedResult,
    Refuse,
    ReturnRecorded,
    Run,
    UncertainResult,
    WorkRefusal,
    admit,
)
from ringfence_server.worker.envelope import Envelope, EnvelopeRefused, LogicalKey, seal
from ringfence_server.worker.errors import (
    CallConflict,
    InvalidTransition,
    NotClaimant,
    PruneHorizonTooShort,
    ResultsError,
    WorkerError,
)
from ringfence_server.worker.keys import KeyFileError
from ringfence_server.worker.results import (
    RECOVERY_RELEASE_REASON,
    SCHEMA_VERSION,
    CallState,
    Recovery,
    SqliteResults,
)

ENV = envelope()
KEY = ENV.logical_key
DIG = ENV.call_digest
OTHER_DIG = envelope(arguments={"amount": 1_000_000}).call_digest
A, B = "env-a", "env-b"
REASON = "engine refused the container: runtime runsc not registered"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "results.sqlite3"


@pytest.fixture
def store(path: Path):
    with SqliteResults(path) as s:
        yield s


def started(store: SqliteResults, key: LogicalKey = KEY, env: str = A) -> None:
    assert store.claim(key, env, DIG)
    store.mark_started(key, env)


# -- the transitions ---------------------------------------------------------------------------


def test_claimed_then_started_then_recorded(store):
    assert store.entry(KEY) is None and store.get(KEY) is None
    assert store.claim(KEY, A, DIG) is True
    assert store.entry(KEY).state is CallState.CLAIMED and store.get(KEY) is None
    store.mark_started(KEY, A)
    assert store.entry(KEY).state is CallState.STARTED and store.get(KEY) is None
    recorded = store.record(KEY, A, b'{"ok":true}')
    assert recorded == RecordedResult(A, DIG, b'{"ok":true}') == store.get(KEY)
    entry = store.entry(KEY)
    assert entry.state is CallState.RECORDED and entry.envelope_id == A and entry.release_reason is None


def test_a_held_call_is_claimed_by_nobody_else_in_any_state(store):
    assert store.claim(KEY, A, DIG)
    assert store.claim(KEY, B, DIG) is False
    assert store.claim(KEY, A, DIG) is False  # a redelivery of the running envelope: in progress
    store.mark_started(KEY, A)
    assert store.claim(KEY, B, DIG) is False
    assert store.entry(KEY).envelope_id == A


def test_a_claim_after_the_record_returns_the_record(store):
    started(store)
    store.record(KEY, A, b"out")
    assert store.claim(KEY, B, DIG) is False
    assert store.get(KEY) == RecordedResult(A, DIG, b"out")
    # Through admission: the later delivery is answered with it, and nothing runs.
    d = admit(seal(envelope(), CONTROL_KEY), worker_id=WORKER, trusted_keys=TRUSTED, images=Images(),
              capabilities=Caps(), results=store, now=NOW)
    assert isinstance(d, ReturnRecorded) and d.recorded == RecordedResult(A, DIG, b"out")


def test_claimed_then_released_then_claimed_by_a_later_delivery(store):
    assert store.claim(KEY, A, DIG)
    store.release(KEY, A, REASON)
    entry = store.entry(KEY)
    assert entry.state is CallState.RELEASED and entry.release_reason == REASON and entry.envelope_id == A
    assert store.get(KEY) is None
    assert store.claim(KEY, B, DIG) is True  # the control plane's retry runs it
    entry = store.entry(KEY)
    assert entry.state is CallState.CLAIMED and entry.envelope_id == B and entry.release_reason is None
    store.mark_started(KEY, B)
    assert store.record(KEY, B, b"out").envelope_id == B


def test_the_releaser_may_claim_again_but_not_act_on_its_released_claim(store):
    assert store.claim(KEY, A, DIG)
    store.release(KEY, A, REASON)
    for act in (lambda: store.mark_started(KEY, A), lambda: store.record(KEY, A, b"x")):
        with pytest.raises(NotClaimant) as e:
            act()
        assert e.value.holder is None
    assert store.claim(KEY, A, DIG) is True  # the same envelope redelivered: nothing ran, so it may


# -- the refused transitions: a clear error, nothing written ------------------------------------


def test_a_call_that_started_is_never_released(store):
    started(store)
    with pytest.raises(InvalidTransition, match="never released") as e:
        store.release(KEY, A, REASON)
    assert (e.value.state, e.value.action) == ("started", "release")
    assert store.entry(KEY).state is CallState.STARTED
    assert store.claim(KEY, B, DIG) is False  # so no later delivery runs it again
    store.record(KEY, A, b"out")
    with pytest.raises(InvalidTransition) as e:
        store.release(KEY, A, REASON)
    assert e.value.state == "recorded"
    assert store.get(KEY) == RecordedResult(A, DIG, b"out")


def test_a_result_is_recorded_only_by_the_claimant(store):
    with pytest.raises(NotClaimant) as e:
        store.record(KEY, A, b"x")  # nobody claimed it
    assert e.value.holder is None
    started(store)
    with pytest.raises(NotClaimant) as e:
        store.record(KEY, B, b"forged")
    assert e.value.holder == A and e.value.envelope_id == B
    store.record(KEY, A, b"out")
    with pytest.raises(NotClaimant):
        store.record(KEY, B, b"out")  # not even the same bytes: B never held the call
    assert store.get(KEY) == RecordedResult(A, DIG, b"out")


def test_only_the_claimant_starts_or_releases(store):
    assert store.claim(KEY, A, DIG)
    with pytest.raises(NotClaimant):
        store.mark_started(KEY, B)
    with pytest.raises(NotClaimant):
        store.release(KEY, B, REASON)
    with pytest.raises(NotClaimant):
        store.mark_started(LogicalKey("acme", "run-1", "never-claimed", 1), A)
    assert store.entry(KEY).state is CallState.CLAIMED
    # A released claim taken by B: A's release of it again is refused, not "idempotent".
    store.release(KEY, A, REASON)
    assert store.claim(KEY, B, DIG)
    with pytest.raises(NotClaimant):
        store.release(KEY, A, REASON)
    assert store.entry(KEY).envelope_id == B


def test_a_result_before_the_start_mark_is_refused(store):
    assert store.claim(KEY, A, DIG)
    with pytest.raises(InvalidTransition, match="never marked started") as e:
        store.record(KEY, A, b"out")
    assert (e.value.state, e.value.action) == ("claimed", "record")
    assert store.entry(KEY).state is CallState.CLAIMED


def test_a_start_after_the_record_is_refused(store):
    started(store)
    store.record(KEY, A, b"out")
    with pytest.raises(InvalidTransition) as e:
        store.mark_started(KEY, A)
    assert (e.value.state, e.value.action) == ("recorded", "mark_started")


def test_a_recorded_result_never_changes_and_the_same_one_again_is_a_no_op(store):
    started(store)
    store.record(KEY, A, b"out")
    assert store.record(KEY, A, b"out") == RecordedResult(A, DIG, b"out")  # a retry after a lost commit
    with pytest.raises(InvalidTransition, match="never changes"):
        store.record(KEY, A, b"other")
    assert store.get(KEY).result == b"out"


def test_the_same_fact_again_is_idempotent(store):
    assert store.claim(KEY, A, DIG)
    store.mark_started(KEY, A)
    store.mark_started(KEY, A)
    assert store.entry(KEY).state is CallState.STARTED
    other = LogicalKey("acme", "run-1", "call-2", 1)
    assert store.claim(other, A, DIG)
    store.release(other, A, REASON)
    store.release(other, A, "said again")
    assert store.entry(other).release_reason == REASON  # the first reason stands


def test_a_started_call_the_sandbox_never_started_is_released_for_the_retry(store):
    # The sandbox answered START_FAILED (or raised before any container existed): nothing ran,
    # so the start mark is taken back and the next delivery runs the call.
    started(store)
    store.release_not_started(KEY, A, REASON)
    entry = store.entry(KEY)
    assert (entry.state, entry.release_reason, entry.envelope_id) == (CallState.RELEASED, REASON, A)
    store.release_not_started(KEY, A, "said again")  # the same fact again: a no-op
    assert store.entry(KEY).release_reason == REASON
    assert store.claim(KEY, B, DIG) is True
    with pytest.raises(NotClaimant):
        store.release_not_started(KEY, A, REASON)  # A's claim is gone: B holds the call now


def test_release_not_started_is_refused_before_the_start_mark_after_the_record_and_to_others(store):
    assert store.claim(KEY, A, DIG)
    with pytest.raises(InvalidTransition, match="never marked started") as e:
        store.release_not_started(KEY, A, REASON)  # a claimed call is released with `release`
    assert (e.value.state, e.value.action) == ("claimed", "release_not_started")
    store.mark_started(KEY, A)
    with pytest.raises(NotClaimant):
        store.release_not_started(KEY, B, REASON)
    with pytest.raises(ValueError):
        store.release_not_started(KEY, A, "")
    store.record(KEY, A, b"out")
    with pytest.raises(InvalidTransition, match="recorded") as e:
        store.release_not_started(KEY, A, REASON)
    assert e.value.state == "recorded"
    assert store.get(KEY) == RecordedResult(A, DIG, b"out")


def test_release_not_started_of_an_uncertain_call_is_refused(store):
    started(store)
    store.recover()
    with pytest.raises(InvalidTransition, match="uncertain"):
        store.release_not_started(KEY, A, REASON)
    assert store.entry(KEY).state is CallState.UNCERTAIN


def test_each_attempt_of_a_call_is_its_own_row(store):
    # A retry (attempt 2) is claimed, run and recorded on its own; attempt 1's record stands.
    retry = envelope(attempt=2)
    started(store)
    store.record(KEY, A, b"attempt 1 failed")
    assert store.claim(retry.logical_key, B, retry.call_digest) is True
    store.mark_started(retry.logical_key, B)
    store.record(retry.logical_key, B, b"attempt 2 ran")
    assert store.get(KEY).result == b"attempt 1 failed"
    assert store.get(retry.logical_key).result == b"attempt 2 ran"
    assert store.recover() == Recovery(released=(), uncertain=())
    # Recovery names the attempt it changed.
    third = envelope(attempt=3)
    assert store.claim(third.logical_key, A, third.call_digest)
    store.mark_started(third.logical_key, A)
    assert store.recover().uncertain == (LogicalKey("acme", "run-1", "call-1", 3),)


@pytest.mark.parametrize("state", ["claimed", "started", "recorded", "released"])
def test_the_same_ids_with_other_content_are_a_conflict_in_every_state(store, state):
    assert store.claim(KEY, A, DIG)
    if state in ("started", "recorded"):
        store.mark_started(KEY, A)
    if state == "recorded":
        store.record(KEY, A, b"out")
    if state == "released":
        store.release(KEY, A, REASON)
    before = store.entry(KEY)
    with pytest.raises(CallConflict) as e:
        store.claim(KEY, B, OTHER_DIG)
    assert (e.value.held_digest, e.value.offered_digest) == (DIG, OTHER_DIG)
    assert store.entry(KEY) == before


def test_through_admission_a_held_claim_of_other_content_is_a_conflict(store):
    assert admit(seal(envelope(arguments={"amount": 1}), CONTROL_KEY), **_worker(store)).__class__ is Run
    d = admit(seal(envelope(arguments={"amount": 2}), CONTROL_KEY), **_worker(store))
    assert isinstance(d, Refuse) and d.reason is WorkRefusal.CALL_CONFLICT


@pytest.mark.parametrize("call", [
    lambda s: s.claim(KEY, "", DIG), lambda s: s.claim(KEY, A, "sha256:" + DIG), lambda s: s.claim(KEY, A, DIG.upper()),
    lambda s: s.release(KEY, A, ""), lambda s: s.record(KEY, A, "text, not bytes"), lambda s: s.mark_started(KEY, ""),
])
def test_malformed_arguments_are_programming_errors(store, call):
    with pytest.raises(ValueError):
        call(store)
    assert store.entry(KEY) is None


def test_the_layer_has_one_exception_hierarchy():
    for error in (ResultsError, CallConflict, NotClaimant, InvalidTransition, PruneHorizonTooShort, EnvelopeRefused,
                  KeyFileError):
        assert issubclass(error, WorkerError)
    for error in (CallConflict, NotClaimant, InvalidTransition, PruneHorizonTooShort):
        assert issubclass(error, ResultsError)


# -- concurrency -------------------------------------------------------------------------------


def _race(claimants) -> list[tuple[str, bool]]:
    """Each (store, envelope id) claims KEY at once (a barrier releases them together)."""
    barrier = threading.Barrier(len(claimants))
    outcomes: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def go(s: SqliteResults, env: str) -> None:
        barrier.wait()
        won = s.claim(KEY, env, DIG)
        with lock:
            outcomes.append((env, won))

    threads = [threading.Thread(target=go, args=c) for c in claimants]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_of_n_threads_claiming_one_call_exactly_one_wins(store):
    outcomes = _race([(store, f"env-{i}") for i in range(16)])
    winners = [env for env, won in outcomes if won]
    assert len(outcomes) == 16 and len(winners) == 1
    assert store.entry(KEY).envelope_id == winners[0]


def test_exactly_one_wins_across_connections_to_one_file(path):
    # Two stores on one file (as two processes would be): SQLite's IMMEDIATE transactions, not
    # only the in-process lock, decide.
    with SqliteResults(path) as one, SqliteResults(path) as two:
        outcomes = _race([(one if i % 2 else two, f"env-{i}") for i in range(16)])
        winners = [env for env, won in outcomes if won]
        assert len(winners) == 1
        assert one.entry(KEY).envelope_id == two.entry(KEY).envelope_id == winners[0]


def test_concurrent_calls_of_many_keys_each_go_through_their_states(store):
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def go(i: int) -> None:
        key = LogicalKey("acme", "run-1", f"call-{i}", 1)
        try:
            barrier.wait()
            assert store.claim(key, f"env-{i}", DIG)
            store.mark_started(key, f"env-{i}")
            store.record(key, f"env-{i}", f"out-{i}".encode())
        except BaseException as e:  # noqa: BLE001 - reported by the main thread's assertion
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [store.get(LogicalKey("acme", "run-1", f"call-{i}", 1)).result for i in range(8)] == \
        [f"out-{i}".encode() for i in range(8)]


# -- durability --------------------------------------------------------------------------------


def test_the_file_is_durable_and_private(store, path):
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_claims_starts_results_and_releases_survive_a_restart(path):
    keys = {state: LogicalKey("acme", "run-1", state, 1) for state in ("claimed", "started", "recorded", "released")}
    with SqliteResults(path) as s:
        assert s.claim(keys["claimed"], A, DIG)
        started(s, keys["started"])
        started(s, keys["recorded"])
        s.record(keys["recorded"], A, b"\x00binary\xff")
        assert s.claim(keys["released"], A, DIG)
        s.release(keys["released"], A, REASON)
        before = {state: s.entry(key) for state, key in keys.items()}
    with SqliteResults(path) as s:
        assert {state: s.entry(key) for state, key in keys.items()} == before
        assert s.get(keys["recorded"]) == RecordedResult(A, DIG, b"\x00binary\xff")
        assert s.claim(keys["claimed"], B, DIG) is False
        assert s.claim(keys["released"], B, DIG) is True


@pytest.mark.parametrize("version", [SCHEMA_VERSION - 1, SCHEMA_VERSION + 1])
def test_a_file_of_another_schema_version_is_refused(path, version):
    # Version 2, before the attempt column, included: refused, not read as if every row were
    # attempt 1 (no worker ran it, so there is nothing to migrate).
    assert SCHEMA_VERSION == 3
    SqliteResults(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {version}")
    db.close()
    with pytest.raises(ResultsError, match="schema version"):
        SqliteResults(path)


# The child: opens the store, makes the changes `action` names, says so on stdout, and then blocks
# on stdin (which the test never closes) until it is killed: nothing runs after the change returned.
_CHILD = """
import sys
from ringfence_server.worker.envelope import LogicalKey
from ringfence_server.worker.results import SqliteResults

path, action, tenant, run_id, call_id, attempt, digest = sys.argv[1:]
key = LogicalKey(tenant, run_id, call_id, int(attempt))
store = SqliteResults(path)
assert store.claim(key, "env-child", digest)
if action in ("start", "record"):
    store.mark_started(key, "env-child")
if action == "record":
    store.record(key, "env-child", b"the child's result")
if action == "release":
    store.release(key, "env-child", "engine refused")
print("returned", flush=True)
sys.stdin.read()
"""


def _killed_after(path: Path, action: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), action, KEY.tenant, KEY.run_id, KEY.call_id,
                              str(KEY.attempt), DIG], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "returned\n"  # the change returned: now, kill -9
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
    # Killed with its connection open: no checkpoint ran, the change is in the write-ahead log.
    assert Path(f"{path}-wal").stat().st_size > 0


def test_a_claim_survives_kill_9_right_after_it_returned(path):
    _killed_after(path, "claim")
    with SqliteResults(path) as s:
        entry = s.entry(KEY)
        assert entry.state is CallState.CLAIMED and entry.envelope_id == "env-child"
        assert s.claim(KEY, B, DIG) is False  # still held: no second delivery runs it
        # It never started: the restarted worker may release it, and the retry then runs it.
        s.release(KEY, "env-child", "worker restarted before the container was started")
        assert s.claim(KEY, B, DIG) is True


def test_a_start_mark_survives_kill_9_and_the_call_is_never_released(path):
    _killed_after(path, "start")
    with SqliteResults(path) as s:
        assert s.entry(KEY).state is CallState.STARTED
        with pytest.raises(InvalidTransition):
            s.release(KEY, "env-child", "worker restarted")
        d = admit(seal(envelope(), CONTROL_KEY), **_worker(s))
        assert isinstance(d, InProgress)  # until recovery makes it uncertain: never run a second time


def test_a_result_survives_kill_9_right_after_it_returned(path):
    _killed_after(path, "record")
    with SqliteResults(path) as s:
        assert s.get(KEY) == RecordedResult("env-child", DIG, b"the child's result")
        assert s.claim(KEY, B, DIG) is False


def test_a_release_survives_kill_9_right_after_it_returned(path):
    _killed_after(path, "release")
    with SqliteResults(path) as s:
        assert s.entry(KEY).state is CallState.RELEASED
        assert s.claim(KEY, B, DIG) is True


# -- admission over the durable store ------------------------------------------------------------


class Images:
    def has(self, digest: str) -> bool:
        return digest == DIGEST


class Caps:
    def has_runtime(self, runtime: str) -> bool:
        return True

    def has_egress(self) -> bool:
        return True

    def has_workspace(self) -> bool:
        return True

    def has_inputs(self) -> bool:
        return True


def _worker(results: SqliteResults) -> dict:
    return {"worker_id": WORKER, "trusted_keys": TRUSTED, "images": Images(), "capabilities": Caps(),
            "results": results, "now": NOW}


def test_a_call_runs_once_across_a_worker_restart(path):
    sealed = seal(envelope(), CONTROL_KEY)
    with SqliteResults(path) as s:
        d = admit(sealed, **_worker(s))
        assert isinstance(d, Run)
        s.mark_started(d.envelope.logical_key, d.envelope.envelope_id)
        s.record(d.envelope.logical_key, d.envelope.envelope_id, b"ran once")
    with SqliteResults(path) as s:
        again = admit(seal(envelope(deadline=NOW + 300), CONTROL_KEY), **_worker(s))  # a re-issue
        assert isinstance(again, ReturnRecorded) and again.recorded.result == b"ran once"


def test_a_call_the_engine_refused_to_start_runs_on_the_retry(store):
    first = admit(seal(envelope(), CONTROL_KEY), **_worker(store))
    assert isinstance(first, Run)
    # The engine refused the container: nothing ran, so the claim is given back.
    store.release(first.envelope.logical_key, first.envelope.envelope_id, REASON)
    retry = admit(seal(envelope(deadline=NOW + 120), CONTROL_KEY), **_worker(store))
    assert isinstance(retry, Run) and retry.envelope.envelope_id != first.envelope.envelope_id
    assert store.entry(KEY).envelope_id == retry.envelope.envelope_id


# -- restart recovery ------------------------------------------------------------------------------


class Clock:
    """The store's clock, moved by the test: no sleeps."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountingRunner:
    """The witness: every call that reached the tool."""

    def __init__(self) -> None:
        self.runs: list[Envelope] = []

    def __call__(self, env: Envelope) -> bytes:
        self.runs.append(env)
        return b"ran " + env.envelope_id.encode()


def _deliver(store: SqliteResults, runner: CountingRunner, *, crash: bool = False, **changes: object) -> Decision:
    """The worker's loop for one delivery (a fresh envelope of the same logical call): admission,
    then on Run the start mark, the tool, and the record, unless the worker `crash`es while the
    tool runs (it ran; nothing recorded)."""
    d = admit(seal(envelope(**changes), CONTROL_KEY), **_worker(store))
    if isinstance(d, Run):
        store.mark_started(d.envelope.logical_key, d.envelope.envelope_id)
        out = runner(d.envelope)
        if not crash:
            store.record(d.envelope.logical_key, d.envelope.envelope_id, out)
    return d


def _keys(*names: str) -> dict[str, LogicalKey]:
    return {name: LogicalKey("acme", "run-1", name, 1) for name in names}


def _one_of_each(s: SqliteResults) -> dict[str, LogicalKey]:
    keys = _keys("claimed", "started", "recorded", "released")
    assert s.claim(keys["claimed"], A, DIG)
    started(s, keys["started"])
    started(s, keys["recorded"])
    s.record(keys["recorded"], A, b"out")
    assert s.claim(keys["released"], A, DIG)
    s.release(keys["released"], A, REASON)
    return keys


def test_recovery_releases_a_claimed_call_and_makes_a_started_one_uncertain(path):
    clock = Clock()
    with SqliteResults(path, clock=clock) as s:
        keys = _one_of_each(s)
        before = {name: s.entry(key) for name, key in keys.items()}
    clock.now += 10
    with SqliteResults(path, clock=clock) as s:  # the worker's restart
        summary = s.recover()
        assert summary == Recovery(released=(keys["claimed"],), uncertain=(keys["started"],))
        assert (summary.released_count, summary.uncertain_count) == (1, 1)
        released = s.entry(keys["claimed"])
        assert released.state is CallState.RELEASED and released.release_reason == RECOVERY_RELEASE_REASON
        assert released.changed_at == clock.now
        uncertain = s.entry(keys["started"])
        assert uncertain.state is CallState.UNCERTAIN and uncertain.result is None and uncertain.envelope_id == A
        assert s.get(keys["started"]) == UncertainResult(A, DIG)
        # Finished calls are untouched, their stamps included.
        assert s.entry(keys["recorded"]) == before["recorded"] and s.entry(keys["released"]) == before["released"]
        # The claimed one never started: the retry claims it and runs it.
        assert s.claim(keys["claimed"], B, DIG) is True
        # The uncertain one is held for good: never claimed again.
        assert s.claim(keys["started"], B, DIG) is False


def test_recovery_twice_changes_nothing_the_second_time(path):
    clock = Clock()
    with SqliteResults(path, clock=clock) as s:
        keys = _one_of_each(s)
        s.recover()
        after = {name: s.entry(key) for name, key in keys.items()}
        clock.now += 10
        assert s.recover() == Recovery(released=(), uncertain=())
        assert {name: s.entry(key) for name, key in keys.items()} == after


def test_an_uncertain_call_is_final(store):
    started(store)
    store.recover()
    for action, act in (("mark_started", lambda: store.mark_started(KEY, A)),
                        ("record", lambda: store.record(KEY, A, b"late result")),
                        ("release", lambda: store.release(KEY, A, REASON))):
        with pytest.raises(InvalidTransition, match="uncertain") as e:
            act()
        assert (e.value.state, e.value.action) == ("uncertain", action)
    with pytest.raises(CallConflict):
        store.claim(KEY, B, OTHER_DIG)
    assert store.entry(KEY).state is CallState.UNCERTAIN


def test_a_redelivery_after_a_crash_while_the_tool_ran_gets_the_uncertain_record(path):
    runner = CountingRunner()
    with SqliteResults(path) as s:
        first = _deliver(s, runner, crash=True)  # the worker dies while the tool runs
    assert isinstance(first, Run) and len(runner.runs) == 1
    with SqliteResults(path) as s:
        assert s.recover().uncertain == (KEY,)
        again = _deliver(s, runner, deadline=NOW + 300)  # the control plane's re-issue
        assert isinstance(again, ReturnRecorded)
        assert again.recorded == UncertainResult(first.envelope.envelope_id, DIG)
    assert len(runner.runs) == 1  # never run a second time


def test_red_check_without_the_uncertain_step_a_redelivery_after_a_crash_runs_again(path, monkeypatch):
    monkeypatch.setattr(results_module, "_make_uncertain", lambda db, now: ())
    runner = CountingRunner()
    with SqliteResults(path) as s:
        _deliver(s, runner, crash=True)
    with SqliteResults(path) as s:
        s.recover()  # now releases the started call as if nothing ran
        again = _deliver(s, runner, deadline=NOW + 300)
    assert isinstance(again, Run) and len(runner.runs) == 2  # the tool ran twice: the test above turns red


def test_recovery_after_kill_9_of_a_child_that_claimed_and_started(path):
    _killed_after(path, "start")
    runner = CountingRunner()
    with SqliteResults(path) as s:
        assert s.recover() == Recovery(released=(), uncertain=(KEY,))
        d = _deliver(s, runner)
        assert isinstance(d, ReturnRecorded) and d.recorded == UncertainResult("env-child", DIG)
    assert runner.runs == []


def test_recovery_after_kill_9_of_a_child_that_only_claimed(path):
    _killed_after(path, "claim")
    runner = CountingRunner()
    with SqliteResults(path) as s:
        assert s.recover() == Recovery(released=(KEY,), uncertain=())
        d = _deliver(s, runner)
        assert isinstance(d, Run) and len(runner.runs) == 1  # nothing ran: the retry runs it
        assert s.get(KEY) == RecordedResult(d.envelope.envelope_id, DIG, b"ran " + d.envelope.envelope_id.encode())


# -- pruning ----------------------------------------------------------------------------------------

DAY = 24 * 3600.0


def test_prune_removes_only_finished_calls_older_than_the_horizon(path):
    clock = Clock()
    with SqliteResults(path, clock=clock, min_prune_age=DAY) as s:
        old = _keys("old-recorded", "old-released", "old-uncertain", "old-claimed", "old-started")
        started(s, old["old-recorded"])
        s.record(old["old-recorded"], A, b"out")
        assert s.claim(old["old-released"], A, DIG)
        s.release(old["old-released"], A, REASON)
        started(s, old["old-uncertain"])
        s.recover()  # old-uncertain → uncertain (nothing else live yet)
        assert s.claim(old["old-claimed"], A, DIG)
        started(s, old["old-started"])
        clock.now += 2 * DAY
        young = _keys("young-recorded")
        started(s, young["young-recorded"])
        s.record(young["young-recorded"], A, b"out")
        assert s.prune(DAY) == 3
        assert [name for name, key in old.items() if s.entry(key) is not None] == ["old-claimed", "old-started"]
        assert s.entry(young["young-recorded"]) is not None
        assert s.prune(DAY) == 0  # again: nothing more is old enough
        # A pruned call held nothing: a later claim starts afresh (only after every deadline).
        assert s.claim(old["old-released"], B, DIG) is True


def test_prune_judges_age_by_the_last_change(path):
    clock = Clock()
    with SqliteResults(path, clock=clock, min_prune_age=DAY) as s:
        assert s.claim(KEY, A, DIG)
        clock.now += 2 * DAY
        s.mark_started(KEY, A)
        s.record(KEY, A, b"out")  # recorded just now, claimed long ago: young
        assert s.prune(DAY) == 0 and s.get(KEY) is not None
        clock.now += DAY + 1
        assert s.prune(DAY) == 1 and s.entry(KEY) is None


def test_prune_refuses_a_horizon_under_the_minimum(path):
    clock = Clock()
    with SqliteResults(path, clock=clock, min_prune_age=DAY) as s:
        started(s)
        s.record(KEY, A, b"out")
        clock.now += 10 * DAY
        with pytest.raises(PruneHorizonTooShort, match="minimum") as e:
            s.prune(DAY - 1)
        assert (e.value.older_than, e.value.minimum) == (DAY - 1, DAY)
        assert isinstance(e.value, ResultsError) and s.get(KEY) is not None  # nothing deleted
        with pytest.raises(PruneHorizonTooShort):
            s.prune(float("nan"))
    with pytest.raises(ValueError, match="min_prune_age"):
        SqliteResults(path, min_prune_age=0)
