"""Where a warm call's time goes: each step of one SubmitBatch on the pool, measured in place.

bench_speed says how far a warm call is above the floor; this says why. It runs the same echo
call as bench_speed's `warm` (the real server in-process, gRPC on loopback, SQLite, the
DockerBackend with a pool, waiting untimed for the pool to be full before each call) and times,
inside each call:

    e2e          the client's SubmitBatch round trip
    backend      DockerBackend.run (everything from the claim to the classified result)
    control      e2e - backend: gRPC, admission, policy, the appends, the observation; split
                 into before and after the backend, and the durable writes' own time (their
                 sum) and number
    claim        the pool's claim (includes the check that the container still waits)
    pump         the request in, the streams to their end
    engine:X     each engine round trip the call's own thread made (X: the request's method and
                 path, ids folded), e.g. the wait and the inspect after it
    background   engine requests other threads made while the call ran (the rename, the refill's
                 create and start, the removal of the previous call's container): how many,
                 and each kind's time; on two cores they compete with the call for the CPUs
    floor        bench_speed's floor, in the same run: a pre-started container answering on
                 stdin, only the exchange and the wait timed

The engine requests are seen by wrapping docker-py's APIClient.request (every call docker-py
makes goes through it); nothing in the product is changed.

    .venv/bin/python -m bench.bench_warm_steps [--calls 30] [--pool-size 2] [--busy]

--busy: back-to-back calls without waiting for the refill (bench_speed's warm_busy).
Prints one table: per step p50 and p90 in ms, and how many calls had the step.
"""

from __future__ import annotations

import argparse
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.bench_speed import BareRunner, ControlPlane, FloorRunner, _echo_manifest_profile, percentile, submit_echo

_ID = re.compile(r"/[0-9a-f]{64}|/rf-[\w.-]+")


class StepClock:
    """Per-call step timings, gathered from the threads that do the call's work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._call: dict[str, list[float]] | None = None
        self._owner: int | None = None
        self._started = 0.0
        self._ended_backend: float | None = None
        self.background: list[tuple[float, str, float]] = []
        self.calls: list[dict[str, list[float]]] = []

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            if self._call is not None and threading.get_ident() == self._owner:
                self._call[name].append(seconds)

    def engine_request(self, label: str, started: float, seconds: float) -> None:
        with self._lock:
            if self._call is not None and threading.get_ident() == self._owner:
                self._call[f"engine:{label}"].append(seconds)
            else:
                self.background.append((started, label, seconds))

    def begin_backend(self) -> None:
        with self._lock:
            self._owner = threading.get_ident()
            if self._call is not None:
                self._call["before backend"].append(time.perf_counter() - self._started)

    def end_backend(self) -> None:
        with self._lock:
            self._ended_backend = time.perf_counter()

    def append(self, seconds: float) -> None:
        """A durable append of the call's events (on whichever thread)."""
        with self._lock:
            if self._call is not None:
                self._call["durable writes (sum)"].append(seconds)
                self._call["durable writes (count)"].append(1.0)

    @contextmanager
    def call(self) -> Iterator[None]:
        with self._lock:
            self._call = defaultdict(list)
            self._owner = None
            self.background = []
            self._started = started = time.perf_counter()
            self._ended_backend = None
        try:
            yield
        finally:
            ended = time.perf_counter()
            with self._lock:
                record = self._call or defaultdict(list)
                record["e2e"].append(ended - started)
                if self._ended_backend is not None:
                    record["after backend"].append(ended - self._ended_backend)
                during = [(label, s) for t, label, s in self.background if started <= t <= ended]
                record["background requests"].append(float(len(during)))
                for label, seconds in during:
                    record[f"background:{label}"].append(seconds)
                self.calls.append(record)
                self._call = None


