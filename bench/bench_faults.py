"""Load with faults: many concurrent runs against two `ringfence serve` instances on one
PostgreSQL, the instances killed (SIGKILL) and restarted while the load runs. Not a test: it
prints what happened, and the counts that must be zero.

Each client drives one run: turn after turn, a batch of an echo and a credit (unique amount and
account per turn, so every credit is a distinct effect); an approver client approves credits as
they come. When the instance under a client dies, the client sends the same batch (same batch
id) to the other instance. Afterwards:

    events written            events in the log of every run
    batches resent            batches a client had to send again after an instance died
    runs resumed              runs whose client lost an instance under it and went on on the other
    ledger duplicates         second deliveries at the receiver (replays) + records beyond the
                              credits observed executed: MUST be 0
    lost acknowledged         observations a client received that the final log does not hold
                              (or holds with another status): MUST be 0
    leaked containers         containers of any instance (dead or stopped) still present: MUST be 0

The same load without faults runs first, for a baseline in this run (turns per second); the
ratio is what to read on a shared machine.

    .venv/bin/python -m bench.bench_faults [--runs 50] [--seconds 60] [--kills 3]

It starts its own PostgreSQL cluster (Debian's binaries, `make postgres`) on 127.0.0.1, its own
ledger and proxy containers, and removes everything when it ends.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[1]
# The test harness's process and cluster helpers (a real `ringfence serve`, a real PostgreSQL).
sys.path.insert(0, str(ROOT / "tests"))

from ringfence import Client as RingfenceClient  # noqa: E402 - importable only after the sys.path insert above
from ringfence.errors import ControlError  # noqa: E402 - importable only after the sys.path insert above
from ringfence.model import ApprovalStatus, ObservationStatus  # noqa: E402 - importable only after the sys.path insert above
from ringfence_server.control.config import token_digest  # noqa: E402 - importable only after the sys.path insert above
from ringfence_server.control.state import fold  # noqa: E402 - importable only after the sys.path insert above
from ringfence_server.control.store import open_store  # noqa: E402 - importable only after the sys.path insert above
from ringfence_server.demo_services.ledger.container import LEDGER_HOST, Ledger  # noqa: E402 - importable only after the sys.path insert above
from ringfence_server.sandbox.pinned_images import load_lock  # noqa: E402 - importable only after the sys.path insert above

AGENT, APPROVER = "bench-agent-token", "bench-approver-token"


def _config(path: Path, ledger) -> None:
    address = ledger.services()[LEDGER_HOST][0]
    path.write_text(
        "[tenants.bench]\ntokens = [\n"
        f'  {{ sha256 = "{token_digest(AGENT)}", role = "agent", subject = "agent" }},\n'
        f'  {{ sha256 = "{token_digest(APPROVER)}", role = "approver", subject = "approver" }},\n]\n'
        "[limits]\nlease_ttl_s = 3\nmax_concurrent_batches = 64\nmax_turns = 100000\nmax_cost = 1000000\n"
        "run_deadline_s = 7200\n"
        '[policy]\nautonomy = "autonomous"\n'
        'rules = [{ tool = "echo", verdict = "allow" }, { tool = "credit", verdict = "allow" }]\n'
        f'[policy.egress]\ncredit = ["{LEDGER_HOST}"]\ncredit_lookup = ["{LEDGER_HOST}"]\n'
        f'[egress]\nservices = {{ "{LEDGER_HOST}" = ["{address}"] }}\nnetworks = ["{ledger.network}"]\n'
    )


class Cluster:
    """Two instances; kill(i) SIGKILLs one and starts a new one in its place."""

    def __init__(self, config: Path, state: Path, url: str) -> None:
        from serve_support import Served

        self._served = Served
        self.config, self.state, self.url = config, state, url
        self.servers = [self._start(i) for i in range(2)]
        self.pids: list[int] = [s.proc.pid for s in self.servers]
        self.lock = threading.Lock()

    def _start(self, i: int):
        return self._served(self.config, self.state / f"i{i}", "--database-url", self.url, "--reap-every", "2")

    def address(self, i: int) -> str:
        with self.lock:
            return self.servers[i % 2].address

    def kill_and_restart(self, i: int) -> None:
        with self.lock:
            old = self.servers[i]
        old.proc.kill()
        old.proc.wait(30)
        old.stop()
        new = self._start(i)
        with self.lock:
            self.servers[i] = new
            self.pids.append(new.proc.pid)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


class Client(threading.Thread):
    def __init__(self, n: int, cluster: Cluster, until: float) -> None:
        super().__init__(daemon=True)
        self.n, self.cluster, self.until = n, cluster, until
        self.run_id = f"load-{n}"
        self.turns = 0
        self.resent = 0
        self.failovers = 0  # RPCs that failed on a dying instance and went to the other
        self.acknowledged: dict[str, str] = {}  # call id -> status the client received
        self.errors: list[str] = []
        self.prefer = n % 2

    def _with_failover(self, fn):
        for attempt in range(60):
            try:
                with RingfenceClient(self.cluster.address(self.prefer), AGENT) as client:
                    return fn(client)
            except ControlError as e:
                self.failovers += 1
                if attempt:
                    time.sleep(0.2)
                self.prefer += 1
                last = e
        self.errors.append(repr(last))
        return None

    def run(self) -> None:
        if self._with_failover(lambda c: c.start_run("load with faults", self.run_id)) is None:
            return
        while time.monotonic() < self.until:
            turn = self.turns + 1
            batch = [{"call_id": f"e{turn}", "tool": "echo", "arguments": {"text": str(turn)}},
                     {"call_id": f"p{turn}", "tool": "credit",
                      "arguments": {"account": f"acme-{self.n}", "amount": turn}}]
            sends = [0]

            def submit(client, batch=batch, turn=turn, sends=sends):
                sends[0] += 1
                return client.submit_batch(self.run_id, batch, batch_id=f"t{turn}")

            observations = self._with_failover(submit)
            if observations is None:
                return
            self.resent += sends[0] - 1
            for o in observations:
                self.acknowledged[o.call_id] = o.status.value
            # Wait for the credit's approval (the approver thread) to be decided and dispatched.
            for _ in range(600):
                view = self._with_failover(lambda c: c.get_run(self.run_id))
                pay = {o.call_id: o for o in view.trajectory}.get(f"p{turn}") if view else None
                if pay is not None and pay.status is not ObservationStatus.PENDING_APPROVAL:
                    self.acknowledged[pay.call_id] = pay.status.value
                    break
                time.sleep(0.2)
            self.turns = turn
        self._with_failover(lambda c: c.finish_run(self.run_id))


class Approver(threading.Thread):
    def __init__(self, cluster: Cluster, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.cluster, self.stop, self.decided = cluster, stop, 0

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                with RingfenceClient(self.cluster.address(i), APPROVER) as approver:
                    for approval in approver.list_approvals():
                        if approval.status is ApprovalStatus.PENDING:
                            approver.decide_approval(approval.approval_id, True, "load")
                            self.decided += 1
            except ControlError:
                i += 1
            time.sleep(0.1)


def _phase(cluster: Cluster, runs: int, seconds: float, kills: int, prefix: str) -> dict:
    until = time.monotonic() + seconds
    clients = [Client(n, cluster, until) for n in range(runs)]
    for c in clients:
        c.run_id = f"{prefix}-{c.n}"
    stop = threading.Event()
    approver = Approver(cluster, stop)
    approver.start()
    started = time.monotonic()
    for c in clients:
        c.start()
    killed = 0
    if kills:
        interval = seconds / (kills + 1)
        for k in range(kills):
            time.sleep(max(0.0, started + interval * (k + 1) - time.monotonic()))
            print(f"   [{time.monotonic() - started:5.1f}s] killing instance {k % 2} (SIGKILL), restarting it",
                  flush=True)
            cluster.kill_and_restart(k % 2)
            killed += 1
    for c in clients:
        c.join(seconds + 120)
    stop.set()
    approver.join(10)
    elapsed = time.monotonic() - started
    return {"clients": clients, "elapsed": elapsed, "turns": sum(c.turns for c in clients), "killed": killed}


def _audit(url: str, phase: dict, ledger) -> dict:
    store = open_store(url)
    events = lost = executed_credits = 0
    try:
        for c in phase["clients"]:
            log = store.read(c.run_id)
            events += len(log)
            trajectory = {o.call_id: o for o in fold(log).view().trajectory}
            for call_id, status in c.acknowledged.items():
                final = trajectory.get(call_id)
                if final is None or (status != "pending_approval" and final.status.value != status):
                    lost += 1
            executed_credits += sum(1 for o in trajectory.values() if o.tool == "credit" and o.executed
                                    and o.error_class is None)
    finally:
        store.close()
    return {"events": events, "lost": lost, "executed_credits": executed_credits}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="concurrent runs (default 50)")
    parser.add_argument("--seconds", type=float, default=60, help="length of the faulty phase (default 60)")
    parser.add_argument("--baseline-seconds", type=float, default=20, help="length of the fault-free phase")
    parser.add_argument("--kills", type=int, default=3, help="instance kills during the faulty phase (default 3)")
    args = parser.parse_args(argv)

    import tempfile

    from pg_support import PgCluster, pg_bin_dir

    bin_dir = pg_bin_dir()
    if bin_dir is None:
        print("error: PostgreSQL's binaries are missing (run `make postgres`)", file=sys.stderr)
        return 1
    client = docker.from_env()
    pg = PgCluster(bin_dir, Path(tempfile.mkdtemp(prefix="ringfence-pg-")))
    cluster = None
    leaked = -1
    try:
        pg.start()
        url = pg.url(pg.create_database())
        with Ledger(client, lock=load_lock()) as ledger, tempfile.TemporaryDirectory(prefix="rf-bench-") as tmp:
            config = Path(tmp) / "ringfence.toml"
            _config(config, ledger)
            cluster = Cluster(config, Path(tmp), url)
            print(f"two instances on PostgreSQL, {args.runs} concurrent runs, approver approving credits")
            base = _phase(cluster, args.runs, args.baseline_seconds, 0, "base")
            print(f"baseline (no faults): {base['turns']} turns in {base['elapsed']:.1f}s", flush=True)
            faulty = _phase(cluster, args.runs, args.seconds, args.kills, "load")
            credits_before = ledger.stats()
            audit = _audit(url, faulty, ledger)
            base_audit = _audit(url, base, ledger)
            cluster.stop()
            leaked = sum(len(client.containers.list(all=True, filters={"label": f"ringfence.pid={pid}"}))
                         for pid in cluster.pids)
            stats = credits_before
            executed = audit["executed_credits"] + base_audit["executed_credits"]
            duplicates = stats["replays"] + max(0, stats["credits"] - executed)
            resumed = sum(1 for c in faulty["clients"] if c.failovers)
            report = {
                "runs": args.runs, "kills": faulty["killed"],
                "turns_baseline_per_s": round(base["turns"] / base["elapsed"], 2),
                "turns_faulty_per_s": round(faulty["turns"] / faulty["elapsed"], 2),
                "events_written": audit["events"] + base_audit["events"],
                "batches_resent": sum(c.resent for c in faulty["clients"]),
                "runs_resumed": resumed,
                "ledger_credits": stats["credits"], "credits_observed": executed,
                "ledger_duplicates": duplicates,
                "lost_acknowledged": audit["lost"] + base_audit["lost"],
                "leaked_containers": leaked,
                "client_errors": sum(len(c.errors) for c in faulty["clients"] + base["clients"]),
            }
            baseline = report["turns_baseline_per_s"]
            ratio = report["turns_faulty_per_s"] / baseline if baseline else 0
            print(json.dumps(report, indent=2))
            print(f"throughput with faults: x{ratio:.2f} of the fault-free baseline measured in this run")
            bad = report["ledger_duplicates"] or report["lost_acknowledged"] or report["leaked_containers"]
            return 1 if bad else 0
    finally:
        if cluster is not None:
            cluster.stop()
        pg.stop()
        client.close()


if __name__ == "__main__":
    sys.exit(main())
