"""Live output: a call's stdout and stderr written to the run's log while the call runs.

The backend hands each piece of a tool's output, as it reads it, to `SandboxRequest.on_output`
(from its reading thread; only bytes kept under the call's output caps). One `LiveOutput` per
call attempt turns those pieces into `call_output` events:

- whole lines only: a partial line waits for its end, so a secret that arrives in two pieces
  is scanned whole;
- a stream is flushed when data arrives and >= FLUSH_BYTES are pending, or FLUSH_INTERVAL_S
  passed since its last flush (or it was never flushed: the first line shows at once); what is
  left is flushed when the attempt ends (`close`);
- an event holds at most MAX_CHUNK bytes: several lines, or one piece of a line longer than
  that (cut where the secret scanner, run over both sides of the cut, finds nothing crossing
  it, so the cut itself cannot hide a secret from it);
- every chunk goes through the secret scanner (ringfence_server.control.guardrails, as the call's result does)
  BEFORE it is appended: the log never holds what it redacts. Private key material withholds
  the chunk and everything after it in that attempt, as it withholds a result.

A tool run by the image's runner answers with one JSON line on stdout, its last (the runner
protocol): that line is the call's result, recorded with `call_completed`, not output. With
`protocol_stdout`, stdout's last line is held back until the attempt ends and dropped when it is
the runner's result document; every line before it (a tool's own prints) is streamed, one line
behind.

Appends come from the backend's reading thread(s) while the dispatching thread waits for the
call: `RunRepository.append` is atomic per run (its append lock), as it is for parallel reads,
and the run's lease is the one its dispatcher holds. `close` runs on the dispatching thread
after the backend returned, before the attempt's `attempt` event.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ringfence_server.control import guardrails
from ringfence_server.control.events import OUTPUT_STREAMS, CallOutput
from ringfence_server.control.orchestration.runs import RunRepository
from ringfence_server.control.state import RunState
from ringfence_server.sandbox.runner_protocol import is_result_line

log = logging.getLogger(__name__)

FLUSH_BYTES = 4 * 1024
"""Pending bytes of a stream that flush it when more data arrives."""
FLUSH_INTERVAL_S = 0.2
"""Seconds since a stream's last flush after which arriving data flushes it."""
MAX_CHUNK = 16 * 1024
"""Bytes of one event at most: a line longer than this is cut."""
CUT_CONTEXT = 256
"""Bytes on each side of a cut the scanner looks at: more than the longest secret it matches as
one piece (its random-token rule stops at 200 characters), so a secret across a cut is seen."""
WITHHELD = "[withheld: this call's output holds private key material]"


@dataclass
class _Stream:
    pending: bytearray = field(default_factory=bytearray)
    seq: int = 0
    last_flush: float | None = None


def _utf8_boundary(buf: bytes | bytearray, cut: int) -> int:
    """`cut`, moved back (at most 3 bytes) to the start of a UTF-8 character, so that a cut does
    not turn one character into two replacement characters; `cut` itself for bytes that are not
    UTF-8 there."""
    for c in range(cut, max(cut - 3, 1) - 1, -1):
        if c >= len(buf) or (buf[c] & 0xC0) != 0x80:
            return c
    return cut


def _crosses_a_secret(buf: bytes | bytearray, cut: int) -> bool:
    """Whether the scanner finds something across `cut` that it would miss in the two sides."""
    left = bytes(buf[max(0, cut - CUT_CONTEXT):cut]).decode("utf-8", "replace")
    right = bytes(buf[cut:cut + CUT_CONTEXT]).decode("utf-8", "replace")
    return guardrails.redact(left + right) != guardrails.redact(left) + guardrails.redact(right)


def _long_line_cut(buf: bytes | bytearray) -> int:
    """Where to cut a line longer than MAX_CHUNK: at MAX_CHUNK, or before it where no secret
    crosses the cut."""
    cut = _utf8_boundary(buf, MAX_CHUNK)
    candidate = cut
    while candidate > CUT_CONTEXT:
        if not _crosses_a_secret(buf, candidate):
            return candidate
        candidate = _utf8_boundary(buf, candidate - CUT_CONTEXT)
    # Something the scanner matches at every candidate: a chunk of its own still gets scanned.
    return cut


