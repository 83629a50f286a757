"""bench/bench_speed.py's pure parts: percentiles, the targets, the report's keys and rendering.
No Docker and no timing: the benchmark's figures are printed, never asserted."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    # bench/ is not an installed package: load the module from the checkout.
    name = "bench_speed_under_test"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "bench_speed.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bs = _load()


def _full_results() -> dict:
    """A measured run's raw figures (before finalize), every variant present."""
    r: dict = {}
    for name, p50 in (("floor", 40.0), ("bare", 400.0), ("cold", 440.0), ("warm", 60.0), ("warm_busy", 150.0),
                      ("overhead", 1.2), ("rpc_floor", 0.5)):
        r.update(bs.summarize(name, [p50 / 1000] * 10))
    r.update({"warm_p99_ms": 100.0})
    for name in bs.CONCURRENCY_VARIANTS:
        lat = [i / 10 for i in range(1, 21)]
        r.update(bs.summarize(name, lat))
        r[f"{name}_ms"] = sorted(x * 1000 for x in lat)
    r.update({"throughput_engine_calls_per_s": 5.0, "throughput_cold_calls_per_s": 4.75,
              "throughput_warm_calls_per_s": 8.0, "throughput_clients": 8, "throughput_calls": 40,
              "rss_mb_before": 50.0, "rss_mb_100_runs": 60.0, "rss_mb_peak": 61.0, "rss_threads": 20,
              "concurrency_clients": 20, "concurrency_dispatch_width": 4, "leftover_containers": 0,
              "machine": {"cpus": 2, "docker_version": "20.10", "kernel": "6.1"}, "when": "2024-01-01T00:00:00+00:00",
              "samples_ms": {"bare": [400.0] * 10, "cold": [440.0] * 10}, "notes": [], "errors": []})
    return r


# -- percentiles ------------------------------------------------------------------------------

def test_percentile_interpolates_between_ranks_like_numpy():
    assert bs.percentile([1, 2, 3, 4], 50) == 2.5
    assert bs.percentile([4, 1, 3, 2], 0) == 1
    assert bs.percentile([4, 1, 3, 2], 100) == 4
    assert bs.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert bs.percentile([7.0], 99) == 7.0


@pytest.mark.parametrize("samples, q", [([], 50), ([1.0], -1), ([1.0], 101)])
def test_percentile_refuses_no_samples_and_bad_q(samples, q):
    with pytest.raises(ValueError):
        bs.percentile(samples, q)


def test_summarize_reports_milliseconds_under_the_variant_name():
    s = bs.summarize("cold", [0.1, 0.2, 0.3, 0.4])
    assert s["cold_p50_ms"] == pytest.approx(250.0)
    assert s["cold_max_ms"] == pytest.approx(400.0)
    assert s["cold_n"] == 4
    assert {"cold_p95_ms", "cold_p99_ms", "cold_mean_ms"} <= s.keys()


def test_summarize_of_nothing_is_none_not_zero():
    s = bs.summarize("warm", [])
    assert s["warm_p50_ms"] is None and s["warm_n"] == 0


# -- targets ----------------------------------------------------------------------------------

def test_targets_pass_miss_and_skip():
    r = bs.finalize(_full_results())
    t = r["targets"]
    assert t["warm_p50_vs_bare"] == {**t["warm_p50_vs_bare"], "value": 0.15, "target": 0.2, "met": True}
    assert t["cold_p50_vs_bare"]["value"] == pytest.approx(1.1) and t["cold_p50_vs_bare"]["met"] is True
    assert t["warm_p99_vs_warm_p50"]["met"] is True  # 100 / 60
    assert t["overhead_p50_ms"]["met"] is True
    assert t["throughput_ratio"]["value"] == pytest.approx(0.95) and t["throughput_ratio"]["met"] is True
    assert t["throughput_ratio_warm"]["met"] is True  # 1.6 >= 1.5
    assert t["warm_p50_over_floor_ms"] == {**t["warm_p50_over_floor_ms"], "value": 20.0, "met": True}  # 60 - 40
    assert t["back_to_back_p90_vs_warm_p50"]["value"] == pytest.approx(2.5)  # 150 / 60
    assert t["back_to_back_p90_vs_warm_p50"]["met"] is False
    # The same burst as bare's: its slowest is not slower (met), its median not half (missed).
    assert t["burst_slowest_vs_bare"]["met"] is True and t["burst_median_vs_bare"]["met"] is False
    assert t["rss_mb_100_runs"]["met"] is True
    assert t["leftover_containers"]["met"] is True

    missed = bs.finalize({**_full_results(), "leftover_containers": 2, "rss_mb_100_runs": 250.0,
                          "throughput_cold_calls_per_s": 4.0, "throughput_warm_calls_per_s": 7.0})["targets"]
    assert missed["leftover_containers"]["met"] is False
    assert missed["rss_mb_100_runs"]["met"] is False
    assert missed["throughput_ratio"]["met"] is False  # 0.8 < 0.9
    assert missed["throughput_ratio_warm"]["met"] is False  # 1.4 < 1.5


