"""The README read as the tests that run it read it: a section, its shell lines (the way
tests/e2e/test_readme_commands.py reads them), and the files its code blocks show.

A block is a file when the line just before its fence names it, as "(`path/to/file`):"; a
```python block with no such line is a script to run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FILE_LABEL = re.compile(r"\(`([\w./-]+)`\):\s*$")


def section(heading: str) -> str:
    """The text of the README's `## heading` section, up to the next `## `."""
    text = (ROOT / "README.md").read_text()
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def sh_lines(text: str) -> list[str]:
    """Each command of every ```sh block: continuation lines joined, trailing comments and
    comment lines dropped (test_readme_commands runs every such line of the README)."""
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


def blocks(text: str) -> list[tuple[str, str | None, str]]:
    """(language, the file it is or None, content) of each fenced block but ```sh, in order."""
    out = []
    for m in re.finditer(r"```(\w+)\n(.*?)```", text, re.S):
        if m.group(1) == "sh":
            continue
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        label = _FILE_LABEL.search(before)
        out.append((m.group(1), label.group(1) if label else None, m.group(2)))
    return out
