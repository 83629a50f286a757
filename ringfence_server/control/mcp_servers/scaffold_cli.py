"""`ringfence mcp-servers add`: its parser and body (ringfence_server.control.mcp_servers.scaffold).

`register(commands)` adds the `mcp-servers` command to `ringfence` (ringfence_server.control.cli)
and returns its sub-command parsers, where the other `mcp-servers` actions are added.

`python -m ringfence_server.control.mcp_servers.scaffold_cli wheelhouse DEST PKG==VERSION...`
fills a flat wheelhouse for offline use (`make mcp-wheels`); it is not part of `ringfence`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ringfence_server.control.mcp_servers import scaffold
from ringfence_server.sandbox.errors import SandboxError

EXIT_OK, EXIT_USAGE = 0, 2

DESCRIPTION = """\
Add a third-party MCP server published on PyPI (mcp-server-time, mcp-server-fetch, ...) to run
in the sandbox:

  1. pip resolves PKG==VERSION and every dependency for the image's interpreter (CPython and
     glibc of the base image, not this host's), wheels only, and each wheel is pinned by
     sha256. pip's own configuration applies: PIP_INDEX_URL for a mirror, or PIP_NO_INDEX=1
     with PIP_FIND_LINKS=DIR to work offline from a wheelhouse;
  2. the package's console script is the command (--entry when it has several);
  3. it writes IMAGES_DIR/mcp-NAME/image.json (a child of the built-in base image: the wheels,
     the --debian packages, a small launcher in rootfs/) and SERVERS_DIR/NAME/server.toml (the
     declaration: image, command, no egress, no workspace, limits; no tools judged yet);
  4. it runs `ringfence images fetch` and `ringfence images build --update-lock mcp-NAME` on
     IMAGES_DIR, which pins the image in IMAGES_DIR/images.lock (this takes a while: progress
     lines go to stderr);
  5. it starts the server in a session sandbox and pins its tools (`ringfence mcp-servers pin`):
     SERVERS_DIR/NAME/tools.json, and a commented [tools.NAME] table per tool in server.toml
     for you to judge (what it may do is yours to say, never the server's).

Refused, with nothing written: a NAME not matching [a-z][a-z0-9_]{0,31}, an existing
IMAGES_DIR/mcp-NAME or SERVERS_DIR/NAME folder (unless --force), a package pip cannot resolve
to wheels, a package with no console script. The image's name is mcp-NAME with '_' as '-'.
Exit 0 when the image is built and pinned, 2 otherwise (one line saying why)."""

EPILOG = """\
examples:
  ringfence mcp-servers add time --package mcp-server-time==2026.10.19 \\
      --arg=--local-timezone --arg=UTC
  ringfence mcp-servers add git --package mcp-server-git==2026.10.19 \\
      --debian git=1:2.39.5-0+deb12u3 --arg=--repository --arg=/workspace \\
      --images-dir my/images --servers-dir my/mcp-servers

Arguments that start with '-' are given as --arg=VALUE."""


def _progress_printer() -> Callable[[str], None]:
    t0 = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {msg}", file=sys.stderr, flush=True)

    return progress


def cmd_add(args: argparse.Namespace) -> int:
    written = False
    try:
        package, version = scaffold.parse_requirement(args.package)
        req = scaffold.Request(
            name=args.name, package=package, version=version, images_dir=args.images_dir,
            servers_dir=args.servers_dir, entry=args.entry, debian=scaffold.parse_debian(args.debian),
            args=tuple(args.arg), force=args.force)
        progress = _progress_printer()

        def tracking(msg: str) -> None:
            nonlocal written
            written = written or msg.startswith("wrote ")
            progress(msg)

        added = scaffold.add(req, tracking)
    except (scaffold.ScaffoldError, SandboxError, OSError, ValueError) as e:
        what = f"mcp-servers add: {' '.join(str(e).split()) or type(e).__name__}"
        if written:
            what += (f"; the files are written: fix it, then `ringfence images fetch --images-dir {args.images_dir}` "
                     f"and `ringfence images build --images-dir {args.images_dir} --update-lock "
                     f"{scaffold.image_name(args.name)}`")
        else:
            what += "; nothing was written"
        print(what, file=sys.stderr)
        return EXIT_USAGE
    for path in added.written:
        print(f"created {path}")
    print(f"{added.image}\t{added.image_id}\tpinned in {added.lock}")
    print(f"command: {' '.join(added.command)}")
    # The server's own tools, pinned from the server itself, started in a session sandbox.
    folder = args.servers_dir / args.name
    status = _pin(folder, args.images_dir)
    if status == EXIT_OK:
        print(f"next: judge each tool in {folder / 'server.toml'} (uncomment its [tools.NAME] table: mutates, "
              f"reversible, cost), then serve it: [images] dir = \"{args.images_dir}\" and [mcp] servers = "
              f"[\"{args.servers_dir}\"] in ringfence.toml, and `ringfence tools check {folder}`")
    return status


def _pin(folder: Path, images_dir: Path) -> int:
    from ringfence.errors import ConfigError
    from ringfence_server.control.mcp_servers.pinning import pin_and_template
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.pinned_images import lock_for

    try:
        backend = DockerBackend(lock=lock_for(images_dir))
    except SandboxError as e:
        print(f"mcp-servers pin: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        tools, templates = pin_and_template(folder, backend)
    except (SandboxError, ConfigError, OSError) as e:
        print(f"mcp-servers pin: {folder}: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        backend.close()
    print(f"pinned {len(tools)} tool(s) in {folder / 'tools.json'}: {', '.join(str(t['name']) for t in tools)}")
    if templates:
        print(f"{templates} tool(s) to judge: their tables are in {folder / 'server.toml'}, commented out")
    return EXIT_OK


def cmd_pin(args: argparse.Namespace) -> int:
    return _pin(args.folder, args.images_dir)


def add_pin_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "pin", help="pin a declared server's tools (tools.json) from the server itself",
        prog="ringfence mcp-servers pin", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start the server of FOLDER/server.toml in a session sandbox (its image, command and limits; "
                    "no network, no workspace), ask it for tools/list and write FOLDER/tools.json: the names, "
                    "descriptions and input schemas calls are validated against from then on. Each tool not "
                    "judged yet gets a commented [tools.NAME] table in server.toml to fill in; it is not exposed "
                    "until it is uncommented. Run it again after changing the server's version; `ringfence tools "
                    "check FOLDER` reports a server whose tools changed since they were pinned.",
        epilog="example:\n  ringfence mcp-servers pin mcp-servers/time --images-dir images")
    p.add_argument("folder", type=Path, metavar="FOLDER", help="the server's folder (its server.toml)")
    p.add_argument("--images-dir", type=Path, default=Path("images"), metavar="DIR",
                   help="the images dir whose lock pins the server's image (default: images)")
    p.set_defaults(func=cmd_pin)
    return p


def add_add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("add", help="scaffold and build an MCP server from a PyPI package",
                       description=DESCRIPTION, epilog=EPILOG, prog="ringfence mcp-servers add",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", metavar="NAME", help="the server's name, [a-z][a-z0-9_]{0,31}: its tools are NAME.TOOL")
    p.add_argument("--package", required=True, metavar="PKG==VERSION",
                   help="the PyPI package and its exact version, e.g. mcp-server-time==2026.10.19")
    p.add_argument("--entry", default=None, metavar="SCRIPT",
                   help="the console script to run, when the package declares several")
    p.add_argument("--debian", action="append", default=[], metavar="PKG=VERSION",
                   help="a Debian package the server needs, at an exact bookworm version (repeatable), "
                        "e.g. git=1:2.39.5-0+deb12u3")
    p.add_argument("--arg", action="append", default=[], metavar="ARG",
                   help="an argument for the server's command (repeatable, in order); --arg=--flag for "
                        "one that starts with '-'")
    p.add_argument("--images-dir", type=Path, default=Path("images"), metavar="DIR",
                   help="your images dir: the spec goes to DIR/mcp-NAME, the pin to DIR/images.lock "
                        "(default: images)")
    p.add_argument("--servers-dir", type=Path, default=Path("mcp-servers"), metavar="DIR",
                   help="where the declaration goes, DIR/NAME/server.toml (default: mcp-servers)")
    p.add_argument("--force", action="store_true", help="write over existing folders of that name")
    p.set_defaults(func=cmd_add)
    return p


def cmd_judge(args: argparse.Namespace) -> int:
    from ringfence.errors import ConfigError
    from ringfence_server.control.mcp_servers.judging import Judgement, judge

    if args.reads == (args.reversible is not None):
        print("mcp-servers judge: say what the tool does: --reads, or --mutates with --reversible or --irreversible",
              file=sys.stderr)
        return EXIT_USAGE
    judgement = Judgement(mutates=not args.reads, reversible=True if args.reads else bool(args.reversible),
                          cost=args.cost, expose=not args.hide)
    try:
        path = judge(args.folder, args.tool, judgement)
    except (ConfigError, OSError) as e:
        print(f"mcp-servers judge: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{path}: [tools.{args.tool}] mutates={str(judgement.mutates).lower()} "
          f"reversible={str(judgement.reversible).lower()} cost={judgement.cost:g}"
          + ("" if judgement.expose else " (not exposed)"))
    return EXIT_OK


def add_judge_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "judge", help="say what one of a server's tools does (its risk metadata), which exposes it",
        prog="ringfence mcp-servers judge", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write TOOL's [tools.TOOL] table into FOLDER/server.toml: whether it mutates the world, whether "
                    "that can be undone, what a call costs. This is what policy decides on (an irreversible "
                    "mutation is always asked); what the server says of its tool is never read. A tool is "
                    "exposed (listed and callable as SERVER.TOOL) only once it is judged; --hide judges it and "
                    "keeps it out. A tool judged already is refused: edit its table.",
        epilog="examples:\n  ringfence mcp-servers judge mcp-servers/time get_current_time --reads\n"
               "  ringfence mcp-servers judge mcp-servers/git git_commit --mutates --reversible --cost 0.01")
    p.add_argument("folder", type=Path, metavar="FOLDER", help="the server's folder (its server.toml)")
    p.add_argument("tool", metavar="TOOL", help="the tool's name, as the server lists it (tools.json)")
    p.add_argument("--reads", action="store_true", help="it changes nothing in the world")
    p.add_argument("--mutates", action="store_true", help="it changes something (say --reversible or --irreversible)")
    p.add_argument("--reversible", dest="reversible", action="store_const", const=True, default=None,
                   help="its change can be undone")
    p.add_argument("--irreversible", dest="reversible", action="store_const", const=False,
                   help="its change cannot be undone (always asked)")
    p.add_argument("--cost", type=float, default=0.0, metavar="N", help="charged to the run's budget per call (0)")
    p.add_argument("--hide", action="store_true", help="judged, but not exposed")
    p.set_defaults(func=cmd_judge)
    return p


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser],
             ) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """`ringfence mcp-servers ACTION`; returns where the actions are added."""
    top = commands.add_parser(
        "mcp-servers", help="add third-party MCP servers to run in the sandbox (their images, declarations)",
        description="Third-party MCP servers run in session sandboxes (docs/mcp-servers.md): `add` makes one's "
                    "pinned image and declaration from a PyPI package and pins its tools; `judge` says what one of "
                    "its tools does (and so exposes it); `pin` pins a declared server's tools again. Each action "
                    "has --help.")
    sub = top.add_subparsers(dest="mcp_servers_command", required=True, metavar="ACTION")
    add_add_parser(sub)
    add_pin_parser(sub)
    add_judge_parser(sub)
    return sub


def main(argv: list[str] | None = None) -> int:
    """`wheelhouse DEST PKG==VERSION...`: the wheels each needs (every dependency), flat in DEST."""
    parser = argparse.ArgumentParser(prog="python -m ringfence_server.control.mcp_servers.scaffold_cli")
    sub = parser.add_subparsers(dest="action", required=True)
    w = sub.add_parser("wheelhouse", help="download wheels for the image's interpreter into a flat folder")
    w.add_argument("dest", type=Path, metavar="DEST")
    w.add_argument("requirements", nargs="+", metavar="PKG==VERSION")
    args = parser.parse_args(argv)
    try:
        scaffold.wheelhouse(args.requirements, args.dest, _progress_printer())
    except (scaffold.ScaffoldError, SandboxError, OSError) as e:
        print(f"wheelhouse: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
