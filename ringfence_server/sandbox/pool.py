"""Warm containers: created and started ahead of the calls, each given to exactly one.

Starting a hardened container costs a few hundred milliseconds of engine work; a container that
is already running, blocked reading its request on stdin, answers in tens. The pool keeps, per
(image ID, container shape), a few such containers ready. A claim takes one out of the pool for
one call, and the container is removed after that call like a cold one: never reused, so no
state, file or process of one call can reach another.

    PoolSettings(size=2, max_size=8, idle_s=300)   per shape: ready when quiet, at most under
                                          demand, and how long one may wait
    pool.claim(request) -> Warm | None   None: none ready (the caller starts one cold)
    pool.prewarm(request)                 fill the request's shape ahead of its first call
    pool.expect(request)                  one call of this shape is about to claim (a batch's
                                          reads announced together): made for ahead of it
    pool.wait_filled(timeout_s) -> bool
    pool.forget(keys)                     let go of shapes now (a run's workspace, at its end)
    pool.nudge()                          a call ended: the refill looks again
    pool.stats()
    pool.close()                          every ready container removed

How many are ready follows demand. Each shape keeps `size` ready when it is quiet; every call
that found none ready (a miss, or a claim that had to wait) raises that shape's target by one,
up to `max_size`, for DEMAND_WINDOW_S: after a burst, the next burst finds more ready. Demand
that is known ahead is met ahead: a batch of N reads announces its N calls (`expect`) before
they claim, and the shape's want is at least those still to claim (up to `max_size`, for at
most EXPECT_S), so the refill starts on the calls past the ready ones at once instead of after
their misses.

Refill threads (MAKERS: one per CPU and one more, at most four) make containers, since making
one is mostly the engine's CPU work, and they give way to the calls (`load()`, the backend's
count of what runs now):

    MAKERS containers are starting   no refill: cold starts and makes share MAKERS starts
                                     at once, or they fight for the same CPUs
    warm calls are running           refill a shape with none ready (its next call would
                                     otherwise go cold) or under demand (its target raised by
                                     recent shortfalls); a quiet shape with one to spare waits
    nothing runs                     refill

A claim that finds none ready waits for the pool, first come first served, when a container of
its shape is being made for it (ready sooner than a cold start, the same work begun later) or
when the engine already starts MAKERS containers (a cold start would only share the CPUs with
the work ahead of it: in a burst, queueing finishes the first calls early instead of every call
late); each waiter raises the target, so the refill makes one for it. It waits no longer than
its place in the queue should take; otherwise, and when the engine has room, it goes cold.

A shape is kept warm once a call has asked for it (a miss registers it); shapes not asked for
in `idle_s` are let go, the least recently used first past `max_shapes`. A ready container older
than `idle_s` is replaced, and one whose stream shows it is no longer waiting (it exited, or
wrote something) is discarded at the claim, not given out.

Everything that makes a container safe is the backend's, the same code as a cold call's
(ringfence_server.sandbox.docker_backend): the pool only decides when to create and whom to give what. The
hand-over's own pieces are here too (the end of this module): the launcher command, the name a
claimed container takes, the launch line, and the check that a ready one still waits.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import select
import socket
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar

from ringfence_server.sandbox import launcher
from ringfence_server.sandbox.profile import SandboxProfile

if TYPE_CHECKING:
    from docker.models.containers import Container

    from ringfence_server.sandbox.backend import SandboxRequest

log = logging.getLogger("ringfence.pool")

K = TypeVar("K", bound=Hashable)
"""A shape's key: what must be equal for a ready container to serve a request."""
S = TypeVar("S")
"""A shape's spec: what the backend makes a container of that shape from."""


