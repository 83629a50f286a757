"""Egress proxy cost: throughput (MB/s) and added latency per request, through the proxy against a
direct connection, both measured in this run from the same hardened sandbox image and profile
(DockerBackend): once as egress calls run (no network; the in-sandbox relay on 127.0.0.1:3128,
the call's own unix socket, the egress proxy), once also joined straight to the decoy's (test)
network and connecting to it directly. The decoy is a `base` container on the test's own
internal network; nothing leaves the machine. Shared, noisy 2-core machine: read the ratios.
It also times whole egress calls (a trivial command, proxy already up) against calls without
egress: the per-call cost of the call's socket, credentials and relay.

    .venv/bin/python -m bench.bench_egress [--requests 100] [--mib 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import docker

from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.egress.grant import EgressGrant, GiB, MiB
from ringfence_server.sandbox.pinned_images import load_lock
from ringfence_server.sandbox.profile import SandboxProfile

# The egress testbed (decoys on the bench's own networks) is test harness: it lives in tests/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from egress_support import EgressTestbed

CLIENT = r'''
import base64, json, os, socket, ssl, statistics, sys, time, urllib.parse
cfg = json.loads(sys.stdin.read())
ctx = ssl._create_unverified_context()
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"]) if cfg["mode"] == "proxy" else None

def auth():
    tok = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
    return f"Proxy-Authorization: Basic {tok}\r\n"

def drain(s):
    n = 0
    while True:
        b = s.recv(262144)
        if not b:
            return n
        n += len(b)

def http(path):
    if proxy:
        s = socket.create_connection((proxy.hostname, proxy.port))
        s.sendall(f"GET http://allowed.test{path} HTTP/1.1\r\nHost: allowed.test\r\n{auth()}\r\n".encode())
    else:
        s = socket.create_connection((cfg["ip"], 80))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: allowed.test\r\n\r\n".encode())
    n = drain(s); s.close(); return n

def https(path):
    if proxy:
        s = socket.create_connection((proxy.hostname, proxy.port))
        s.sendall(f"CONNECT allowed.test:443 HTTP/1.1\r\n{auth()}\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1)
        assert head.startswith(b"HTTP/1.1 200"), head
    else:
        s = socket.create_connection((cfg["ip"], 443))
    t = ctx.wrap_socket(s, server_hostname="allowed.test")
    t.sendall(f"GET {path} HTTP/1.1\r\nHost: allowed.test\r\n\r\n".encode())
    n = drain(t); t.close(); return n

out = {}
for name, fn in (("http", http), ("https", https)):
    fn("/")  # warm up
    lat = []
    for _ in range(cfg["requests"]):
        t0 = time.perf_counter(); fn("/"); lat.append(time.perf_counter() - t0)
    t0 = time.perf_counter(); got = fn(f"/big?n={cfg['bytes']}"); dt = time.perf_counter() - t0
    out[name] = {"median_ms": statistics.median(lat) * 1000, "p90_ms": sorted(lat)[int(len(lat) * 0.9)] * 1000,
                 "mb_s": got / dt / 1e6, "bytes": got}
print(json.dumps(out))
'''


class _Direct(DockerBackend):
    """The same sandbox, also joined straight to the decoy's test network (the client then
    connects to the decoy directly; the relay is there but unused)."""

    network = ""

    def _apply_egress(self, settings, call):
        settings = super()._apply_egress(settings, call)
        settings["network_mode"] = self.network
        return settings


def _run(backend, cfg) -> dict:
    profile = SandboxProfile(egress=EgressGrant(allow=("allowed.test",), max_bytes=16 * GiB, max_connections=10_000),
                             timeout_s=600, memory_bytes=256 * MiB)
    r = backend.run(SandboxRequest(profile=profile, argv=("python3", "-I", "-S", "-B", "-c", CLIENT),
                                   stdin=json.dumps(cfg).encode(), run_id="bench-egress"))
    if r.outcome != "ok":
        raise SystemExit(f"bench client failed: {r.outcome} {r.message}\n{r.stderr.decode()[-3000:]}")
    return json.loads(r.stdout)


def _call_ms(backend, calls: int, egress: bool) -> float:
    """Median wall time of whole calls running `true` (container create to removal)."""
    extra = {"egress": EgressGrant(allow=("allowed.test",))} if egress else {}
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        r = backend.run(SandboxRequest(profile=SandboxProfile(timeout_s=60, **extra), argv=("true",),
                                       run_id="bench-egress"))
        times.append((time.perf_counter() - t0) * 1000)
        if r.outcome != "ok":
            raise SystemExit(f"bench call failed: {r.outcome} {r.message}")
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100, help="small requests per variant (default 100)")
    parser.add_argument("--mib", type=int, default=64, help="download size for throughput (default 64 MiB)")
    parser.add_argument("--calls", type=int, default=10,
                        help="whole calls per variant for the per-call cost (default 10)")
    args = parser.parse_args(argv)
    os.environ.setdefault("RINGFENCE_TEST_SESSION", "bench-egress")
    client = docker.from_env(timeout=120)
    lock = load_lock()
    workdir = tempfile.TemporaryDirectory(prefix="rf-bench-egress-")
    tb = EgressTestbed(client, lock, workdir.name)
    try:
        proxy = tb.proxy()
        cfg = {"requests": args.requests, "bytes": args.mib * MiB, "ip": tb.decoys["allowed"].ip}
        _Direct.network = tb.networks["outside"].name
        direct = _run(_Direct(client, lock=lock, egress_proxy=proxy), {**cfg, "mode": "direct"})
        backend = DockerBackend(client, lock=lock, egress_proxy=proxy)
        proxied = _run(backend, {**cfg, "mode": "proxy"})
        plain_call, egress_call = _call_ms(backend, args.calls, False), _call_ms(backend, args.calls, True)
    finally:
        tb.close()
        workdir.cleanup()
    print(f"egress proxy vs direct, {args.requests} requests (new connection each), {args.mib} MiB download")
    print(f"{'':8}{'direct ms':>11}{'proxy ms':>10}{'added ms':>10}{'ratio':>7}   "
          f"{'direct MB/s':>12}{'proxy MB/s':>11}{'ratio':>7}")
    for proto in ("http", "https"):
        d, p = direct[proto], proxied[proto]
        print(f"{proto:8}{d['median_ms']:11.2f}{p['median_ms']:10.2f}{p['median_ms'] - d['median_ms']:10.2f}"
              f"{p['median_ms'] / d['median_ms']:7.2f}   {d['mb_s']:12.1f}{p['mb_s']:11.1f}"
              f"{p['mb_s'] / d['mb_s']:7.2f}")
    print("(latency = median per request; p90 direct/proxy: "
          + ", ".join(f"{k} {direct[k]['p90_ms']:.2f}/{proxied[k]['p90_ms']:.2f} ms" for k in ("http", "https")) + ")")
    print(f"whole call running `true`, median of {args.calls}: without egress {plain_call:.0f} ms, "
          f"with egress {egress_call:.0f} ms (+{egress_call - plain_call:.0f} ms: socket, credentials, relay)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
