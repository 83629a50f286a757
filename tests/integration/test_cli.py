"""`ringfence sandbox exec` as a user runs it: a real process, the real engine, one JSON object."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ringfence_server.sandbox import labels as L

pytestmark = pytest.mark.docker
RINGFENCE = [str(Path(sys.executable).with_name("ringfence"))]


def ringfence(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(RINGFENCE + list(args), capture_output=True, text=True, timeout=timeout, env=os.environ)


def exec_json(*args: str) -> dict:
    proc = ringfence("sandbox", "exec", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # exactly one JSON object: json.loads fails on anything more


def test_id_u_prints_ok_and_10001(pinned_images):
    result = exec_json("--", "id", "-u")
    assert result["outcome"] == "ok" and result["stdout"] == "10001\n"
    assert set(result) >= {
        "outcome", "exit_code", "stdout", "stderr", "stdout_truncated", "stderr_truncated",
        "duration_ms", "image_id", "runtime", "applied",
    }
    assert result["image_id"] == pinned_images.image_id("tool")


def test_limits_given_on_the_command_line_are_applied(pinned_images):
    result = exec_json("--memory", "64m", "--cpus", "0.5", "--pids", "64", "--tmpfs", "8MiB", "--", "true")
    applied = result["applied"]
    assert applied["read_only"] is True and applied["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in applied["security_opt"]
    assert applied["network_mode"] == "none"
    assert applied["memory"] == 64 << 20 and applied["nano_cpus"] == 500_000_000
    assert applied["pids_limit"] == 64 and "size=8388608" in applied["tmpfs"]["/tmp"]


def test_yes_is_cut_at_the_output_limit(pinned_images):
    result = exec_json("--output-limit", "4KiB", "--", "sh", "-c", "yes")
    assert result["outcome"] == "output_limit"
    assert len(result["stdout"]) == 4096 and result["stdout_truncated"] is True


def test_memory_bomb_is_oom(pinned_images):
    result = exec_json("--memory", "64m", "--", "python3", "-c", "x = bytearray(1 << 30)")
    assert result["outcome"] == "oom"


def test_setsid_escape_times_out_and_leaves_no_container(pinned_images, docker_client):
    result = exec_json("--timeout", "2s", "--", "sh", "-c", "setsid sleep 1000 & sleep 100")
    assert result["outcome"] == "timeout"
    assert docker_client.containers.list(all=True, filters={"label": "ringfence.run=cli"}) == []


def test_fork_bomb_with_32_pids_ends_classified(pinned_images):
    result = exec_json("--pids", "32", "--timeout", "2s", "--", "sh", "-c", "f() { f | f & }; f; sleep 3")
    assert result["outcome"] in ("timeout", "tool_error", "ok")


def test_gvisor_runtime(pinned_images, gvisor_available):
    if not gvisor_available and os.environ.get("RINGFENCE_REQUIRE_DOCKER") != "1":
        pytest.skip("no runsc runtime")
    # gVisor's sentry presents its own kernel, never the host's.
    host_kernel = Path("/proc/version").read_text().split()[2]
    result = exec_json("--runtime", "gvisor", "--", "cat", "/proc/version")
    assert result["outcome"] == "ok" and result["runtime"] == "gvisor"
    assert result["applied"]["runtime"] == "runsc"
    assert result["stdout"].startswith("Linux version ") and host_kernel not in result["stdout"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--"], "give the command"),
        (["--memory", "lots", "--", "true"], "not a size"),
        (["--timeout", "forever", "--", "true"], "not a duration"),
        (["--pids", "1", "--", "true"], "pids"),
        (["--image", "unpinned", "--", "true"], "unpinned"),
    ],
)
def test_usage_errors_exit_nonzero_with_a_clear_message(args, message):
    proc = ringfence("sandbox", "exec", *args)
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert message in proc.stderr


def test_help_explains():
    proc = ringfence("sandbox", "exec", "--help")
    assert proc.returncode == 0 and "one JSON object" in proc.stdout


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_cli_kills_its_container_first(pinned_images, docker_client, signum):
    """What timeout(1), kill and service managers send: the CLI must not exit and leave its
    container running with nobody enforcing the wall time."""
    proc = subprocess.Popen([*RINGFENCE, "sandbox", "exec", "--timeout", "120s", "--", "sleep", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)
    try:
        selector = {"label": f"{L.PID_LABEL}={proc.pid}", "status": "running"}
        for _ in range(600):
            if docker_client.containers.list(filters=selector) or proc.poll() is not None:
                break
            threading.Event().wait(0.05)
        assert docker_client.containers.list(filters=selector), "the call's container never ran"
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, err
    result = json.loads(out)
    assert result["outcome"] == "killed" and signal.Signals(signum).name in result["message"]
    assert docker_client.containers.list(all=True, filters={"label": f"{L.PID_LABEL}={proc.pid}"}) == []
