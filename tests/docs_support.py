"""The project's pages read as the tests that run them read them: which pages there are, a
page's section, its shell lines, its fenced blocks and the one Python script of a section.

Every command shown on any page (README.md and docs/*.md) is run by a test:
tests/e2e/test_readme_commands.py takes `doc_commands()` and fails on a line it does not know how
to run, so a page cannot gain an untested command.

A block is a file when the line just before its fence names it, as "(`path/to/file`):"; a
```python block with no such line is a script to run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
_FILE_LABEL = re.compile(r"\(`([\w./-]+)`\):\s*$")


def pages() -> list[Path]:
    """README.md, then every docs/*.md by name: the order in which their commands are read."""
    return [README, *sorted(DOCS.glob("*.md"))]


def section(page: Path, heading: str) -> str:
    """The text of `page`'s `## heading` section, up to the next `## ` (the heading must exist)."""
    text = page.read_text()
    marker = f"\n## {heading}\n"
    assert marker in text, f"{page.relative_to(ROOT)} has no section '## {heading}'"
    return text.split(marker, 1)[1].split("\n## ", 1)[0]


def python_block(page: Path, heading: str) -> str:
    """The one ```python block of `page`'s `## heading` section, as written."""
    [code] = re.findall(r"```python\n(.*?)```", section(page, heading), re.S)
    return code


def sh_lines(text: str) -> list[str]:
    """Each command of every ```sh block: continuation lines joined, trailing comments and
    comment lines dropped."""
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        pending = ""
        for raw in block.splitlines():
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def doc_commands() -> list[str]:
    """Every shell line of every page, page by page in `pages()` order."""
    return [line for page in pages() for line in sh_lines(page.read_text())]


def blocks(text: str) -> list[tuple[str, str | None, str]]:
    """(language, the file it is or None, content) of each fenced block but ```sh, in order."""
    out: list[tuple[str, str | None, str]] = []
    for m in re.finditer(r"```(\w+)\n(.*?)```", text, re.S):
        if m.group(1) == "sh":
            continue
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        label = _FILE_LABEL.search(before)
        out.append((m.group(1), label.group(1) if label else None, m.group(2)))
    return out
