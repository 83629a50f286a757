"""The README's table of "the ten tests worth copying" points at tests that exist: every
`path::name` (and every `name_*` prefix) in it names a test function in that file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def table_rows() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("**The ten tests worth copying**", 1)[1].split("\n\n", 2)[1]
    return [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]


def test_the_table_has_ten_rows_each_pointing_at_real_tests():
    rows = table_rows()
    assert [int(r.split("|")[1]) for r in rows] == list(range(1, 11))
    for row in rows:
        cell = row.split("|")[3]
        refs = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`(?: \(([^)]*)\))?", cell)
        assert refs, row
        for path, name, listed in refs:
            source = (ROOT / path).read_text()
            defined = set(re.findall(r"^def (test_\w+)", source, re.M))
            names = [name] if name else re.findall(r"`(test_\w+?)(\*?)`", listed)
            assert names, row
            for n in names:
                if isinstance(n, tuple):  # a prefix such as test_budget_exhausted_*
                    n, star = n
                    assert any(d.startswith(n) if star else d == n for d in defined), (path, n)
                else:
                    assert n in defined, (path, n)
