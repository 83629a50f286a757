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
        self._more = threading.Condition()  # notified at each line and at the end of stdout
        self._ended = False

        def read() -> None:
            for line in stdout:
                with self._more:
                    self.lines.append(line.rstrip("\n"))
                    self._more.notify_all()
                if line.startswith("ringfence: serving"):
                    first.set()
            with self._more:
                self._ended = True
                self._more.notify_all()
            first.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        serving = [line for line in self.lines if line.startswith("ringfence: serving")] if first.wait(60) else []
        if not serving:
            self.stop()
            raise AssertionError(f"no address printed; stderr: {stderr.read()[-2000:]}")
        self.address = serving[0].split(" on ", 1)[1].split()[0]

    def line_starting(self, prefix: str, timeout: float = 60) -> str:
        """The first stdout line that starts with `prefix`, waited for (AssertionError, with
        stderr's end, when stdout ends or `timeout` passes first)."""
        with self._more:
            found = self._more.wait_for(
                lambda: any(line.startswith(prefix) for line in self.lines) or self._ended, timeout)
            lines = [line for line in self.lines if line.startswith(prefix)]
        if found and lines:
            return lines[0]
        raise AssertionError(f"no line {prefix!r} on stdout: {self.lines[-5:]}")

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
