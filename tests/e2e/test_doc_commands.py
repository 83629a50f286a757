"""Every command in the shell blocks of README.md and docs/*.md works as written, tried as a
new user would.

Each line of every ```sh block of every page (tests/docs_support.py: `doc_commands`) is run
(in a scratch folder holding a copy of `examples/`), in an order that lets later commands use
what earlier ones printed: RUN_ID and APPROVAL_ID are the ids `submit` and `approvals` printed.
A line this test does not know how to run fails it, so a new command on any page cannot go
untested. What is changed, and why:

- the servers listen on port 0 instead of the pages' fixed ports (a busy port on a shared
  machine is not the page's fault); the people commands reach the first one through
  $RINGFENCE_SERVER, which docs/control-plane.md documents;
- `make demo` / `make test` are not run here: CI runs `make test`, and tests/e2e/test_demo.py
  runs what `make demo` runs after building the images;
- `ringfence eval contract` (with and without `--repeat 2`) is what tests/e2e/test_eval_contract.py
  runs, with its table and comparison checked;
- `ringfence conformance` (runc and gVisor, table and JSON) is what
  tests/integration/test_conformance.py runs, with its cases checked;
- grpcurl is not part of ringfence: its lines run only where it is installed;
- the lines that build the two wheels and install them into venvs of their own (the README's
  client venv, docs/operations.md's `make dist` and install) are what tests/e2e/test_distributions.py
  does, into fresh venvs in tmp, with normal resolution from the package index;
- the lines of the README's "Third-party MCP servers, sandboxed" run as written in a project
  folder of their own, with an MCP host calling the tools and an approver, in
  tests/e2e/test_mcp_servers_readme.py: accounted for here, run there;
- the lines of the README's "Sandboxes on other hosts" run as written, one host playing both
  (TLS on loopback), with a real call reaching the worker, in tests/e2e/test_workers_readme.py;
- the lines of "Your own tools" (docs/tools-and-images.md) run, as written and in their order, in a project folder of
  their own in tests/e2e/test_own_tools.py (which fetches from the Debian mirror and PyPI and
  builds an image twice): they are accounted for here, run there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docs_support import DOCS, README, doc_commands, section, sh_lines
from serve_support import ROOT, Served

from ringfence import Client

pytestmark = pytest.mark.docker

RINGFENCE = str(Path(sys.executable).with_name("ringfence"))


def split(line: str) -> tuple[dict[str, str], list[str]]:
    """VAR=value prefixes and the argv, with .venv/bin/ringfence made this venv's."""
    words = shlex.split(line)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if words and words[0] == ".venv/bin/ringfence":
        words[0] = RINGFENCE
    return env, words


class Session:
    def __init__(self, workdir: Path, server: str) -> None:
        self.workdir = workdir
        self.env = {**os.environ, "RINGFENCE_SERVER": server}
        self.env.pop("RINGFENCE_TOKEN", None)
        self.ids: dict[str, str] = {}
        self.ran: list[str] = []

    def run(self, line: str) -> subprocess.CompletedProcess:
        # Longest name first: RUN_ID is also the tail of WS_RUN_ID.
        for name, value in sorted(self.ids.items(), key=lambda item: -len(item[0])):
            line = line.replace(name, value)
        env, argv = split(line)
        proc = subprocess.run(argv, cwd=self.workdir, env={**self.env, **env}, capture_output=True, text=True,
                              timeout=180)
        assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        self.ran.append(line)
        return proc


def serve_line(line: str, workdir: Path) -> None:
    """A page's `ringfence serve ...` line starts, serves and stops cleanly (port 0)."""
    _, argv = split(line)
    args = argv[2:]
    for flag in ("--listen", "--metrics-listen"):
        if flag in args:
            i = args.index(flag)
            del args[i:i + 2]
    if "--metrics-listen" in argv:
        args += ["--metrics-listen", "127.0.0.1:0"]
    served = Served(None, workdir / ".state", *args, command=[RINGFENCE], cwd=workdir)
    assert served.stop() == 0, served.lines


