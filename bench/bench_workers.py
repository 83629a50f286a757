"""Sandbox workers: throughput and latency of calls placed on 1, 2 and 3 `ringfence worker run`
processes, against the same calls run by `ringfence serve` on its own engine, in one run.

**Read this first.** Every process here shares this one machine (2 CPUs where `make bench` runs)
and this host's one Docker engine: the control plane, every worker, every container. More
workers therefore cannot be faster here, and the figures are not a speed-up curve. What they
show is (1) the cost of the extra hop a call on a worker takes (the envelope sealed and signed,
sent over the Attach stream, opened and admitted by the worker, its claim, start mark and result
written to the worker's SQLite results store, the result encoded, sent back and decoded), read
as the ratio to the `local` baseline measured in the same run, and (2) that the calls spread over
the workers and all come back executed. A real deployment puts each worker on its own host with
its own engine and CPUs; that is not measured here.

**The variants do not run the same number of containers at once.** `local` caps nothing: each
of the C clients' calls gets a container at once (C containers on 2 CPUs, plus the pool's
refills). A worker runs at most --slots calls at once (default: its host's CPUs, 2 here) and the
control plane holds the rest until a slot frees; so workers=K runs at most 2K at once. With
C > 2K the worker variants therefore contend less for this machine's CPUs than local does, and
can come out *faster* than local here: that is the cap, not the hop, and a ratio above 1 must
not be read as a speed-up from workers. To tell them apart each call's round trip is split in
two: `in sandbox` (its successful attempt's setup_ms + duration_ms: the container's claim or
start and the tool's run, as the sandbox on whichever engine measured them) and `outside` (the
rest: the control plane, the hop to the worker and back, the wait for a free slot, and the
engine work the sandbox's figures leave out: the inspect after the exit, the removal). Contention
shows in `in sandbox`. `outside` is not the hop alone either: for local it includes the cost of
driving C containers' streams and the pool from the control plane's own process beside its API
threads, work a worker takes out of that process; with workers it includes the wait for a slot.
For the hop's cost per call with neither queue nor contention in the way, run with --clients 1.

Every variant runs the same load: N `echo` calls (default 60) submitted by C concurrent clients
(default 6), each client its own run and its own connection, sending one-call SubmitBatches back
to back (client k takes calls k, k+C, k+2C, ...; each call its own text, since the same call
proposed twice in a run is a loop). The clients are released together (a barrier); wall time
from the release to the last answer gives calls/s, and each SubmitBatch's round trip a latency
sample (p50/p95).

    local        `ringfence serve` WITHOUT workers: the calls run on its own engine (DockerBackend,
                 the default warm pool: [pool] size 2, growing to 8 under demand). One warm-up
                 call (untimed) registers the echo shape with the pool.
    workers=K    `ringfence serve` with `[workers] enabled` and K `ringfence worker run` processes
                 (w1..wK) on the same engine, each with its defaults: --slots = this host's CPUs,
                 the warm pool (--pool-size 2, --pool-max 8). Timing starts only after every
                 worker logged "worker ID attached to" and ran at least one warm-up call
                 (untimed; sequential calls are placed round robin, and the warm-up goes on,
                 up to 4 per worker, until each worker's name is in an attempt event). The calls
                 are placed by the control plane (least loaded, then least recently given work);
                 a call waits for a free slot up to [workers] place_timeout_s, set to 60 s here
                 (default 10) so that a queue behind busy slots is a latency, not a failure.

Both kinds wait --settle seconds (default 2) after the warm-up, so the pools can refill. The
control planes share one config but for [workers]: the `echo` rule allows it, autonomy is
autonomous, limits.max_concurrent_batches is at least C (past it the edge refuses).

For each variant: calls/s, p50/p95/mean/max of a SubmitBatch in ms, the p50 of `in sandbox` and
of `outside`, the ratio to local (calls/s over local's calls/s; p50 over local's p50), and the
spread: calls per worker, read
back through the client's `list_events` from the runs' `attempt` events (their `worker` field;
`local` for an attempt without one, i.e. run on the control plane's own engine). Only attempts
that succeeded count in the spread, so it sums to the executed calls; attempts that failed
(retried or not) are counted apart (`failed_attempts`). Every call must come back EXECUTED with
its own text (an echo killed at its timeout comes back EXECUTED with an error: a failure too): a
call that does not is a failure, reported with its error, and the bench exits non-zero (so it
does for an error starting a variant, a process that exits non-zero when stopped, or anything
left behind).

Every variant gets a fresh directory (signing key pair from ringfence_server.worker.keys, worker
tokens from `ringfence worker token`, config, state dirs, logs) and fresh processes; each process
is stopped in a `finally` (SIGTERM, then SIGKILL after 60 s), workers before the control plane.
At the end the bench checks that none of its processes is alive and that no container labelled
`ringfence.product` with one of their pids (`ringfence.pid`) is left on the engine (removed and
reported if there is). The temporary directory is removed unless something failed (its path is
printed then; --keep-logs keeps it always).

Machines are shared and noisy (other people's tests may be running on the same engine): read
the ratios against the in-run local baseline, not the absolute numbers.

    .venv/bin/python -m bench.bench_workers [--calls 60] [--clients 6] [--workers 1,2,3]
                                            [--settle 2] [--out bench/results] [--quick] [--keep-logs]

--quick: 12 calls, 3 clients, workers 1,2 (for the test). Writes OUT/workers.json and
OUT/workers.md; prints the table. Nothing is asserted about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
AGENT_TOKEN = "demo-agent-token"  # the embedded defaults' dev tenant (a config without [tenants] keeps it)
LOCAL = "local"
ATTACHED = "attached to"
PLACE_TIMEOUT_S = 60.0
STOP_WAIT_S = 60.0
CAVEAT = ("all workers share this {cpus}-CPU machine and its one Docker engine with the control plane, so more "
          "workers cannot be faster here: the figures show the cost of the extra hop (sealing, the Attach "
          "stream, the worker's admission and results store) and that the calls spread and all succeed, "
          "not a speed-up")
CONCURRENCY = ("local has no cap on containers at once (each client's call starts one at once), a worker runs at "
               "most --slots (= CPUs) calls at once and the rest wait at the control plane: with more clients than "
               "slots, local's containers contend for the CPUs and its calls take longer inside the sandbox. "
               "'in sandbox' is setup_ms + duration_ms of the call's attempt; 'outside' the rest of the round "
               "trip (the control plane, the hop, a wait for a slot; for local also driving the containers from "
               "the control plane's own process). --clients 1 shows the hop's cost without either queue")


# ----------------------------------------------------------------------------- pure parts

def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default)."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    k = (len(ordered) - 1) * q / 100
    low = math.floor(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def latency_summary(samples_s: Sequence[float]) -> dict[str, float | None]:
    ms = [s * 1000 for s in samples_s]
    if not ms:
        return {"p50_ms": None, "p95_ms": None, "mean_ms": None, "max_ms": None}
    return {"p50_ms": round(percentile(ms, 50), 1), "p95_ms": round(percentile(ms, 95), 1),
            "mean_ms": round(sum(ms) / len(ms), 1), "max_ms": round(max(ms), 1)}


def spread_of(attempts: Sequence[dict[str, Any]]) -> tuple[dict[str, int], int]:
    """(successful attempts per worker, failed attempts) of `attempt` events' data; an attempt
    without a worker ran on the control plane's own engine (LOCAL)."""
    ok: Counter[str] = Counter()
    failed = 0
    for a in attempts:
        if a.get("failure_class"):
            failed += 1
        else:
            ok[a.get("worker") or LOCAL] += 1
    return dict(sorted(ok.items())), failed