def take_chunks(pending: bytearray, *, final: bool) -> list[bytes]:
    """Remove from `pending` and return the chunks ready to go: whole lines, at most MAX_CHUNK
    bytes each; a line longer than MAX_CHUNK in pieces (once CUT_CONTEXT bytes past the cut, or
    the line's end, have arrived: the scanner sees both sides of the cut); with `final`,
    everything."""
    chunks: list[bytes] = []
    while pending:
        newline = pending.rfind(b"\n", 0, MAX_CHUNK)
        if newline >= 0:
            cut = newline + 1
        elif len(pending) > MAX_CHUNK and (final or len(pending) >= MAX_CHUNK + CUT_CONTEXT
                                           or pending.find(b"\n", MAX_CHUNK) >= 0):
            cut = _long_line_cut(pending)
        elif final:
            cut = len(pending)
        else:
            break  # a partial line waits for its end
        chunks.append(bytes(pending[:cut]))
        del pending[:cut]
    return chunks


def _last_line_start(pending: bytearray) -> int:
    """Where the last line of `pending` (complete or not) begins."""
    return pending.rfind(b"\n", 0, max(len(pending) - 1, 0)) + 1


class LiveOutput:
    """The `on_output` listener of one call attempt (see the module docstring)."""

    def __init__(self, *, repo: RunRepository, state: RunState, call_id: str, attempt: int,
                 clock: Callable[[], float], protocol_stdout: bool = False) -> None:
        self._protocol_stdout = protocol_stdout
        self._repo = repo
        self._state = state
        self._call_id = call_id
        self._attempt = attempt
        self._clock = clock
        self._lock = threading.Lock()  # the backend may read stdout and stderr on two threads
        self._streams = {name: _Stream() for name in OUTPUT_STREAMS}
        self._closed = False
        self._withheld = False
        self._failed = False
        self.chunks = 0
        """call_output events appended so far."""

    def __call__(self, stream: str, data: bytes) -> None:
        """SandboxRequest.on_output: never raises into the backend's reading thread (it would
        lose the call's output there); a failure to append is logged, and the rest of this
        attempt's live output is dropped. The call's result is unchanged either way."""
        try:
            with self._lock:
                if self._failed or not data:
                    return
                s = self._streams[stream]
                s.pending.extend(data)
                now = self._clock()
                if self._closed:
                    self._flush(stream, s, now, final=True)  # late data after the end: at once
                elif (len(s.pending) >= FLUSH_BYTES or s.last_flush is None
                      or now - s.last_flush >= FLUSH_INTERVAL_S):
                    self._flush(stream, s, now, final=False)
        except Exception:
            log.exception("live output of call %s (attempt %d) of run %s: dropped from here on",
                          self._call_id, self._attempt, self._state.run_id)
            with self._lock:
                self._failed = True

    def close(self) -> None:
        """The attempt ended: flush what is left of both streams (on the dispatching thread;
        an append failure here raises, like any other append of the call)."""
        with self._lock:
            self._closed = True
            if self._failed:
                return
            now = self._clock()
            for name, s in self._streams.items():
                self._flush(name, s, now, final=True)

    def _flush(self, stream: str, s: _Stream, now: float, *, final: bool) -> None:
        if self._protocol_stdout and stream == "stdout":
            start = _last_line_start(s.pending)
            if final:
                if is_result_line(bytes(s.pending[start:])):
                    del s.pending[start:]  # the result: recorded with call_completed, not output
            else:
                held = bytes(s.pending[start:])  # may be the result: wait for the end
                del s.pending[start:]
                chunks = take_chunks(s.pending, final=False)
                s.pending.extend(held)
                self._emit(stream, s, now, chunks)
                return
        self._emit(stream, s, now, take_chunks(s.pending, final=final))

    def _emit(self, stream: str, s: _Stream, now: float, chunks: list[bytes]) -> None:
        for chunk in chunks:
            s.seq += 1
            self._append(stream, s.seq, chunk)
        if chunks:
            s.last_flush = now

    def _append(self, stream: str, seq: int, chunk: bytes) -> None:
        raw = chunk.decode("utf-8", "replace")
        text = WITHHELD
        if not self._withheld:
            # The scanner sees the chunk before anything of it is written.
            verdict = guardrails.check_result(raw)
            if verdict.action is guardrails.Action.BLOCK:
                self._withheld = True  # the key's remaining lines may follow in later chunks
            else:
                text = verdict.content
        self._repo.append(self._state, CallOutput(call_id=self._call_id, attempt=self._attempt, stream=stream,
                                                  seq=seq, text=text, bytes=len(chunk), redacted=text != raw))
        self.chunks += 1