@dataclass(frozen=True)
class PoolSettings:
    size: int = 2
    """Ready containers kept per shape (image ID + everything fixed at creation) when it is
    quiet. 0: no pool."""

    max_size: int = 8
    """Ready containers a shape may have under demand: each recent shortfall (a miss, a wait)
    raises its target by one up to this (never below `size`)."""

    idle_s: float = 300.0
    """How long a ready container may wait for a call before it is replaced, and how long a
    shape nobody asked for stays warm."""

    max_shapes: int = 8
    """Shapes kept warm at once; past it the least recently used is let go."""

    def __post_init__(self) -> None:
        if self.size < 0 or self.max_shapes < 1 or self.idle_s <= 0 or self.max_size < self.size:
            raise ValueError("size >= 0, max_size >= size, max_shapes >= 1 and idle_s > 0")


# How long a shortfall (a miss, a claim that waited) keeps its shape's target raised.
DEMAND_WINDOW_S = 60.0
# How long a call announced by `expect` counts as demand if it never claims (its run was
# cancelled, its image refused): the refill stops making for it then.
EXPECT_S = 30.0
# The time to make a container, assumed until one was made (a hardened start on two cores).
FIRST_MAKE_S = 0.5
# Container starts at once, cold or for the pool, and so refill threads: one per CPU and one more
# (a start is mostly the engine's CPU work, with waits on the kernel between: a 20-call burst on
# two cores ended sooner, first and last call alike, with three than with two or four, in
# bench_speed's burst), at most four (past that the engine's own locks are the limit).
MAKERS = max(1, min(4, (os.cpu_count() or 1) + 1))


@dataclass(frozen=True)
class Load:
    """What the backend runs now, which the refill gives way to."""

    calls: int = 0
    """Calls running (warm or cold)."""
    cold: int = 0
    """Of them, calls that create and start their own container."""


class AttachStream(Protocol):
    """The engine's attach stream of a container (docker-py's socket wrapper): only closed."""

    def close(self) -> None: ...


class Demux(Protocol):
    """Splits the attach stream's bytes into (stream, payload) frames."""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]: ...


class WarmExtra(TypedDict, total=False):
    """The backend's own data about a ready container (ringfence_server.sandbox.docker_backend)."""

    mode: str
    """How the call is handed over: "runner" (the image's runner reads the request) or
    "launcher" (ringfence_server.sandbox.launcher reads a launch line first)."""
    egress_dir: tuple[str, str] | None
    """The egress socket directory reserved for it (ringfence_server.sandbox.egress.proxy.reserve_call_dir)."""
    demux: Demux
    early: list[tuple[int, bytes]]
    """Frames it wrote while it waited (its init's report), for the call's streams."""


@dataclass
class Warm:
    """One ready container and what the backend needs to hand it a call."""

    key: Hashable
    container: Container
    attach: AttachStream
    sock: socket.socket
    applied: dict[str, Any]
    image_id: str
    created: float = field(default_factory=time.monotonic)
    extra: WarmExtra = field(default_factory=lambda: WarmExtra())
    """Backend data (a reserved egress directory)."""


