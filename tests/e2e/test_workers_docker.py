"""Sandbox workers as real processes on the host's real Docker engine: `ringfence serve` with
`[workers] enabled` and `ringfence worker run` processes that attach to it over the Attach
stream, the calls of a real client running in real hardened containers started by the workers.
(Several engines, worker loss and partitions: tests/e2e/test_workers_farm.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from workers_e2e_support import AGENT, ROOT, Deployment

from ringfence import Client
from ringfence.model import ObservationStatus
from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.pinned_images import load_lock


def _attempts(agent: Client, run_id: str) -> list[Mapping[str, Any]]:
    return [e.data for e in agent.list_events(run_id, page_size=1000).events if e.type == "attempt"]


def test_a_client_s_calls_run_on_worker_processes_in_real_containers(tmp_path, pinned_images, docker_client):
    d = Deployment(tmp_path, ["w1", "w2"])
    served = d.serve("cp")
    workers = []
    try:
        workers = [d.worker(w, [served.address], extra=["--pool-size", "0"]) for w in ("w1", "w2")]
        for w in workers:
            w.wait_for(f"worker {w.worker_id} attached to")
        with Client(served.address, AGENT) as agent:
            run = agent.start_run("calls on sandbox workers")
            calls = [{"call_id": f"e{i}", "tool": "echo", "arguments": {"text": f"t{i}"}} for i in range(6)]
            calls.append({"call_id": "note", "tool": "write_note", "arguments": {"name": "n1", "text": "hello"}})
            obs = {o.call_id: o for o in agent.submit_batch(run.run_id, calls)}
            assert all(o.status is ObservationStatus.EXECUTED for o in obs.values()), obs
            assert [obs[f"e{i}"].content for i in range(6)] == [{"text": f"t{i}"} for i in range(6)]
            assert obs["note"].content["idempotency_key"]  # the runner in the container saw the key
            attempts = _attempts(agent, run.run_id)
        # Every call once, each attempt names the worker that ran it, and both took a share.
        assert sorted(a["call_id"] for a in attempts) == sorted([f"e{i}" for i in range(6)] + ["note"])
        assert {a["worker"] for a in attempts} == {"w1", "w2"}
        assert {a["image_id"] for a in attempts} == {load_lock().image_id("tool")}
        assert all(a["outcome"] == "ok" and a["runtime"] == "runc" for a in attempts)
    finally:
        codes = [w.stop() for w in workers]
        served.stop()
    assert codes == [0, 0]
    assert all("stopped" in w.log() for w in workers)
    # The operator's view, read from the store: both workers' first epochs, ended with their streams.
    shown = subprocess.run([sys.executable, "-m", "ringfence.cli", "workers", "--state-dir",
                            str(tmp_path / "state-cp")], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert shown.startswith("workers in ") and shown.splitlines()[0].endswith(": 2"), shown
    for w in ("w1", "w2"):
        assert re.search(rf"^  {w} +epoch 1 +lapsed \d+ s ago +held by ", shown, re.M), shown
    assert "late results (latest 0;" in shown
    # Nothing of the run is left on the engine.
    left = docker_client.containers.list(all=True, filters={"label": f"{L.RUN_LABEL}=demo:{run.run_id}"})
    assert left == []


def test_a_worker_with_a_token_the_control_plane_does_not_know_is_refused_and_exits(tmp_path, pinned_images):
    d = Deployment(tmp_path, ["w1"])
    served = d.serve("cp")
    try:
        d.tokens["w1"].write_text("rfw_not-the-real-token\n")
        w = d.worker("w1", [served.address])
        assert w.proc.wait(120) == 2
        assert "the control plane refused this worker" in w.log() and "not one of [workers] tokens" in w.log()
    finally:
        served.stop()


def test_worker_help_explains_its_actions():
    out = subprocess.run([sys.executable, "-m", "ringfence.cli", "worker", "run", "--help"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    for flag in ("--id", "--token-file", "--trusted-keys", "--control-plane", "--state-dir", "--slots", "--label"):
        assert flag in out
    assert "fencing" in out
