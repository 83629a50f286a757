"""Copy the proxy's stdlib modules into the egress-proxy image spec, or check the copies.

The proxy runs from images/egress-proxy/rootfs/opt/ringfence/rfegress/, which must be exactly
these modules: the image is built from that folder alone (its hash pins the image ID), and the
host tests import them from here. A unit test fails when the two differ.

    python -m sandbox.egress.sync            copy, then rebuild: images build --update-lock egress-proxy
    python -m sandbox.egress.sync --check    exit 1 and list the files that differ
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TARGET = ROOT / "images" / "egress-proxy" / "rootfs" / "opt" / "ringfence" / "rfegress"
MODULES = ("addresses.py", "allowlist.py", "tlspeek.py", "server.py")


def differences(target: Path = TARGET) -> list[str]:
    out = []
    for name in MODULES:
        copy = target / name
        if not copy.is_file() or copy.read_bytes() != (HERE / name).read_bytes():
            out.append(str(copy.relative_to(ROOT)))
    return out


def write(target: Path = TARGET) -> list[str]:
    changed = differences(target)
    target.mkdir(parents=True, exist_ok=True)
    for name in MODULES:
        (target / name).write_bytes((HERE / name).read_bytes())
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandbox.egress.sync", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    if args.check:
        diff = differences()
        for d in diff:
            print(f"differs from sandbox/egress: {d}")
        return 1 if diff else 0
    for d in write():
        print(f"updated {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
