"""Generate control/api/gen from protos/ (`make protos` runs `python -m control.api.protos_gen`).

protoc writes modules that import each other as the top-level package `ringfence.v1`; we want
them importable only as `control.api.gen.ringfence.v1` (no top-level `ringfence` package to
shadow or be shadowed), so the imports are rewritten after generation. The output is written to
a temporary directory and swapped in whole, so an interrupted run never leaves a half-updated
package. The generated tree is committed; tests/unit/test_api_protos.py regenerates it into a
temporary directory and fails when the committed copy differs (stale or hand-edited).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "protos"
GEN_DIR = ROOT / "control" / "api" / "gen"
PACKAGE = "control.api.gen"

HEADER = '"""Generated from protos/ by `make protos` (control/api/protos_gen.py). Do not edit."""\n'

# `from ringfence.v1 import x_pb2` (the .py modules) ...
_FROM_IMPORT = re.compile(r"^from ringfence\.v1 import ", re.MULTILINE)
# ... and `import ringfence.v1.x_pb2` / `ringfence.v1.x_pb2.Message` (the .pyi stubs). The
# look-behind keeps quoted module names and the serialized descriptors untouched.
_DOTTED = re.compile(r"(?<![\w.'\"/])ringfence\.v1\.(\w+_pb2(?:_grpc)?)\b")


class GenerationError(Exception):
    pass


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    return sorted(proto_root.glob("ringfence/v1/*.proto"))


def _rewrite(text: str) -> str:
    text = _FROM_IMPORT.sub(f"from {PACKAGE}.ringfence.v1 import ", text)
    return _DOTTED.sub(rf"{PACKAGE}.ringfence.v1.\1", text)


def generate(out_dir: Path = GEN_DIR, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Generate the package into `out_dir` (replacing it); return the files written."""
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
        for path in staging.rglob("*.py*"):
            path.write_text(_rewrite(path.read_text()))
        for package_dir in (staging, staging / "ringfence", staging / "ringfence" / "v1"):
            (package_dir / "__init__.py").write_text(HEADER)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
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
