"""The warm pool's own rules (ringfence_server/sandbox/pool.py), with containers stood in by plain objects:
one container per claim, never handed out twice, the shape registered by a miss, expiry, the
least recently used shape let go, a dead container never handed out, the refill giving way to
live calls, a claim waiting for the container being made, the target following demand, and
close() removing everything. The real engine: tests/integration/
test_pool_docker.py and the escape battery's [warm] cases."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from ringfence_server.sandbox import pool as pool_module
from ringfence_server.sandbox.pool import Load, PoolSettings, Warm, WarmPool


class Engine:
    """Makes and removes stand-in containers, and says which are alive."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        # The stand-ins are ints: the pool hands a Warm's container to the engine's callbacks
        # and never looks inside it, so an int is all these tests need.
        self.live: set[object] = set()
        self.made: list[tuple] = []
        self.removed: list[object] = []
        self.dead: set[object] = set()
        self.load = Load()
        self.fail = False
        self.gate: threading.Event | None = None  # set: make() waits for it (a slow engine)
        self.making = threading.Event()
        self.begun = 0  # makes begun (made: those that ended)
        self.lock = threading.Lock()

    def shape(self, request):
        return (request, "shape") if request != "unpoolable" else None

    def make(self, key, spec) -> Warm:
        with self.lock:
            self.begun += 1
        self.making.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail:
            raise RuntimeError("the engine said no")
        with self.lock:
            n = next(self.ids)
            self.live.add(n)
            self.made.append(key)
        return Warm(key, container=n, attach=None, sock=None, applied={}, image_id="sha256:x")  # type: ignore[arg-type]  # stand-ins, see live

    def discard(self, warm: Warm) -> None:
        with self.lock:
            self.live.discard(warm.container)
            self.removed.append(warm.container)

    def alive(self, warm: Warm) -> bool:
        return warm.container not in self.dead


def pool_of(engine: Engine, **settings) -> WarmPool:
    return WarmPool(PoolSettings(**settings), shape=engine.shape, make=engine.make, discard=engine.discard,
                    alive=engine.alive, load=lambda: engine.load)


@pytest.fixture
def engine():
    return Engine()


def test_a_miss_registers_the_shape_and_the_next_call_claims(engine):
    pool = pool_of(engine, size=2)
    try:
        assert pool.claim("a") is None  # nothing ready yet: the caller goes cold
        assert pool.wait_filled(5)
        first, second = pool.claim("a"), pool.claim("a")
        assert first is not None and second is not None and first.container != second.container
        assert pool.stats()["claims"] == 2 and pool.stats()["misses"] == 1
    finally:
        pool.close()


