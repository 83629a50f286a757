"""Repeats, baselines and the PAIRED comparison of two versions.

Runs are grouped by case: with `--repeat N` a case has N runs and k/N of them passed. A case
PASSES only when all of its runs pass (k == N).

Comparing two versions (the stored baseline, A, against this build, B) is paired BY CASE, the
only unit both versions share:

    both pass | both fail | only A passes (b) | only B passes (c)

The discordant cases (b and c) are listed by name: they are what changed. The counts b and c are
McNemar's, and the one test given is the exact two-sided sign (binomial) test of b against c
(p = P(|X - n/2| >= |b - n/2|), X ~ Binomial(b + c, 1/2)): with a few dozen cases it is the
honest one, and it says only whether the changes lean one way.

What is deliberately NOT computed: a confidence interval for a pass rate that treats the repeats
as independent binomial samples. Repeats of one case are not independent samples: they share the
case's script, goal and world, so they are strongly correlated (with a scripted model they are
near copies). N repeats of one case are not N pieces of evidence, and an interval over them
would be confidently wrong. Repeats are for finding flaky cases (0 < k < N), nothing more.

A baseline file (JSON, `ringfence eval SUITE --record` writes it):

    {"format": "ringfence-eval-baseline/1", "suite": "contract",
     "cases": {"<case>": {"runs": 1, "passed": 1, "semantics": {<ringfence_server.control.evals.semantics.record>}}}}

A case's semantics differ from the baseline when any of its runs' records differs from the
stored one (ringfence_server.control.evals.semantics.diff names the fields); a case on one side only is a
difference too (record a new baseline on purpose, never by accident).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringfence_server.control.evals.semantics import diff

__all__ = [
    "BASELINE_FORMAT",
    "CaseSummary",
    "Comparison",
    "SemanticDiff",
    "baseline_document",
    "compare",
    "load_baseline",
    "save_baseline",
    "semantic_differences",
    "sign_test_p",
    "summarize",
]

BASELINE_FORMAT = "ringfence-eval-baseline/1"


@dataclass(frozen=True)
class RunRecord:
    """One run of one case, as the comparison needs it."""

    case: str
    passed: bool
    semantics: Mapping[str, Any]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CaseSummary:
    """A case's runs grouped: k of N passed."""

    case: str
    runs: int
    passed_runs: int
    semantics: Mapping[str, Any]
    """The first run's semantic record (what a baseline stores)."""
    variants: int = 1
    """How many distinct semantic records its runs produced (1 = stable)."""
    notes: tuple[str, ...] = ()
    """The failed checks of its failed runs (deduplicated, in order)."""

    @property
    def passed(self) -> bool:
        return self.runs > 0 and self.passed_runs == self.runs

    def as_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "passed": self.passed_runs, "semantics": dict(self.semantics)}


def summarize(runs: Iterable[RunRecord]) -> list[CaseSummary]:
    """Group runs by case, in the order the cases first appear."""
    grouped: dict[str, list[RunRecord]] = {}
    for r in runs:
        grouped.setdefault(r.case, []).append(r)
    out = []
    for case, rs in grouped.items():
        distinct: list[str] = []
        for r in rs:
            key = json.dumps(r.semantics, sort_keys=True)
            if key not in distinct:
                distinct.append(key)
        notes: list[str] = []
        for r in rs:
            for n in r.notes:
                if n not in notes:
                    notes.append(n)
        out.append(CaseSummary(case, len(rs), sum(r.passed for r in rs), rs[0].semantics, len(distinct),
                               tuple(notes)))
    return out


def sign_test_p(b: int, c: int) -> float:
    """Exact two-sided sign test of b against c (McNemar's exact test): 1.0 when b + c = 0."""
    if b < 0 or c < 0:
        raise ValueError("counts cannot be negative")
    n = b + c
    if n == 0:
        return 1.0
    tail: float = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class Comparison:
    """A against B, paired by case (only the cases both hold)."""

    both_pass: tuple[str, ...] = ()
    both_fail: tuple[str, ...] = ()
    only_a: tuple[str, ...] = ()
    """Discordant: passed in A, failed in B (McNemar's b): regressions when A is the baseline."""
    only_b: tuple[str, ...] = ()
    """Discordant: failed in A, passed in B (McNemar's c)."""
    only_in_a: tuple[str, ...] = ()
    """Cases A has and B has not (not paired)."""
    only_in_b: tuple[str, ...] = ()
    label_a: str = "A"
    label_b: str = "B"

    @property
    def b(self) -> int:
        return len(self.only_a)

    @property
    def c(self) -> int:
        return len(self.only_b)

    @property
    def discordant(self) -> tuple[str, ...]:
        return self.only_a + self.only_b

    @property
    def p_value(self) -> float:
        return sign_test_p(self.b, self.c)

    def lines(self) -> list[str]:
        a, b = self.label_a, self.label_b
        out = [
            f"paired by case ({len(self.both_pass) + len(self.both_fail) + self.b + self.c} cases in both): "
            f"both pass {len(self.both_pass)}, both fail {len(self.both_fail)}, "
            f"only {a} passes {self.b}, only {b} passes {self.c}",
        ]
        if self.discordant:
            out.append(f"discordant cases: {len(self.discordant)}")
            out += [f"  {name}: passes in {a}, fails in {b}" for name in self.only_a]
            out += [f"  {name}: fails in {a}, passes in {b}" for name in self.only_b]
        else:
            out.append("discordant cases: none")
        out.append(f"McNemar b={self.b} c={self.c}; exact two-sided sign test p={self.p_value:.3g} "
                   "(cases are the unit; repeats of a case are not independent samples)")
        if self.only_in_a:
            out.append(f"only in {a}: {', '.join(self.only_in_a)}")
        if self.only_in_b:
            out.append(f"only in {b}: {', '.join(self.only_in_b)}")
        return out

    def as_json(self) -> dict[str, Any]:
        return {"a": self.label_a, "b": self.label_b, "both_pass": list(self.both_pass),
                "both_fail": list(self.both_fail), "only_a": list(self.only_a), "only_b": list(self.only_b),
                "discordant": list(self.discordant), "mcnemar_b": self.b, "mcnemar_c": self.c,
                "sign_test_p": self.p_value, "only_in_a": list(self.only_in_a), "only_in_b": list(self.only_in_b)}


