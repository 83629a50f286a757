"""A warm container's first process after its init: it waits for the call, then becomes it.

A pooled container is created and started before any call exists, so nothing call-specific can
be in its configuration: not the command (a request may name its own argv), not the egress
credentials (bound to one call at its claim). The launcher runs as the tool would (same uid,
namespaces, cgroup, limits) and blocks reading ONE line on stdin:

    {"argv": ["python3", "-c", "..."], "env": {"HTTPS_PROXY": "..."}}\\n

then restores the signal dispositions Python changed and execs argv with env added to the
environment it was started with (not Python's os.environ, which Python itself changes). The
tool keeps this process (its pid, stdin, stdout, stderr and exit status are exactly the
tool's), and what follows the line on stdin is the tool's own input, unread: the line is read
a byte at a time so that not one byte past it is consumed.

It is passed as source with -c (stdlib only, no image change):

    python3 -I -S -B -c <this file>

A malformed line, or an argv that cannot be exec'd, is said on stderr and ends it with 125 or
127 (what a shell would), before any tool ran. Authority: none the tool does not have; it is
a convenience of the pool, not a boundary.
"""

import contextlib
import json
import os
import signal
import sys

EXIT_SETUP = 125
EXIT_NOT_FOUND = 127
MAX_LINE = 1 << 20


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"ringfence launcher: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def read_line(fd: int = 0) -> bytes | None:
    """The first line of fd, without reading past it (None at EOF before any newline)."""
    line = bytearray()
    while len(line) <= MAX_LINE:
        byte = os.read(fd, 1)
        if not byte:
            return None
        if byte == b"\n":
            return bytes(line)
        line += byte
    raise ValueError(f"the launch line is over {MAX_LINE} bytes")


def parse(line: bytes) -> tuple[list[str], dict[str, str]]:
    doc = json.loads(line)
    argv, env = doc.get("argv"), doc.get("env") or {}
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a non-empty list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("env must map strings to strings")
    return argv, env


def original_environment() -> dict[str, str]:
    """The environment this process was started with. Not os.environ: Python itself adds
    LC_CTYPE=C.UTF-8 at start-up where no locale is set (PEP 538, which -I cannot turn off),
    and a tool must get exactly a cold call's environment (battery case 24). The kernel's copy
    of the start-up block is /proc/self/environ; setenv() never changes it."""
    try:
        with open("/proc/self/environ", "rb") as f:
            block = f.read()
    except OSError:
        return dict(os.environ)
    out: dict[str, str] = {}
    for entry in block.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            out[os.fsdecode(name)] = os.fsdecode(value)
    return out


def main() -> int:
    try:
        line = read_line()
        if line is None:
            _say("stdin ended before the launch line")
            return EXIT_SETUP
        argv, env = parse(line)
    except ValueError as e:
        _say(f"bad launch line: {e}")
        return EXIT_SETUP
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
        # Python ignores SIGPIPE and SIGXFSZ and handles SIGINT; the tool gets the defaults.
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvpe(argv[0], argv, {**original_environment(), **env})
    except OSError as e:
        _say(f"cannot exec {argv[0]!r}: {e.strerror}")
        return EXIT_NOT_FOUND if isinstance(e, FileNotFoundError) else EXIT_SETUP


if __name__ == "__main__":
    sys.exit(main())
