"""The pages stay true to the repository: the README is a newcomer's page, every link and every
repository path a page names exists, no page (and no tracked file) cites a file outside the
repository, and the table
of "the ten tests worth copying" (docs/agent-harness.md) points at tests that exist.

The commands and examples on the pages are run as written by tests/e2e (test_doc_commands,
test_doc_examples, test_own_tools)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from docs_support import DOCS, README, ROOT, pages, sh_lines

# The README is the page a newcomer reads first; the rest lives in docs/.
README_MAX_LINES = 250
README_SECTIONS = ("Two commands", "A first agent", "The security model in brief", "Where to read on")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_REPO_PATH = re.compile(
    r"`((?:control|sandbox|imagebuild|conformance|demo_services|tests|images|examples|protos|bench|docs)/[\w./-]*)`")
# Paths a page names that are not in the checkout, each for a reason: a placeholder, a file a
# run writes, a file of the worked example's own project.
_NOT_IN_THE_CHECKOUT = {
    "images/tool/rootfs/opt/ringfence/tools/NAME.py",  # a placeholder for a tool's name
    "bench/results/latest.json",  # written by `make bench`
    "images/jq-table/image.json",  # in the project "Your own tools" builds, not here
}


# Files the project once cited that are not in the repository (its design notes now live in
# docs/: ARCHITECTURE.md, escape-battery.md, security-model.md). Spelled in pieces so that this
# file, too, cites none of them.
_OUTSIDE = ("DESIGN" + ".md", "ESCAPE" + "-BATTERY", "../" + "shared")
# The kinds of tracked file that could cite one: code, pages, configuration.
_CITING_FILES = (".py", ".md", ".toml", ".ini", ".cfg", ".sh", ".json")


def _anchor(heading: str) -> str:
    """The fragment a Markdown renderer gives a heading (GitHub's rule: lower case, punctuation
    dropped, spaces to hyphens)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a `# comment` is no heading
    return {_anchor(h) for h in re.findall(r"^#+ (.+)$", prose, re.M)}


def test_the_readme_is_a_newcomers_page():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    for heading in README_SECTIONS:
        assert f"\n## {heading}\n" in text, heading
    # The two commands stay in the README (.ci/run calls `make test`).
    assert {"make demo", "make test"} <= set(sh_lines(text))
    assert "docs/TOOLS.md" in text


def test_every_link_between_pages_resolves():
    for page in pages():
        for target in _LINK.findall(page.read_text()):
            if re.match(r"\w+://", target):
                continue
            path, _, fragment = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.is_file(), (page.name, target)
            assert ROOT in linked.parents, (page.name, target)
            if fragment:
                assert fragment in _anchors(linked), (page.name, target)


def test_every_repository_path_a_page_names_exists():
    for page in pages():
        for path in _REPO_PATH.findall(page.read_text()):
            if path not in _NOT_IN_THE_CHECKOUT:
                assert (ROOT / path).exists(), (page.name, path)


def test_no_page_cites_a_file_outside_the_repository():
    for page in pages():
        text = page.read_text()
        for outside in _OUTSIDE:
            assert outside not in text, (page.name, outside)


# What a tree without git holds that is not the project's own (environments, caches, builds).
_NOT_THE_PROJECTS = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".mypy_cache",
                     ".hypothesis", ".build"}


def _tracked_files() -> list[Path]:
    """Every file git tracks in the checkout (untracked scratch files are nobody's citation); in
    a copy without git, every file outside environments, caches and builds."""
    if not (ROOT / ".git").exists():
        return [p for p in ROOT.rglob("*") if p.is_file() and not _NOT_THE_PROJECTS & set(p.relative_to(ROOT).parts)
                and not any(part.endswith(".egg-info") for part in p.parts)]
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_tracked_file_cites_a_file_outside_the_repository():
    files = [p for p in _tracked_files() if p.name == "Makefile" or p.suffix in _CITING_FILES]
    assert len(files) > 100  # the listing worked: code, tests and pages are all in it
    cited = [f"{p.relative_to(ROOT)}: {outside}" for p in files if p.is_file()
             for outside in _OUTSIDE if outside in p.read_text(errors="replace")]
    assert cited == []


def table_rows() -> list[str]:
    text = (DOCS / "agent-harness.md").read_text()
    section = text.split("**The ten tests worth copying**", 1)[1].split("\n\n", 2)[1]
    return [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]


def test_the_ten_tests_table_has_ten_rows_each_pointing_at_real_tests():
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
