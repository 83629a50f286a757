"""`ringfence conformance` without an engine: the cases against the battery's own words (kept in
docs/escape-battery.md, "The cases in the battery's own words"), each check
on made-up evidence (a pass, a fail naming what differed, a known finding), the report and the
CLI's usage errors. The real runs on runc and gVisor are tests/integration/test_conformance.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ringfence_server.conformance import attacks, probes
from ringfence_server.conformance.cases import (
    CASES,
    NOT_INCLUDED,
    TITLES,
    Call,
    Evidence,
    Host,
    ImageCheck,
    Probe,
    make_probes,
    needed_probes,
)
from ringfence_server.conformance.runner import FAIL, PASS, XFAIL, Report, evaluate, select
from ringfence_server.sandbox.result import Outcome, SandboxResult

ROOT = Path(__file__).resolve().parents[2]
BATTERY_DOC = ROOT / "docs" / "escape-battery.md"
BATTERY_WORDS = "## The cases in the battery's own words"


def battery_lines(text: str) -> dict[int, str]:
    """Each numbered case of the battery's list, its continuation lines joined."""
    out: dict[int, str] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^(\d+)\. (.*)$", line)
        if m:
            current = int(m.group(1))
            out[current] = m.group(2).strip()
        elif current is not None and line.startswith("    ") and line.strip():
            out[current] += " " + line.strip()
        else:
            current = None
    return out


def by_id(case_id: str):
    return next(c for c in CASES if c.case == case_id)


# ---- the cases are the battery's ---------------------------------------------------------------------


def test_every_battery_case_is_in_conformance_or_named_as_not():
    included = {c.number for c in CASES}
    assert sorted(included | set(NOT_INCLUDED)) == list(range(1, 48)) == sorted(TITLES)
    assert not included & set(NOT_INCLUDED)
    assert sorted(NOT_INCLUDED) == [27, 29, 38, 39, 46, 47]
    # The as-built document's tables cover the same numbers (1-24 one row each, then 25-28 and on).
    doc = (ROOT / "docs" / "escape-battery.md").read_text()
    rows = set()
    for m in re.finditer(r"^\| (\d+)(?:-(\d+))? \|", doc, re.M):
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        rows |= set(range(first, last + 1))
    assert set(range(1, 48)) <= rows


def test_titles_are_the_battery_s_words():
    # The repository's own copy of the battery's words: a test reads nothing outside the checkout.
    section = BATTERY_DOC.read_text().split(BATTERY_WORDS, 1)[1].split("\n## ", 1)[0]
    assert battery_lines(section) == TITLES


def test_case_ids_are_the_numbers_and_the_image_cases():
    ids = [c.case for c in CASES]
    assert len(ids) == len(set(ids))
    assert [c for c in ids if not c.isdigit()] == ["1.image", "4.image", "18.image"]
    assert all(c.title == TITLES[c.number] for c in CASES if not c.image)


def test_every_probe_a_case_reads_is_made_and_every_probe_is_read():
    made = make_probes()
    needed = needed_probes(CASES)
    assert set(needed) == set(made)  # nothing missing, nothing dead
    assert set(probes.names()) <= set(made)
    for p in made.values():
        assert p.argv and all(isinstance(a, str) for a in p.argv)
    assert {p.key for p in made.values() if p.alone} == {"fork_bomb", "cpu_quota"}


def test_tokens_are_fresh_per_run():
    assert make_probes()["lingerers"].argv != make_probes()["lingerers"].argv


def test_the_battery_imports_its_probes_from_the_product():
    """One battery: tests/escape's probe helpers and attack scripts are the product's."""
    escape = ROOT / "tests" / "escape"
    assert [p.name for p in (escape / "probes").iterdir() if p.suffix == ".py"] == ["__init__.py"]
    helpers = (escape / "probes" / "__init__.py").read_text()
    assert "from ringfence_server.conformance.probes import HERE, argv, source" in helpers
    ceilings = (escape / "test_ceilings.py").read_text()
    assert "from ringfence_server.conformance.attacks import" in ceilings and 'FORK_COUNTER = r"""' not in ceilings
    network = (escape / "test_network.py").read_text()
    assert "from ringfence_server.conformance.attacks import DNS_PROBE, VIEW_PROBE" in network
    assert 'VIEW_PROBE = r"""' not in network


def test_probe_scripts_are_valid_python_with_the_helpers():
    for name in probes.names():
        compile(probes.source(name), name, "exec")
    for text in (attacks.FORK_COUNTER, attacks.CPU_QUOTA, attacks.WRITER, attacks.FD_OPENER, attacks.ORPHANS,
                 attacks.VIEW_PROBE, attacks.DNS_PROBE):
        compile(text, "attack", "exec")


# ---- checks on made-up evidence --------------------------------------------------------------------


