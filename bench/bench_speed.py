"""Speed: what one call costs end to end, against what the engine itself costs, in one run.

Every variant runs the same trivial tool in the same pinned `tool` image with the same input:
the tool runner (the image's own command under tini) reads the dispatcher's request body for
`echo {"text": "hi"}` on stdin and answers `{"ok":true,...}` on stdout.

    floor        what any pool could reach: the same hardened container, created, attached and
                 started before the clock starts (untimed, with half a second for its runner to
                 be waiting on stdin); timed:
                 the request in, the answer out, the exit. Removal is untimed too. A warm call
                 that costs more than this pays for ringfence's own steps (admission, the
                 appends, the claim, the result's parse).
    bare         the engine's cost per call: docker-py's low-level API with the identical hardening
                 (host_config_kwargs of the echo manifest's profile, ringfence's seccomp JSON,
                 MaskedPaths, tini entrypoint, the image's Cmd, labels): create, attach, start,
                 stdin in / stdout out over the attach socket, wait, remove. Not included: what
                 ringfence adds around that (the inspect after create and after wait, the
                 image's pin check, the init witness, the result's classification).
    cold         SubmitBatch of one echo call over real gRPC on loopback to the in-process
                 server (Orchestrator + SQLite event log + DockerBackend, no pool). The run is
                 started before the clock starts; the latency is the SubmitBatch round trip.
    warm         the same with the warm pool on, waiting (untimed) for the pool to be full
                 and then the floor's half second before each call: each call claims a ready
                 container whose runner waits on stdin (steady state).
    warm_busy    the same pool, back-to-back calls with no waiting: what a burst sees.
    epicbox      the same runner in the same image by `epicbox.run` (a container per run), from a
                 venv of its own (bench/epicbox_child.py; `make bench` makes .bench-epicbox-venv),
                 in the same run: a sandbox library people compare us with.
    overhead     the control plane alone: SubmitBatch on the product's FakeBackend (admission,
                 policy, the durable appends to SQLite, gRPC); rpc_floor is a GetRun beside it,
                 append one SQLite append alone (fsync'd) in a scratch store on the same disk.
    throughput   N calls by C concurrent clients, wall time -> calls/s: bare (the engine's own
                 create+start+wait rate, C threads), cold, and warm (pool of --throughput-pool-size).
    concurrency  K clients at once (a barrier), one echo batch each, each client's latency
                 sorted; the same K as bare calls in K threads. The ratio says whose limit it is.
                 Ours runs with the pool as `ringfence serve` runs it (its defaults, the shape
                 registered by a warm-up call and filled before the burst), twice: with the
                 default dispatcher width (limits.max_parallel_reads)
                 and with it widened to K ("wide"); if wide ~ bare and default >> bare, the
                 limit is ours, not the engine's.
    batch        SubmitBatch of --batch echo reads in one run (the dispatcher runs
                 limits.max_parallel_reads of them at once), on serve's pool with its `size` ready
                 before each batch, --batch-repeats times each way, alternating: announced (the
                 dispatcher tells the pool the batch's reads before they claim, as it does) and
                 unannounced (that hint switched off). Shortfalls do not raise the target here
                 (DEMAND_WINDOW_S 0), so every batch starts from the same pool.
    memory       VmRSS of a fresh process hosting the control plane (FakeBackend, SQLite in a
                 temp dir), before and after starting 100 runs left open with one batch each.

The control plane runs on the embedded defaults (tenant demo, `echo` allowed) with one change:
limits.max_concurrent_batches is raised to the number of clients, because past it the edge
refuses (RESOURCE_EXHAUSTED) instead of queueing, and a refusal is not a latency.

Machines are shared and noisy: read the ratios against the in-run baseline, not the absolute
numbers. p99 of 30 samples is close to the maximum: one slow outlier moves it.

    .venv/bin/python -m bench.bench_speed [--calls 30] [--throughput-calls 40] [--clients 8]
                                          [--out bench/results] [--quick]

Writes OUT/latest.json, OUT/latest.md and OUT/latest.png (the PNG needs matplotlib, the
`bench` extra; without it the PNG is skipped). Targets are printed as pass/miss, never asserted.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import math
import os
import platform
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
AGENT_TOKEN = "demo-agent-token"  # the embedded demo tenant's public dev token (loopback only)
ECHO_ARGUMENTS = {"text": "hi"}
CALL_ID = "b1"
# The dispatcher's request body for that call (ringfence_server.control.orchestration.dispatch), byte for byte:
# bare feeds the same bytes to the same runner.
ECHO_BODY = json.dumps({"tool": "echo", "arguments": ECHO_ARGUMENTS, "call_id": CALL_ID, "idempotency_key": None},
                       separators=(",", ":")).encode()
ECHO_STDOUT = b'{"ok":true,"content":{"text":"hi"}}\n'  # what the runner answers (the fake backend's too)
RSS_RUNS = 100

# The variants with latency samples, in plot and table order.
LATENCY_VARIANTS = ("floor", "bare", "cold", "warm", "warm_busy", "epicbox", "overhead", "rpc_floor", "append",
                    "batch_announced", "batch_unannounced")
EPICBOX_PYTHON = ROOT / ".bench-epicbox-venv" / "bin" / "python"
CONCURRENCY_VARIANTS = ("concurrency_bare", "concurrency_ours", "concurrency_wide")


# ----------------------------------------------------------------------------- pure parts

def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between the closest ranks
    (numpy's default): percentile([1, 2, 3, 4], 50) == 2.5."""
    if not samples:
        raise ValueError("no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"q={q} is outside [0, 100]")
    ordered = sorted(samples)
    k = (len(ordered) - 1) * q / 100
    low = math.floor(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def summarize(name: str, samples_s: Sequence[float]) -> dict[str, Any]:
    """`{name}_p50_ms`, `_p90_ms`, `_p95_ms`, `_p99_ms`, `_mean_ms`, `_max_ms` and `_n` of samples in
    seconds."""
    ms = [s * 1000 for s in samples_s]
    if not ms:
        return {f"{name}_{k}": None for k in ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms")} | {
            f"{name}_n": 0}
    return {
        f"{name}_p50_ms": round(percentile(ms, 50), 3),
        f"{name}_p90_ms": round(percentile(ms, 90), 3),
        f"{name}_p95_ms": round(percentile(ms, 95), 3),
        f"{name}_p99_ms": round(percentile(ms, 99), 3),
        f"{name}_mean_ms": round(sum(ms) / len(ms), 3),
        f"{name}_max_ms": round(max(ms), 3),
        f"{name}_n": len(ms),
    }


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or not b:
        return None
    return a / b


@dataclass(frozen=True)
class Target:
    name: str
    what: str
    op: str  # "<=", ">=" or ">"
    goal: float
    value: Callable[[dict], float | None]


def _minus(a: Any, b: Any) -> float | None:
    if a is None or b is None:
        return None
    return float(a) - float(b)


def _slowest(r: dict, name: str) -> float | None:
    found = r.get(f"{name}_ms")
    return max(found) if found else None


# What "at the floor" means: a warm call close to a pre-started container, bursts never worse than
# bare, the pool ahead of its load; the older ratios stay beside them.
TARGETS = (
    Target("warm_p50_over_floor_ms", "warm p50 - floor p50, ms", "<=", 25.0,
           lambda r: _minus(r.get("warm_p50_ms"), r.get("floor_p50_ms"))),
    Target("warm_p50_vs_bare", "warm p50 / bare p50", "<=", 0.2,
           lambda r: _ratio(r.get("warm_p50_ms"), r.get("bare_p50_ms"))),
    Target("warm_p99_vs_warm_p50", "warm p99 / warm p50", "<=", 2.0,
           lambda r: _ratio(r.get("warm_p99_ms"), r.get("warm_p50_ms"))),
    Target("back_to_back_p90_vs_warm_p50", "back-to-back (warm_busy) p90 / warm p50", "<=", 2.0,
           lambda r: _ratio(r.get("warm_busy_p90_ms"), r.get("warm_p50_ms"))),
    Target("burst_slowest_vs_bare", "burst: our slowest / bare's slowest (K runs at once)", "<=", 1.0,
           lambda r: _ratio(_slowest(r, "concurrency_ours"), _slowest(r, "concurrency_bare"))),
    Target("burst_median_vs_bare", "burst: our median / bare's median", "<=", 0.5,
           lambda r: _ratio(r.get("concurrency_ours_p50_ms"), r.get("concurrency_bare_p50_ms"))),
    Target("cold_p50_vs_bare", "cold p50 / bare p50", "<=", 1.15,
           lambda r: _ratio(r.get("cold_p50_ms"), r.get("bare_p50_ms"))),
    Target("epicbox_p50_vs_warm_p50", "epicbox p50 / warm p50 (same image, same run)", ">=", 4.0,
           lambda r: _ratio(r.get("epicbox_p50_ms"), r.get("warm_p50_ms"))),
    Target("overhead_p50_ms", "control plane alone, p50 ms per call (with the durable append)", "<=", 1.5,
           lambda r: r.get("overhead_p50_ms")),
    Target("throughput_ratio", "cold calls/s / engine's own calls/s", ">=", 0.9,
           lambda r: r.get("throughput_ratio")),
    Target("throughput_ratio_warm", "warm calls/s / engine's own calls/s", ">=", 1.5,
           lambda r: r.get("throughput_ratio_warm")),
    Target("rss_mb_100_runs", f"control-plane RSS MB with {RSS_RUNS} live runs", "<=", 200.0,
           lambda r: r.get("rss_mb_100_runs")),
    Target("leftover_containers", "containers of this process left after the benchmark", "<=", 0,
           lambda r: r.get("leftover_containers")),
)

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda v, g: v <= g, ">=": lambda v, g: v >= g, ">": lambda v, g: v > g,
}


def evaluate_targets(results: dict) -> dict[str, dict]:
    """{name: {"value", "target", "op", "what", "met"}}; met is None when the figure was not
    measured (a skipped or failed variant)."""
    out = {}
    for t in TARGETS:
        value = t.value(results)
        met = None if value is None else bool(_OPS[t.op](value, t.goal))
        if value is not None and not isinstance(value, int):
            value = round(float(value), 4)
        out[t.name] = {"value": value, "target": t.goal,
                       "op": t.op, "what": t.what, "met": met}
    return out


def _verdict(met: bool | None) -> str:
    return "skipped" if met is None else ("pass" if met else "MISS")


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ms(value: float | None) -> str:
    return _fmt(value, 2 if value is not None and value < 10 else 1)


def _variant_rows(results: dict) -> list[list[str]]:
    base = results.get("bare_p50_ms")
    rows = []
    for v in LATENCY_VARIANTS + CONCURRENCY_VARIANTS:
        if results.get(f"{v}_n") is None:
            continue
        ratio = _ratio(results.get(f"{v}_p50_ms"), base)
        rows.append([v, _fmt(results.get(f"{v}_n")), _ms(results.get(f"{v}_p50_ms")),
                     _ms(results.get(f"{v}_p95_ms")), _ms(results.get(f"{v}_p99_ms")),
                     "-" if ratio is None else f"x{ratio:.2f}"])
    return rows


def _target_rows(results: dict) -> list[list[str]]:
    targets = results.get("targets") or evaluate_targets(results)
    return [[name, t["what"], _fmt(t["value"], 3), f"{t['op']} {t['target']:g}", _verdict(t["met"])]
            for name, t in targets.items()]


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    # Not strict: a short row just leaves its last columns out, as it always has.
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


_LAT_HEADER = ("variant", "n", "p50 ms", "p95 ms", "p99 ms", "p50 / bare p50")
_TARGET_HEADER = ("target", "what", "value", "goal", "result")


def _extra_lines(results: dict) -> list[str]:
    lines = []
    if results.get("throughput_engine_calls_per_s") is not None:
        lines.append(
            f"throughput ({results.get('throughput_clients')} clients, {results.get('throughput_calls')} calls): "
            f"engine {_fmt(results.get('throughput_engine_calls_per_s'), 2)}/s, "
            f"cold {_fmt(results.get('throughput_cold_calls_per_s'), 2)}/s "
            f"(x{_fmt(results.get('throughput_ratio'), 2)}), "
            f"warm {_fmt(results.get('throughput_warm_calls_per_s'), 2)}/s "
            f"(x{_fmt(results.get('throughput_ratio_warm'), 2)})")
    if results.get("overhead_events_per_call") is not None:
        lines.append(f"overhead: {results['overhead_events_per_call']} events appended per one-call batch in "
                     f"{results.get('overhead_writes_per_call')} durable writes; "
                     f"one append alone p50 {_ms(results.get('append_p50_ms'))} ms")
    if results.get("concurrency_bare_ms"):
        lines.append(f"concurrency ({results.get('concurrency_clients')} clients at once, sorted ms):")
        for v in CONCURRENCY_VARIANTS:
            if results.get(f"{v}_ms"):
                lines.append(f"  {v:<18} " + " ".join(f"{x:.0f}" for x in results[f"{v}_ms"]))
        lines.append(f"  slowest client: ours / bare x{_fmt(results.get('concurrency_ratio_max'), 2)}, "
                     f"wide / bare x{_fmt(results.get('concurrency_wide_ratio_max'), 2)}; "
                     f"median client: ours / bare x{_fmt(results.get('concurrency_ratio_p50'), 2)} "
                     f"(dispatcher width {results.get('concurrency_dispatch_width')})")
    if results.get("rss_mb_100_runs") is not None:
        lines.append(f"memory: control-plane RSS {_fmt(results.get('rss_mb_before'))} MB before, "
                     f"{_fmt(results.get('rss_mb_100_runs'))} MB with {RSS_RUNS} live runs "
                     f"(peak {_fmt(results.get('rss_mb_peak'))} MB, {results.get('rss_threads')} threads)")
    if results.get("batch_announced_ratio") is not None:
        lines.append(f"batch of reads: announced p50 / unannounced p50 x{_fmt(results['batch_announced_ratio'], 2)}")
    for key in ("pool_warm", "pool_warm_busy", "pool_throughput", "pool_concurrency_ours", "pool_concurrency_wide",
                "pool_batch_announced", "pool_batch_unannounced"):
        if results.get(key):
            lines.append(f"{key}: {json.dumps(results[key], sort_keys=True)}")
    if results.get("leftover_containers") is not None:
        lines.append(f"leftover containers: {results['leftover_containers']}")
    for note in results.get("notes") or []:
        lines.append(f"note: {note}")
    for err in results.get("errors") or []:
        lines.append(f"error: {err}")
    return lines


def render_text(results: dict) -> str:
    parts = ["call latency (ms; ratio of medians to the bare baseline measured in this run)",
             _text_table(_LAT_HEADER, _variant_rows(results)), "",
             "targets (benchmark figures, not assertions)", _text_table(_TARGET_HEADER, _target_rows(results)), ""]
    parts += _extra_lines(results)
    return "\n".join(parts)


def render_markdown(results: dict) -> str:
    machine = results.get("machine") or {}
    parts = [
        "# ringfence speed benchmark",
        "",
        f"Measured {results.get('when', '?')} on {machine.get('cpus', '?')} CPUs, Docker "
        f"{machine.get('docker_version', '?')}, kernel {machine.get('kernel', '?')}. "
        "Every figure is read against the bare baseline measured in the same run.",
        "",
        "## Latency",
        "",
        _markdown_table(_LAT_HEADER, _variant_rows(results)),
        "",
        "## Targets",
        "",
        _markdown_table(_TARGET_HEADER, _target_rows(results)),
        "",
    ]
    extra = _extra_lines(results)
    if extra:
        parts += ["## Details", "", "```", *extra, "```", ""]
    return "\n".join(parts)


REQUIRED_KEYS = (
    "floor_p50_ms", "floor_p95_ms", "floor_p99_ms",
    "bare_p50_ms", "bare_p95_ms", "bare_p99_ms",
    "cold_p50_ms", "cold_p95_ms", "cold_p99_ms",
    "warm_p50_ms", "warm_p95_ms", "warm_p99_ms",
    "warm_busy_p50_ms", "warm_busy_p95_ms", "warm_busy_p99_ms",
    "overhead_p50_ms", "overhead_p95_ms", "overhead_p99_ms",
    "throughput_engine_calls_per_s", "throughput_cold_calls_per_s", "throughput_warm_calls_per_s",
    "throughput_ratio", "throughput_ratio_warm",
    "rss_mb_before", "rss_mb_100_runs",
    "concurrency_bare_ms", "concurrency_ours_ms", "concurrency_wide_ms",
    "concurrency_bare_p50_ms", "concurrency_bare_p95_ms", "concurrency_bare_p99_ms",
    "concurrency_ours_p50_ms", "concurrency_ours_p95_ms", "concurrency_ours_p99_ms",
    "concurrency_ratio_max", "concurrency_ratio_p50",
    "leftover_containers", "targets", "machine", "when",
)


def finalize(results: dict) -> dict:
    """Fill in every required key (None where not measured), the derived ratios and the targets."""
    out = dict(results)
    for v in LATENCY_VARIANTS + CONCURRENCY_VARIANTS:
        for suffix in ("p50_ms", "p95_ms", "p99_ms"):
            out.setdefault(f"{v}_{suffix}", None)
    for key in REQUIRED_KEYS:
        out.setdefault(key, None)
    out["throughput_ratio"] = _round(_ratio(out["throughput_cold_calls_per_s"], out["throughput_engine_calls_per_s"]))
    out["throughput_ratio_warm"] = _round(_ratio(out["throughput_warm_calls_per_s"],
                                                 out["throughput_engine_calls_per_s"]))
    for which in ("max", "p50"):
        ours, bare = out.get(f"concurrency_ours_{which}_ms"), out.get(f"concurrency_bare_{which}_ms")
        out[f"concurrency_ratio_{which}"] = _round(_ratio(ours, bare))
    out["concurrency_wide_ratio_max"] = _round(_ratio(out.get("concurrency_wide_max_ms"),
                                                      out.get("concurrency_bare_max_ms")))
    out["batch_announced_ratio"] = _round(_ratio(out.get("batch_announced_p50_ms"),
                                                 out.get("batch_unannounced_p50_ms")))
    out["targets"] = evaluate_targets(out)
    return out


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def write_results(results: dict, out_dir: Path) -> list[str]:
    """latest.json, latest.md and (with matplotlib) latest.png; returns notes on what was skipped."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "latest.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    (out_dir / "latest.md").write_text(render_markdown(results))
    try:
        plot(results, out_dir / "latest.png")
    except ImportError as e:
        return [f"PNG skipped: matplotlib is not installed ({e}); `pip install -e '.[bench]'`"]
    except Exception as e:  # noqa: BLE001 - the figures are in the JSON and markdown already
        return [f"PNG skipped: plotting failed: {type(e).__name__}: {e}"]
    return []


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = results.get("samples_ms") or {}
    names = [v for v in LATENCY_VARIANTS + CONCURRENCY_VARIANTS if samples.get(v)]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names) + 2), 5))
    if names:
        # Whiskers at p1/p99; the tick labels set apart (`labels=` was renamed in matplotlib 3.9).
        ax.boxplot([samples[n] for n in names], whis=(1, 99), showfliers=True)
        ax.set_xticks(range(1, len(names) + 1), names)
        ax.set_yscale("log")
        for i, n in enumerate(names, start=1):
            p50 = results.get(f"{n}_p50_ms")
            if p50 is not None:
                ax.annotate(_ms(p50), (i + 0.28, p50), fontsize=7, va="center")
        if results.get("bare_p50_ms"):
            ax.axhline(results["bare_p50_ms"], color="grey", linestyle="--", linewidth=0.8)
            ax.annotate("bare p50", (len(names) + 0.45, results["bare_p50_ms"]), fontsize=7, color="grey",
                        va="bottom", ha="right")
    ax.set_ylabel("latency per call, ms (log)")
    machine = results.get("machine") or {}
    ax.set_title(f"ringfence call latency ({machine.get('cpus', '?')} CPUs, "
                 f"Docker {machine.get('docker_version', '?')}, {results.get('when', '')[:16]})", fontsize=9)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- measuring

def _rss() -> dict[str, float]:
    """VmRSS, VmHWM (MB) and Threads of this process, from /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
            elif key == "Threads":
                out[key] = int(value)
    return out


def _echo_manifest_profile():
    """The SandboxProfile dispatch gives `echo` (its manifest's limits): bare and the pool's
    pre-warmed key use exactly this shape."""
    from ringfence_server.control.config import load_config
    from ringfence_server.control.registry import Registry
    from ringfence_server.sandbox.profile import SandboxProfile

    config = load_config()
    manifest = Registry.from_dir(config.tools_dir).get("echo")
    lim = manifest.limits
    return SandboxProfile(image=manifest.image, runtime=manifest.runtime, memory_bytes=lim.memory_bytes,
                          cpus=lim.cpus, pids=lim.pids, timeout_s=lim.timeout_s, stdout_limit=lim.stdout_limit,
                          stderr_limit=lim.stderr_limit), manifest


class BareRunner:
    """The baseline: the hardened container through docker-py's low-level API, nothing else."""

    def __init__(self, client, image_id: str, profile) -> None:
        from docker.models.containers import _create_container_args

        from ringfence_server.sandbox import labels as L
        from ringfence_server.sandbox import seccomp
        from ringfence_server.sandbox.host_config import host_config_kwargs

        self.api = client.api
        settings = host_config_kwargs(profile, seccomp.profile_json(profile.runtime))
        masked = settings.pop("masked_paths", None)
        command = list((self.api.inspect_image(image_id).get("Config") or {}).get("Cmd") or [])
        settings.update(image=image_id, command=command, labels=L.base_labels("bench"), version=self.api._version)
        self._create_kwargs = _create_container_args(settings)
        if masked is not None:
            self._create_kwargs["host_config"]["MaskedPaths"] = list(masked)
        self.timeout_s = profile.timeout_s

    def run(self, body: bytes = ECHO_BODY) -> bytes:
        api = self.api
        container_id = api.create_container(**self._create_kwargs)["Id"]
        try:
            attach = api.attach_socket(container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            sock = getattr(attach, "_sock", attach)
            out = bytearray()
            try:
                api.start(container_id)
                sock.settimeout(self.timeout_s)
                sock.sendall(body)
                sock.shutdown(socket.SHUT_WR)
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    out += chunk
            finally:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                attach.close()
                sock.close()
            status = api.wait(container_id, timeout=self.timeout_s + 10)
        finally:
            api.remove_container(container_id, force=True)
        if status.get("StatusCode") != 0 or b'"ok":true' not in out:
            raise RuntimeError(f"bare call failed: status {status}, output {bytes(out)[-300:]!r}")
        return bytes(out)


READY_WAIT_S = 0.5


class FloorRunner:
    """The floor: BareRunner's container, made and started ahead; only the exchange is timed."""

    def __init__(self, bare: BareRunner) -> None:
        self.api, self._create_kwargs, self.timeout_s = bare.api, bare._create_kwargs, bare.timeout_s

    def ready(self) -> tuple[str, Any, Any]:
        """A started container whose runner waits on stdin (untimed)."""
        container_id = self.api.create_container(**self._create_kwargs)["Id"]
        attach = self.api.attach_socket(container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        sock = getattr(attach, "_sock", attach)
        self.api.start(container_id)
        # Untimed: the runner's interpreter starts and blocks on stdin (a pool's container has
        # long been there when a call claims it). Measured without it, the floor paid the
        # interpreter's start-up and read above warm (173 ms against 96 ms p50).
        time.sleep(READY_WAIT_S)
        return container_id, attach, sock

    def call(self, ready: tuple[str, Any, Any], body: bytes = ECHO_BODY) -> bytes:
        """Timed: the request in, the answer out, the exit."""
        container_id, _attach, sock = ready
        out = bytearray()
        sock.settimeout(self.timeout_s)
        sock.sendall(body)
        sock.shutdown(socket.SHUT_WR)
        while chunk := sock.recv(65536):
            out += chunk
        status = self.api.wait(container_id, timeout=self.timeout_s + 10)
        if status.get("StatusCode") != 0 or b'"ok":true' not in out:
            raise RuntimeError(f"floor call failed: status {status}, output {bytes(out)[-300:]!r}")
        return bytes(out)

    def samples(self, calls: int) -> list[float]:
        """`calls` timed exchanges, each with a container of its own (one more first, untimed
        in the result: it warms caches, like bare's first run)."""
        samples = []
        for _ in range(calls + 1):
            ready = self.ready()
            try:
                started = time.perf_counter()
                self.call(ready)
                samples.append(time.perf_counter() - started)
            finally:
                self.remove(ready)
        return samples[1:]

    def remove(self, ready: tuple[str, Any, Any]) -> None:
        container_id, attach, sock = ready
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        attach.close()
        sock.close()
        self.api.remove_container(container_id, force=True)


class ControlPlane:
    """The real server in-process: Orchestrator + SQLite event log + gRPC on a loopback port."""

    def __init__(self, backend, limits: dict[str, Any] | None = None) -> None:
        from ringfence_server.control.api.background import BackgroundServer
        from ringfence_server.control.config import load_config
        from ringfence_server.control.orchestration import Orchestrator
        from ringfence_server.control.store import SqliteEventStore

        self.tmp = tempfile.mkdtemp(prefix="rf-bench-speed-")
        overrides: dict[str, Any] = {"state_dir": self.tmp}
        if limits:
            overrides["limits"] = dict(limits)
        self.config = load_config(overrides=overrides)
        self.store = SqliteEventStore(self.config.db_path)
        self.orchestrator = Orchestrator.from_config(self.config, backend, self.store)
        self.server = BackgroundServer(self.orchestrator, self.config).start()
        self._runs = 0

    def client(self):
        from ringfence import Client

        return Client(self.server.address, AGENT_TOKEN, timeout=300)

    def new_runs(self, client, n: int, prefix: str) -> list[str]:
        ids = []
        for _ in range(n):
            self._runs += 1
            ids.append(client.start_run("bench", f"{prefix}-{self._runs}").run_id)
        return ids

    def close(self) -> None:
        try:
            self.server.stop()
        finally:
            self.orchestrator.close()
            self.store.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


def submit_echoes(client, run_id: str, n: int) -> None:
    """One batch of `n` echo reads (each its own text: the same call proposed again is a loop)."""
    from ringfence.model import ObservationStatus

    calls = [{"call_id": f"{CALL_ID}-{i}", "tool": "echo", "arguments": {"text": f"hi {i}"}} for i in range(n)]
    for call, o in zip(calls, client.submit_batch(run_id, calls), strict=True):
        if o.status is not ObservationStatus.EXECUTED or o.error or o.content != call["arguments"]:
            raise RuntimeError(f"echo did not run as expected: {o}")


def submit_echo(client, run_id: str) -> None:
    from ringfence.model import ObservationStatus

    observations = client.submit_batch(run_id, [{"call_id": CALL_ID, "tool": "echo", "arguments": ECHO_ARGUMENTS}])
    o = observations[0]
    if o.status is not ObservationStatus.EXECUTED or o.error or o.content != ECHO_ARGUMENTS:
        raise RuntimeError(f"echo did not run as expected: {o}")


def _finish(client, run_ids: Sequence[str]) -> None:
    for run_id in run_ids:
        with suppress(Exception):  # bookkeeping after the measurement only
            client.finish_run(run_id)


def timed_sequence(n: int, call: Callable[[int], None], before: Callable[[int], None] | None = None) -> list[float]:
    """n calls one after another; `before(i)` runs untimed before each."""
    samples = []
    for i in range(n):
        if before is not None:
            before(i)
        started = time.perf_counter()
        call(i)
        samples.append(time.perf_counter() - started)
    return samples


def timed_concurrent(total: int, workers: int,
                     make_worker: Callable[[int], Callable[[int], None]]) -> tuple[float, list[float]]:
    """`total` calls taken from a shared counter by `workers` threads released together;
    `make_worker(k)` (untimed) returns worker k's call(i). Returns (wall seconds, each call's latency)."""
    items: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(total):
        items.put(i)
    barrier = threading.Barrier(workers + 1)
    latencies: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def body(k: int) -> None:
        try:
            call = make_worker(k)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            call = None
        barrier.wait()
        if call is None:
            return
        while True:
            try:
                i = items.get_nowait()
            except queue.Empty:
                return
            started = time.perf_counter()
            try:
                call(i)
            except BaseException as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(e)
                continue
            with lock:
                latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=body, args=(k,), name=f"bench-{k}", daemon=True) for k in range(workers)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} of {total} calls failed; first: {errors[0]!r}")
    return wall, latencies


def pool_api() -> tuple[Any, str]:
    """(PoolSettings, "") when the warm pool exists, else (None, why not)."""
    try:
        from ringfence_server.sandbox.pool import PoolSettings
    except ImportError as e:
        return None, f"pool not available: cannot import ringfence_server.sandbox.pool.PoolSettings ({e})"
    from ringfence_server.sandbox.docker_backend import DockerBackend

    if "pool" not in inspect.signature(DockerBackend.__init__).parameters:
        return None, "pool not available: DockerBackend takes no pool= argument yet"
    return PoolSettings, ""


def _pool_delta(before: dict, after: dict) -> dict:
    return {k: after.get(k, 0) - before.get(k, 0) for k in ("claims", "misses", "created", "discarded")} | {
        "waited": after.get("waited", 0) - before.get("waited", 0), "ready_at_end": after.get("ready")}


@contextmanager
def _quiet_urllib3() -> Iterator[None]:
    # docker-py's connection pool holds 10 connections; past that urllib3 warns on every
    # discard. The same for bare and ours; the warning is noise in the table.
    log = logging.getLogger("urllib3.connectionpool")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


# ----------------------------------------------------------------------------- phases

class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import docker

        from ringfence_server.sandbox.pinned_images import load_lock

        self.args = args
        self.client = docker.from_env(timeout=120)
        self.image_id = load_lock().image_id("tool")
        self.profile, self.manifest = _echo_manifest_profile()
        self.bare = BareRunner(self.client, self.image_id, self.profile)
        self.results: dict[str, Any] = {}
        self.samples: dict[str, list[float]] = {}
        self.notes: list[str] = []
        self.errors: list[str] = []
        self.limits = {"max_concurrent_batches": max(args.clients, args.concurrency, 4)}

    def log(self, message: str) -> None:
        print(f"   {message}", flush=True)

    def record(self, name: str, samples_s: Sequence[float]) -> None:
        self.samples[name] = [round(s * 1000, 3) for s in samples_s]
        self.results.update(summarize(name, samples_s))
        p50 = self.results[f"{name}_p50_ms"]
        self.log(f"{name:<18} n={len(samples_s):<4} p50 {p50:8.1f} ms  p99 {self.results[f'{name}_p99_ms']:8.1f} ms")

    def phase(self, name: str, fn: Callable[[], None]) -> None:
        print(f"-- {name}", flush=True)
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - one failed phase must not lose the others
            self.errors.append(f"{name}: {type(e).__name__}: {e}")
            print(f"   FAILED: {type(e).__name__}: {e}", flush=True)

    def _check_profile(self, cp: ControlPlane) -> None:
        used = cp.orchestrator.dispatcher.profile(self.manifest)
        if used != self.profile:
            self.notes.append("the dispatcher's echo profile differs from the one bare and the pool key use: "
                              f"{used} vs {self.profile}")

    # -- bare, cold, concurrency, throughput without the pool
    def run_floor(self) -> None:
        self.record("floor", FloorRunner(self.bare).samples(self.args.calls))

    def run_bare(self) -> None:
        self.bare.run()  # warm up caches (image, seccomp JSON)
        self.record("bare", timed_sequence(self.args.calls, lambda i: self.bare.run()))

    def run_cold(self) -> None:
        from ringfence_server.sandbox.docker_backend import DockerBackend

        backend = DockerBackend()
        cp = None
        try:
            cp = ControlPlane(backend, self.limits)
            self._check_profile(cp)
            with cp.client() as c:
                warmup = cp.new_runs(c, 1, "cold-warmup")
                submit_echo(c, warmup[0])
                runs = cp.new_runs(c, self.args.calls, "cold")
                self.record("cold", timed_sequence(self.args.calls, lambda i: submit_echo(c, runs[i])))
                _finish(c, warmup + runs)
            self.throughput("cold", cp)
        finally:
            if cp is not None:
                cp.close()
            backend.close()

    def throughput_engine(self) -> None:
        n, workers = self.args.throughput_calls, self.args.clients
        wall, _lat = timed_concurrent(n, workers, lambda k: (lambda i: self.bare.run()))
        self.results["throughput_engine_calls_per_s"] = round(n / wall, 3)
        self.results.update({"throughput_clients": workers, "throughput_calls": n})
        self.log(f"engine (bare) throughput: {n} calls, {workers} threads, {wall:.2f}s -> {n / wall:.2f}/s")

    def throughput(self, name: str, cp: ControlPlane) -> None:
        n, workers = self.args.throughput_calls, self.args.clients
        with cp.client() as c:
            runs = cp.new_runs(c, n, f"tp-{name}")
        clients: list[Any] = []

        def make_worker(k: int):
            client = cp.client()
            clients.append(client)
            return lambda i: submit_echo(client, runs[i])

        try:
            wall, _lat = timed_concurrent(n, workers, make_worker)
        finally:
            for client in clients:
                client.close()
        self.results[f"throughput_{name}_calls_per_s"] = round(n / wall, 3)
        self.log(f"{name} throughput: {n} calls, {workers} clients, {wall:.2f}s -> {n / wall:.2f}/s")

    def run_concurrency(self) -> None:
        from ringfence_server.sandbox.docker_backend import DockerBackend

        k = self.args.concurrency
        self.results["concurrency_clients"] = k
        _, lat = timed_concurrent(k, k, lambda w: (lambda i: self.bare.run()))
        self._record_concurrency("concurrency_bare", lat)
        width = self.limits.get("max_parallel_reads")
        from ringfence_server.control.config import Limits

        self.results["concurrency_dispatch_width"] = width or Limits().max_parallel_reads
        from ringfence_server.control.api.serve import pool_settings
        from ringfence_server.control.config import load_config

        # The pool as `ringfence serve` runs it on its defaults ([pool] size 2, max_size 8): the
        # warm-up call registers the shape, and the burst starts once its `size` are ready.
        served_pool = pool_settings(load_config())
        for name, extra in (("concurrency_ours", {}), ("concurrency_wide", {"max_parallel_reads": k})):
            backend = DockerBackend(pool=served_pool)
            cp = None
            try:
                cp = ControlPlane(backend, {**self.limits, **extra})
                with cp.client() as c:
                    submit_echo(c, cp.new_runs(c, 1, "conc-warmup")[0])
                    runs = cp.new_runs(c, k, name)
                if backend.pool is not None:
                    backend.pool.wait_filled(60)
                    before = backend.pool.stats()
                clients: list[Any] = []

                def make_worker(w: int, cp=cp, runs=runs, clients=clients):
                    client = cp.client()
                    clients.append(client)
                    return lambda i: submit_echo(client, runs[i])

                try:
                    _, lat = timed_concurrent(k, k, make_worker)
                finally:
                    for client in clients:
                        client.close()
                self._record_concurrency(name, lat)
                if backend.pool is not None:
                    self.results[f"pool_{name}"] = _pool_delta(before, backend.pool.stats())
            finally:
                if cp is not None:
                    cp.close()
                backend.close()

    def _record_concurrency(self, name: str, lat: list[float]) -> None:
        self.record(name, lat)
        self.results[f"{name}_ms"] = sorted(round(x * 1000, 1) for x in lat)

    # -- warm: the pool
    def run_warm(self) -> None:
        PoolSettings, why = pool_api()
        if PoolSettings is None:
            self.notes.append(why + "; warm, warm_busy and warm throughput skipped")
            print(f"   {why}: warm variants skipped", flush=True)
            return
        from ringfence_server.sandbox.backend import SandboxRequest
        from ringfence_server.sandbox.docker_backend import DockerBackend

        key_request = SandboxRequest(profile=self.profile, argv=(), stdin=b"", run_id="bench")
        size = self.args.pool_size
        backend = DockerBackend(pool=PoolSettings(size=size, max_size=max(size, 8), idle_s=600))
        cp = None
        try:
            pool = backend.pool
            pool.prewarm(key_request)
            if not pool.wait_filled(timeout_s=60):
                self.notes.append("the pool was not full 60 s after prewarm")
            cp = ControlPlane(backend, self.limits)
            self._check_profile(cp)
            with cp.client() as c:
                submit_echo(c, cp.new_runs(c, 1, "warm-warmup")[0])
                runs = cp.new_runs(c, self.args.calls, "warm")
                unfilled = [0]

                def refill(i: int) -> None:
                    if not pool.wait_filled(timeout_s=60):
                        unfilled[0] += 1
                    # The floor's allowance: a container the refill just started still boots its
                    # runner (some 100 ms of CPU) and the last call's container is being removed;
                    # in steady state both are long done when a call claims one.
                    time.sleep(READY_WAIT_S)

                refill(-1)
                before = pool.stats()
                self.record("warm", timed_sequence(self.args.calls, lambda i: submit_echo(c, runs[i]), before=refill))
                self.results["pool_warm"] = _pool_delta(before, pool.stats()) | {"pool_size": self.args.pool_size}
                if unfilled[0]:
                    self.notes.append(f"warm: the pool was not refilled within 60 s before {unfilled[0]} calls")
                runs = cp.new_runs(c, self.args.calls, "warm-busy")
                refill(-1)
                before = pool.stats()
                self.record("warm_busy", timed_sequence(self.args.calls, lambda i: submit_echo(c, runs[i])))
                self.results["pool_warm_busy"] = _pool_delta(before, pool.stats()) | {"pool_size": self.args.pool_size}
        finally:
            if cp is not None:
                cp.close()
            backend.close()
        # Throughput with a pool sized for the clients (a deployment sizes it to its concurrency).
        size = self.args.throughput_pool_size or self.args.clients
        backend = DockerBackend(pool=PoolSettings(size=size, max_size=max(size, 8), idle_s=600))
        cp = None
        try:
            pool = backend.pool
            pool.prewarm(key_request)
            cp = ControlPlane(backend, self.limits)
            with cp.client() as c:
                submit_echo(c, cp.new_runs(c, 1, "tpw-warmup")[0])
            if not pool.wait_filled(timeout_s=120):
                self.notes.append("throughput (warm): the pool was not full before the clients started")
            before = pool.stats()
            self.throughput("warm", cp)
            self.results["pool_throughput"] = _pool_delta(before, pool.stats()) | {"pool_size": size}
        finally:
            if cp is not None:
                cp.close()
            backend.close()

    # -- a batch of reads: the pool told ahead, or not
    def run_batch(self) -> None:
        from ringfence_server.control.api.serve import pool_settings
        from ringfence_server.control.config import load_config
        from ringfence_server.sandbox import pool as pool_module
        from ringfence_server.sandbox.docker_backend import DockerBackend

        n, repeats = self.args.batch, self.args.batch_repeats
        window = pool_module.DEMAND_WINDOW_S
        pool_module.DEMAND_WINDOW_S = 0.0  # every batch starts from `size` ready
        backend = DockerBackend(pool=pool_settings(load_config()))
        announce = backend.expect
        cp = None
        try:
            cp = ControlPlane(backend, self.limits)
            samples: dict[str, list[float]] = {"batch_announced": [], "batch_unannounced": []}
            stats: dict[str, dict] = {}
            with cp.client() as c:
                submit_echo(c, cp.new_runs(c, 1, "batch-warmup")[0])
                runs = cp.new_runs(c, 2 * repeats, "batch")
                for i, run in enumerate(runs):
                    name = "batch_announced" if i % 2 == 0 else "batch_unannounced"
                    backend.expect = announce if i % 2 == 0 else (lambda requests: None)  # type: ignore[method-assign]
                    backend.pool.wait_filled(60)
                    time.sleep(READY_WAIT_S)
                    before = backend.pool.stats()
                    started = time.perf_counter()
                    submit_echoes(c, run, n)
                    samples[name].append(time.perf_counter() - started)
                    delta = _pool_delta(before, backend.pool.stats())
                    total = stats.setdefault(name, {})
                    for k in ("claims", "misses", "waited"):
                        total[k] = total.get(k, 0) + delta[k]
            for name, taken in samples.items():
                self.record(name, taken)
                self.results[f"pool_{name}"] = stats[name] | {"batch": n, "repeats": repeats}
        finally:
            pool_module.DEMAND_WINDOW_S = window
            backend.expect = announce  # type: ignore[method-assign]
            if cp is not None:
                cp.close()
            backend.close()

    # -- epicbox, from its own venv
    def run_epicbox(self) -> None:
        python = Path(self.args.epicbox_python)
        if not python.is_file():
            self.notes.append(f"epicbox skipped: no {python} (make bench makes it)")
            self.log(f"no {python}: epicbox skipped")
            return
        proc = subprocess.run([str(python), str(ROOT / "bench" / "epicbox_child.py"), self.image_id,
                               str(self.args.calls)], capture_output=True, text=True, timeout=900)
        report = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}
        if proc.returncode != 0 or "samples_s" not in report:
            raise RuntimeError(f"epicbox child failed ({proc.returncode}): "
                               f"{report.get('error') or proc.stderr.strip()[-800:]}")
        self.results["epicbox_version"] = report["version"]
        self.record("epicbox", report["samples_s"])

    # -- overhead: the fake backend
    def run_overhead(self) -> None:
        from ringfence_server.sandbox.fake import FakeBackend, ok_result

        backend = FakeBackend(lambda request: ok_result(ECHO_STDOUT))
        cp = ControlPlane(backend, self.limits)
        try:
            with cp.client() as c:
                warm = cp.new_runs(c, 3, "ovh-warmup")
                for run_id in warm:
                    submit_echo(c, run_id)
                runs = cp.new_runs(c, self.args.overhead_calls, "ovh")
                self.record("overhead", timed_sequence(len(runs), lambda i: submit_echo(c, runs[i])))
                self.record("rpc_floor", timed_sequence(len(runs), lambda i: c.get_run(runs[i])))
                # Durable appends behind one measured call: the run's log minus its run_started,
                # and the writes they took (group commit: events of one write share its `at`).
                events = cp.store.read(runs[0])[1:]
                self.results["overhead_events_per_call"] = len(events)
                self.results["overhead_writes_per_call"] = len({e.at for e in events})
        finally:
            cp.close()
        # One durable append alone (SQLite, WAL, synchronous=FULL: an fsync each), on the same
        # disk, in a scratch store: what each of those events costs at least.
        from ringfence_server.control.store import SqliteEventStore

        tmp = tempfile.mkdtemp(prefix="rf-bench-append-")
        store = SqliteEventStore(Path(tmp) / "scratch.sqlite3")
        try:
            store.append("scratch", "run_started", {"tenant": "bench"}, tenant="bench")
            data = {"call_id": CALL_ID, "tool": "echo", "content": ECHO_ARGUMENTS}
            self.record("append", timed_sequence(self.args.overhead_calls,
                                                 lambda i: store.append("scratch", "bench_note", data)))
        finally:
            store.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def run_memory(self) -> None:
        # A fresh process: this one holds docker-py, the earlier phases' leftovers, and so on.
        proc = subprocess.run([sys.executable, "-m", "bench.bench_speed", "--memory-child", str(RSS_RUNS)],
                              cwd=str(ROOT), capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"memory child failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        self.results.update(report)
        self.log(f"RSS {report['rss_mb_before']:.1f} MB before, {report['rss_mb_100_runs']:.1f} MB with "
                 f"{RSS_RUNS} live runs (peak {report['rss_mb_peak']:.1f} MB)")

    def leftovers(self) -> int:
        from ringfence_server.sandbox import labels as L

        found = self.client.containers.list(all=True, filters={"label": [
            f"{L.PRODUCT_LABEL}={L.PRODUCT}", f"{L.INSTANCE_LABEL}={L.instance_id()}"]})
        ours = [c for c in found if c.labels.get(L.PURPOSE_LABEL) in ("bench", "call", "pool")]
        for c in ours:
            with suppress(Exception):  # gone meanwhile
                c.remove(force=True)
        return len(ours)

    def machine(self) -> dict:
        from ringfence_server.sandbox import labels as L

        try:
            version = self.client.version().get("Version")
        except Exception:  # noqa: BLE001 - the report only notes the version when it can
            version = None
        try:
            others = [c for c in self.client.containers.list()
                      if c.labels.get(L.INSTANCE_LABEL) != L.instance_id()]
        except Exception:  # noqa: BLE001 - the report only notes other load when it can
            others = []
        return {"cpus": os.cpu_count(), "docker_version": version, "kernel": platform.release(),
                "python": platform.python_version(), "loadavg": [round(x, 2) for x in os.getloadavg()],
                "other_containers_running": len(others)}


def memory_child(runs: int) -> dict:
    """In a fresh process: the control plane on the fake backend, RSS before and after `runs`
    live runs with one batch each (submitted by 8 client threads)."""
    from ringfence_server.control.telemetry import configure_tracing
    from ringfence_server.sandbox.fake import FakeBackend, ok_result

    configure_tracing(None, False, record=True)  # as `ringfence serve` does
    backend = FakeBackend(lambda request: ok_result(ECHO_STDOUT))
    cp = ControlPlane(backend, {"max_concurrent_batches": 16})
    try:
        with cp.client() as c:
            warm = cp.new_runs(c, 1, "mem-warmup")
            submit_echo(c, warm[0])
            _finish(c, warm)
        before = _rss()
        ids = [f"mem-{i}" for i in range(runs)]

        def make_worker(k: int):
            client = cp.client()

            def one(i: int) -> None:
                client.start_run("bench", ids[i])
                submit_echo(client, ids[i])

            return one

        timed_concurrent(runs, 8, make_worker)
        wanted = set(ids)
        with cp.client() as c:
            live = sum(1 for r in c.list_runs() if r.run_id in wanted and r.status.value != "finished")
        after = _rss()
        return {"rss_mb_before": round(before["VmRSS"], 1), "rss_mb_100_runs": round(after["VmRSS"], 1),
                "rss_mb_peak": round(after["VmHWM"], 1), "rss_threads": after["Threads"], "rss_live_runs": live}
    finally:
        cp.close()


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=30, help="sequential calls per latency variant (default 30)")
    parser.add_argument("--throughput-calls", type=int, default=40, help="calls per throughput variant (default 40)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients for throughput (default 8)")
    parser.add_argument("--concurrency", type=int, default=20, help="clients at once in the concurrency variant")
    parser.add_argument("--overhead-calls", type=int, default=200, help="calls on the fake backend (default 200)")
    parser.add_argument("--batch", type=int, default=8, help="reads per batch in the batch variant (default 8)")
    parser.add_argument("--batch-repeats", type=int, default=8, help="batches each way in the batch variant")
    parser.add_argument("--pool-size", type=int, default=2, help="warm containers per key for warm/warm_busy")
    parser.add_argument("--throughput-pool-size", type=int, default=0,
                        help="pool size for the warm throughput (default: --clients)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where latest.* go")
    parser.add_argument("--epicbox-python", default=str(EPICBOX_PYTHON),
                        help="the python of a venv with epicbox (default: .bench-epicbox-venv, `make bench`)")
    parser.add_argument("--quick", action="store_true", help="a smoke run with few calls")
    parser.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child)), flush=True)
        return 0
    if args.quick:
        args.calls, args.throughput_calls, args.overhead_calls = min(args.calls, 5), min(args.throughput_calls, 16), 30
        args.concurrency = min(args.concurrency, 6)
        args.batch_repeats = min(args.batch_repeats, 2)

    from ringfence_server.control.telemetry import configure_tracing, shutdown_tracing

    # As `ringfence serve` does: spans always recorded (exported nowhere).
    tracing = configure_tracing(None, False, record=True)
    bench = Bench(args)
    machine = bench.machine()
    print(f"speed: {args.calls} calls per variant, throughput {args.throughput_calls} calls x {args.clients} "
          f"clients, concurrency {args.concurrency}; {machine['cpus']} CPUs, Docker {machine['docker_version']}, "
          f"load {machine['loadavg']}, {machine['other_containers_running']} other containers running", flush=True)
    started = time.monotonic()
    try:
        with _quiet_urllib3():
            bench.phase("floor (a started container answering on stdin)", bench.run_floor)
            bench.phase("bare (docker-py, identical hardening)", bench.run_bare)
            bench.phase("engine throughput (bare)", bench.throughput_engine)
            bench.phase("cold (SubmitBatch, no pool) + throughput", bench.run_cold)
            bench.phase("warm (pool) + warm_busy + throughput", bench.run_warm)
            bench.phase("batch of reads, announced to the pool or not", bench.run_batch)
            bench.phase("epicbox (its own venv, same image)", bench.run_epicbox)
            bench.phase("overhead (fake backend)", bench.run_overhead)
            bench.phase("concurrency", bench.run_concurrency)
            bench.phase("memory", bench.run_memory)
    finally:
        leftover = bench.leftovers()
        machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        machine["other_containers_running_end"] = bench.machine()["other_containers_running"]
        bench.client.close()
        shutdown_tracing(tracing)
    results = dict(bench.results)
    results.update({
        "leftover_containers": leftover,
        "samples_ms": bench.samples,
        "machine": machine,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - started, 1),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "memory_child"},
        "notes": bench.notes,
        "errors": bench.errors,
    })
    results = finalize(results)
    results["notes"] = results["notes"] + write_results(results, args.out)
    # Written again so the JSON carries the PNG note too.
    (args.out / "latest.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print()
    print(render_text(results))
    print(f"\nwrote {args.out / 'latest.json'}, latest.md" + ("" if any("PNG skipped" in n for n in results["notes"])
                                                          else ", latest.png"))
    return 1 if bench.errors else 0


if __name__ == "__main__":
    sys.exit(main())
