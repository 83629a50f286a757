"""bench/bench_workers.py end to end, quick: `ringfence serve` alone and with 1 and 2 real
`ringfence worker run` processes on the host's engine. Only the report's shape and correctness
are checked (every call executed, the spread sums to the calls, nothing left running): the
benchmark's timings are printed, never asserted."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.docker


def _load() -> ModuleType:
    # bench/ is not an installed package: load the module from the checkout.
    name = "bench_workers_under_test"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "bench_workers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_quick_run_reports_every_variant_with_every_call_executed_and_spread(tmp_path: Path, pinned_images: object,
                                                                             docker_client: object) -> None:
    bench = _load()
    out = tmp_path / "results"

    assert bench.main(["--quick", "--out", str(out)]) == 0

    results = json.loads((out / "workers.json").read_text())
    assert (out / "workers.md").read_text().startswith("# ringfence sandbox workers benchmark")
    assert results["ok"] is True
    assert results["args"]["calls"] == 12 and results["args"]["clients"] == 3
    assert "cannot be faster here" in results["caveat"]
    variants = {v["name"]: v for v in results["variants"]}
    assert list(variants) == ["local", "workers=1", "workers=2"]
    for name, v in variants.items():
        assert "error" not in v, v
        assert v["calls"] == 12 and v["executed"] == 12 and v["failed"] == 0 and v["failures"] == [], v
        assert sum(v["spread"].values()) == 12, v
        assert len(v["latencies_ms"]) == 12
        for key in ("calls_per_s", "p50_ms", "p95_ms", "ratio_to_local", "p50_ratio_to_local"):
            assert isinstance(v[key], float), (name, key, v[key])
        assert all(code == 0 for code in v["exit_codes"].values()), v["exit_codes"]
    assert set(variants["local"]["spread"]) == {"local"}
    assert set(variants["workers=1"]["spread"]) == {"w1"}
    # Both workers took calls (placement spreads back-to-back calls over idle workers).
    assert set(variants["workers=2"]["spread"]) == {"w1", "w2"}
    assert set(variants["workers=2"]["warmup"]) == {"w1", "w2"}
    assert variants["local"]["ratio_to_local"] == 1.0
    assert results["failed_calls"] == 0
    assert results["leftover_processes"] == [] and results["leftover_containers"] == []