def result(stdout: bytes = b"", *, outcome: Outcome = Outcome.OK, exit_code: int | None = 0,
           stderr: bytes = b"") -> SandboxResult:
    return SandboxResult(outcome=outcome, exit_code=exit_code, stdout=stdout, stderr=stderr, stdout_truncated=False,
                         stderr_truncated=False, duration_ms=1, image_id="sha256:" + "0" * 64, runtime="runc")


def evidence(reports: dict[str, dict], runtime: str = "runc", *, image=None, image_error=None,
             results: dict[str, SandboxResult] | None = None) -> Evidence:
    calls = {k: Call(Probe(k, ("x",)), result(json.dumps(v).encode())) for k, v in reports.items()}
    calls.update({k: Call(Probe(k, ("x",)), r) for k, r in (results or {}).items()})
    return Evidence(runtime, calls, Host(image_env={"PATH": "/usr/bin:/bin"}), image, image_error)


IDENTITY = {
    "uid": 10001, "euid": 10001, "gid": 10001, "egid": 10001, "groups": [10001], "id_u": "10001",
    "status": {"Uid": "10001\t10001\t10001\t10001", "Gid": "10001\t10001\t10001\t10001", "CapInh": "0",
               "CapPrm": "0", "CapEff": "0", "CapBnd": "0", "CapAmb": "0", "NoNewPrivs": "1", "Seccomp": "2"},
    "capget": {"effective": 0, "inheritable": 0, "permitted": 0}, "bounding": [], "ambient": [],
    "no_new_privs": 1, "seccomp_mode": {"ret": 2, "errno": None},
}


def test_a_hardened_identity_passes_cases_1_to_3():
    ev = evidence({"identity": IDENTITY})
    assert [evaluate(by_id(c), ev).status for c in ("1", "2", "3")] == [PASS] * 3


def test_root_fails_case_1_naming_what_differed():
    ev = evidence({"identity": {**IDENTITY, "uid": 0, "euid": 0}})
    r = evaluate(by_id("1"), ev)
    assert r.status == FAIL and "uid, euid, gid, egid: [0, 0, 10001, 10001]" in r.detail


def test_a_setuid_file_that_gives_euid_0_fails_case_4():
    ran = {"/usr/local/bin/rootsh": {"mode": "0o4755", "owner": [0, 0], "euid": {"rc": 0, "out": "0\n"},
                                     "egid": {"rc": 0, "out": "10001\n"}}}
    ev = evidence({"identity": IDENTITY, "setuid": {"setuid_files": list(ran), "ran": ran, "uid": 10001}})
    r = evaluate(by_id("4"), ev)
    assert r.status == FAIL and "/usr/local/bin/rootsh (mode 0o4755) ran with euid 0" in r.detail
    inert = {k: {**v, "euid": {"rc": 0, "out": "10001\n"}} for k, v in ran.items()}
    ev = evidence({"identity": IDENTITY, "setuid": {"setuid_files": list(ran), "ran": inert, "uid": 10001}})
    assert evaluate(by_id("4"), ev).status == PASS


@pytest.mark.parametrize("case_id, check", [("1.image", "user"), ("4.image", "setuid"), ("18.image", "init")])
def test_image_cases_are_the_adopt_checks(case_id, check):
    good = {n: ImageCheck(n, True, "fine") for n in ("user", "setuid", "init")}
    assert evaluate(by_id(case_id), evidence({}, image=good)).status == PASS
    bad = {**good, check: ImageCheck(check, False, f"the {check} check failed here")}
    r = evaluate(by_id(case_id), evidence({}, image=bad))
    assert (r.status, r.detail) == (FAIL, f"the {check} check failed here")
    r = evaluate(by_id(case_id), evidence({}, image_error="EngineError: gone"))
    assert r.status == FAIL and "could not be inspected: EngineError: gone" in r.detail


NOEXEC_HELD = {d: {"exec": {"rc": None, "errno": "EACCES"}, "mmap_exec": {"ok": False, "errno": "EPERM"},
                   "noexec_flag": True, "via_loader": {"rc": 127, "out": "", "err": "failed to map segment"}}
               for d in ("/tmp", "/dev/shm")}
NOEXEC_MAPPED = {d: {**v, "mmap_exec": {"ok": True}, "via_loader": {"rc": 0, "out": "", "err": ""}}
                 for d, v in NOEXEC_HELD.items()}


