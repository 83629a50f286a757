"""Generate the client's gRPC stubs, client/ringfence/v1, from protos/ (`make protos`).

protoc writes modules that import each other as the package `ringfence.v1`, which is where they
live: the client package is named `ringfence`, so nothing is rewritten. The output is written to
a temporary directory and swapped in whole, so an interrupted run never leaves a half-updated
package. The generated tree is committed; tests/unit/test_api_protos.py regenerates it into a
temporary directory and fails when the committed copy differs (stale or hand-edited).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTO_ROOT = ROOT / "protos"
GEN_DIR = ROOT / "client" / "ringfence" / "v1"

HEADER = '"""Generated from protos/ by `make protos` (ringfence_server/control/api/protos_gen.py). Do not edit."""\n'

class GenerationError(Exception):
    pass


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    return sorted(proto_root.glob("ringfence/v1/*.proto"))


def generate(out_dir: Path = GEN_DIR, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Generate the package `ringfence.v1` into `out_dir` (replacing it); return the files written."""
    import grpc_tools  # type: ignore[import-untyped]  # grpcio-tools ships no stubs
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    files = proto_files(proto_root)
    if not files:
        raise GenerationError(f"no .proto files under {proto_root}/ringfence/v1")
    bindir = Path(sys.executable).parent
    plugins = {name: bindir / f"protoc-gen-{name}" for name in ("mypy", "mypy_grpc")}
    for path in plugins.values():
        if not path.exists():
            raise GenerationError(f"{path} is missing: install mypy-protobuf (the dev extra)")
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".gen-", dir=out_dir.parent))
    try:
        args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{well_known}",
            f"--python_out={staging}",
            f"--grpc_python_out={staging}",
            f"--mypy_out=quiet:{staging}",
            f"--mypy_grpc_out=quiet:{staging}",
            *(f"--plugin=protoc-gen-{name}={path}" for name, path in plugins.items()),
            *(str(f.relative_to(proto_root)) for f in files),
        ]
        if protoc.main(args) != 0:
            raise GenerationError("protoc failed (its messages are above)")
        (staging / "ringfence" / "v1" / "__init__.py").write_text(HEADER)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        (staging / "ringfence" / "v1").rename(out_dir)
        shutil.rmtree(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(p for p in out_dir.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=GEN_DIR, help="output package directory")
    args = parser.parse_args(argv)
    try:
        written = generate(args.out)
    except GenerationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"generated {len(written)} files in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
