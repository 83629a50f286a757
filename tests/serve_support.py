"""`ringfence serve` as a real process for the tests: started on a free port, its address read
from its first line, stopped with SIGTERM (or killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Served:
    def __init__(self, config: Path | None, state: Path, *extra: str, env: dict[str, str] | None = None,
                 command: Sequence[str] | None = None, cwd: Path | None = None,
                 base_env: Mapping[str, str] | None = None) -> None:
        """`config` None: the embedded defaults (no --config). `command` replaces
        `python -m ringfence.cli` (e.g. an installed `ringfence` script), `cwd` the checkout, and
        `base_env` os.environ as what `env` is laid over."""
        argv = list(command) if command is not None else [sys.executable, "-m", "ringfence.cli"]
        self.proc = subprocess.Popen(
            [*argv, "serve", "--listen", "127.0.0.1:0",
             *(["--config", str(config)] if config is not None else []), "--state-dir", str(state), *extra],
            cwd=cwd if cwd is not None else ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**(os.environ if base_env is None else base_env), "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        # Both are pipes (PIPE above), never None; narrowed once for the reader and the error.
        assert self.proc.stdout is not None and self.proc.stderr is not None
        stdout, stderr = self.proc.stdout, self.proc.stderr
        self.lines: list[str] = []
        first = threading.Event()

        def read() -> None:
            for line in stdout:
                self.lines.append(line.rstrip("\n"))
                if line.startswith("ringfence: serving"):
                    first.set()
            first.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        serving = [line for line in self.lines if line.startswith("ringfence: serving")] if first.wait(60) else []
        if not serving:
            self.stop()
            raise AssertionError(f"no address printed; stderr: {stderr.read()[-2000:]}")
        self.address = serving[0].split(" on ", 1)[1].split()[0]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self._reader.join(10)