def test_a_documented_gvisor_gap_is_xfail_there_and_a_failure_elsewhere():
    sh = {"rc": 0, "out": "script-ran\n", "err": ""}
    assert evaluate(by_id("13"), evidence({"noexec": {**NOEXEC_HELD, "sh_script": sh}})).status == PASS
    r = evaluate(by_id("13"), evidence({"noexec": {**NOEXEC_MAPPED, "sh_script": sh}}, "gvisor"))
    assert r.status == XFAIL and r.detail.startswith("known gVisor gap") and "mapped PROT_EXEC" in r.detail
    r = evaluate(by_id("13"), evidence({"noexec": {**NOEXEC_MAPPED, "sh_script": sh}}, "runc"))
    assert r.status == FAIL and "/tmp: a file there mapped PROT_EXEC" in r.detail
    # The gap closed (a newer runsc): a pass, saying so.
    r = evaluate(by_id("13"), evidence({"noexec": {**NOEXEC_HELD, "sh_script": sh}}, "gvisor"))
    assert r.status == PASS and "did not show" in r.detail
    # An exec that succeeds is a failure under gVisor too: the finding covers only the mapping.
    ran = {d: {**v, "exec": {"rc": 0, "out": "", "err": ""}} for d, v in NOEXEC_MAPPED.items()}
    assert evaluate(by_id("13"), evidence({"noexec": {**ran, "sh_script": sh}}, "gvisor")).status == FAIL


def test_a_probe_that_did_not_run_fails_its_cases_with_the_reason():
    broken = result(b"", outcome=Outcome.START_FAILED, exit_code=None, stderr=b"exec: python3: not found\n")
    r = evaluate(by_id("1"), evidence({}, results={"identity": broken}))
    assert r.status == FAIL and "did not run to completion: outcome start_failed" in r.detail
    assert "python3: not found" in r.detail
    assert evaluate(by_id("2"), evidence({})).detail == "probe identity was not run"
    ev = Evidence("runc", {"identity": Call(Probe("identity", ("x",)), None, "EngineError: down")}, Host())
    assert evaluate(by_id("3"), ev).detail == "probe identity could not run: EngineError: down"
    # A report of another shape (an image lacking what a probe uses) fails, never raises.
    r = evaluate(by_id("2"), evidence({"identity": {"uid": 10001}}))
    assert r.status == FAIL and "not what the case reads (KeyError" in r.detail


def test_ceiling_cases_read_outcomes_and_leftovers():
    ev = evidence({}, results={"memory_bomb": result(b"", outcome=Outcome.OOM, exit_code=137)})
    assert evaluate(by_id("31"), ev).status == PASS
    ev = evidence({}, results={"memory_bomb": result(b"allocated 1073741824\n")})
    assert evaluate(by_id("31"), ev).status == FAIL
    orphans = result(json.dumps({"pid": 7, "zombies": 0, "others": 1}).encode())
    ev = evidence({}, results={"orphans": orphans})
    assert evaluate(by_id("37"), ev).status == PASS
    ev.calls["orphans"] = Call(Probe("orphans", ("x",)), orphans, None, ("/rf-conformance-x",))
    r = evaluate(by_id("37"), ev)
    assert r.status == FAIL and "containers of the orphans call left behind" in r.detail


def test_cpu_quota_case_reads_the_engine_s_throttling_and_the_share_of_a_core():
    def burn(cpu_s: float, throttled: int = 22, runtime: str = "runc", stats: bool = True) -> Evidence:
        out = json.dumps({"busy": 3, "wall_s": 1.0, "cpu_s": cpu_s}).encode() + b"\n"
        r = dataclasses.replace(result(out, outcome=Outcome.TIMEOUT, exit_code=None), applied={"nano_cpus": 500000000})
        data = {"throttling_data": {"periods": 24, "throttled_periods": throttled, "throttled_time": throttled * 10**8}}
        call = Call(Probe("cpu_quota", ("x",)), r, None, (), data if stats else None, None if stats else "gone")
        return Evidence(runtime, {"cpu_quota": call}, Host())

    assert evaluate(by_id("32"), burn(0.49)).status == PASS
    r = evaluate(by_id("32"), burn(1.9))
    assert r.status == FAIL and "got 1.90 cores, quota 0.5" in r.detail
    r = evaluate(by_id("32"), burn(0.49, throttled=0))
    assert r.status == FAIL and "the engine saw no CFS throttling" in r.detail
    # gVisor's sentry counts its tasks' time its own way: the engine's counters decide there.
    assert evaluate(by_id("32"), burn(1.0, runtime="gvisor")).status == PASS
    r = evaluate(by_id("32"), burn(0.49, stats=False))
    assert r.status == FAIL and "stats of the cpu_quota call could not be read: gone" in r.detail


