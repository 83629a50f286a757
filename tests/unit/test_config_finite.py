"""Every numeric setting is finite and in range, refused at load naming its key (second attack
review, finding 7: `run_deadline_s = inf` made every StartRun INTERNAL, `approval_ttl_s = nan`
every ASK, and `max_cost = nan` switched the cost ceiling off, because `nan <= 0` is false).

TOML spells `inf`, `-inf` and `nan`, so a deployment's file can hold them; each must stop
`ringfence serve` at start (tests/e2e/test_api_serve.py runs the real command), not a call later.
"""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from ringfence.errors import ConfigError
from ringfence_server.control.config import LIMIT_RANGES, TOOL_LIMIT_CAPS, Limits, load_config

NON_FINITE = ("inf", "-inf", "nan")


def _refused(tmp_path, text: str) -> ConfigError:
    f = tmp_path / "ringfence.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(f)
    return e.value


def test_every_limit_has_a_range_that_holds_its_default():
    assert set(LIMIT_RANGES) == {f.name for f in fields(Limits)}
    for f in fields(Limits):
        low, high = LIMIT_RANGES[f.name]
        assert math.isfinite(low) and math.isfinite(high) and low <= f.default <= high, f.name


@pytest.mark.parametrize("name", sorted(LIMIT_RANGES))
@pytest.mark.parametrize("spelled", NON_FINITE)
def test_a_non_finite_limit_is_refused_naming_its_key(tmp_path, name, spelled):
    e = _refused(tmp_path, f"[limits]\n{name} = {spelled}\n")
    assert e.key == f"limits.{name}"


@pytest.mark.parametrize("name", sorted(LIMIT_RANGES))
def test_a_limit_past_its_range_is_refused_naming_its_key(tmp_path, name):
    _low, high = LIMIT_RANGES[name]
    is_int = next(f for f in fields(Limits) if f.name == name).type in ("int", int)
    over = int(high) + 1 if is_int else high * 2 + 1
    e = _refused(tmp_path, f"[limits]\n{name} = {over}\n")
    assert e.key == f"limits.{name}"
    assert f"{high:g}" in str(e)


def test_the_findings_three_values_are_refused(tmp_path):
    for text, key in (("run_deadline_s = inf", "limits.run_deadline_s"),
                      ("approval_ttl_s = nan", "limits.approval_ttl_s"),
                      ("max_cost = nan", "limits.max_cost")):
        assert _refused(tmp_path, f"[limits]\n{text}\n").key == key


@pytest.mark.parametrize("spelled", NON_FINITE)
@pytest.mark.parametrize("table,key", [
    ("tools", "max_cpus"),
    ("tools", "max_timeout_s"),
    ("workspace", "reap_interval_s"),
    ("pool", "idle_s"),
])
def test_other_numeric_settings_refuse_non_finite_values(tmp_path, table, key, spelled):
    assert _refused(tmp_path, f"[{table}]\n{key} = {spelled}\n").key == f"{table}.{key}"


@pytest.mark.parametrize("spelled", NON_FINITE)
def test_a_policy_predicate_refuses_a_non_finite_operand(tmp_path, spelled):
    # A nan bound would make the rule match nothing (every comparison with nan is false).
    text = f"[[policy.rules]]\ntool = 'echo'\nverdict = 'allow'\nwhen = {{n = {{lte = {spelled}}}}}\n"
    assert _refused(tmp_path, text).key == "policy.rules[0].when.n.lte"


@pytest.mark.parametrize("spelled", NON_FINITE)
def test_a_specialist_deadline_refuses_a_non_finite_value(tmp_path, spelled):
    e = _refused(tmp_path, f"[routing.specialists.latency]\ndeadline_s = {spelled}\n")
    assert e.key == "routing.specialists.latency.deadline_s"


def test_tool_caps_stay_finite():
    assert all(math.isfinite(v) for v in TOOL_LIMIT_CAPS.values())


def test_backoff_initial_may_not_exceed_backoff_max(tmp_path):
    e = _refused(tmp_path, "[limits]\nbackoff_initial_s = 10\nbackoff_max_s = 5\n")
    assert e.key == "limits.backoff_initial_s"


def test_values_inside_the_ranges_load(tmp_path):
    f = tmp_path / "ringfence.toml"
    f.write_text("[limits]\nrun_deadline_s = 7200\napproval_ttl_s = 60.5\nmax_cost = 0.5\nlease_ttl_s = 3\n")
    limits = load_config(f).limits
    assert (limits.run_deadline_s, limits.approval_ttl_s, limits.max_cost, limits.lease_ttl_s) == (7200, 60.5, 0.5, 3)