def test_a_skipped_variant_has_none_figures_and_unmet_targets_are_none():
    raw = {k: v for k, v in _full_results().items() if not k.startswith(("warm", "throughput_warm"))}
    r = bs.finalize(raw)
    assert r["warm_p50_ms"] is None and r["warm_busy_p99_ms"] is None
    assert r["throughput_ratio_warm"] is None
    assert r["targets"]["warm_p50_vs_bare"]["met"] is None
    assert r["targets"]["warm_p99_vs_warm_p50"]["value"] is None
    assert r["targets"]["cold_p50_vs_bare"]["met"] is True


def test_every_target_names_a_known_operator():
    assert {t.op for t in bs.TARGETS} <= set(bs._OPS)
    assert len({t.name for t in bs.TARGETS}) == len(bs.TARGETS)


# -- the report ---------------------------------------------------------------------------------

def test_finalize_fills_every_required_key_even_from_nothing():
    r = bs.finalize({})
    assert set(bs.REQUIRED_KEYS) <= r.keys()
    for v in bs.LATENCY_VARIANTS:
        for p in ("p50", "p95", "p99"):
            assert f"{v}_{p}_ms" in r
    assert all(t["met"] is None for name, t in r["targets"].items() if name != "leftover_containers")


def test_finalize_derives_the_ratios():
    r = bs.finalize(_full_results())
    assert r["throughput_ratio"] == pytest.approx(0.95)
    assert r["throughput_ratio_warm"] == pytest.approx(1.6)
    assert r["concurrency_ratio_max"] == pytest.approx(1.0)
    assert r["concurrency_ratio_p50"] == pytest.approx(1.0)


def test_markdown_has_the_latency_table_and_every_target_with_its_verdict():
    r = bs.finalize({**_full_results(), "rss_mb_100_runs": 250.0})
    r["targets"]["warm_p50_vs_bare"]["met"] = None
    md = bs.render_markdown(r)
    assert "| variant | n | p50 ms | p95 ms | p99 ms | p50 / bare p50 |" in md
    assert "| bare | 10 | 400.0 | 400.0 | 400.0 | x1.00 |" in md
    for name in r["targets"]:
        assert f"| {name} |" in md
    assert "| MISS |" in md and "| pass |" in md and "| skipped |" in md
    assert "20 clients at once" in md


def test_text_rendering_lists_the_same_variants():
    text = bs.render_text(bs.finalize(_full_results()))
    for v in ("bare", "cold", "warm", "warm_busy", "overhead", "concurrency_bare"):
        assert f"\n{v} " in text
    assert "throughput (8 clients, 40 calls)" in text


def test_write_results_writes_json_and_markdown_and_skips_the_png_without_matplotlib(tmp_path, monkeypatch):
    def no_matplotlib(results, path):
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(bs, "plot", no_matplotlib)
    r = bs.finalize(_full_results())
    notes = bs.write_results(r, tmp_path / "out")
    assert any("PNG skipped" in n for n in notes)
    written = json.loads((tmp_path / "out" / "latest.json").read_text())
    assert set(bs.REQUIRED_KEYS) <= written.keys()
    assert written["targets"]["cold_p50_vs_bare"]["met"] is True
    assert (tmp_path / "out" / "latest.md").read_text().startswith("# ringfence speed benchmark")
    assert not (tmp_path / "out" / "latest.png").exists()


def test_the_png_is_written_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    notes = bs.write_results(bs.finalize(_full_results()), tmp_path)
    assert notes == []
    assert (tmp_path / "latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the drivers' bookkeeping (no engine, no clock assertions) -------------------------------------

def test_timed_sequence_runs_before_untimed_then_the_call_n_times():
    seen = []
    samples = bs.timed_sequence(3, lambda i: seen.append(("call", i)), before=lambda i: seen.append(("before", i)))
    assert len(samples) == 3 and all(s >= 0 for s in samples)
    assert seen == [("before", 0), ("call", 0), ("before", 1), ("call", 1), ("before", 2), ("call", 2)]


def test_timed_concurrent_does_every_call_once_and_reports_failures():
    done = []
    wall, lat = bs.timed_concurrent(10, 3, lambda k: done.append)
    assert sorted(done) == list(range(10)) and len(lat) == 10 and wall >= 0

    def make(k):
        def call(i):
            if i == 4:
                raise OSError("engine said no")
        return call

    with pytest.raises(RuntimeError, match="1 of 10 calls failed"):
        bs.timed_concurrent(10, 3, make)


def test_the_bare_body_is_the_dispatchers_request_for_echo():
    body = json.loads(bs.ECHO_BODY)
    assert body == {"tool": "echo", "arguments": {"text": "hi"}, "call_id": "b1", "idempotency_key": None}
