"""Sandbox call latency: the hardened DockerBackend (runc and gVisor) against a baseline of a bare
`docker run` of the same image, both measured in this run on this machine (shared and noisy:
read the ratios, not the absolute numbers).

    .venv/bin/python -m bench.bench_sandbox [--calls 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import docker

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.pinned_images import load_lock
from ringfence_server.sandbox.profile import SandboxProfile


def _timed(fn, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20, help="calls per variant (default 20)")
    args = parser.parse_args(argv)
    client = docker.from_env()
    image = load_lock().image_id("tool")
    backend = DockerBackend(client)
    has_gvisor = "runsc" in (client.info().get("Runtimes") or {})

    def bare():
        # The baseline: the same image and command with none of the hardening or the caps.
        client.containers.run(image, ["true"], remove=True, labels=L.base_labels("bench"))

    def hardened(runtime: str):
        def call():
            request = SandboxRequest(profile=SandboxProfile(runtime=runtime), argv=("true",), run_id="bench")
            result = backend.run(request)
            assert result.ok, result
        return call

    variants = [("bare docker run (baseline)", bare), ("ringfence runc", hardened("runc"))]
    if has_gvisor:
        variants.append(("ringfence gvisor", hardened("gvisor")))
    for _, fn in variants:  # warm up caches once each
        fn()
    results = {name: _timed(fn, args.calls) for name, fn in variants}
    base = statistics.median(results[variants[0][0]])
    print(f"sandbox call latency, {args.calls} calls each (median, p90, ratio of medians to baseline)")
    for name, samples in results.items():
        med = statistics.median(samples)
        p90 = sorted(samples)[int(0.9 * (len(samples) - 1))]
        print(f"  {name:<28} median {med * 1000:7.1f} ms  p90 {p90 * 1000:7.1f} ms  x{med / base:5.2f}")
    backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