def split_time(latency_s: Mapping[tuple[str, str], float],
               attempts: Sequence[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """(in_sandbox_ms, outside_ms) per call: its successful attempt's setup_ms + duration_ms (the
    container's claim or start and the tool's run, as the sandbox measured them, on whichever
    engine ran it), and the rest of its SubmitBatch round trip (the control plane, the hop to a
    worker and back, a wait for a free slot, earlier failed attempts). Calls without a
    successful attempt or without both figures are left out."""
    inside, outside = [], []
    for a in attempts:
        took = latency_s.get((a.get("run_id", ""), a.get("call_id", "")))
        setup, duration = a.get("setup_ms"), a.get("duration_ms")
        if a.get("failure_class") or took is None or setup is None or duration is None:
            continue
        inside.append(float(setup) + float(duration))
        outside.append(took * 1000 - inside[-1])
    return inside, outside


def _p50(ms: Sequence[float]) -> float | None:
    return round(percentile(ms, 50), 1) if ms else None


def variant_name(workers: int) -> str:
    return LOCAL if workers == 0 else f"workers={workers}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def add_ratios(variants: list[dict[str, Any]]) -> None:
    """Each variant's calls/s and p50 over local's (None without a local figure)."""
    local = next((v for v in variants if v["name"] == LOCAL), {})
    for v in variants:
        v["ratio_to_local"] = _ratio(v.get("calls_per_s"), local.get("calls_per_s"))
        v["p50_ratio_to_local"] = _ratio(v.get("p50_ms"), local.get("p50_ms"))


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


HEADER = ("variant", "calls/s", "p50 ms", "p95 ms", "in sandbox p50", "outside p50", "x local (calls/s)",
          "x local (p50)", "executed", "spread")


def rows(results: dict[str, Any]) -> list[list[str]]:
    out = []
    for v in results["variants"]:
        spread = " ".join(f"{w}:{n}" for w, n in (v.get("spread") or {}).items()) or "-"
        if v.get("failed_attempts"):
            spread += f" (+{v['failed_attempts']} failed attempts)"
        executed = f"{v.get('executed', 0)}/{v.get('calls', '?')}"
        if v.get("error"):
            executed += " ERROR"
        out.append([v["name"], _fmt(v.get("calls_per_s"), 2), _fmt(v.get("p50_ms")), _fmt(v.get("p95_ms")),
                    _fmt(v.get("in_sandbox_p50_ms")), _fmt(v.get("outside_p50_ms")),
                    "-" if v.get("ratio_to_local") is None else f"x{v['ratio_to_local']:.2f}",
                    "-" if v.get("p50_ratio_to_local") is None else f"x{v['p50_ratio_to_local']:.2f}",
                    executed, spread])
    return out


def _text_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body, strict=True)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in body])


