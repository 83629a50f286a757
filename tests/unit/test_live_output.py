"""Live output (ringfence_server.control.orchestration.live_output): how a call's output becomes `call_output`
events while it runs. Chunking by meaning (which bytes go in which event), never by elapsed
time: the clock is injected and moved by hand.

The red checks: a secret that arrives in two pieces, or that a long line's cut would split, is
redacted only because lines are flushed whole and cuts are checked (weakened in place below,
the same data leaks); and the stored log (the SQLite file itself) never holds the secret.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from control_support import AGENT, FakeClock, Harness

from ringfence.model import ObservationStatus as S
from ringfence_server.control import guardrails
from ringfence_server.control.events import CallOutput, EventPayload, event_data
from ringfence_server.control.orchestration import live_output
from ringfence_server.control.orchestration.live_output import (
    CUT_CONTEXT,
    FLUSH_BYTES,
    FLUSH_INTERVAL_S,
    MAX_CHUNK,
    WITHHELD,
    LiveOutput,
    take_chunks,
)
from ringfence_server.control.state import RunState
from ringfence_server.sandbox.result import Outcome, SandboxResult, ToolErrorClass
from ringfence_server.sandbox.runner_protocol import is_result_line

SECRET = "AKIAIOSFODNN7EXAMPLE"  # an AWS access key id, as the scanner knows them


class Recorder:
    """The part of RunRepository a LiveOutput uses: `append`, recorded."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.fail = fail

    def append(self, state: RunState, payload: EventPayload) -> None:
        assert isinstance(payload, CallOutput)
        if self.fail is not None:
            raise self.fail
        self.events.append(event_data(payload))

    def texts(self, stream: str = "stdout") -> list[str]:
        return [e["text"] for e in self.events if e["stream"] == stream]


def live(fail: Exception | None = None) -> tuple[LiveOutput, Recorder, FakeClock]:
    repo, clock = Recorder(fail), FakeClock()
    out = LiveOutput(repo=repo, state=RunState(run_id="r", key="r", tenant="acme"),  # type: ignore[arg-type]
                     call_id="c1", attempt=2, clock=clock)
    return out, repo, clock


def test_only_whole_lines_are_flushed_and_the_rest_at_the_end():
    out, repo, _ = live()
    out("stdout", b"hel")
    assert repo.events == []  # a partial line waits for its end
    out("stdout", b"lo\nwor")
    assert repo.texts() == ["hello\n"]  # the first line goes at once (never flushed before)
    out.close()
    assert repo.texts() == ["hello\n", "wor"]
    assert repo.events[0] == {"call_id": "c1", "attempt": 2, "stream": "stdout", "seq": 1, "text": "hello\n",
                              "bytes": 6, "redacted": False}
    assert repo.events[1]["seq"] == 2 and repo.events[1]["bytes"] == 3


