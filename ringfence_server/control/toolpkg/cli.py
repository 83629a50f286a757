"""`ringfence tools new NAME` and `ringfence tools check DIR...` (docs/TOOLS.md): their parsers and
bodies.

These two work on the user's files, without a server. The `tools` command itself (`tools [QUERY]`
lists a running server's tools) is ringfence.cli.tools's: it adds these parsers beside its own
and routes `tools new|check ...` to them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ringfence.errors import ConfigError
from ringfence_server.control.config import load_config
from ringfence_server.control.toolpkg import scaffold
from ringfence_server.control.toolpkg.check import Checker, Images, Target, builtin_tools, targets
from ringfence_server.sandbox.errors import SandboxError

if TYPE_CHECKING:
    from ringfence_server.sandbox.backend import SandboxBackend

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def cmd_new(args: argparse.Namespace) -> int:
    try:
        planned = scaffold.plan(args.name, tools_dir=args.tools_dir, images_dir=args.images_dir, image=args.image)
        scaffold.write(planned)
    except scaffold.ScaffoldError as e:
        print(f"tools new: {e}; nothing was written", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"tools new: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(scaffold.next_steps(planned, tools_dir=args.tools_dir, images_dir=args.images_dir))
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        images = Images(args.images_dir if args.images_dir is not None else config.images_dir)
    except (ConfigError, SandboxError) as e:
        print(f"tools check: {e}", file=sys.stderr)
        return EXIT_USAGE
    from ringfence_server.control.mcp_servers.check import check_server
    from ringfence_server.control.mcp_servers.declaration import server_folders

    found: list[Target | Path] = []
    for d in args.dirs:
        # A declared MCP server's folder (server.toml) is checked as one (mcp_servers.check).
        here: list[Target | Path] = [*server_folders(d)] or [*targets(d)]
        if not here:
            print(f"tools check: {d}: no tool package or MCP server (a folder with a manifest.json or a "
                  "server.toml, or folders of them)", file=sys.stderr)
            return EXIT_USAGE
        found += here

    if not 1 <= args.timeout <= 3600:
        print("tools check: --timeout must be 1 to 3600 seconds", file=sys.stderr)
        return EXIT_USAGE

    def backend() -> SandboxBackend:  # the engine is reached only when a package gets that far
        from ringfence_server.sandbox.docker_backend import DockerBackend

        return DockerBackend(lock=images.lock)

    checker = Checker(caps=config.tools, caps_from=str(args.config) if args.config else "the embedded defaults",
                      images=images, backend=backend, builtin=builtin_tools(config.tools_dir),
                      timeout_s=args.timeout)
    reports = []
    try:
        for target in found:
            report = (checker.check(target) if isinstance(target, Target)
                      else check_server(target, caps=config.tools, images=images, backend=backend))
            reports.append(report)
            if not args.json:
                print(f"{report.path}: {report.name or '?'}")
                for c in report.checks:
                    print(f"    {c}")
                sys.stdout.flush()
    finally:
        checker.close()
    failed = [r for r in reports if not r.ok]
    if args.json:
        print(json.dumps({"ok": not failed, "packages": [r.to_json() for r in reports]}, indent=1))
    elif failed:
        print(f"tools check: {len(failed)} of {len(reports)} failed: "
              + "; ".join(f"{r.name or r.path} ({', '.join(r.failed)})" for r in failed))
    else:
        print(f"tools check: {len(reports)} package{'s' if len(reports) != 1 else ''}, every check passed")
    return EXIT_FAILED if failed else EXIT_OK


def add_new_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                   ) -> argparse.ArgumentParser:
    """The parser of `ringfence tools new`, added to `subparsers` as `name`.

    No help= (here or in add_check_parser): argparse then leaves it out of the command list,
    where `tools` names it.
    """
    p = subparsers.add_parser(
        name, prog="ringfence tools new",
        description=("Scaffold a tool package: TOOLS_DIR/NAME/{manifest.json, NAME.py, test_NAME.py} (a working "
                     "tool with a passing test) and IMAGES_DIR/IMAGE/image.json (a child of the built-in tool "
                     "image that lays the package's code), then print what to do next. Refuses a bad or taken "
                     "name and an existing folder; writes nothing then. See docs/TOOLS.md."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  ringfence tools new jq_table\n  ringfence tools new pdf_text --tools-dir my/tools "
               "--images-dir my/images")
    p.add_argument("name", metavar="NAME", help="the tool's name: [a-z][a-z0-9_]{0,63}")
    p.add_argument("--tools-dir", type=Path, default=Path("tools"), metavar="DIR",
                   help="where the package folder goes (default: tools)")
    p.add_argument("--images-dir", type=Path, default=Path("images"), metavar="DIR",
                   help="your images dir, where its image spec goes (default: images)")
    p.add_argument("--image", default=None, metavar="IMAGE",
                   help="the image's name (default: NAME with '_' as '-')")
    p.set_defaults(func=cmd_new)
    return p


def add_check_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                     ) -> argparse.ArgumentParser:
    """The parser of `ringfence tools check`, added to `subparsers` as `name`."""
    c = subparsers.add_parser(
        name, prog="ringfence tools check",
        description=("Check tool packages: files, schema (valid JSON Schema), risk metadata, limits within the "
                     "server's caps, the other manifest fields, the image pinned, the image holding this code; "
                     "then the package's own tests, run in the sandbox in the tool's image. One line per check; "
                     "exit 0 when every check passed, 1 when one failed, 2 for bad usage. See docs/TOOLS.md."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  ringfence tools check tools/jq_table --config ringfence.toml\n"
               "  ringfence tools check tools --images-dir images --json")
    c.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                   help="a package folder, a folder of packages, or a folder of built-in manifests")
    c.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="the server's ringfence.toml: its caps ([tools] max_*) and its [images] dir "
                        "(default: the embedded defaults)")
    c.add_argument("--images-dir", type=Path, default=None, metavar="DIR",
                   help="your images dir (default: the config's [images] dir, else the built-in images)")
    c.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="wall time of the tests' sandbox (default 120)")
    c.add_argument("--json", action="store_true", help="one JSON document on stdout, for CI")
    c.set_defaults(func=cmd_check)
    return c
