"""The egress proxy's lifecycle on a real engine: its hardening, the per-call networks (labels,
members, removal, reaping), the control channel's reach, concurrency, and the CLI flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandbox import labels as L
from sandbox.backend import SandboxRequest
from sandbox.docker_backend import DockerBackend
from sandbox.egress.grant import EgressGrant
from sandbox.egress.proxy import CONTROL_DIR, INHIBIT_IPV4, ProxySettings
from sandbox.egress.testing import SANDBOX_CLIENT
from sandbox.profile import SandboxProfile
from sandbox.reaper import reap
from sandbox.result import Outcome

pytestmark = pytest.mark.docker

ARGV = ("python3", "-I", "-S", "-B", "-c", SANDBOX_CLIENT)
ROOT = Path(__file__).resolve().parents[2]


def call(docker_client, lock, proxy, argv, stdin=b"", allow=("allowed.test",), reports=None, timeout_s=30,
         run_id="it-egress"):
    backend = DockerBackend(docker_client, lock=lock, egress_proxy=proxy,
                            on_egress_report=(lambda _r, rep: reports.append(rep)) if reports is not None else None)
    profile = SandboxProfile(egress=EgressGrant(allow=allow), timeout_s=timeout_s)
    return backend.run(SandboxRequest(profile=profile, argv=tuple(argv), stdin=stdin, run_id=run_id))


def test_the_proxy_container_is_hardened_like_a_sandbox(proxy):
    attrs = proxy.container.attrs
    host, config = attrs["HostConfig"], attrs["Config"]
    assert config["User"] == "10001:10001"
    assert host["ReadonlyRootfs"] is True and host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert any(o.startswith("seccomp=") and o != "seccomp=unconfined" for o in host["SecurityOpt"])
    assert host["Memory"] > 0 and host["PidsLimit"] > 0 and host["Dns"] == ["127.0.0.1"]
    # Its only mount is the control directory; never the Docker socket.
    assert [(m["Destination"], m["Type"]) for m in attrs["Mounts"]] == [(CONTROL_DIR, "bind")]
    labels = config["Labels"]
    assert labels[L.PRODUCT_LABEL] == L.PRODUCT and labels[L.PURPOSE_LABEL] == "proxy"
    assert labels[L.TEST_SESSION_LABEL] == os.environ[L.TEST_SESSION_ENV]


def test_each_call_gets_its_own_labelled_internal_network_removed_afterwards(docker_client, pinned_images, proxy):
    seen: dict = {}
    stop = threading.Event()

    def watch():
        import docker.errors

        selector = {"label": [f"{L.RUN_LABEL}=it-egress-watch",
                              f"{L.TEST_SESSION_LABEL}={os.environ[L.TEST_SESSION_ENV]}"]}
        while not stop.is_set():
            for n in docker_client.networks.list(filters=selector):
                try:
                    n.reload()
                except docker.errors.NotFound:  # removed between list and inspect
                    continue
                if len(n.attrs.get("Containers") or {}) == 2:
                    seen.setdefault(n.name, n.attrs)
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        r = call(docker_client, pinned_images, proxy, ["sleep", "2"], run_id="it-egress-watch")
    finally:
        stop.set()
        t.join(5)
    assert r.outcome is Outcome.OK
    [(name, attrs)] = seen.items()
    assert attrs["Internal"] is True and attrs["Options"] == {INHIBIT_IPV4: "true"}
    members = {c["Name"] for c in attrs["Containers"].values()}
    assert members == {proxy.name, r.container_name}  # the sandbox and the proxy, nobody else
    labels = attrs["Labels"]
    assert labels[L.PURPOSE_LABEL] == "network" and labels[L.RUN_LABEL] == "it-egress-watch"
    assert labels[L.CALL_LABEL] and int(labels[L.DEADLINE_LABEL]) > time.time()
    assert labels[L.TEST_SESSION_LABEL] == os.environ[L.TEST_SESSION_ENV]
    assert r.applied["network_mode"] == name
    # After the call: network gone, proxy no longer attached to it.
    assert not docker_client.networks.list(names=[name])
    proxy.container.reload()
    assert name not in proxy.container.attrs["NetworkSettings"]["Networks"]


def test_the_reaper_removes_an_orphaned_call_network(docker_client, proxy):
    orphan = proxy.open_call("orphan-call", EgressGrant(allow=("allowed.test",)), deadline_s=-10)
    assert docker_client.networks.list(names=[orphan.network])
    reaped = reap(docker_client)
    assert ("network", orphan.network) in {(r.kind, r.name) for r in reaped}
    assert not docker_client.networks.list(names=[orphan.network])
    # Revoking still works (and is harmless) once the network is gone.
    assert proxy.close_call(orphan).error is None


def test_the_sandbox_cannot_reach_the_control_channel(docker_client, pinned_images, proxy):
    script = ("import json,os\n"
              "m=open('/proc/self/mountinfo').read()\n"
              "u=open('/proc/net/unix').read()\n"
              "print(json.dumps({'mount': 'rfproxy' in m or 'rf-egress' in m, 'unix': 'control.sock' in u,"
              " 'dir': os.path.exists('/run/rfproxy')}))")
    r = call(docker_client, pinned_images, proxy, ["python3", "-c", script])
    assert json.loads(r.stdout) == {"mount": False, "unix": False, "dir": False}
    # Positive control: the channel does answer on the host.
    assert proxy.channel.ping()["ok"] is True


def test_concurrent_calls_have_separate_networks_and_credentials(docker_client, pinned_images, proxy, testbed):
    results, reports = {}, []
    ops = json.dumps([{"op": "env"}, {"op": "get", "url": "http://allowed.test/"}, {"op": "netinfo"}]).encode()

    def one(i):
        results[i] = call(docker_client, pinned_images, proxy, ARGV, ops, reports=reports)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    outs = [json.loads(results[i].stdout) for i in range(3)]
    assert all(o[1]["status"] == 200 for o in outs)
    assert len({o[0]["proxy"] for o in outs}) == 3  # three credentials (and proxy addresses)
    assert len({tuple(r["dest"] for r in o[2]["routes"]) for o in outs}) == 3  # three networks
    assert sorted(len(rep.events) for rep in reports) == [1, 1, 1]


def test_every_decision_is_also_in_the_proxy_log(docker_client, pinned_images, proxy):
    reports = []
    ops = json.dumps([{"op": "get", "url": "http://denied.test/"}]).encode()
    call(docker_client, pinned_images, proxy, ARGV, ops, reports=reports)
    call_id = reports[0].call_id
    logged = [e for e in proxy.logs() if e.get("call_id") == call_id]
    assert [e["event"] for e in logged] == ["grant", "request", "revoke"]
    assert logged[1]["reason"] == "not_allowlisted"


def test_a_weakened_proxy_needs_the_test_resolver():
    with pytest.raises(ValueError):
        ProxySettings(disabled_checks={"allowlist"})
    with pytest.raises(ValueError):
        ProxySettings(test_networks=("10.0.0.0/8",))


def egress_objects(client) -> set[str]:
    selector = {"label": f"{L.TEST_SESSION_LABEL}={os.environ[L.TEST_SESSION_ENV]}"}
    names = {c.name for c in client.containers.list(all=True, filters=selector) if c.name.startswith("rf-egress")}
    return names | {n.name for n in client.networks.list(filters=selector) if n.name.startswith("rf-egress")}


def test_cli_exec_with_egress_allow_runs_through_a_proxy(docker_client, pinned_images):
    """`ringfence sandbox exec --egress-allow` (production settings: the proxy's own bridge,
    system resolver). The command makes no request -- a real resolver would be asked -- it
    only shows it has an interface besides lo and the proxy URL, and nothing is left behind."""
    before = egress_objects(docker_client)
    ringfence = str(Path(sys.executable).parent / "ringfence")
    cmd = [ringfence, "sandbox", "exec", "--egress-allow", "example.test", "--",
           "sh", "-c", "cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' '; echo \"$HTTPS_PROXY\" | cut -d@ -f2"]
    probe = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    result = json.loads(probe.stdout)
    lines = result["stdout"].split() if isinstance(result["stdout"], str) else []
    assert result["outcome"] == "ok", result
    assert lines[:2] == ["lo", "eth0"] and lines[2].endswith(":3128")
    assert egress_objects(docker_client) == before  # the CLI's proxy and network are gone


def test_the_result_never_carries_the_proxy_password(docker_client, pinned_images, proxy):
    r = call(docker_client, pinned_images, proxy, ["sh", "-c", "echo \"$HTTPS_PROXY\""])
    password = r.stdout.decode().strip().split("//", 1)[1].split("@", 1)[0].split(":", 1)[1]
    assert len(password) > 20
    assert password not in json.dumps(r.to_json()["applied"])  # (stdout has it: the tool printed it)
    assert any(e.startswith("HTTPS_PROXY=http://c") and ":***@" in e for e in r.applied["env"])


def test_the_proxys_decisions_are_part_of_the_calls_result(docker_client, pinned_images, proxy):
    """Every decision becomes part of the SandboxResult (and the executor writes them as an
    `egress` event of the call): here one allowed and one denied request, in order."""
    reports = []
    ops = json.dumps([{"op": "get", "url": "http://allowed.test/"}, {"op": "get", "url": "http://denied.test/"}]).encode()
    r = call(docker_client, pinned_images, proxy, ARGV, ops, reports=reports)
    decisions = [(e.get("host"), e.get("decision"), e.get("reason")) for e in r.egress_events]
    assert decisions == [(e.get("host"), e.get("decision"), e.get("reason")) for e in reports[0].events]
    assert [(host, decision) for host, decision, _ in decisions] == [("allowed.test", "allowed"), ("denied.test", "denied")]
    assert r.to_json()["egress_events"][1]["reason"] == "not_allowlisted"