def test_a_container_is_handed_out_once(engine):
    pool = pool_of(engine, size=3)
    pool.prewarm("a")
    assert pool.wait_filled(5)
    claimed = []
    threads = [threading.Thread(target=lambda: claimed.append(pool.claim("a"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pool.close()
    got = [w.container for w in claimed if w is not None]
    assert len(got) == len(set(got)) >= 3  # every claim got its own; none twice
    # Nothing claimed is removed by the pool (its call removes it); everything else is.
    assert set(engine.removed).isdisjoint(got)
    assert engine.live == set(got)


def test_unpoolable_requests_are_never_claimed_nor_registered(engine):
    pool = pool_of(engine, size=1)
    try:
        assert pool.claim("unpoolable") is None and pool.prewarm("unpoolable") is False
        assert pool.stats()["shapes"] == 0 and pool.stats()["misses"] == 0
    finally:
        pool.close()


def test_a_dead_container_is_discarded_not_handed_out(engine):
    pool = pool_of(engine, size=1)
    try:
        pool.prewarm("a")
        assert pool.wait_filled(5)
        engine.dead.update(engine.live)
        doomed = set(engine.live)
        assert pool.claim("a") is None
        assert doomed <= set(engine.removed)
        assert pool.stats()["misses"] == 1 and pool.stats()["claims"] == 0
    finally:
        pool.close()


def test_an_expired_container_is_replaced(engine):
    pool = pool_of(engine, size=1, idle_s=0.2)
    try:
        pool.prewarm("a")
        assert pool.wait_filled(5)
        [old] = engine.live
        time.sleep(0.3)
        pool.prewarm("a")  # still wanted
        deadline = time.monotonic() + 5
        while old not in engine.removed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert old in engine.removed
        pool.prewarm("a")
        assert pool.wait_filled(5)
        claimed = pool.claim("a")
        assert claimed is not None and claimed.container != old
    finally:
        pool.close()


def test_the_least_recently_used_shape_is_let_go(engine):
    pool = pool_of(engine, size=1, max_shapes=2)
    try:
        for shape in ("a", "b"):
            pool.prewarm(shape)
        assert pool.wait_filled(5)
        a_containers = {w for w, k in zip(range(1, 100), engine.made, strict=False) if k == "a"}
        assert len(a_containers) == 1
        pool.prewarm("c")  # a is the oldest: let go, its container removed
        assert pool.wait_filled(5)
        assert pool.stats()["shapes"] == 2
        deadline = time.monotonic() + 5
        while not a_containers <= set(engine.removed) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a_containers <= set(engine.removed)
    finally:
        pool.close()


def test_the_refill_waits_while_the_engine_starts_a_container_per_maker(engine, monkeypatch):
    monkeypatch.setattr(pool_module, "MAKERS", 2)
    engine.load = Load(calls=2, cold=2)  # two cold starts: every maker's CPU taken
    pool = pool_of(engine, size=2)
    try:
        pool.prewarm("a")  # nothing ready: still no make beside them
        assert not pool.wait_filled(0.5) and engine.made == []
        engine.load = Load(calls=1, cold=1)  # one CPU left: one make may run beside it
        pool.nudge()
        deadline = time.monotonic() + 5
        while len(engine.made) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        assert len(engine.made) == 1  # and then the shape has one ready: the rest waits for the call
        engine.load = Load()
        pool.nudge()
        assert pool.wait_filled(5)
    finally:
        pool.close()


def test_beside_warm_calls_only_an_empty_shape_is_refilled(engine):
    pool = pool_of(engine, size=2)
    try:
        pool.prewarm("a")
        assert pool.wait_filled(5)
        engine.load = Load(calls=1)
        assert pool.claim("a") is not None  # one left: its refill waits for the call to end
        time.sleep(0.3)
        assert len(engine.made) == 2
        assert pool.claim("a") is not None  # none left: the next call would go cold, so refill
        deadline = time.monotonic() + 5
        while len(engine.made) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        assert len(engine.made) == 3  # one, not two: the shape has one ready again
        engine.load = Load()
        pool.nudge()
        assert pool.wait_filled(5) and len(engine.made) == 4
    finally:
        pool.close()


def test_a_claim_waits_for_the_container_being_made_first_come_first_served(engine, monkeypatch):
    monkeypatch.setattr(pool_module, "MAKERS", 1)
    engine.gate = threading.Event()
    pool = pool_of(engine, size=1)
    try:
        assert pool.claim("a") is None  # the engine has room: this one goes cold, and the shape is kept
        assert engine.making.wait(5)
        got: dict[int, object] = {}

        def claim(n: int) -> None:
            got[n] = pool.claim("a")

        waiters = []
        for n in (1, 2):  # the first waits for the make under way, the second behind it (the
            waiters.append(threading.Thread(target=claim, args=(n,)))  # one maker is busy)
            waiters[-1].start()
            deadline = time.monotonic() + 5
            while pool.stats()["waited"] < n and time.monotonic() < deadline:
                time.sleep(0.01)
            assert pool.stats()["waited"] == n
        engine.gate.set()
        for t in waiters:
            t.join(10)
        assert got[1] is not None and got[2] is not None
        assert (got[1].container, got[2].container) == (1, 2)  # in the order they came
        stats = pool.stats()
        assert stats["waited"] == 2 and stats["claims"] == 2 and stats["misses"] == 1
    finally:
        engine.gate.set()
        pool.close()


def test_when_the_engine_is_saturated_every_miss_queues_for_the_pool(engine, monkeypatch):
    """Two makes under way (MAKERS 2): three claims all wait, first come first served, and the
    refill makes the third's container when a maker is free, none goes cold."""
    monkeypatch.setattr(pool_module, "MAKERS", 2)
    engine.gate = threading.Event()
    pool = pool_of(engine, size=2)
    try:
        pool.prewarm("a")
        deadline = time.monotonic() + 5
        while engine.begun < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.begun == 2  # two at once, both held by the gate
        got: dict[int, object] = {}

        def claim(n: int) -> None:
            got[n] = pool.claim("a")

        waiters = []
        for n in (1, 2, 3):
            waiters.append(threading.Thread(target=claim, args=(n,)))
            waiters[-1].start()
            while pool.stats()["waited"] < n and time.monotonic() < deadline:
                time.sleep(0.01)
        assert pool.stats()["waited"] == 3
        engine.gate.set()
        for t in waiters:
            t.join(10)
        assert {got[1].container, got[2].container} == {1, 2} and got[3].container == 3
        assert pool.stats()["misses"] == 0
    finally:
        engine.gate.set()
        pool.close()


def test_a_claim_waiting_for_a_make_that_fails_goes_cold(engine):
    engine.gate = threading.Event()
    pool = pool_of(engine, size=1)
    try:
        pool.prewarm("a")
        assert engine.making.wait(5)
        engine.fail = True
        got: list = []
        waiter = threading.Thread(target=lambda: got.append(pool.claim("a")))
        waiter.start()
        deadline = time.monotonic() + 5
        while pool.stats()["waited"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        engine.gate.set()
        waiter.join(5)
        assert got == [None] and pool.stats()["failures"] >= 1
    finally:
        engine.gate.set()
        pool.close()


def test_the_target_follows_shortfalls_up_to_max_size_and_falls_back(engine, monkeypatch):
    monkeypatch.setattr(pool_module, "DEMAND_WINDOW_S", 0.5)
    monkeypatch.setattr(pool_module, "MAKERS", 1)
    engine.gate = threading.Event()
    pool = pool_of(engine, size=1, max_size=3)
    got: list = []
    waiters = [threading.Thread(target=lambda: got.append(pool.claim("a"))) for _ in range(5)]
    try:
        assert pool.claim("a") is None  # registers the shape; the refill's first make is held
        assert engine.making.wait(5)
        for t in waiters:
            t.start()
        deadline = time.monotonic() + 5
        while pool.stats()["waited"] < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.stats()["target"] == 3  # 1 + 6 shortfalls, capped at max_size
        engine.gate.set()
        for t in waiters:
            t.join(20)
        assert len(got) == 5 and all(w is not None for w in got)
        assert pool.wait_filled(5) and pool.stats()["ready"] == 3
        time.sleep(0.6)
        assert pool.stats()["target"] == 1
    finally:
        engine.gate.set()
        pool.close()


def test_a_failing_engine_is_counted_and_calls_go_cold(engine):
    engine.fail = True
    pool = pool_of(engine, size=1)
    try:
        pool.prewarm("a")
        deadline = time.monotonic() + 5
        while pool.stats()["failures"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.stats()["failures"] >= 1 and pool.claim("a") is None
    finally:
        pool.close()


def test_forget_removes_the_shapes_ready_containers_before_it_returns(engine):
    pool = pool_of(engine, size=2)
    try:
        for shape in ("a", "b"):
            pool.prewarm(shape)
        assert pool.wait_filled(5)
        a_containers = [n for n, k in zip(range(1, 100), engine.made, strict=False) if k == "a"]
        assert len(a_containers) == 2 and pool.forget({"a"}) == 2
        assert set(a_containers) <= set(engine.removed)  # already gone: what they mounted is free
        assert pool.stats()["shapes"] == 1 and pool.claim("b") is not None
    finally:
        pool.close()


def test_forget_waits_for_one_being_made_and_removes_it_too(engine):
    engine.gate = threading.Event()
    pool = pool_of(engine, size=1)
    try:
        pool.prewarm("a")
        assert engine.making.wait(5)
        forgot: list[int] = []
        forgetting = threading.Thread(target=lambda: forgot.append(pool.forget({"a"})))
        forgetting.start()
        time.sleep(0.2)
        assert forgot == []  # still waiting for the make
        engine.gate.set()
        forgetting.join(10)
        assert forgot == [1] and engine.removed == [1] and engine.live == set()
        time.sleep(0.2)
        assert len(engine.made) == 1  # and no refill of a forgotten shape
    finally:
        engine.gate.set()
        pool.close()


def test_close_removes_every_ready_container_and_stops_refilling(engine):
    pool = pool_of(engine, size=3)
    for shape in ("a", "b"):
        pool.prewarm(shape)
    assert pool.wait_filled(5)
    pool.close()
    assert engine.live == set() and len(engine.removed) == 6
    assert pool.claim("a") is None
    made = len(engine.made)
    time.sleep(0.2)
    assert len(engine.made) == made


def test_settings_are_checked():
    with pytest.raises(ValueError):
        PoolSettings(size=-1)
    with pytest.raises(ValueError):
        PoolSettings(idle_s=0)
    with pytest.raises(ValueError):
        PoolSettings(size=3, max_size=2)


def _until(check, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


def test_announced_calls_are_made_for_before_they_claim(engine):
    """A batch of four reads announced with one ready (and a call running beside, when a quiet
    shape is not refilled): three more are made before any of them claims, each claim takes
    one, and none counts as a shortfall (the target stays at size)."""
    pool = pool_of(engine, size=1, max_size=8)
    try:
        pool.prewarm("a")
        assert pool.wait_filled(5) and len(engine.made) == 1
        engine.load = Load(calls=1)
        assert all(pool.expect("a") for _ in range(4))
        assert pool.stats()["announced"] == 4
        assert _until(lambda: len(engine.made) == 4)
        time.sleep(0.3)
        assert len(engine.made) == 4  # the announced four, not more
        got = [pool.claim("a") for _ in range(4)]
        assert sorted(w.container for w in got) == [1, 2, 3, 4]
        stats = pool.stats()
        assert stats["misses"] == 0 and stats["announced"] == 0 and stats["target"] == 1
    finally:
        pool.close()


def test_announced_calls_count_up_to_max_size_and_not_past_expect_s(engine, monkeypatch):
    monkeypatch.setattr(pool_module, "EXPECT_S", 0.3)
    pool = pool_of(engine, size=1, max_size=3)
    try:
        engine.load = Load(calls=1)
        for _ in range(6):
            assert pool.expect("a")
        assert _until(lambda: len(engine.made) == 3)
        time.sleep(0.4)  # past EXPECT_S: the six that never claimed no longer count
        assert pool.stats()["announced"] == 0 and len(engine.made) == 3
        assert not pool.expect("unpoolable")
    finally:
        pool.close()
    assert not pool.expect("a")  # closed


def test_each_shape_has_its_own_make_time_and_forgets_it_with_the_shape(engine):
    """A slow shape (gVisor, the egress relay) does not set a fast one's patience, nor the other
    way round: a waiter gives up after its own shape's make time. A shape let go of is forgotten."""
    fast_make = engine.make

    def make(key, spec):
        if key == "slow":
            time.sleep(0.4)
        return fast_make(key, spec)

    pool = WarmPool(PoolSettings(size=1), shape=engine.shape, make=make, discard=engine.discard,
                    alive=engine.alive, load=lambda: engine.load)
    try:
        assert pool.make_s("fast") == pool_module.FIRST_MAKE_S  # nothing made yet
        pool.prewarm("fast")
        pool.prewarm("slow")
        assert pool.wait_filled(10)
        with pool._lock:
            slow, fast = pool.make_s("slow"), pool.make_s("fast")
        assert slow > fast + 0.05
        assert pool.forget({"slow"}) == 1
        with pool._lock:
            assert set(pool._make_s) == {"fast"}
    finally:
        pool.close()