class WarmPool(Generic[K, S]):
    def __init__(self, settings: PoolSettings, *, shape: Callable[[SandboxRequest], tuple[K, S] | None],
                 make: Callable[[K, S], Warm], discard: Callable[[Warm], None],
                 alive: Callable[[Warm], bool], load: Callable[[], Load] = Load) -> None:
        """`shape(request)` is the request's (key, spec), or None when it cannot be pooled;
        `make(key, spec)` creates and starts one container of the shape; `discard(warm)`
        removes one; `alive(warm)` says a ready one is still blocked on its stdin; `load()`
        says what runs now (the refill gives way to live calls)."""
        self.settings = settings
        self._shape = shape
        self._make = make
        self._discard = discard
        self._alive = alive
        self._load = load
        self._lock = threading.Condition()
        self._ready: dict[K, list[Warm]] = {}
        self._shapes: OrderedDict[K, tuple[S, float]] = OrderedDict()  # key -> (spec, last asked)
        self._closed = False
        self._counts = {"claims": 0, "misses": 0, "waited": 0, "created": 0, "discarded": 0, "failures": 0}
        self._shortfalls: dict[K, deque[float]] = {}  # key -> when a call found none ready, oldest first
        self._expected: dict[K, deque[float]] = {}  # key -> when each announced call was announced, oldest first
        self._making: dict[K, int] = {}  # shape -> how many the refill threads are making now
        self._waiters: dict[K, list[object]] = {}  # key -> claims waiting for it, first come first
        # Recent time to make one, per shape (a moving average): a gVisor shape or one behind the
        # egress relay takes longer than a plain runc one, and a waiter's patience follows it.
        self._make_s: dict[K, float] = {}
        self._forgetting: set[K] = set()  # shapes forget() is letting go of now
        self._pending_drop: list[Warm] = []  # collected under the lock, removed outside it
        self._threads = [threading.Thread(target=self._refill, name=f"rf-pool-{n}", daemon=True)
                         for n in range(MAKERS)]
        for thread in self._threads:
            thread.start()

    # -- the calls' side -------------------------------------------------------------------

    def claim(self, request: SandboxRequest, shaped: tuple[K, S] | None = None) -> Warm | None:
        """A ready container of the request's shape, now this caller's alone; None when there
        is none (the shape is then kept warm for the next call) or it cannot be pooled.
        `shaped`: the request's (key, spec) when the caller has it already."""
        shaped = shaped if shaped is not None else self._shape(request)
        if shaped is None:
            return None
        key, spec = shaped
        stale: list[Warm] = []
        found = None
        with self._lock:
            if self._closed:
                return None
            self._ask(key, spec)
            announced = self._expected.get(key)
            if announced:
                announced.popleft()  # this call was announced: it claims now
            # Claims already waiting for this shape come first.
            spare = len(self._ready.get(key, [])) > len(self._waiters.get(key, []))
            found = self._take(key, stale) if spare else None
            waited = found is None and self._should_wait(key)
            if found is None:
                self._shortfall(key)  # now: the refill makes one for a waiter at once
            if waited:
                self._lock.notify_all()
                found = self._wait_for_make(key, stale)
            self._counts["claims" if found is not None else "misses"] += 1
            self._lock.notify_all()
        for w in stale:
            self._drop(w)
        if found is not None and not self._alive(found):
            # It stopped waiting while idle (killed, or it exited): never hand that out.
            self._drop(found)
            with self._lock:
                self._counts["claims"] -= 1
                self._counts["misses"] += 1
            return None
        return found

    def _take(self, key: K, stale: list[Warm]) -> Warm | None:
        """A ready container of the shape, if any (expired ones go to `stale`). Under the lock."""
        ready = self._ready.get(key, [])
        while ready:
            candidate = ready.pop(0)
            if not self._expired(candidate):
                return candidate
            stale.append(candidate)
        return None

    def _should_wait(self, key: K) -> bool:
        """A claim that found none ready: wait for the pool rather than start cold when a
        container of its shape is being made for it, or when the engine already starts as many
        containers as there are makers (a cold start now would only share the CPUs with the
        work queued before it, and finish later than that work). Under the lock."""
        waiting = len(self._waiters.get(key, []))
        if self._making.get(key, 0) > waiting:
            return True
        return self._load().cold + sum(self._making.values()) >= MAKERS

    def _wait_for_make(self, key: K, stale: list[Warm]) -> Warm | None:
        """Wait, first come first served, for a container of the shape: the refill makes one
        per waiter (each raised the shape's target). None when a make failed meanwhile, or
        past the time its place in the queue should take (two makes' time per round of
        MAKERS ahead of it, and two more): then the caller starts one cold. Under the lock
        (released while waiting)."""
        ticket = object()
        waiters = self._waiters.setdefault(key, [])
        ahead = len(waiters)
        waiters.append(ticket)
        self._counts["waited"] += 1
        failures = self._counts["failures"]
        give_up = time.monotonic() + (ahead // MAKERS + 2) * 2 * self.make_s(key) + 0.1
        try:
            while not self._closed:
                if waiters[0] is ticket:
                    found = self._take(key, stale)
                    if found is not None:
                        return found
                if self._counts["failures"] > failures:
                    return None  # the engine failed to make one: go cold (it may say why)
                left = give_up - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)
            return None
        finally:
            waiters.remove(ticket)
            if not waiters:
                self._waiters.pop(key, None)
            self._lock.notify_all()  # the next waiter may be first now

    def _shortfall(self, key: K) -> None:
        """A call of the shape found none ready: its target rises for DEMAND_WINDOW_S."""
        self._shortfalls.setdefault(key, deque()).append(time.monotonic())

    def wanted(self, key: K) -> int:
        """How many of the shape to have ready or being made now: its target, or the calls
        announced and yet to claim when more (up to `max_size`), or the claims waiting for it
        when more still. Under the lock."""
        announced = self._expected.get(key)
        pending = 0
        if announced is not None:
            now = time.monotonic()
            while announced and now - announced[0] > EXPECT_S:
                announced.popleft()
            if not announced:
                del self._expected[key]
            pending = min(self.settings.max_size, len(announced))
        return max(self.target(key), pending, len(self._waiters.get(key, [])))

    def make_s(self, key: K) -> float:
        """The recent time to make one of the shape; until one was made, the slowest shape's
        (or FIRST_MAKE_S before any). Under the lock."""
        known = self._make_s.get(key)
        if known is not None:
            return known
        return max(self._make_s.values(), default=FIRST_MAKE_S)

    def target(self, key: K) -> int:
        """How many of the shape to keep ready now: `size`, plus one per recent shortfall, up to
        `max_size`. Under the lock."""
        recent = self._shortfalls.get(key)
        if recent is None:
            return self.settings.size
        now = time.monotonic()
        while recent and now - recent[0] > DEMAND_WINDOW_S:  # oldest first: drop what is past
            recent.popleft()
        if not recent:
            del self._shortfalls[key]
        return min(self.settings.max_size, self.settings.size + len(recent))

    def forget(self, keys: set[K]) -> int:
        """Let go of these shapes now (a run's workspace shapes when the run ends): no more
        refills, and their ready containers removed before this returns, also one being made
        (waited for), so that what they mounted is free. How many were removed."""
        with self._lock:
            for key in keys:
                self._shapes.pop(key, None)
            drops = [w for key in keys for w in self._ready.pop(key, [])]
            self._forgetting |= keys  # one being made now is handed to us, not dropped by the refill
            try:
                give_up = time.monotonic() + 2 * max((self.make_s(k) for k in keys), default=FIRST_MAKE_S) + 5
                while any(self._making.get(k) for k in keys) and time.monotonic() < give_up:
                    self._lock.wait(0.1)
                drops += [w for key in keys for w in self._ready.pop(key, [])]  # made meanwhile
            finally:
                self._forgetting -= keys
                for key in keys:
                    self._let_go(key)
            self._lock.notify_all()
        for w in drops:
            self._drop(w)
        return len(drops)

    def nudge(self) -> None:
        """A call ended: the refill may go on (it gives way while calls run)."""
        with self._lock:
            self._lock.notify_all()

    def prewarm(self, request: SandboxRequest) -> bool:
        """Keep the request's shape warm from now on (before its first call); False when it
        cannot be pooled."""
        shaped = self._shape(request)
        if shaped is None:
            return False
        with self._lock:
            self._ask(*shaped)
            self._lock.notify_all()
        return True

    def expect(self, request: SandboxRequest) -> bool:
        """One call of the request's shape is about to claim (a batch announces its reads
        before they run): the refill makes for it ahead, past the shape's ready ones. False when
        it cannot be pooled."""
        shaped = self._shape(request)
        if shaped is None:
            return False
        with self._lock:
            if self._closed:
                return False
            self._ask(*shaped)
            self._expected.setdefault(shaped[0], deque()).append(time.monotonic())
            self._lock.notify_all()
        return True

    def wait_filled(self, timeout_s: float = 60.0) -> bool:
        """Whether every shape has `size` ready containers within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not self._closed and not self._filled():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.5))
            return self._filled()

    def stats(self) -> dict[str, int]:
        with self._lock:
            for key in list(self._expected):
                self.wanted(key)  # lets go of announcements past EXPECT_S
            return {**self._counts, "ready": sum(len(r) for r in self._ready.values()), "shapes": len(self._shapes),
                    "target": sum(self.target(k) for k in self._shapes),
                    "announced": sum(len(a) for a in self._expected.values())}

    def close(self) -> None:
        """Stop refilling and remove every ready container (the backend's close, SIGTERM)."""
        with self._lock:
            self._closed = True
            drained = [w for ready in self._ready.values() for w in ready]
            self._ready.clear()
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(60)
        for w in drained:
            self._drop(w)

    # -- internals ---------------------------------------------------------------------------

    def _ask(self, key: K, spec: S) -> None:
        self._shapes[key] = (spec, time.monotonic())
        self._shapes.move_to_end(key)
        while len(self._shapes) > self.settings.max_shapes:
            old, _ = self._shapes.popitem(last=False)
            self._let_go(old)
            for w in self._ready.pop(old, []):
                threading.Thread(target=self._drop, args=(w,), daemon=True).start()

    def _let_go(self, key: K) -> None:
        """What the pool remembers of a shape it no longer keeps (its demand, its make time):
        a shape per run's workspace would otherwise pile up. Under the lock."""
        self._shortfalls.pop(key, None)
        self._expected.pop(key, None)
        self._make_s.pop(key, None)

    def _filled(self) -> bool:
        return all(len(self._ready.get(k, [])) >= self.target(k) for k in self._shapes)

    def _expired(self, w: Warm) -> bool:
        return time.monotonic() - w.created > self.settings.idle_s

    def _drop(self, w: Warm) -> None:
        try:
            self._discard(w)
        except Exception:
            log.warning("could not remove a warm container", exc_info=True)
        with self._lock:
            self._counts["discarded"] += 1

    def _next(self) -> tuple[K, S] | None:
        """The shape to fill next (most recently asked first), letting go of forgotten ones
        and collecting expired containers. Under the lock."""
        now = time.monotonic()
        for key, (_spec, asked) in list(self._shapes.items()):
            if now - asked > self.settings.idle_s:
                del self._shapes[key]
                self._let_go(key)
                for w in self._ready.pop(key, []):
                    self._pending_drop.append(w)
        for ready in self._ready.values():
            for w in [w for w in ready if self._expired(w)]:
                ready.remove(w)
                self._pending_drop.append(w)
        for key in reversed(self._shapes):
            if len(self._ready.get(key, [])) + self._making.get(key, 0) < self.wanted(key):
                return key, self._shapes[key][0]
        return None

    def _made(self, key: K) -> None:
        """One make of the shape ended (made or failed). Under the lock."""
        left = self._making.get(key, 0) - 1
        if left > 0:
            self._making[key] = left
        else:
            self._making.pop(key, None)

    def _may_make(self, key: K) -> bool:
        """Whether the refill may make one of the shape now: never when cold starts and makes
        already number MAKERS (they would fight for the same CPUs); beside warm calls only when
        the shape has none ready or is under demand (recent shortfalls, or calls announced).
        Under the lock."""
        load = self._load()
        if load.cold + sum(self._making.values()) >= MAKERS:
            return False  # one container start per maker at once, cold or for the pool
        # Under demand (recent shortfalls raised the target) calls come faster than a quiet
        # refill keeps up with: then it makes beside the calls too.
        return load.calls == 0 or not self._ready.get(key) or self.wanted(key) > self.settings.size

    def _refill(self) -> None:
        while True:
            with self._lock:
                job = None
                while not self._closed:
                    job = self._next()
                    if self._pending_drop or (job is not None and self._may_make(job[0])):
                        break
                    self._lock.wait(1.0)
                if self._closed:
                    return
                drops, self._pending_drop = self._pending_drop, []
                if job is not None and not self._may_make(job[0]):
                    job = None  # woken for the drops only
                if job is not None:
                    self._making[job[0]] = self._making.get(job[0], 0) + 1
            for w in drops:
                self._drop(w)
            if job is None:
                continue
            key, spec = job
            started = time.monotonic()
            try:
                w = self._make(key, spec)
            except Exception:
                log.warning("could not start a warm container", exc_info=True)
                with self._lock:
                    self._made(key)
                    self._counts["failures"] += 1
                    self._lock.notify_all()  # a claim waiting for it goes cold now
                    self._lock.wait(2.0)  # not a hot loop against a failing engine
                continue
            with self._lock:
                self._made(key)
                if key in self._shapes:  # one let go of meanwhile is not remembered again
                    took, before = time.monotonic() - started, self._make_s.get(key)
                    self._make_s[key] = took if before is None else 0.8 * before + 0.2 * took
                self._counts["created"] += 1
                if key in self._forgetting:
                    self._ready.setdefault(key, []).append(w)  # forget() removes it
                    keep = True
                elif self._closed or key not in self._shapes:
                    keep = False
                else:
                    self._ready.setdefault(key, []).append(w)
                    keep = True
                self._lock.notify_all()
            if not keep:
                self._drop(w)


# -- the hand-over: how the backend gives a call to a warm container ------------------------

# A warm container's command when the call's command or environment is not known ahead of it:
# it reads one launch line on stdin and execs it (ringfence_server.sandbox.launcher).
LAUNCHER_ARGV = ["python3", "-I", "-S", "-B", "-c", inspect.getsource(launcher)]
# How long a warm container may live past its pool's idle limit, for the reaper's deadline label:
# the longest wall time a call may have (SandboxProfile caps timeout_s) and a margin.
POOL_DEADLINE_MARGIN_S = 3600 + 60
# A pool shape's key: what must be equal for a warm container to serve a call (image ID, runtime,
# hand-over mode, egress or not, digest of the container settings); and its spec: what a
# container of the shape is made from (image ID, the profile without its egress grant, mode,
# egress or not). See DockerBackend._pool_shape.
ShapeKey = tuple[str, str, str, bool, str]
ShapeSpec = tuple[str, SandboxProfile, str, bool]


def claimed_prefix(run_id: str) -> str:
    """The name prefix of a warm container claimed by one of `run_id`'s calls: a digest of the
    whole run id (a container name cannot hold every character a run id may, and a prefix of
    the id could match another run)."""
    return f"rf-w-{hashlib.sha256(run_id.encode()).hexdigest()[:24]}-"


def claimed_name(run_id: str) -> str:
    """A fresh name for a warm container claimed by one of `run_id`'s calls: kill_run finds it
    by its prefix from any instance."""
    return claimed_prefix(run_id) + uuid.uuid4().hex[:12]


def launch_line(argv: list[str], env: dict[str, str]) -> bytes:
    """What a launcher-mode container reads before the call's stdin (ringfence_server.sandbox.launcher)."""
    return json.dumps({"argv": argv, "env": env}).encode() + b"\n"


def warm_alive(warm: Warm) -> bool:
    """Still blocked on its stdin: its stream has not ended. What it wrote meanwhile (the
    init's report of its child) is kept for the call's streams, in order."""
    sock = warm.sock
    try:
        sock.setblocking(False)
        while select.select([sock], [], [], 0)[0]:
            data = sock.recv(65536)
            if not data:
                return False
            warm.extra["early"].extend(warm.extra["demux"].feed(data))
    except BlockingIOError:
        return True
    except (OSError, ValueError):
        return False
    return True