def compare(a: Mapping[str, bool], b: Mapping[str, bool], label_a: str = "A", label_b: str = "B") -> Comparison:
    """Pair two versions' verdicts ({case: passed}) by case."""
    both_pass: list[str] = []
    both_fail: list[str] = []
    only_a: list[str] = []
    only_b: list[str] = []
    for case in [c for c in a if c in b]:
        pa, pb = bool(a[case]), bool(b[case])
        (both_pass if pa and pb else both_fail if not pa and not pb else only_a if pa else only_b).append(case)
    return Comparison(tuple(both_pass), tuple(both_fail), tuple(only_a), tuple(only_b),
                      tuple(c for c in a if c not in b), tuple(c for c in b if c not in a), label_a, label_b)


# -- baselines ----------------------------------------------------------------------------------


def baseline_document(suite: str, summaries: Sequence[CaseSummary]) -> dict[str, Any]:
    return {"format": BASELINE_FORMAT, "suite": suite, "cases": {s.case: s.as_json() for s in summaries}}


def save_baseline(path: Path, suite: str, summaries: Sequence[CaseSummary]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = baseline_text(baseline_document(suite, summaries))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def baseline_text(doc: Mapping[str, Any]) -> str:
    """The document as JSON text, one line per call: a re-recording diffs line by line."""

    def dump(v: Any) -> str:
        return json.dumps(v, sort_keys=False)

    lines = ["{", f'  "format": {dump(doc["format"])},', f'  "suite": {dump(doc["suite"])},', '  "cases": {']
    cases = list(doc["cases"].items())
    for n, (name, entry) in enumerate(cases):
        sem = entry["semantics"]
        lines.append(f'    {dump(name)}: {{"runs": {entry["runs"]}, "passed": {entry["passed"]}, "semantics": {{')
        keys = list(sem)
        for k, key in enumerate(keys):
            comma = "," if k < len(keys) - 1 else ""
            value = sem[key]
            if key == "calls" and isinstance(value, list) and value:
                lines.append('      "calls": [')
                lines += [f"        {dump(c)}{',' if i < len(value) - 1 else ''}" for i, c in enumerate(value)]
                lines.append(f"      ]{comma}")
            else:
                lines.append(f"      {dump(key)}: {dump(value)}{comma}")
        lines.append("    }}" + ("," if n < len(cases) - 1 else ""))
    lines += ["  }", "}"]
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == json.loads(json.dumps(doc)), "the baseline text must read back as the document"
    return text


class BaselineError(ValueError):
    """A baseline file that is not one."""


def load_baseline(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise BaselineError(f"cannot read the baseline {path}: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != BASELINE_FORMAT or not isinstance(doc.get("cases"), dict):
        raise BaselineError(f"{path} is not a ringfence eval baseline ({BASELINE_FORMAT})")
    for name, entry in doc["cases"].items():
        if not (isinstance(entry, dict) and isinstance(entry.get("runs"), int) and isinstance(entry.get("passed"), int)
                and isinstance(entry.get("semantics"), dict)):
            raise BaselineError(f"{path}: case {name!r} needs runs, passed and semantics")
    return doc


def baseline_verdicts(doc: Mapping[str, Any]) -> dict[str, bool]:
    """{case: passed} of a baseline: a case passed when all its recorded runs did."""
    return {name: e["runs"] > 0 and e["passed"] == e["runs"] for name, e in doc["cases"].items()}


@dataclass(frozen=True)
class SemanticDiff:
    case: str
    differences: tuple[str, ...] = field(default_factory=tuple)

    def line(self) -> str:
        return f"{self.case}: " + "; ".join(self.differences)


def semantic_differences(doc: Mapping[str, Any], runs: Iterable[RunRecord]) -> list[SemanticDiff]:
    """The cases whose runs' semantics differ from the baseline's, and the cases on one side only."""
    stored = doc["cases"]
    out: list[SemanticDiff] = []
    seen: list[str] = []
    for r in runs:
        if r.case in seen:
            if any(d.case == r.case for d in out):
                continue
        else:
            seen.append(r.case)
        if r.case not in stored:
            out.append(SemanticDiff(r.case, ("not in the baseline",)))
            continue
        found = diff(stored[r.case]["semantics"], dict(r.semantics))
        if found:
            out.append(SemanticDiff(r.case, tuple(found)))
    out += [SemanticDiff(name, ("in the baseline, not run",)) for name in stored if name not in seen]
    return out
