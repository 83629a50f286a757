"""Warm containers: created and started ahead of the calls, each given to exactly one.

Starting a hardened container costs a few hundred milliseconds of engine work; a container that
is already running, blocked reading its request on stdin, answers in tens. The pool keeps, per
(image ID, container shape), a few such containers ready. A claim takes one out of the pool for
one call, and the container is removed after that call like a cold one: never reused, so no
state, file or process of one call can reach another.

    PoolSettings(size=2, idle_s=300)      per shape: ready containers, and how long one may wait
    pool.claim(request) -> Warm | None   None: none ready (the caller starts one cold)
    pool.prewarm(request)                 fill the request's shape ahead of its first call
    pool.wait_filled(timeout_s) -> bool
    pool.stats()
    pool.close()                          every ready container removed

One refill thread creates one container at a time (container churn is CPU-bound: on two cores a
second creator would compete with the live calls it is meant to speed up), and waits while the
backend says it is busy. A shape is kept warm once a call has asked for it (a miss registers
it); shapes not asked for in `idle_s` are let go, the least recently used first past
`max_shapes`. A ready container older than `idle_s` is replaced, and one whose stream shows it
is no longer waiting (it exited, or wrote something) is discarded at the claim, not given out.

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
import select
import socket
import threading
import time
import uuid
from collections import OrderedDict
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
    """Ready containers kept per shape (image ID + everything fixed at creation). 0: no pool."""

    idle_s: float = 300.0
    """How long a ready container may wait for a call before it is replaced, and how long a
    shape nobody asked for stays warm."""

    max_shapes: int = 8
    """Shapes kept warm at once; past it the least recently used is let go."""

    def __post_init__(self) -> None:
        if self.size < 0 or self.max_shapes < 1 or self.idle_s <= 0:
            raise ValueError("size >= 0, max_shapes >= 1 and idle_s > 0")


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
                 alive: Callable[[Warm], bool], busy: Callable[[], bool] = lambda: False) -> None:
        """`shape(request)` is the request's (key, spec), or None when it cannot be pooled;
        `make(key, spec)` creates and starts one container of the shape; `discard(warm)`
        removes one; `alive(warm)` says a ready one is still blocked on its stdin; `busy()`
        makes the refill wait (live calls first)."""
        self.settings = settings
        self._shape = shape
        self._make = make
        self._discard = discard
        self._alive = alive
        self._busy = busy
        self._lock = threading.Condition()
        self._ready: dict[K, list[Warm]] = {}
        self._shapes: OrderedDict[K, tuple[S, float]] = OrderedDict()  # key -> (spec, last asked)
        self._closed = False
        self._counts = {"claims": 0, "misses": 0, "created": 0, "discarded": 0, "failures": 0}
        self._pending_drop: list[Warm] = []  # collected under the lock, removed outside it
        self._thread = threading.Thread(target=self._refill, name="rf-pool", daemon=True)
        self._thread.start()

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
            ready = self._ready.get(key, [])
            while ready and found is None:
                candidate = ready.pop(0)
                if self._expired(candidate):
                    stale.append(candidate)
                else:
                    found = candidate
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
            return {**self._counts, "ready": sum(len(r) for r in self._ready.values()), "shapes": len(self._shapes)}

    def close(self) -> None:
        """Stop refilling and remove every ready container (the backend's close, SIGTERM)."""
        with self._lock:
            self._closed = True
            drained = [w for ready in self._ready.values() for w in ready]
            self._ready.clear()
            self._lock.notify_all()
        self._thread.join(60)
        for w in drained:
            self._drop(w)

    # -- internals ---------------------------------------------------------------------------

    def _ask(self, key: K, spec: S) -> None:
        self._shapes[key] = (spec, time.monotonic())
        self._shapes.move_to_end(key)
        while len(self._shapes) > self.settings.max_shapes:
            old, _ = self._shapes.popitem(last=False)
            for w in self._ready.pop(old, []):
                threading.Thread(target=self._drop, args=(w,), daemon=True).start()

    def _filled(self) -> bool:
        return all(len(self._ready.get(k, [])) >= self.settings.size for k in self._shapes)

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
                for w in self._ready.pop(key, []):
                    self._pending_drop.append(w)
        for ready in self._ready.values():
            for w in [w for w in ready if self._expired(w)]:
                ready.remove(w)
                self._pending_drop.append(w)
        for key in reversed(self._shapes):
            if len(self._ready.get(key, [])) < self.settings.size:
                return key, self._shapes[key][0]
        return None

    def _refill(self) -> None:
        while True:
            with self._lock:
                job = None
                while not self._closed:
                    job = self._next()
                    if self._pending_drop or (job is not None and not self._busy()):
                        break
                    self._lock.wait(1.0)
                if self._closed:
                    return
                drops, self._pending_drop = self._pending_drop, []
            for w in drops:
                self._drop(w)
            if job is None or self._busy():
                continue
            key, spec = job
            try:
                w = self._make(key, spec)
            except Exception:
                log.warning("could not start a warm container", exc_info=True)
                with self._lock:
                    self._counts["failures"] += 1
                    self._lock.wait(2.0)  # not a hot loop against a failing engine
                continue
            with self._lock:
                self._counts["created"] += 1
                if self._closed or key not in self._shapes:
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
