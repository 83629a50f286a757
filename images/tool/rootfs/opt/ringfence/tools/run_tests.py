"""run_tests: the workspace's Python tests (unittest), their output live, their report kept.

arguments: {"pattern"?: "test*.py"}  (the file names unittest discovers; a glob, no "/")
returns {"passed": bool, "ran": int, "failures": int, "errors": int, "skipped": int,
         "exit_code": int | null, "timed_out": bool, "report": "reports/tests.txt" | null,
         "report_error": null | "why the report could not be saved (a full workspace)",
         "tail": ["the last lines of the output", ...]}

Runs `python3 -B -m unittest discover -s /workspace -t /workspace -v [-p PATTERN]` in
/workspace (PYTHONDONTWRITEBYTECODE=1: nothing but the report is added to the workspace by
the runner itself; the tests may write what they like, within the workspace's caps). Each line
of its output (stdout and stderr merged, in order) is written to this container's stderr and
flushed as it comes, so the control plane streams it as `call_output` events while the tests
run; the same lines are saved to /workspace/reports/tests.txt (capped at MAX_REPORT bytes),
which the manifest declares as an output: the control plane collects it into the run's
artifacts after the call. `passed` is true only when unittest exits 0 and ran at least one test
(Python 3.11's unittest exits 0 when it finds none). Failing tests are a result, not an error:
the call succeeds and says what failed.

The tests run as the sandbox user in this call's container: no network, the call's memory,
pids and wall-clock ceilings. A run past DEADLINE_S is killed (its whole process group) and
reported `timed_out`, before the container's own wall clock would end the call with nothing.
"""

import os
import re
import signal
import subprocess
import sys
import threading

from ringfence_tool import ToolError, load_tool

REPORT = "reports/tests.txt"
MAX_REPORT = 1024 * 1024
MAX_LINE = 16 * 1024  # longer lines are passed on in pieces
DEADLINE_S = 100.0  # below the manifest's timeout_s (120): the call still returns its result
TAIL_LINES = 20
PATTERN = re.compile(r"[A-Za-z0-9_.*?\[\]-]{1,64}")
RAN = re.compile(rb"^Ran (\d+) tests? in ")
VERDICT = re.compile(rb"^(OK|FAILED)(?: \((.*)\))?\s*$")
workspace = load_tool("workspace_write")


def _command(pattern):
    argv = [sys.executable, "-B", "-m", "unittest", "discover", "-s", workspace.ROOT, "-t", workspace.ROOT, "-v"]
    return argv + (["-p", pattern] if pattern is not None else [])


def _counts(verdict):
    """{"failures": n, "errors": n, "skipped": n} from unittest's last line's parentheses."""
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    for item in (verdict or b"").split(b","):
        key, _, value = item.strip().partition(b"=")
        if key.decode() in counts and value.isdigit():
            counts[key.decode()] = int(value)
    return counts


def run(arguments, context):
    pattern = arguments.get("pattern")
    if pattern is not None and (not isinstance(pattern, str) or not PATTERN.fullmatch(pattern)):
        raise ToolError("invalid", "pattern must be a file-name glob of 1-64 characters of [A-Za-z0-9_.*?[]-]")
    report = workspace.Replacement(REPORT)  # the reports/ directory exists before the tests run
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",  # the tests' own prints arrive as they happen, too
        "PYTHONIOENCODING": "utf-8",
    }
    try:
        proc = subprocess.Popen(_command(pattern), cwd=workspace.ROOT, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        report.abort()
        raise ToolError("fatal", f"could not start python3: {e.strerror}") from None
    timed_out = threading.Event()

    def kill():
        timed_out.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the tests' own children too
        except OSError:
            pass  # already gone

    timer = threading.Timer(DEADLINE_S, kill)
    timer.start()
    ran, verdict, tail, written, report_error = 0, None, [], 0, None
    out = sys.stderr.buffer

    def keep(data):
        # The report is best effort: a workspace the tests filled stops it, never the run.
        nonlocal report_error
        if report_error is None:
            try:
                report.write(data)
            except ToolError as e:
                report_error = e.message

    try:
        while True:
            line = proc.stdout.readline(MAX_LINE)
            if not line:
                break
            out.write(line)
            out.flush()
            if written < MAX_REPORT:
                piece = line[:MAX_REPORT - written]
                keep(piece)
                written += len(piece)
                if written >= MAX_REPORT:
                    keep(b"\n[report cut at %d bytes]\n" % MAX_REPORT)
            stripped = line.rstrip(b"\r\n")
            tail = (tail + [stripped])[-TAIL_LINES:]
            found = RAN.match(stripped)
            if found:
                ran = int(found.group(1))
            found = VERDICT.match(stripped)
            if found:
                verdict = found
        exit_code = proc.wait()
    except BaseException:
        report.abort()
        raise
    finally:
        timer.cancel()
        if proc.poll() is None:
            kill()
            proc.wait()
    if timed_out.is_set():
        line = b"[run_tests: stopped after %d seconds]\n" % DEADLINE_S
        out.write(line)
        out.flush()
        keep(line)
        tail = (tail + [line.rstrip()])[-TAIL_LINES:]
    if report_error is None:
        try:
            report.commit()
        except ToolError as e:
            report_error = e.message
    counts = _counts(verdict.group(2) if verdict else None)
    passed = exit_code == 0 and ran > 0 and not timed_out.is_set() and verdict is not None and verdict.group(1) == b"OK"
    return {
        "passed": passed,
        "ran": ran,
        "failures": counts["failures"],
        "errors": counts["errors"],
        "skipped": counts["skipped"],
        "exit_code": None if timed_out.is_set() else exit_code,
        "timed_out": timed_out.is_set(),
        "report": REPORT if report_error is None else None,
        "report_error": report_error,
        "tail": [t.decode("utf-8", "replace") for t in tail],
    }
