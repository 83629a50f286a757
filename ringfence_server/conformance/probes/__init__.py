"""The probe scripts of the escape and ceiling battery (docs/escape-battery.md, posture cases and
cases 40-44), shared by `ringfence conformance` and the battery's tests (tests/escape/probes).

Each probe is a stdlib-only Python script run inside the sandbox with `python3 -I -c`, after the
shared helpers of `_lib.py` (the container cannot see host files, so the text travels in argv).
A probe never exits non-zero on a blocked attack: it prints one JSON object describing what
each attempt got, and the caller (a check of ringfence_server.conformance.cases, or a test) decides.

The scripts are data, not modules of this package: each uses names `_lib.py` defines, so none is
ever imported (mypy skips them; ruff knows why the names look undefined: pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def names() -> list[str]:
    """Every probe's name (its file's stem), sorted."""
    return sorted(p.stem for p in HERE.glob("*.py") if not p.name.startswith("_"))


def source(name: str) -> str:
    """The text `python3 -I -c` runs for probe `name`: the helpers, then the probe."""
    return (HERE / "_lib.py").read_text() + "\n# ---- probe: " + name + "\n" + (HERE / f"{name}.py").read_text()


def argv(name: str, *args: str) -> list[str]:
    """The argv that runs probe `name` inside the sandbox (extra args land in sys.argv[1:])."""
    return ["python3", "-I", "-c", source(name), *args]
