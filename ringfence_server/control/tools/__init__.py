"""Tool manifests shipped with ringfence (one JSON file per tool) and their loader.

A manifest says what a tool takes (JSON Schema), what it does to the world (mutates,
reversible), which resources it may touch (path roots, egress hosts) and the limits of its
sandbox. The parsing and checks live in ringfence_server.control.registry; this package only holds the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ringfence_server.control.registry import Registry

BUILTIN_DIR = Path(__file__).resolve().parent


def manifest_files(directory: str | Path | None = None) -> list[Path]:
    """The manifest files of `directory` (default: the built-in ones), sorted by name."""
    d = Path(directory) if directory is not None else BUILTIN_DIR
    return sorted(p for p in d.iterdir() if p.suffix in (".json", ".toml") and p.is_file())


def load_builtin() -> Registry:
    """The registry of the built-in manifests (imported late: ringfence_server.control.registry reads this package)."""
    from ringfence_server.control.registry import Registry

    return Registry.from_dir(BUILTIN_DIR)
