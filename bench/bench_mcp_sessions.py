"""MCP servers in session sandboxes: what a run's first call to a server costs (the session's
start: create, start, the server's own start-up, initialize) and what each later call costs,
against a cold call of the built-in `tool` image in the same run (the per-call container a
session replaces).

    session_start   the first call of a run to the server (a new session), ms
    session_call    each later call of that run (the session is up), ms
    cold_call       the same backend running `echo` in a fresh container (no pool), ms

Servers: the tests' rogue server (stdlib Python: the cheapest start-up) and mcp-server-time
(the MCP SDK and pydantic imported at start-up: a real server's), both under their
declarations' limits (0.5 CPU). Needs `make mcp-images`. Ratios, never asserts:

    .venv/bin/python -m bench.bench_mcp_sessions [--runs 3] [--calls 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVERS = (
    ("rogue", ROOT / "tests/mcp_servers/images", ROOT / "tests/mcp_servers/servers/rogue", "echo", {"text": "x"}),
    ("time", ROOT / "examples/mcp/images", ROOT / "examples/mcp/servers/time", "get_current_time",
     {"timezone": "UTC"}),
)


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(statistics.median(ordered), 1),
            "p90_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))], 1)}


def measure(runs: int, calls: int) -> dict[str, dict[str, dict[str, float]]]:
    from ringfence_server.control.mcp_servers.pinning import listing_request
    from ringfence_server.sandbox.backend import SandboxRequest
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.mcp_session import McpCall
    from ringfence_server.sandbox.pinned_images import lock_for
    from ringfence_server.sandbox.profile import SandboxProfile

    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, images, folder, tool, arguments in SERVERS:
        backend = DockerBackend(lock=lock_for(images))
        try:
            base = listing_request(folder)
            assert base.mcp is not None
            starts, later, cold = [], [], []
            for r in range(runs):
                request = dataclasses.replace(base, run_id=f"bench-mcp-{r}-{time.time_ns()}",
                                              mcp=McpCall(server=base.mcp.server, tool=tool, arguments=arguments))
                for i in range(calls + 1):
                    t = time.perf_counter()
                    result = backend.run(request)
                    (starts if i == 0 else later).append((time.perf_counter() - t) * 1000)
                    if not result.ok:
                        raise RuntimeError(f"{name}: {result.outcome.value}: {result.message}")
                backend.end_run(request.run_id)
            body = json.dumps({"tool": "echo", "arguments": {"text": "x"}, "call_id": "b", "idempotency_key": None})
            for _ in range(runs + 1):
                t = time.perf_counter()
                result = backend.run(SandboxRequest(profile=SandboxProfile(), stdin=body.encode(), run_id="bench-mcp",
                                                    warm=False))
                cold.append((time.perf_counter() - t) * 1000)
                if not result.ok:
                    raise RuntimeError(f"cold echo: {result.outcome.value}: {result.message}")
            out[name] = {"session_start": _ms(starts), "session_call": _ms(later), "cold_call": _ms(cold[1:])}
        finally:
            backend.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_mcp_sessions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per server (each starts one session)")
    parser.add_argument("--calls", type=int, default=20, help="later calls per run")
    args = parser.parse_args(argv)
    try:
        results = measure(args.runs, args.calls)
    except Exception as e:  # noqa: BLE001 - a benchmark reports what failed, it asserts nothing
        print(f"mcp sessions: FAILED: {type(e).__name__}: {e}", flush=True)
        return 1
    print(f"{'server':<8} {'session start p50':>18} {'later call p50/p90':>20} {'cold call p50':>14} "
          f"{'later / cold':>13}")
    for name, r in results.items():
        ratio = r["session_call"]["p50_ms"] / r["cold_call"]["p50_ms"]
        print(f"{name:<8} {r['session_start']['p50_ms']:>15.1f} ms {r['session_call']['p50_ms']:>9.1f} / "
              f"{r['session_call']['p90_ms']:<6.1f} ms {r['cold_call']['p50_ms']:>11.1f} ms {ratio:>13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
