"""What PID 1 saw of the tool's end: how a runtime death is told apart from the tool's exit.

The engine reports one exit status for a container. Under runc it is tini's, which is the
tool's; under gVisor, when the sentry itself dies (a Go runtime that cannot create a thread
exits 2), the engine reports the sentry's status, and a sandbox killed by its runtime looked
exactly like a tool that exited 2.

tini runs with `-v` and then writes one line to stdout after the tool ended:

    [INFO  tini (1)] Main child exited normally (with status '2')
    [INFO  tini (1)] Main child exited with signal (with signal 'Killed')

(and, at the start, "Spawned child process ..."; both are taken out of the output).

A container that ended with a failure status and without that line was ended by something
other than its tool: the runtime, or a kill from outside. `InitWitness` takes tini's lines out
of the stdout stream as it flows (they are never the tool's output) and remembers the report.

A tool can print such a line itself. That only makes a runtime death look like the tool's own
failure, which is what the status alone would have said; it can never make the tool's failure
look like anything else, because a present report is trusted only to say the tool ended.
"""

from __future__ import annotations

import re

MARK = b"[INFO  tini ("
# A tini line is short; a "line" longer than this after the mark is the tool's, not tini's.
_MAX_LINE = 512
# After the mark: tini's pid (1, unless a test ran it in the host's pid namespace), then text.
_LINE = re.compile(rb"^\d+\)\] (.*)$")
_EXITED = re.compile(
    rb"^Main child exited (?:normally \(with status '(-?\d+)'\)"
    rb"|with signal \(with signal '([^']*)'\))$"
)


class InitWitness:
    """Streams stdout through, removing tini's lines and keeping its report of the tool's end."""

    def __init__(self) -> None:
        self._held = b""
        self.tool_ended = False
        self.status: int | None = None
        self.signal: str | None = None

    def feed(self, data: bytes) -> bytes:
        """The part of `data` that is the tool's own stdout (some may be held back until the
        next call, while it could still be the start of a tini line)."""
        buf = self._held + data
        self._held = b""
        out = bytearray()
        while buf:
            at = buf.find(MARK)
            if at < 0:
                keep = _partial_mark(buf)
                out += buf[: len(buf) - keep]
                self._held = buf[len(buf) - keep :]
                break
            out += buf[:at]
            end = buf.find(b"\n", at)
            if end < 0:
                if len(buf) - at > _MAX_LINE:
                    out += buf[at:]
                else:
                    self._held = buf[at:]
                break
            line = buf[at + len(MARK) : end]
            if len(line) > _MAX_LINE or not self._note(line):
                out += buf[at : end + 1]
            buf = buf[end + 1 :]
        return bytes(out)

    def finish(self) -> bytes:
        """What is still held back: the tool's, since no complete tini line followed."""
        held, self._held = self._held, b""
        return held

    def _note(self, line: bytes) -> bool:
        """Take in one line that followed the mark; False when it is not tini's."""
        tini = _LINE.match(line.rstrip(b"\r"))
        if not tini:
            return False
        match = _EXITED.match(tini.group(1))
        if match:
            self.tool_ended = True
            if match.group(1) is not None:
                self.status = int(match.group(1))
            else:
                self.signal = match.group(2).decode("ascii", "replace")
        return True


def _partial_mark(buf: bytes) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of MARK."""
    for n in range(min(len(MARK) - 1, len(buf)), 0, -1):
        if buf.endswith(MARK[:n]):
            return n
    return 0
