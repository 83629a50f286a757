"""Fairness: tenant B's GetRun latency idle, and while tenant A bursts 1,000 concurrent StartRuns.

A real `ringfence serve` process on loopback (SQLite event log in a temporary directory, the
warm pool off, so no container is started: StartRun and GetRun never reach the sandbox), with
two tenants, `alpha` (A) and `beta` (B), one agent token each.

    idle     B's GetRun of one of its runs, one after another, with nothing else running: the
             in-run baseline.
    burst    A (its own process, one channel, grpc.aio) runs 1,000 agents at once, each starting
             runs one after another for --seconds, so A keeps up to 1,000 StartRuns in flight
             the whole window. A refused StartRun (RESOURCE_EXHAUSTED, "retry later") is sent
             again: in mode `backoff` after 0.1 s doubling to 2 s (how the SDK retries), in
             mode `flood` after 10-50 ms every time (an adversary). B meanwhile, on one thread:
             20 GetRuns one after another (the latency samples), then a volley of 100
             concurrent GetRuns (the refusals), and again, until A stops; only B's calls
             answered inside the window count.

It prints B's p50/p95 idle and in each burst, the ratio of the p50s (burst / idle), B's
refusals (a fair server refuses none: B is far below its own limits), and what A got back
(started, refused and sent again, other errors). Machines are shared and noisy: read the
ratios, not the absolute numbers.

    .venv/bin/python -m bench.bench_fairness [--burst 1000] [--seconds 10] [--modes backoff,flood]
                                             [--idle-samples 200]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
A_TOKEN = "bench-alpha-agent-token"
B_TOKEN = "bench-beta-agent-token"
B_RUN = "beta-probe"
VOLLEY = 100
PROBES_PER_VOLLEY = 20


def _config(path: Path) -> None:
    lines = []
    for tenant, token in (("alpha", A_TOKEN), ("beta", B_TOKEN)):
        digest = hashlib.sha256(token.encode()).hexdigest()
        lines += [f"[tenants.{tenant}]",
                  f'tokens = [{{ sha256 = "{digest}", role = "agent", subject = "{tenant}-agent" }}]', ""]
    lines += ["[pool]", "size = 0", ""]
    path.write_text("\n".join(lines))


class Server:
    """`ringfence serve` on 127.0.0.1:0; its address read from its first line."""

    def __init__(self, config: Path, state: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ringfence.cli", "serve", "--listen", "127.0.0.1:0", "--config", str(config),
             "--state-dir", str(state)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.address = ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ringfence: serving"):
                self.address = line.split(" on ", 1)[1].split()[0]
                break
        if not self.address:
            self.stop()
            raise RuntimeError("ringfence serve printed no address")
        # Keep reading so a full pipe never blocks the server.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# ------------------------------------------------------------------ A: the burst (a child process)

def _pause(mode: str, refusals: int) -> float:
    """Seconds an agent of A waits before sending a refused StartRun again."""
    if mode == "flood":  # an adversary: again at once, whatever the server says
        return random.uniform(0.01, 0.05)
    # "retry later" taken as the SDK's RetryPolicy takes UNAVAILABLE: 0.1 s doubling to 2 s,
    # plus up to 0.1 s of jitter.
    return min(0.1 * 2 ** (refusals - 1), 2.0) + random.uniform(0, 0.1)


async def _burst(address: str, count: int, seconds: float, mode: str) -> dict[str, Any]:
    import grpc

    from ringfence.v1 import runs_pb2, runs_pb2_grpc

    outcomes: Counter[str] = Counter()
    md = (("authorization", f"Bearer {A_TOKEN}"),)
    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        stub = runs_pb2_grpc.RunServiceStub(channel)
        deadline = time.monotonic() + seconds

        async def agent(i: int) -> None:
            n = refusals = 0
            while time.monotonic() < deadline:
                request = runs_pb2.StartRunRequest(goal="burst", run_id=f"alpha-{i}-{n}")
                try:
                    await stub.StartRun(request, metadata=md, timeout=60)
                except grpc.aio.AioRpcError as e:
                    if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        outcomes[f"error {e.code().name}"] += 1
                        return
                    outcomes["refused, sent again"] += 1
                    refusals += 1
                    await asyncio.sleep(_pause(mode, refusals))
                else:
                    outcomes["started"] += 1
                    n += 1
                    refusals = 0

        tasks = [asyncio.create_task(agent(i)) for i in range(count)]
        await asyncio.sleep(0)  # every first call is on the wire before we say so
        print("fired", flush=True)
        started = time.monotonic()
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started
    return {"outcomes": dict(outcomes), "elapsed_s": round(elapsed, 3)}


def _burst_child(address: str, count: int, seconds: float, mode: str) -> int:
    summary = asyncio.run(_burst(address, count, seconds, mode))
    print("done " + json.dumps(summary), flush=True)
    return 0


# ------------------------------------------------------------------ B: the probe (this process)

def _get_run(stub: Any, request: Any, md: Any) -> tuple[float, str]:
    import grpc

    started = time.perf_counter()
    try:
        stub.GetRun(request, metadata=md, timeout=60)
        code = "OK"
    except grpc.RpcError as e:
        code = e.code().name
    return time.perf_counter() - started, code


def _p(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] * 1000


def _phase(address: str, stub: Any, request: Any, md: Any, burst: int, seconds: float,
           mode: str) -> dict[str, Any]:
    """B's probes while A's burst (a child process) runs."""
    import grpc

    child = subprocess.Popen(
        [sys.executable, "-m", "bench.bench_fairness", "--burst-child", address, "--burst", str(burst),
         "--seconds", str(seconds), "--mode", mode],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert child.stdout is not None
        fired = threading.Event()
        finished = threading.Event()
        summary: dict[str, Any] = {}

        def follow(out: Any) -> None:
            for line in out:
                if line.startswith("fired"):
                    fired.set()
                elif line.startswith("done "):
                    summary.update(json.loads(line[5:]))
            finished.set()
            fired.set()

        threading.Thread(target=follow, args=(child.stdout,), daemon=True).start()
        fired.wait(60)
        busy: list[tuple[float, str]] = []
        volley: Counter[str] = Counter()
        while not finished.is_set():
            # One thread, so B never queues behind its own calls: GetRuns one after another
            # (the latency), then a volley of concurrent ones (the refusals), and again.
            for _ in range(PROBES_PER_VOLLEY):
                sample = _get_run(stub, request, md)
                if finished.is_set():  # answered after the burst ended: not a burst sample
                    break
                busy.append(sample)
            if finished.is_set():
                break
            futures = [stub.GetRun.future(request, metadata=md, timeout=60) for _ in range(VOLLEY)]
            for f in futures:
                try:
                    f.result()
                    volley["OK"] += 1
                except grpc.RpcError as e:
                    volley[e.code().name] += 1
        child.wait(seconds + 60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    return {"samples": busy, "volley": dict(volley), "a": summary}


def run(burst: int, idle_samples: int, seconds: float, modes: tuple[str, ...]) -> dict[str, Any]:
    """The idle baseline, then one burst per mode, on one server."""
    import grpc

    from ringfence.v1 import runs_pb2, runs_pb2_grpc

    with tempfile.TemporaryDirectory(prefix="rf-bench-fair-") as tmp:
        config = Path(tmp) / "ringfence.toml"
        _config(config)
        server = Server(config, Path(tmp) / "state")
        try:
            with grpc.insecure_channel(server.address) as channel:
                stub = runs_pb2_grpc.RunServiceStub(channel)
                md = (("authorization", f"Bearer {B_TOKEN}"),)
                stub.StartRun(runs_pb2.StartRunRequest(goal="probe", run_id=B_RUN), metadata=md, timeout=60)
                request = runs_pb2.GetRunRequest(run_id=B_RUN)
                for _ in range(20):  # warm up the channel and the server's caches
                    _get_run(stub, request, md)
                idle = [_get_run(stub, request, md) for _ in range(idle_samples)]
                phases = {mode: _phase(server.address, stub, request, md, burst, seconds, mode) for mode in modes}
        finally:
            server.stop()
    return {"idle": idle, "phases": phases}


def _line(name: str, samples: list[tuple[float, str]], idle_p50: float | None = None) -> str:
    ok = [s for s, code in samples if code == "OK"]
    refused = len(samples) - len(ok)
    if not ok:
        return f"  {name:<8} no GetRun of B answered ({refused} refused)"
    text = f"  {name:<8} p50 {_p(ok, 50):8.2f} ms  p95 {_p(ok, 95):8.2f} ms  n={len(ok)}"
    if idle_p50:
        text += f"  p50 x{_p(ok, 50) / idle_p50:.2f} of idle"
    return text + (f"  ({refused} refused)" if refused else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_fairness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, default=1000,
                        help="A's concurrent agents, each with one StartRun in flight (default 1000)")
    parser.add_argument("--idle-samples", type=int, default=200, help="B's GetRuns in the idle phase (default 200)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long A's agents keep starting runs (default 10)")
    parser.add_argument("--modes", default="backoff,flood",
                        help="how A sends a refused StartRun again: backoff (0.1 s doubling to 2 s, as the "
                             "SDK retries), flood (after 10-50 ms, always); comma-separated (default both)")
    parser.add_argument("--burst-child", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="backoff", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.burst_child:
        return _burst_child(args.burst_child, args.burst, args.seconds, args.mode)
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or set(modes) - {"backoff", "flood"}:
        parser.error("--modes: backoff, flood or both")
    r = run(args.burst, args.idle_samples, args.seconds, modes)
    print(f"tenant B's GetRun while tenant A's {args.burst} concurrent agents start runs for {args.seconds:g} s "
          "(ringfence serve, SQLite, loopback)")
    idle_ok = [s for s, code in r["idle"] if code == "OK"]
    print(_line("idle", r["idle"]))
    for mode, phase in r["phases"].items():
        print(_line(mode, phase["samples"], _p(idle_ok, 50) if idle_ok else None))
        volley = phase["volley"]
        sent = sum(volley.values())
        print(f"           B's volleys of {VOLLEY} concurrent GetRuns: {sent - volley.get('OK', 0)} of {sent} refused "
              f"{volley}")
        print(f"           A: {phase['a'].get('outcomes')} in {phase['a'].get('elapsed_s')} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