def _markdown_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def _detail_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    for v in results["variants"]:
        for f in v.get("failures") or []:
            lines.append(f"failed call in {v['name']}: {f}")
        if v.get("error"):
            lines.append(f"error in {v['name']}: {v['error']}")
        if v.get("exit_codes") and any(c != 0 for c in v["exit_codes"].values()):
            lines.append(f"exit codes in {v['name']}: {json.dumps(v['exit_codes'], sort_keys=True)}")
    for what in ("leftover_processes", "leftover_containers"):
        if results.get(what):
            lines.append(f"{what.replace('_', ' ')}: {results[what]}")
    for note in results.get("notes") or []:
        lines.append(f"note: {note}")
    return lines


def render_text(results: dict[str, Any]) -> str:
    a = results["args"]
    parts = [f"sandbox workers: {a['calls']} echo calls by {a['clients']} clients per variant "
             "(each client its own run, one-call SubmitBatches back to back)",
             _text_table(HEADER, rows(results)), "",
             "NOTE: " + results["caveat"] + ".",
             "NOTE: " + results["concurrency_note"] + ".",
             f"failed calls: {results['failed_calls']}; leftover processes: {len(results['leftover_processes'])}; "
             f"leftover containers: {len(results['leftover_containers'])}"]
    return "\n".join(parts + _detail_lines(results))


