"""The README's "Sandboxes on other hosts", run as written, one host playing both: the control
plane's three commands and the worker's one, each line as the page has it but for the addresses
(the page's 0.0.0.0:50051 becomes 127.0.0.1:0, the worker dials the address the server printed
instead of cp.example.internal) and the TLS files, which the page takes as given and this test
makes (a CA and a server certificate for 127.0.0.1, with openssl). `cp.toml` holds what the page
says it holds. Then a real client's call runs on the worker, in a real container."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest
from docs_support import README, section, sh_lines
from serve_support import Served

from ringfence import Client, TlsConfig
from ringfence.model import ObservationStatus

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _pki(d) -> None:
    """ca.pem, and cp.pem / cp-key.pem for 127.0.0.1 signed by it: what the page takes as given."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=readme CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "cp.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=cp", "-keyout", "cp-key.pem", "-out", "cp.csr",
             cwd=d)
    _openssl("x509", "-req", "-in", "cp.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
             "-extfile", "cp.ext", "-out", "cp.pem", cwd=d)


def _ringfence(line: str) -> list[str]:
    words = shlex.split(line)
    assert words[0] == "ringfence", line
    return [sys.executable, "-m", "ringfence.cli", *words[1:]]


def test_the_two_host_deployment_runs_as_written(tmp_path, pinned_images):
    keygen, token, serve, worker = sh_lines(section(README, "Sandboxes on other hosts"))
    assert keygen.startswith("ringfence worker keygen") and token.startswith("ringfence worker token")
    assert serve.startswith("ringfence serve") and worker.startswith("ringfence worker run")
    (tmp_path / "trusted").mkdir()
    _pki(tmp_path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    subprocess.run(_ringfence(keygen), cwd=tmp_path, check=True, capture_output=True, text=True, env=env)
    printed = subprocess.run(_ringfence(token), cwd=tmp_path, check=True, capture_output=True, text=True,
                             env=env).stdout.strip()
    assert printed.startswith('tokens.w1 = "') and (tmp_path / "w1.token").stat().st_mode & 0o077 == 0
    # cp.toml as the page describes it: the deployment's own tenants (off loopback serve refuses the
    # public demo tokens), and [workers] with enabled, signing_key and the printed line.
    agent_token = "readme-agent-token"
    (tmp_path / "cp.toml").write_text(
        f'[tenants.acme]\ntokens = [{{ sha256 = "{hashlib.sha256(agent_token.encode()).hexdigest()}", '
        f'role = "agent", subject = "acme-agent" }}]\n\n'
        f'[workers]\nenabled = true\nsigning_key = "signing-key.pem"\n{printed}\n')

    words = shlex.split(serve)
    assert words[words.index("--listen") + 1] == "0.0.0.0:50051"
    words[words.index("--listen") + 1] = "127.0.0.1:0"
    args = words[1:]
    assert args[0] == "serve"
    # Served adds --listen 127.0.0.1:0 and --state-dir; the page's own flags follow (the last --listen wins).
    served = Served(None, tmp_path / "state", *args[1:], cwd=tmp_path)
    proc = None
    try:
        assert "(TLS)" in served.line_starting("ringfence: serving")
        assert served.line_starting("ringfence: calls run on sandbox workers")
        line = worker.replace("cp.example.internal:50051", served.address)
        log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - closed below, after the process
        proc = subprocess.Popen(_ringfence(line), cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while b"worker w1 attached to" not in (tmp_path / "worker.log").read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.1)
        with Client(served.address, agent_token, tls=TlsConfig.from_files(tmp_path / "ca.pem")) as agent:
            run = agent.start_run("a call on the sandbox host")
            [obs] = agent.submit_batch(run.run_id, [{"call_id": "hi", "tool": "echo", "arguments": {"text": "hi"}}])
            assert obs.status is ObservationStatus.EXECUTED and obs.content == {"text": "hi"}
            [attempt] = [e.data for e in agent.list_events(run.run_id).events if e.type == "attempt"]
            assert attempt["worker"] == "w1"
    finally:
        if proc is not None:
            proc.terminate()
            assert proc.wait(60) == 0
            log.close()
        served.stop()
