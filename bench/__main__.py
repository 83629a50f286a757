"""`python -m bench`: run every bench/bench_*.py module's main() with its defaults, in name order."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main() -> int:
    here = Path(__file__).resolve().parent
    status = 0
    for info in sorted(pkgutil.iter_modules([str(here)]), key=lambda m: m.name):
        if not info.name.startswith("bench_"):
            continue
        print(f"== bench.{info.name}", flush=True)
        module = importlib.import_module(f"bench.{info.name}")
        status |= int(module.main([]) or 0)
        print(flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