def render_markdown(results: dict[str, Any]) -> str:
    m, a = results["machine"], results["args"]
    parts = ["# ringfence sandbox workers benchmark", "",
             f"Measured {results['when']} on {m.get('cpus', '?')} CPUs, Docker {m.get('docker_version', '?')}, "
             f"kernel {m.get('kernel', '?')} (load {m.get('loadavg')} at the start, {m.get('loadavg_end')} at "
             f"the end). {a['calls']} `echo` calls by {a['clients']} concurrent clients per variant, each "
             "client its own run, one-call SubmitBatches back to back.", "",
             f"**{results['caveat'][0].upper()}{results['caveat'][1:]}.**", "",
             f"{results['concurrency_note'][0].upper()}{results['concurrency_note'][1:]}.", "",
             _markdown_table(HEADER, rows(results)), "",
             "Latencies in ms, of one SubmitBatch round trip. `x local`: the variant's calls/s (p50) over the local "
             "baseline's, measured in the same run. Spread: successful attempts per worker, from the runs' "
             "`attempt` events.", ""]
    details = _detail_lines(results)
    if details:
        parts += ["## Details", "", "```", *details, "```", ""]
    return "\n".join(parts)


def write_results(results: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "workers.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    (out_dir / "workers.md").write_text(render_markdown(results))


# ----------------------------------------------------------------------------- processes

class Process:
    """A `ringfence` command as a real process, its stdout and stderr in one log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", *argv], cwd=ROOT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log,
                                         stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, find: Callable[[str], str | None], what: str, timeout_s: float) -> str:
        """What `find` returns for the log, once not None; RuntimeError if the process exits or
        `timeout_s` passes first."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = find(self.log())
            if found is not None:
                return found
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode} before {what}: {self.log()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no {what} in {timeout_s:g} s: {self.log()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it has not exited after STOP_WAIT_S; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return self.proc.returncode
        finally:
            if self.proc.poll() is None:  # an exception while waiting: never leave it running
                self.proc.kill()
                self.proc.wait(10)


def _containing(text: str) -> Callable[[str], str | None]:
    """For Process.wait_for: `text`, once the log holds it."""
    return lambda log: text if text in log else None


def _serving_address(log: str) -> str | None:
    for line in log.splitlines():
        if line.startswith("ringfence: serving") and " on " in line:
            return line.split(" on ", 1)[1].split()[0]
    return None


class Deployment:
    """One variant's files: the config, and with workers the signing key pair and a token per
    worker. Nothing runs until `serve` and `worker`."""

    def __init__(self, root: Path, worker_ids: Sequence[str], clients: int) -> None:
        from ringfence_server.worker import keys

        self.root = root
        root.mkdir(parents=True)
        self.tokens: dict[str, Path] = {}
        self.trusted = root / "trusted"
        workers = ""
        if worker_ids:
            private = keys.generate_private_key()
            signing_key = root / "signing-key.pem"
            keys.save_private_key(private, signing_key)
            self.trusted.mkdir()
            keys.save_public_key(private.public_key(), self.trusted / "control-plane.pem")
            digests = []
            for worker_id in worker_ids:
                token = root / f"{worker_id}.token"
                out = subprocess.run([sys.executable, "-m", "ringfence.cli", "worker", "token", worker_id,
                                      "--out", str(token)], capture_output=True, text=True, check=True, cwd=ROOT)
                # It prints the line for [workers]: tokens.ID = "DIGEST"
                digests.append(f'{worker_id} = "{out.stdout.strip().split(chr(34))[1]}"')
                self.tokens[worker_id] = token
            workers = (f'\n[workers]\nenabled = true\nsigning_key = "{signing_key}"\n'
                       f"place_timeout_s = {PLACE_TIMEOUT_S}\n\n[workers.tokens]\n" + "\n".join(digests) + "\n")
        self.config = root / "ringfence.toml"
        self.config.write_text(f"""[policy]
autonomy = "autonomous"

[[policy.rules]]
tool = "echo"
verdict = "allow"

[limits]
max_concurrent_batches = {max(32, clients)}
{workers}""")

    def serve(self) -> Process:
        state = self.root / "state-cp"
        state.mkdir()
        return Process("ringfence serve", ["serve", "--listen", "127.0.0.1:0", "--config", str(self.config),
                                           "--state-dir", str(state)], self.root / "serve.log")

    def worker(self, worker_id: str, address: str) -> Process:
        return Process(f"worker {worker_id}",
                       ["worker", "run", "--id", worker_id, "--token-file", str(self.tokens[worker_id]),
                        "--trusted-keys", str(self.trusted), "--state-dir", str(self.root / f"state-{worker_id}"),
                        "--control-plane", address], self.root / f"worker-{worker_id}.log")


# ----------------------------------------------------------------------------- the load

@dataclass
class Load:
    """What one load gave: the wall time, every SubmitBatch's latency, the failed calls, the runs."""

    wall_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    by_call: dict[tuple[str, str], float] = field(default_factory=dict)
    executed: int = 0
    failures: list[str] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)


def _client(address: str) -> Any:
    from ringfence import Client

    return Client(address, AGENT_TOKEN, timeout=300)


def _echo(client: Any, run_id: str, call_id: str, text: str) -> str | None:
    """One one-call SubmitBatch of echo; None when it came back executed with its text, else why not."""
    from ringfence.model import ObservationStatus

    try:
        [o] = client.submit_batch(run_id, [{"call_id": call_id, "tool": "echo", "arguments": {"text": text}}])
    except Exception as e:  # noqa: BLE001 - a failed call is counted and reported, not raised
        return f"{call_id}: {type(e).__name__}: {e}"
    if o.status is not ObservationStatus.EXECUTED or o.content != {"text": text}:
        return f"{call_id}: {o.status.value}: {o.error_class or ''} {o.error or o.content!r}"
    return None


def run_load(address: str, calls: int, clients: int, tag: str) -> Load:
    """`calls` echo calls by `clients` threads, each with its own client and run, released
    together; client k sends calls k, k+clients, ... one after another."""
    load = Load()
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    setup_errors: list[str] = []

    def body(k: int) -> None:
        client = None
        try:
            client = _client(address)
            run_id = client.start_run(f"bench workers {tag}", f"{tag}-c{k}").run_id
            with lock:
                load.run_ids.append(run_id)
        except Exception as e:  # noqa: BLE001 - reported below, after the barrier
            with lock:
                setup_errors.append(f"client {k}: {type(e).__name__}: {e}")
            run_id = ""
        try:
            barrier.wait()
            if not run_id or client is None:
                return
            for i in range(k, calls, clients):
                started = time.perf_counter()
                failure = _echo(client, run_id, f"e{i}", f"{tag} call {i}")
                took = time.perf_counter() - started
                with lock:
                    load.latencies_s.append(took)
                    load.by_call[(run_id, f"e{i}")] = took
                    if failure is None:
                        load.executed += 1
                    else:
                        load.failures.append(failure)
        finally:
            if client is not None:
                client.close()

    threads = [threading.Thread(target=body, args=(k,), name=f"bench-client-{k}", daemon=True)
               for k in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    load.wall_s = time.perf_counter() - started
    if setup_errors:
        raise RuntimeError("clients could not start their runs: " + "; ".join(setup_errors))
    return load


def attempts_of(address: str, run_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The data of every `attempt` event of the runs (with its `run_id`), read through the
    client's list_events."""
    out: list[dict[str, Any]] = []
    with _client(address) as client:
        for run_id in run_ids:
            seq = 0
            while True:
                page = client.list_events(run_id, seq, page_size=1000)
                out += [{**e.data, "run_id": run_id} for e in page.events if e.type == "attempt"]
                if not page.next_seq:
                    break
                seq = page.next_seq
    return out


def warm_up(address: str, worker_ids: Sequence[str]) -> dict[str, int]:
    """Untimed: one call, or with workers sequential calls until each has run one (up to 4 per
    worker); the calls each ran, by worker. RuntimeError if a call fails or a worker got none."""
    wanted = set(worker_ids) or {LOCAL}
    with _client(address) as client:
        run_id = client.start_run("bench workers warm-up", f"warmup-{os.getpid()}-{time.monotonic_ns()}").run_id
        ran: dict[str, int] = {}
        for i in range(4 * len(wanted)):
            failure = _echo(client, run_id, f"w{i}", f"warm-up {i}")
            if failure is not None:
                raise RuntimeError(f"a warm-up call failed: {failure}")
            ran, _ = spread_of(attempts_of(address, [run_id]))
            if wanted <= set(ran):
                break
        client.finish_run(run_id)
    if not wanted <= set(ran):
        raise RuntimeError(f"warm-up: {sorted(wanted - set(ran))} ran no call in {4 * len(wanted)} ({ran})")
    return ran


# ----------------------------------------------------------------------------- a variant

def measure_variant(workers: int, args: argparse.Namespace, root: Path, started: list[Process]) -> dict[str, Any]:
    """One variant on fresh processes (appended to `started` as they start, for the final check),
    all stopped before it returns, whatever happened."""
    name = variant_name(workers)
    worker_ids = [f"w{i}" for i in range(1, workers + 1)]
    result: dict[str, Any] = {"name": name, "workers": workers, "calls": args.calls, "clients": args.clients,
                              "executed": 0, "failed": 0, "failures": [], "spread": {}, "failed_attempts": 0}
    serve: Process | None = None
    running: list[Process] = []
    codes: dict[str, int] = {}
    try:
        deployment = Deployment(root / name.replace("=", "-"), worker_ids, args.clients)
        serve = deployment.serve()
        started.append(serve)
        address = serve.wait_for(_serving_address, "'ringfence: serving' line", 60)
        for worker_id in worker_ids:
            w = deployment.worker(worker_id, address)
            started.append(w)
            running.append(w)
        for worker_id, w in zip(worker_ids, running, strict=True):
            line = f"worker {worker_id} {ATTACHED}"
            w.wait_for(_containing(line), repr(line), 120)
        result["warmup"] = warm_up(address, worker_ids)
        time.sleep(args.settle)
        tag = f"{name.replace('=', '')}-{os.getpid()}-{time.monotonic_ns()}"
        load = run_load(address, args.calls, args.clients, tag)
        attempts = attempts_of(address, load.run_ids)
        spread, failed_attempts = spread_of(attempts)
        inside, outside = split_time(load.by_call, attempts)
        result.update(latency_summary(load.latencies_s))
        result.update({"in_sandbox_p50_ms": _p50(inside), "outside_p50_ms": _p50(outside)})
        result.update({
            "wall_s": round(load.wall_s, 3),
            "calls_per_s": round(args.calls / load.wall_s, 3) if load.wall_s else None,
            "executed": load.executed, "failed": len(load.failures), "failures": load.failures[:20],
            "spread": spread, "failed_attempts": failed_attempts, "attempts": len(attempts),
            "latencies_ms": [round(s * 1000, 1) for s in load.latencies_s],
        })
        with _client(address) as client:
            for run_id in load.run_ids:
                with contextlib.suppress(Exception):  # bookkeeping after the measurement only
                    client.finish_run(run_id)
    except Exception as e:  # noqa: BLE001 - one failed variant is reported; the others still run
        result["error"] = f"{type(e).__name__}: {e}"
        result["failed"] = max(result["failed"], args.calls - result["executed"])
    finally:
        # Workers first (each kills its sandboxes, drains, empties its pool), then the control plane.
        for w in running:
            codes[w.name] = w.stop()
        if serve is not None:
            codes[serve.name] = serve.stop()
    result["exit_codes"] = codes
    return result


# ----------------------------------------------------------------------------- the checks

def leftover_processes(started: Sequence[Process]) -> list[str]:
    return [f"{p.name} (pid {p.pid})" for p in started if p.proc.poll() is None]


def leftover_containers(pids: set[int]) -> list[str]:
    """Containers labelled ringfence.product left by one of `pids` (removed now)."""
    import docker

    from ringfence_server.sandbox import labels as L

    client = docker.from_env(timeout=60)
    try:
        left = []
        for c in client.containers.list(all=True, filters={"label": L.PRODUCT_LABEL}):
            if c.labels.get(L.PID_LABEL, "").isdigit() and int(c.labels[L.PID_LABEL]) in pids:
                left.append(f"{c.name} ({c.labels.get(L.PURPOSE_LABEL)}, pid {c.labels[L.PID_LABEL]})")
                with contextlib.suppress(Exception):  # gone meanwhile
                    c.remove(force=True)
        return left
    finally:
        client.close()


def machine() -> dict[str, Any]:
    try:
        import docker

        client = docker.from_env(timeout=30)
        try:
            version = client.version().get("Version")
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - the report only notes the version when it can
        version = None
    return {"cpus": os.cpu_count(), "docker_version": version, "kernel": platform.release(),
            "python": platform.python_version(), "loadavg": [round(x, 2) for x in os.getloadavg()]}


# ----------------------------------------------------------------------------- main

def _worker_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of worker counts, e.g. 1,2,3") from None
    if not counts or any(not 1 <= n <= 16 for n in counts):
        raise argparse.ArgumentTypeError("worker counts are 1 to 16")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_workers", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=None, help="echo calls per variant (default 60; --quick 12)")
    parser.add_argument("--clients", type=int, default=None, help="concurrent clients (default 6; --quick 3)")
    parser.add_argument("--workers", type=_worker_counts, default=None,
                        help="worker counts to measure, comma-separated (default 1,2,3; --quick 1,2)")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds to wait after the warm-up, for the pools to refill (default 2)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results",
                        help="where workers.json and workers.md go (default bench/results)")
    parser.add_argument("--quick", action="store_true", help="12 calls, 3 clients, workers 1,2 (for a test)")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the processes' directory (logs, configs) even when all went well")
    args = parser.parse_args(argv)
    args.calls = args.calls if args.calls is not None else (12 if args.quick else 60)
    args.clients = args.clients if args.clients is not None else (3 if args.quick else 6)
    args.workers = args.workers if args.workers is not None else ([1, 2] if args.quick else [1, 2, 3])
    if args.calls < 1 or args.clients < 1:
        parser.error("--calls and --clients must be at least 1")

    info = machine()
    caveat = CAVEAT.format(cpus=info["cpus"])
    print(f"sandbox workers: {args.calls} echo calls by {args.clients} clients; variants local, "
          f"{', '.join(variant_name(n) for n in args.workers)}; {info['cpus']} CPUs, Docker "
          f"{info['docker_version']}, load {info['loadavg']}", flush=True)
    print(f"NOTE: {caveat}.", flush=True)
    print(f"NOTE: {CONCURRENCY}.", flush=True)
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="rf-bench-workers-"))
    started: list[Process] = []
    variants: list[dict[str, Any]] = []
    try:
        for n in [0, *args.workers]:
            print(f"-- {variant_name(n)}", flush=True)
            v = measure_variant(n, args, root, started)
            variants.append(v)
            if v.get("error"):
                print(f"   FAILED: {v['error']}", flush=True)
            else:
                print(f"   {v['calls_per_s']:.2f} calls/s, p50 {v['p50_ms']:.0f} ms, p95 {v['p95_ms']:.0f} ms, "
                      f"{v['executed']}/{v['calls']} executed, spread {v['spread']}", flush=True)
    finally:
        for p in started:  # each was stopped by its variant; this only catches an interruption
            if p.proc.poll() is None:
                p.stop()
        left_processes = leftover_processes(started)
        left_containers = leftover_containers({p.pid for p in started})
    add_ratios(variants)
    failed_calls = sum(v["failed"] for v in variants)
    bad_exits = [f"{v['name']}: {name} exited {code}" for v in variants
                 for name, code in v.get("exit_codes", {}).items() if code != 0]
    ok = not (failed_calls or bad_exits or left_processes or left_containers or any(v.get("error") for v in variants))
    info["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    results: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - began, 1),
        "machine": info,
        "args": {"calls": args.calls, "clients": args.clients, "workers": args.workers, "settle": args.settle,
                 "quick": args.quick, "place_timeout_s": PLACE_TIMEOUT_S},
        "caveat": caveat,
        "concurrency_note": CONCURRENCY,
        "variants": variants,
        "failed_calls": failed_calls,
        "leftover_processes": left_processes,
        "leftover_containers": left_containers,
        "notes": bad_exits,
        "ok": ok,
    }
    if ok and not args.keep_logs:
        shutil.rmtree(root, ignore_errors=True)
    else:
        results["notes"].append(f"the processes' logs are kept in {root}")
    write_results(results, args.out)
    print()
    print(render_text(results))
    print(f"\nwrote {args.out / 'workers.json'}, workers.md ({results['seconds']:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