def _instrument(clock: StepClock, backend: Any, store: Any) -> None:
    """Wrap docker-py's request, the store's append, and the backend's run, claim and pump,
    with the clock."""
    original_append_all = store.append_all  # every append of the run's events goes through it

    def append_all(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original_append_all(*args, **kwargs)
        finally:
            clock.append(time.perf_counter() - started)

    store.append_all = append_all

    from docker.api.client import APIClient

    original_request = APIClient.request

    def request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original_request(self, method, url, *args, **kwargs)
        finally:
            path = _ID.sub("/ID", url.split("/v1.", 1)[-1].split("/", 1)[-1].split("?", 1)[0])
            clock.engine_request(f"{method} /{path}", started, time.perf_counter() - started)

    APIClient.request = request  # type: ignore[method-assign]

    original_run = backend.run

    def run(request_: Any) -> Any:
        clock.begin_backend()
        try:
            with clock.step("backend"):
                return original_run(request_)
        finally:
            clock.end_backend()

    backend.run = run
    pool = backend.pool
    original_claim = pool.claim

    def claim(*args: Any, **kwargs: Any) -> Any:
        with clock.step("claim"):
            return original_claim(*args, **kwargs)

    pool.claim = claim
    original_pump = backend._pump

    def pump(*args: Any, **kwargs: Any) -> Any:
        with clock.step("pump"):
            return original_pump(*args, **kwargs)

    backend._pump = pump


def report(calls: list[dict[str, list[float]]], floor: list[float]) -> str:
    totals: dict[str, list[float]] = defaultdict(list)
    totals["floor"] = list(floor)
    for record in calls:
        for name, values in record.items():
            totals[name].append(sum(values))
    for record in calls:
        if record.get("e2e") and record.get("backend"):
            totals["control (e2e - backend)"].append(sum(record["e2e"]) - sum(record["backend"]))
    order = ["floor", "e2e", "control (e2e - backend)", "before backend", "after backend", "durable writes (sum)",
             "durable writes (count)",
             "backend", "claim", "pump"]
    names = order + sorted(n for n in totals if n not in order)
    lines = [f"{'step':<48} {'calls':>5} {'p50':>9} {'p90':>9}"]
    for name in names:
        values = totals.get(name)
        if not values:
            continue
        counted = name in ("background requests", "durable writes (count)")
        scale = 1.0 if counted else 1000.0
        unit = "" if counted else " ms"
        p50, p90 = percentile(values, 50) * scale, percentile(values, 90) * scale
        lines.append(f"{name:<48} {len(values):>5} {p50:>7.1f}{unit:<3} {p90:>7.1f}{unit}")
    return "\n".join(lines)


def measure_floor(calls: int, profile: Any) -> list[float]:
    """bench_speed's floor: the exchange with a pre-started container (the first call warms caches)."""
    import docker

    from ringfence_server.sandbox.pinned_images import load_lock

    client = docker.from_env(timeout=120)
    try:
        return FloorRunner(BareRunner(client, load_lock().image_id("tool"), profile)).samples(calls)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--busy", action="store_true", help="back-to-back calls, no waiting for the refill")
    args = parser.parse_args(argv)

    from ringfence_server.sandbox.backend import SandboxRequest
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.pool import PoolSettings

    profile, _manifest = _echo_manifest_profile()
    floor = measure_floor(args.calls, profile)
    backend = DockerBackend(pool=PoolSettings(size=args.pool_size, max_size=max(args.pool_size, 8), idle_s=600))
    clock = StepClock()
    cp = None
    try:
        assert backend.pool is not None
        pool = backend.pool
        pool.prewarm(SandboxRequest(profile=profile, argv=(), stdin=b"", run_id="bench"))
        cp = ControlPlane(backend, {"max_concurrent_batches": 4})
        _instrument(clock, backend, cp.store)
        with cp.client() as client:
            submit_echo(client, cp.new_runs(client, 1, "steps-warmup")[0])
            runs = cp.new_runs(client, args.calls, "steps")
            for run_id in runs:
                if not args.busy:
                    pool.wait_filled(timeout_s=60)
                    time.sleep(0.2)  # the previous call's removal has been done, as in a quiet pool
                with clock.call():
                    submit_echo(client, run_id)
            for run_id in runs:
                client.finish_run(run_id)
        print(f"warm call steps ({args.calls} calls, pool size {args.pool_size}"
              f"{', back to back' if args.busy else ', pool full before each'}); pool {pool.stats()}")
        print(report(clock.calls, floor))
    finally:
        if cp is not None:
            cp.close()
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
