"""A deployment of control planes and sandbox workers as real processes, for the end-to-end
tests: `ringfence serve` with `[workers] enabled` (serve_support.Served) and `ringfence worker
run` processes, each worker on the Docker engine it is given (the host's, or an engine of the
test's own: tests/engine_farm.py), all started by the test and stopped (or killed) by it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from serve_support import Served

from ringfence_server.worker import keys

ROOT = Path(__file__).resolve().parents[1]
AGENT = "demo-agent-token"  # the embedded defaults' dev tenant (a config without [tenants] keeps it)

RULES = ("echo", "write_note", "sleep", "fail")


class Deployment:
    """The files a control plane and its workers need: a signing key pair, a token per worker and
    a config. Nothing runs until `serve` and `worker`."""

    def __init__(self, root: Path, worker_ids: Sequence[str], *, database_url: str = "", lease_s: float = 4.0,
                 heartbeat_s: float = 0.5, place_timeout_s: float = 20.0) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        private = keys.generate_private_key()
        self.signing_key = root / "signing-key.pem"
        keys.save_private_key(private, self.signing_key)
        self.trusted = root / "trusted"
        self.trusted.mkdir()
        keys.save_public_key(private.public_key(), self.trusted / "control-plane.pem")
        self.tokens: dict[str, Path] = {}
        digests: dict[str, str] = {}
        for worker_id in worker_ids:
            out = subprocess.run([sys.executable, "-m", "ringfence.cli", "worker", "token", worker_id,
                                  "--out", str(root / f"{worker_id}.token")], capture_output=True, text=True,
                                 check=True, cwd=ROOT)
            # The command prints the line for [workers]: tokens.ID = "DIGEST"
            digests[worker_id] = out.stdout.strip().split('"')[1]
            self.tokens[worker_id] = root / f"{worker_id}.token"
        rules = "\n".join(f'[[policy.rules]]\ntool = "{t}"\nverdict = "allow"\n' for t in RULES)
        tokens = "\n".join(f'{w} = "{d}"' for w, d in digests.items())
        db = f'database_url = "{database_url}"\n' if database_url else ""
        self.config = root / "ringfence.toml"
        self.config.write_text(f"""{db}
[policy]
autonomy = "autonomous"

{rules}

[workers]
enabled = true
signing_key = "{self.signing_key}"
lease_s = {lease_s}
heartbeat_s = {heartbeat_s}
place_timeout_s = {place_timeout_s}

[workers.tokens]
{tokens}
""")

    def serve(self, name: str) -> Served:
        state = self.root / f"state-{name}"
        state.mkdir(exist_ok=True)
        return Served(self.config, state)

    def worker(self, worker_id: str, addresses: Sequence[str], *, docker_host: str | None = None,
               extra: Sequence[str] = ()) -> WorkerProcess:
        return WorkerProcess(self, worker_id, addresses, docker_host=docker_host, extra=extra)


class WorkerProcess:
    """`ringfence worker run` as a real process; its output goes to a log file under the root."""

    def __init__(self, deployment: Deployment, worker_id: str, addresses: Sequence[str], *,
                 docker_host: str | None = None, extra: Sequence[str] = ()) -> None:
        self.worker_id = worker_id
        self.log_path = deployment.root / f"worker-{worker_id}-{time.monotonic_ns()}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if docker_host:
            env["DOCKER_HOST"] = docker_host
        argv = [sys.executable, "-m", "ringfence.cli", "worker", "run", "--id", worker_id,
                "--token-file", str(deployment.tokens[worker_id]), "--trusted-keys", str(deployment.trusted),
                "--state-dir", str(deployment.root / f"worker-state-{worker_id}"), "--reap-every", "5", *extra]
        for address in addresses:
            argv += ["--control-plane", address]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if self.proc.poll() is not None:
                raise AssertionError(f"worker {self.worker_id} exited {self.proc.returncode}: {self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {self.worker_id}: no {text!r} in {timeout} s: {self.log()[-3000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: a worker host that dies mid-call (nothing of it runs its shutdown)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait(10)
