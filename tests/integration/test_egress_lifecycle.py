"""The egress proxy's lifecycle on a real engine: its hardening, each call's own socket directory
(made, mounted read-only into that sandbox alone, removed with its listener after the call,
reaped with a dead process's proxy), the control channel's reach, the relay in front of the
tool, concurrency, and the CLI flag. No call gets a Docker network."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from egress_support import SANDBOX_CLIENT, connect

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.egress.grant import EgressGrant
from ringfence_server.sandbox.egress.proxy import CALLS, CONTROL_DIR, SANDBOX_EGRESS_DIR, STATE_PREFIX, ProxySettings
from ringfence_server.sandbox.egress.server import SOCKET_NAME
from ringfence_server.sandbox.profile import SandboxProfile
from ringfence_server.sandbox.reaper import reap
from ringfence_server.sandbox.result import Outcome

pytestmark = pytest.mark.docker

ARGV = ("python3", "-I", "-S", "-B", "-c", SANDBOX_CLIENT)
ROOT = Path(__file__).resolve().parents[2]


def call(docker_client, lock, proxy, argv, stdin=b"", allow=("allowed.test",), reports=None, timeout_s=30,
         run_id="it-egress"):
    backend = DockerBackend(docker_client, lock=lock, egress_proxy=proxy,
                            on_egress_report=(lambda _r, rep: reports.append(rep)) if reports is not None else None)
    profile = SandboxProfile(egress=EgressGrant(allow=allow), timeout_s=timeout_s)
    return backend.run(SandboxRequest(profile=profile, argv=tuple(argv), stdin=stdin, run_id=run_id))


def egress_mount(result) -> dict:
    [mount] = [m for m in result.applied["mounts"] if m["target"] == SANDBOX_EGRESS_DIR]
    return mount


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
    # It listens on no TCP port (state 0A = LISTEN), only on unix sockets. The one listener in
    # its network namespace is the engine's embedded resolver (127.0.0.11, 0B00007F), which
    # every container on a user-defined network has.
    code, out = proxy.container.exec_run(["cat", "/proc/net/tcp", "/proc/net/tcp6"], user="10001:10001")
    rows = [line.split() for line in out.decode().splitlines() if line.strip() and not line.lstrip().startswith("sl")]
    assert code == 0 and [r[1].split(":")[0] for r in rows if r[3] == "0A"] in ([], ["0B00007F"])


def test_each_call_gets_its_own_socket_directory_removed_afterwards(docker_client, pinned_images, proxy):
    calls_dir = os.path.join(proxy.state_dir, CALLS)
    seen: dict = {}
    networks: set = set()
    stop = threading.Event()
    selector = {"label": [f"{L.RUN_LABEL}=it-egress-watch", f"{L.TEST_SESSION_LABEL}={os.environ[L.TEST_SESSION_ENV]}"]}

    def watch():
        while not stop.is_set():
            for token in os.listdir(calls_dir):
                directory = os.path.join(calls_dir, token)
                try:
                    st, sock = os.stat(directory), os.stat(os.path.join(directory, SOCKET_NAME))
                    seen.setdefault(directory, (st.st_uid, oct(st.st_mode & 0o777), oct(sock.st_mode & 0o777),
                                                sorted(os.listdir(directory))))
                except FileNotFoundError:  # not yet listening, or already gone
                    continue
            networks.update(n.name for n in docker_client.networks.list(filters=selector))
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        r = call(docker_client, pinned_images, proxy, ["sleep", "2"], run_id="it-egress-watch")
    finally:
        stop.set()
        t.join(5)
    assert r.outcome is Outcome.OK
    [(directory, (uid, mode, sock_mode, listing))] = seen.items()
    # The proxy's (uid 10001) directory, searchable but not listable by others; its socket open
    # to whichever uid the sandbox runs as: the bind mount is what gives one sandbox the path.
    assert (uid, mode, sock_mode, listing) == (10001, "0o711", "0o666", [SOCKET_NAME])
    mount = egress_mount(r)
    assert mount == {"source": directory, "target": SANDBOX_EGRESS_DIR, "read_only": True}
    assert r.applied["network_mode"] == "none" and networks == set()  # no network for the call
    # After the call: the directory is gone, the proxy listens for no call any more.
    assert not os.path.exists(directory) and os.listdir(calls_dir) == []
    with pytest.raises(OSError):
        connect(os.path.join(directory, SOCKET_NAME))
    assert proxy.channel.ping()["listeners"] == 0


def test_the_reaper_removes_a_dead_processs_proxy_with_its_call_directories(docker_client, pinned_images):
    """A control plane killed mid-call leaves its proxy container, the proxy's own bridge and the
    state directory with the live call's socket directory; `sandbox gc` (the reaper) removes all
    three once the owning process is gone."""
    script = ("import json, time\n"
              "import docker\n"
              "from ringfence_server.sandbox.egress.grant import EgressGrant\n"
              "from ringfence_server.sandbox.egress.proxy import EgressProxy\n"
              "p = EgressProxy(docker.from_env())\n"
              "c = p.open_call('doomed-call', EgressGrant(allow=('example.test',)))\n"
              "print(json.dumps({'state': p.state_dir, 'call': c.socket_dir, 'name': p.name}), flush=True)\n"
              "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        made = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    try:
        assert os.path.exists(os.path.join(made["call"], SOCKET_NAME))
        reaped = {(r.kind, r.name) for r in reap(docker_client)}
        assert {("container", made["name"]), ("network", f"{made['name']}-out"), ("directory", made["state"])} <= reaped
        assert not os.path.exists(made["state"])
        assert not docker_client.containers.list(all=True, filters={"name": made["name"]})
    finally:
        shutil.rmtree(made["state"], ignore_errors=True)  # the container and network: by session label


def test_the_reaper_still_removes_labelled_networks_past_their_deadline(docker_client):
    name = f"rf-test-old-call-net-{os.getpid()}"
    docker_client.networks.create(name, driver="bridge", internal=True, labels=L.base_labels("network", deadline_s=-10))
    reaped = reap(docker_client)
    assert ("network", name) in {(r.kind, r.name) for r in reaped}
    assert not docker_client.networks.list(names=[name])


def test_the_sandbox_reaches_its_own_socket_and_nothing_of_the_control_channel(docker_client, pinned_images, proxy):
    script = (
        "import json, os, socket\n"
        "mounts = [l.split() for l in open('/proc/self/mountinfo').read().splitlines()]\n"
        "egress = [m for m in mounts if m[4] == '/run/ringfence/egress']\n"
        "try:\n"
        "    open('/run/ringfence/egress/x', 'w'); write = 'written'\n"
        "except OSError as e:\n"
        "    write = e.strerror\n"
        "s = socket.socket(socket.AF_UNIX); s.connect('/run/ringfence/egress/proxy.sock')\n"
        "s.sendall(b'{\"op\": \"ping\"}\\r\\n\\r\\n'); control = s.recv(200).split(b'\\r\\n')[0].decode()\n"
        "print(json.dumps({'egress_mounts': [(m[3], m[5].split(',')[0]) for m in egress],\n"
        "    'listing': sorted(os.listdir('/run/ringfence/egress')), 'up': sorted(os.listdir('/run/ringfence')),\n"
        "    'write': write, 'control': control, 'rfproxy': os.path.exists('/run/rfproxy'),\n"
        "    'unix': 'control.sock' in open('/proc/net/unix').read()}))\n")
    r = call(docker_client, pinned_images, proxy, ["python3", "-c", script])
    assert r.outcome is Outcome.OK, r.stderr
    seen = json.loads(r.stdout)
    # One mount: the call's own directory below the state dir (never the state dir itself), read-only.
    [(root, mode)] = seen["egress_mounts"]
    assert mode == "ro" and root.endswith(egress_mount(r)["source"][len(proxy.state_dir):])
    assert root.split("/")[-2] == CALLS
    assert seen["listing"] == [SOCKET_NAME] and seen["up"] == ["egress"]
    assert seen["write"] == "Read-only file system"
    # The socket speaks HTTP-proxy only: a control request is a bad proxy request.
    assert seen["control"] == "HTTP/1.1 400 Bad Request"
    assert seen["rfproxy"] is False and seen["unix"] is False
    # Positive control: the channel does answer on the host.
    assert proxy.channel.ping()["ok"] is True


def test_the_images_default_command_runs_behind_the_relay_with_its_own_exit_status(docker_client, pinned_images, proxy):
    """No argv: the image's Cmd (the tool runner) runs after the relay, reads the request on its
    stdin and reports a structured tool error with its exit status, exactly as without egress."""
    request = {"tool": "fail", "arguments": {"class": "rate_limited", "retry_after_s": 3}, "call_id": "x"}
    r = call(docker_client, pinned_images, proxy, [], json.dumps(request).encode())
    assert r.outcome is Outcome.TOOL_ERROR and r.exit_code == 3, (r.outcome, r.stderr)
    assert (r.error_class.value, r.retry_after_s) == ("rate_limited", 3.0)
    assert r.applied["entrypoint"] == ["/usr/bin/tini", "-v", "--"]  # the relay is in the command


def test_concurrent_calls_have_separate_sockets_and_credentials(docker_client, pinned_images, proxy, testbed):
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
    assert len({o[0]["proxy"] for o in outs}) == 3  # three credentials ...
    assert {o[0]["proxy"].split("@")[1] for o in outs} == {"127.0.0.1:3128"}  # ... each to its own relay
    assert all(o[2]["interfaces"] == ["lo"] for o in outs)
    assert len({egress_mount(results[i])["source"] for i in range(3)}) == 3  # three sockets
    assert sorted(len(rep.events) for rep in reports) == [1, 1, 1]
    assert all(e["call_id"] == rep.call_id for rep in reports for e in rep.events)


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
        ProxySettings(disabled_checks={"call_binding"})
    with pytest.raises(ValueError):
        ProxySettings(test_networks=("10.0.0.0/8",))


def egress_objects(client) -> set[str]:
    selector = {"label": f"{L.TEST_SESSION_LABEL}={os.environ[L.TEST_SESSION_ENV]}"}
    names = {c.name for c in client.containers.list(all=True, filters=selector) if c.name.startswith("rf-egress")}
    return names | {n.name for n in client.networks.list(filters=selector) if n.name.startswith("rf-egress")}


def test_cli_exec_with_egress_allow_runs_through_a_proxy(docker_client, pinned_images):
    """`ringfence sandbox exec --egress-allow` (production settings: the proxy's own bridge,
    system resolver). The command makes no request -- a real resolver would be asked -- it
    only shows it has no interface but lo and the proxy URL of its relay, and nothing is left
    behind (containers, networks, state directories)."""
    before = egress_objects(docker_client)
    state_dirs = os.path.join(tempfile.gettempdir(), f"{STATE_PREFIX}*")
    dirs_before = set(glob.glob(state_dirs))
    ringfence = str(Path(sys.executable).parent / "ringfence")
    cmd = [ringfence, "sandbox", "exec", "--egress-allow", "example.test", "--",
           "sh", "-c", "cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' '; echo \"$HTTPS_PROXY\" | cut -d@ -f2"]
    probe = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    result = json.loads(probe.stdout)
    lines = result["stdout"].split() if isinstance(result["stdout"], str) else []
    assert result["outcome"] == "ok", result
    assert lines == ["lo", "127.0.0.1:3128"]
    assert egress_objects(docker_client) == before  # the CLI's proxy and its network are gone
    assert set(glob.glob(state_dirs)) == dirs_before


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
    assert [(host, decision) for host, decision, _ in decisions] == [("allowed.test", "allowed"),
                                                                      ("denied.test", "denied")]
    assert r.to_json()["egress_events"][1]["reason"] == "not_allowlisted"