def test_a_sentry_that_dies_of_the_fork_counter_is_the_documented_gvisor_gap():
    died = result(b"", outcome=Outcome.KILLED, exit_code=2, stderr=b"")
    died = dataclasses.replace(died, message="the sandbox ended with status 2 before its init reported the tool's "
                                             "end: the gvisor runtime (or an outside kill) stopped it, not the tool")
    counted = result(json.dumps({"spawned": 29, "error": "EAGAIN", "procs": 32}).encode())
    timeout = result(b"", outcome=Outcome.TIMEOUT, exit_code=None)
    r = evaluate(by_id("30"), evidence({}, "gvisor", results={"fork_counter": died, "fork_bomb": died}))
    assert r.status == XFAIL and r.detail.startswith("known gVisor gap") and "printed no JSON" in r.detail
    assert evaluate(by_id("30"), evidence({}, "runc", results={"fork_counter": counted, "fork_bomb": timeout})
                    ).status == PASS
    # Under runc the same death is a failure; and a bomb blamed on the tool is one under gVisor.
    assert evaluate(by_id("30"), evidence({}, "runc", results={"fork_counter": died, "fork_bomb": timeout})
                    ).status == FAIL
    tool_error = result(b"", outcome=Outcome.TOOL_ERROR, exit_code=2)
    r = evaluate(by_id("30"), evidence({}, "gvisor", results={"fork_counter": counted, "fork_bomb": tool_error}))
    assert r.status == FAIL and "the bomb ended tool_error" in r.detail


def test_environment_from_anywhere_but_the_image_and_the_call_fails_case_24():
    env = {"PATH": "/usr/bin:/bin", "HOSTNAME": "sandbox", "HOME": "/tmp", "RF_DECLARED": "yes"}
    report = {"pid1": "/usr/bin/tini", "environ": {"1": {"errno": "EACCES"}, "7": env}, "credential_files": []}
    assert evaluate(by_id("24"), evidence({"environ": report})).status == PASS
    leaked = {**report, "environ": {"1": {"errno": "EACCES"}, "7": {**env, "AWS_SECRET_ACCESS_KEY": "x"}}}
    r = evaluate(by_id("24"), evidence({"environ": leaked}))
    assert r.status == FAIL and "AWS_SECRET_ACCESS_KEY" in r.detail and "'x'" not in r.detail


# ---- the report and the command ----------------------------------------------------------------------


def test_report_json_and_table():
    cases = [by_id("1"), by_id("4.image"), by_id("13")]
    from ringfence_server.conformance.runner import CaseResult

    results = (CaseResult(cases[0], PASS), CaseResult(cases[1], FAIL, "1 privileged file(s): /usr/local/bin/rootsh"),
               CaseResult(cases[2], XFAIL, "known gVisor gap"))
    report = Report("mine", "sha256:" + "a" * 64, "gvisor", "20.10", results, 12.34, not_selected=("2",))
    doc = report.to_json()
    assert doc["ok"] is False and doc["failed"] == ["4.image"]
    assert doc["summary"] == {"passed": 1, "failed": 1, "xfailed": 1, "not_included": 6, "not_selected": 1}
    assert [c["case"] for c in doc["cases"]] == ["1", "4.image", "13"]
    assert doc["cases"][1] == {"case": "4.image", "number": 4, "kind": "image", "title": cases[1].title,
                               "status": "FAIL", "detail": "1 privileged file(s): /usr/local/bin/rootsh",
                               "partial": ""}
    assert [n["number"] for n in doc["not_included"]] == [27, 29, 38, 39, 46, 47]
    table = report.table()
    assert "4.image  FAIL    The image ships no setuid-root" in table
    assert "1 privileged file(s): /usr/local/bin/rootsh" in table
    assert "not in conformance (needs the test battery's harness): 27, 29, 38, 39, 46, 47" in table
    assert table.splitlines()[-1].startswith("FAILED: 1 passed, 1 failed (4.image), 1 known gvisor finding (13)")


def test_select_by_number_takes_the_image_case_too():
    assert [c.case for c in select(["4"])] == ["4", "4.image"]
    assert [c.case for c in select(["4.image", "13"])] == ["4.image", "13"]
    with pytest.raises(ValueError, match="no such conformance case: 27"):
        select(["27"])


def ringfence(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "ringfence.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_cli_usage_errors_exit_2(tmp_path):
    r = ringfence("conformance", "--case", "27")
    assert r.returncode == 2 and "no such conformance case: 27" in r.stderr
    r = ringfence("conformance", env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert r.returncode == 2 and "conformance: cannot reach the Docker engine" in r.stderr
    assert "Traceback" not in r.stderr
    r = ringfence("conformance", "--runtime", "kata")
    assert r.returncode == 2 and "invalid choice: 'kata'" in r.stderr


def test_help_explains_the_run():
    r = ringfence("conformance", "--help")
    assert r.returncode == 0
    for words in ("docs/escape-battery.md", "PASS, FAIL or XFAIL", "--json", "27, 29, 38, 39, 46,", "Exit status: 0",
                  "red check"):
        assert words in r.stdout, words