def test_after_a_flush_lines_wait_for_the_clock_or_the_size():
    out, repo, clock = live()
    out("stdout", b"first\n")
    out("stdout", b"b\n")
    clock.advance(FLUSH_INTERVAL_S / 2)
    out("stdout", b"c\n")
    assert repo.texts() == ["first\n"]
    clock.advance(2 * FLUSH_INTERVAL_S)
    out("stdout", b"d\n")  # over FLUSH_INTERVAL_S since the last flush: everything whole goes, in one event
    assert repo.texts() == ["first\n", "b\nc\nd\n"]
    line = b"x" * 99 + b"\n"
    for _ in range(FLUSH_BYTES // len(line)):
        out("stdout", line)
    assert len(repo.events) == 2  # under FLUSH_BYTES pending, and no time passed
    out("stdout", line)  # FLUSH_BYTES pending now
    assert repo.texts()[2] == (line * (FLUSH_BYTES // len(line) + 1)).decode()
    out.close()
    assert len(repo.events) == 3  # nothing was left


def test_each_stream_is_chunked_and_numbered_on_its_own():
    out, repo, _clock = live()
    out("stdout", b"o1\n")
    out("stderr", b"e1\n")  # never flushed before: at once, whatever stdout did
    out("stdout", b"o2\n")
    out("stderr", b"e2")
    out.close()
    assert [(e["stream"], e["seq"], e["text"]) for e in repo.events] == [
        ("stdout", 1, "o1\n"), ("stderr", 1, "e1\n"), ("stdout", 2, "o2\n"), ("stderr", 2, "e2")]


def test_a_line_longer_than_the_cap_is_cut_and_nothing_is_lost():
    out, repo, _ = live()
    line = bytes(ord("a") + i % 26 for i in range(40 * 1024))
    out("stdout", line)
    sizes = [e["bytes"] for e in repo.events]
    assert sizes == [MAX_CHUNK, MAX_CHUNK]  # the rest (8 KiB) waits: it may still end the line
    out("stdout", b"\nnext\n")
    out.close()
    assert "".join(repo.texts()) == line.decode() + "\nnext\n"
    assert all(e["bytes"] <= MAX_CHUNK for e in repo.events)


def test_many_lines_at_once_make_events_of_whole_lines_under_the_cap():
    out, repo, _ = live()
    lines = b"".join(b"%05d " % i + b"y" * 93 + b"\n" for i in range(500))  # 50,000 bytes
    out("stdout", lines)
    out.close()
    assert "".join(repo.texts()).encode() == lines
    assert all(e["bytes"] <= MAX_CHUNK and e["text"].endswith("\n") for e in repo.events)
    assert [e["seq"] for e in repo.events] == list(range(1, len(repo.events) + 1))


def test_a_cut_never_splits_a_utf8_character():
    out, repo, _ = live()
    text = ("é" * (MAX_CHUNK // 2 + 300)).encode()  # two bytes each: the cap falls mid-character?
    out("stdout", b"a" + text)  # shifted by one byte: the cap is inside a character
    out.close()
    assert "".join(repo.texts()) == "a" + text.decode()
    assert "\ufffd" not in "".join(repo.texts())


def test_a_secret_arriving_in_two_pieces_of_one_line_is_redacted():
    out, repo, clock = live()
    out("stdout", b"start\n")
    clock.advance(2 * FLUSH_INTERVAL_S)
    out("stdout", b"key=" + SECRET[:9].encode())  # due by the clock, but the line is not whole
    clock.advance(2 * FLUSH_INTERVAL_S)
    out("stdout", SECRET[9:].encode() + b" done\n")
    out.close()
    assert repo.texts() == ["start\n", "key=[REDACTED:aws_access_key] done\n"]
    assert repo.events[1]["redacted"] is True and repo.events[1]["bytes"] == len(f"key={SECRET} done\n")
    assert not any(SECRET[:9] in t or SECRET[9:] in t for t in repo.texts())


def test_red_check_flushing_partial_lines_would_leak_the_split_secret(monkeypatch):
    # The same arrivals with a chunker that flushes whatever is pending: each piece alone passes
    # the scanner, and the secret is in the log in two halves.
    def eager(pending: bytearray, *, final: bool) -> list[bytes]:
        chunk = bytes(pending)
        del pending[:]
        return [chunk] if chunk else []

    monkeypatch.setattr(live_output, "take_chunks", eager)
    out, repo, clock = live()
    out("stdout", b"key=" + SECRET[:9].encode())
    clock.advance(2 * FLUSH_INTERVAL_S)
    out("stdout", SECRET[9:].encode() + b" done\n")
    assert "".join(repo.texts()).find(SECRET) >= 0


def _long_line_with_a_secret_across_the_cap() -> bytes:
    filler = b"lorem ipsum dolor sit amet " * (MAX_CHUNK // 27 + 1)
    head = filler[:MAX_CHUNK - 10] + b" "
    return head + SECRET.encode() + b" " + filler[:2 * CUT_CONTEXT] + b"\n"


def test_a_secret_across_the_cut_of_a_long_line_is_still_redacted():
    out, repo, _ = live()
    out("stdout", _long_line_with_a_secret_across_the_cap())
    out.close()
    assert len(repo.events) == 2  # the line was cut ...
    assert not any("AKIA" in t or "EXAMPLE" in t for t in repo.texts())  # ... but not through the secret
    assert sum("[REDACTED:aws_access_key]" in t for t in repo.texts()) == 1
    assert sum(e["bytes"] for e in repo.events) == len(_long_line_with_a_secret_across_the_cap())


def test_red_check_an_unchecked_cut_splits_the_secret(monkeypatch):
    monkeypatch.setattr(live_output, "_crosses_a_secret", lambda buf, cut: False)
    out, repo, _ = live()
    out("stdout", _long_line_with_a_secret_across_the_cap())
    out.close()
    assert "".join(repo.texts()).find(SECRET) >= 0  # split in two, each half passes the scanner


def test_private_key_material_withholds_the_rest_of_the_attempt():
    out, repo, _clock = live()
    out("stdout", b"ok\n")
    out("stderr", b"-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n")
    out("stdout", b"more\n")
    out.close()
    assert repo.texts("stdout") == ["ok\n", WITHHELD]
    assert repo.texts("stderr") == [WITHHELD]
    assert [e["redacted"] for e in repo.events] == [False, True, True]


def test_the_scanner_sees_every_chunk_before_it_is_appended(monkeypatch):
    seen: list[str] = []
    real = guardrails.check_result

    def scanner(content: Any) -> Any:
        seen.append(content)
        return real(content)

    monkeypatch.setattr(guardrails, "check_result", scanner)
    out, repo, _ = live()

    def append(state: RunState, payload: EventPayload) -> None:
        assert isinstance(payload, CallOutput)
        assert seen and seen[-1].startswith(payload.text[:3])  # scanned first
        repo.events.append(event_data(payload))

    repo.append = append  # type: ignore[method-assign]
    out("stdout", b"one\n")
    out("stdout", b"two\n")
    out.close()
    assert seen == ["one\n", "two\n"]


def test_a_failing_append_never_raises_into_the_backend_and_drops_the_rest():
    out, repo, _ = live(fail=RuntimeError("store down"))
    out("stdout", b"line\n")  # does not raise
    repo.fail = None
    out("stdout", b"later\n")
    out.close()
    assert repo.events == []


def test_output_arriving_after_the_end_is_written_at_once():
    out, repo, _ = live()
    out.close()
    out("stdout", b"late")
    assert repo.texts() == ["late"]


def test_two_reading_threads_at_once_keep_every_byte_in_order():
    out, repo, _clock = live()
    lines = {s: [f"{s} {i:04d}\n".encode() for i in range(2000)] for s in ("stdout", "stderr")}

    def read(stream: str) -> None:
        for line in lines[stream]:
            out(stream, line)

    threads = [threading.Thread(target=read, args=(s,)) for s in lines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.close()
    for stream, sent in lines.items():
        events = [e for e in repo.events if e["stream"] == stream]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert "".join(e["text"] for e in events).encode() == b"".join(sent)


@pytest.mark.parametrize("final", [False, True])
def test_take_chunks_keeps_a_partial_line_unless_final(final):
    pending = bytearray(b"a\nb\nc")
    assert take_chunks(pending, final=final) == ([b"a\nb\n", b"c"] if final else [b"a\nb\n"])
    assert pending == (b"" if final else b"c")


# --------------------------------------------------------------------------- through the orchestrator


def test_a_calls_output_is_in_the_log_before_its_attempt_redacted_in_the_file_itself(tmp_path):
    h = Harness(tmp_path)
    run = h.run()

    def noisy(call: Any) -> SandboxResult:
        doc = b'{"ok": true, "content": {"done": 1}}\n'
        return SandboxResult(outcome=Outcome.OK, exit_code=0, stdout=b"working\n" + doc,
                             stderr=f"token {SECRET} used\n".encode(), stdout_truncated=False,
                             stderr_truncated=False, duration_ms=1, image_id="sha256:fake", runtime="fake")

    h.emulator.overrides["echo"] = noisy
    obs = h.submit(run, ("echo", {"text": "hi"}))[0]
    assert obs.status is S.EXECUTED and obs.content == {"done": 1}  # the result is unchanged
    events = h.events(run)
    outputs = [e.data for e in events if e.type == "call_output"]
    # The tool's own print is output; the runner's result line is not (it is the result).
    assert outputs == [
        {"call_id": obs.call_id, "attempt": 1, "stream": "stdout", "seq": 1,
         "text": "working\n", "bytes": 8, "redacted": False},
        {"call_id": obs.call_id, "attempt": 1, "stream": "stderr", "seq": 1,
         "text": "token [REDACTED:aws_access_key] used\n", "bytes": len(SECRET) + 12, "redacted": True}]
    types = [e.type for e in events]
    assert types.index("dispatch_started") < types.index("call_output") < types.index("attempt")
    h.orch.finish_run(AGENT, run)
    h.orch.close()
    h.store.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("events.sqlite3*"))
    assert SECRET.encode() not in stored and b"[REDACTED:aws_access_key]" in stored


def test_each_attempt_streams_on_its_own(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    answers = iter([("transient", b"try one\n"), (None, b"try two\n")])

    def flaky(call: Any) -> SandboxResult:
        cls, err = next(answers)
        if cls:
            return SandboxResult(outcome=Outcome.TOOL_ERROR, exit_code=3, stderr=err,
                                 stdout=b'{"ok": false, "error": {"class": "transient", "message": "x"}}\n',
                                 stdout_truncated=False, stderr_truncated=False, duration_ms=1,
                                 image_id="sha256:fake", runtime="fake", message="x",
                                 error_class=ToolErrorClass.TRANSIENT)
        return SandboxResult(outcome=Outcome.OK, exit_code=0, stdout=b'{"ok": true, "content": 1}\n', stderr=err,
                             stdout_truncated=False, stderr_truncated=False, duration_ms=1,
                             image_id="sha256:fake", runtime="fake")

    h.emulator.overrides["echo"] = flaky
    h.submit(run, ("echo", {"text": "x"}))
    stderr = [(e.data["attempt"], e.data["seq"], e.data["text"]) for e in h.events(run)
              if e.type == "call_output" and e.data["stream"] == "stderr"]
    assert stderr == [(1, 1, "try one\n"), (2, 1, "try two\n")]


def protocol_live() -> tuple[LiveOutput, Recorder, FakeClock]:
    repo, clock = Recorder(), FakeClock()
    out = LiveOutput(repo=repo, state=RunState(run_id="r", key="r", tenant="acme"),  # type: ignore[arg-type]
                     call_id="c1", attempt=1, clock=clock, protocol_stdout=True)
    return out, repo, clock


def test_the_runners_result_line_is_never_output_and_the_prints_before_it_are():
    out, repo, clock = protocol_live()
    out("stdout", b"step 1\n")
    assert repo.texts() == []  # held back: the last line may be the result
    clock.advance(1)
    out("stdout", b"step 2\n")
    assert repo.texts() == ["step 1\n"]  # one line behind
    clock.advance(1)
    out("stdout", b'{"ok": true, "content": {"n": 2}}\n')
    out.close()
    assert repo.texts() == ["step 1\n", "step 2\n"]
    assert out.chunks == 2


def test_a_last_line_that_is_not_the_runners_result_is_output_at_the_end():
    out, repo, _ = protocol_live()
    out("stdout", b"only a print\n")
    out("stderr", b"progress\n")
    assert repo.texts("stderr") == ["progress\n"]  # stderr is never held back
    out.close()
    assert repo.texts() == ["only a print\n"]
    assert not is_result_line(b"only a print\n")
    assert is_result_line(b'{"ok": false, "error": {"class": "fatal"}}\n')
    assert not is_result_line(b'{"content": 1}')
