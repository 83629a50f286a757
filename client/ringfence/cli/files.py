"""`ringfence files put|get RUN_ID`: files into a run's workspace, files (or artifacts) out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ringfence.cli.connection import Settings, connect
from ringfence.cli.errors import EXIT_OK
from ringfence.cli.failures import guarded
from ringfence.cli.options import SubParsers, add_command
from ringfence.cli.output import Output, jsonable
from ringfence.cli.transfer import pack_local, workspace_dir, write_files


def cmd_files_put(args: argparse.Namespace, s: Settings, out: Output) -> int:
    """Pack the local paths and upload them into the run's workspace, under --to."""
    dest = workspace_dir(args.to or "")
    archive, _count = pack_local(args.local)
    with connect(s) as client:
        result = client.upload_tar(args.run_id, archive, dest)
    if out.json:
        out.obj({"kind": "uploaded", "run_id": args.run_id, "dest": dest, "seq": result.seq,
                 "files": [jsonable(f) for f in result.files]})
        return EXIT_OK
    for f in result.files:
        out.line(f"{f.size:>10}  {f.sha256[:16]}  /workspace/{f.path}")
    total = sum(f.size for f in result.files)
    out.line(f"put {len(result.files)} file{'s' if len(result.files) != 1 else ''} ({total} bytes) into run "
             f"{args.run_id}'s /workspace/{dest} (event {result.seq})")
    return EXIT_OK


def cmd_files_get(args: argparse.Namespace, s: Settings, out: Output) -> int:
    """Download workspace files (or the run's artifacts) and write them under --out."""
    root = Path(args.out or ".")
    with connect(s) as client:
        got = client.download_files(args.run_id, args.paths, artifacts=bool(args.artifacts))
    write_files(root, got)
    if out.json:
        for path, data in sorted(got.items()):
            out.obj({"kind": "file", "path": path, "size": len(data), "written": str(root / path)})
        for path, why in sorted(got.skipped.items()):
            out.obj({"kind": "skipped", "path": path, "why": why})
        return EXIT_OK
    for path, data in sorted(got.items()):
        out.line(f"{len(data):>10}  {root / path}")
    for path, why in sorted(got.skipped.items()):
        print(f"skipped {path}: {why}", file=sys.stderr, flush=True)
    what = "artifact" if args.artifacts else "file"
    out.line(f"got {len(got)} {what}{'s' if len(got) != 1 else ''} of run {args.run_id} into {root}"
             + (f"; {len(got.skipped)} skipped" if got.skipped else ""))
    return EXIT_OK


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    p = add_command(
        subparsers, "files", common, help="put files into a run's workspace, or get them (or its artifacts) out (gRPC)",
        description=("A run started with a workspace has a directory, /workspace, that its workspace tools share "
                     "across calls. `put` copies local files into it; `get` copies files out of it, or with "
                     "--artifacts the files its tools declared as outputs (kept after the run ends). Every "
                     "transfer is checked on the server (no links, no `..`, no devices or set-id bits; sizes "
                     "capped by files.max_upload_bytes and files.max_download_bytes) and recorded in the run's "
                     "log with each file's sha256. Needs an agent (or admin) token."),
        examples=("  ringfence files put run-1 src/ tests/test_mod.py --to project\n"
                  "  ringfence files get run-1 project/src/mod.py --out ./fetched\n"
                  "  ringfence files get run-1 --artifacts --out ./artifacts"))
    actions = p.add_subparsers(dest="files_command", metavar="ACTION", required=True)
    put = add_command(
        actions, "put", common, help="copy local files and directories into the run's workspace",
        description=("Pack each LOCAL_PATH (a file, or a directory with everything in it) under its own name "
                     "into one archive and copy it into the run's /workspace, under --to DIR (created if "
                     "missing). Only regular files and directories are sent: a symbolic link, a device or a "
                     "fifo is refused here, before anything is sent. A file already in the workspace with the "
                     "same path is replaced. Prints each file's size and sha256 as the server recorded it."),
        examples="  ringfence files put run-1 data.csv\n  ringfence files put run-1 src/ --to project")
    put.add_argument("run_id", metavar="RUN_ID")
    put.add_argument("local", metavar="LOCAL_PATH", nargs="+", help="a file or directory to send")
    put.add_argument("--to", default="", metavar="DIR",
                     help="the directory in the workspace, relative to /workspace (default: /workspace itself)")
    put.set_defaults(func=guarded("files", cmd_files_put))
    get = add_command(
        actions, "get", common, help="copy files (or artifacts) of the run out to a local directory",
        description=("Download PATHs (files or directories, relative to /workspace; none: the whole workspace) "
                     "or, with --artifacts, the run's artifacts (none: all of them), and write them under --out "
                     "DIR with the same relative paths. Each file is checked against the sha256 the server "
                     "sent. Nothing is written outside --out, through a link, or over an existing file (the "
                     "command refuses before writing anything). A link in the workspace is never followed: it "
                     "is reported as skipped."),
        examples="  ringfence files get run-1 project/src --out ./fetched\n  ringfence files get run-1 --artifacts")
    get.add_argument("run_id", metavar="RUN_ID")
    get.add_argument("paths", metavar="PATH", nargs="*", help="a file or directory relative to /workspace")
    get.add_argument("--out", default=".", metavar="DIR", help="where to write (created if missing; default: .)")
    get.add_argument("--artifacts", action="store_true",
                     help="the run's collected artifacts instead of the workspace (they outlive it)")
    get.set_defaults(func=guarded("files", cmd_files_get))