def test_every_command_of_every_page_works_as_written(pinned_images, tmp_path):
    # As a fresh checkout has them: without the MCP example images' build cache (`make mcp-images`).
    shutil.copytree(ROOT / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns(".build"))
    lines = doc_commands()
    todo = list(lines)

    def take(pattern: str) -> list[str]:
        found = [ln for ln in todo if re.search(pattern, ln)]
        for ln in found:
            todo.remove(ln)
        return found

    # "Your own tools": run by tests/e2e/test_own_tools.py (before the `ringfence tools` lines below).
    own = sh_lines(section(DOCS / "tools-and-images.md", "Your own tools"))
    assert own and (ROOT / "tests/e2e/test_own_tools.py").is_file()
    for line in own:
        todo.remove(line)
    # The README's third-party MCP server: run as written, in their order, in a project folder of
    # their own, with an MCP host and an approver, by tests/e2e/test_mcp_servers_readme.py.
    worked = sh_lines(section(README, "Third-party MCP servers, sandboxed"))
    assert len(worked) == 6 and (ROOT / "tests/e2e/test_mcp_servers_readme.py").is_file(), worked
    for line in worked:
        todo.remove(line)
    # The README's two-host deployment: run as written (one host playing both, over TLS on
    # loopback) by tests/e2e/test_workers_readme.py, a real call reaching the worker.
    hosts = sh_lines(section(README, "Sandboxes on other hosts"))
    assert len(hosts) == 4 and (ROOT / "tests/e2e/test_workers_readme.py").is_file(), hosts
    for line in hosts:
        todo.remove(line)
    take(r"^make (demo|test)$")
    assert len(take(r"ringfence eval contract")) == 2 and (ROOT / "tests/e2e/test_eval_contract.py").is_file()
    # Both runtimes, table and JSON, and its failures against bad images: that test runs them.
    assert len(take(r"ringfence conformance")) == 2 and (ROOT / "tests/integration/test_conformance.py").is_file()
    installs = take(r"^python3 -m venv \.agent-venv && |^make dist$|^python3 -m pip install dist/")
    assert len(installs) == 3 and (ROOT / "tests/e2e/test_distributions.py").is_file(), installs
    # The other ways to serve, one at a time (as a user would: they share ./.state).
    for line in take(r"^\.venv/bin/ringfence serve "):
        serve_line(line, tmp_path)
    assert take(r"^\.venv/bin/ringfence serve$") == [".venv/bin/ringfence serve"]
    served = Served(None, tmp_path / ".state", command=[RINGFENCE], cwd=tmp_path)
    try:
        s = Session(tmp_path, served.address)

        # The people's commands, in the page's order, each with the ids the earlier ones printed.
        [export] = take(r"^export RINGFENCE_TOKEN=")
        s.env["RINGFENCE_TOKEN"] = export.split("=", 1)[1]
        [submit] = take(r"ringfence submit ")
        out = s.run(submit).stdout
        s.ids["RUN_ID"] = re.match(r"run (\S+)", out).group(1)
        assert "note         write_note   pending_approval" in out
        [whoami] = take(r"ringfence whoami$")
        assert re.fullmatch(r"tenant \S+  principal \S+  role approver\n", s.run(whoami).stdout)
        [listing] = take(r"ringfence approvals$")
        s.ids["APPROVAL_ID"] = re.search(r"^(apr-\S+)", s.run(listing).stdout, re.M).group(1)
        [approve] = take(r"ringfence approvals approve ")
        assert "approved" in s.run(approve).stdout
        [show] = take(r"ringfence approvals show APPROVAL_ID$")
        shown = s.run(show).stdout
        assert shown.startswith(f"approval {s.ids['APPROVAL_ID']}\n") and "  tool      write_note\n" in shown
        assert re.search(r"^  status    (approved|used), by demo-approver: looks fine$", shown, re.M), shown
        [finish] = take(r"ringfence run RUN_ID --finish")
        shown = s.run(finish).stdout
        assert "status finished, outcome completed" in shown and "write_note   executed" in shown
        # Files in and out of a workspace: a run started with one through the SDK, as the
        # workspaces page's example does; run_tests collects its report as an artifact after the upload;
        # `watch` last, on the finished run (it streams until the run ends).
        put, get, get_artifacts, watch_ws = take(r"WS_RUN_ID")
        with Client(served.address, s.env["RINGFENCE_TOKEN"]) as agent:
            ws_run = agent.start_run("the workspaces page's run", workspace=True)
            s.ids["WS_RUN_ID"] = ws_run.run_id
            assert "files put" in put and s.run(put).returncode == 0
            [tests] = agent.submit_batch(ws_run.run_id, [{"call_id": "tests", "tool": "run_tests", "arguments": {}}])
            assert tests.status.value == "executed", tests
            assert "files get" in get and s.run(get).returncode == 0
            assert (tmp_path / "fetched").is_dir() and any((tmp_path / "fetched").rglob("*"))
            assert "--artifacts" in get_artifacts and s.run(get_artifacts).returncode == 0
            assert (tmp_path / "artifacts" / "reports" / "tests.txt").is_file()
            agent.finish_run(ws_run.run_id)
        assert re.search(r"call_output +tests +stderr\| ", s.run(watch_ws).stdout)
        for line in take(r"ringfence (watch|runs$|tools)"):
            s.run(line)

        # The event store, read directly (./.state of this folder is the server's).
        for line in take(r"ringfence (runs (show|export|verify|prune)|trace) "):
            s.run(line)

        # The sandbox.
        for line in take(r"ringfence sandbox "):
            out = s.run(line).stdout
            if " exec " in line:
                result = json.loads(out)
                assert result["outcome"] in ("ok", "output_limit"), (line, result)
                if "HTTPS_PROXY" in line:
                    assert result["stdout"].strip() == "127.0.0.1:3128"

        # grpcurl, where it is installed.
        for line in take(r"^grpcurl "):
            if shutil.which("grpcurl"):
                s.run(line.replace("127.0.0.1:50051", served.address))
    finally:
        assert served.stop() == 0
    assert todo == [], f"commands on the pages this test does not know how to run: {todo}"
    assert {"RUN_ID", "APPROVAL_ID"} <= set(s.ids)
