"""Result classification, the attach-stream demultiplexer, the output caps and unit parsing."""

import struct

import pytest

from ringfence_server.sandbox.classify import engine_reported_oom, oom_in_events
from ringfence_server.sandbox.result import Outcome, ToolErrorClass, classify_exit
from ringfence_server.sandbox.runner_protocol import ToolFailure, read_failure
from ringfence_server.sandbox.streams import CappedStreams, Demuxer
from ringfence_server.sandbox.units import parse_duration, parse_size


@pytest.mark.parametrize(
    "exit_code, killed_for, oom, expected",
    [
        (0, None, False, Outcome.OK),
        (1, None, False, Outcome.TOOL_ERROR),
        (3, None, False, Outcome.TOOL_ERROR),
        (137, None, False, Outcome.OOM),  # SIGKILL we did not send: the OOM killer
        (137, None, True, Outcome.OOM),
        (0, None, True, Outcome.OOM),  # a child was OOM-killed, PID 1 survived
        (143, None, False, Outcome.KILLED),
        (None, None, False, Outcome.KILLED),
        (137, Outcome.TIMEOUT, False, Outcome.TIMEOUT),  # our kill wins over the 137 it causes
        (137, Outcome.OUTPUT_LIMIT, True, Outcome.OUTPUT_LIMIT),
    ],
)
def test_classify_exit(exit_code, killed_for, oom, expected):
    assert classify_exit(exit_code=exit_code, killed_for=killed_for, oom_killed=oom) is expected


def frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(data)) + data


def test_demuxer_splits_frames_across_arbitrary_chunk_boundaries():
    raw = frame(1, b"hello ") + frame(2, b"warn") + frame(1, b"world")
    for cut in range(1, len(raw)):
        demux = Demuxer()
        frames = demux.feed(raw[:cut]) + demux.feed(raw[cut:])
        out = b"".join(d for s, d in frames if s == 1)
        err = b"".join(d for s, d in frames if s == 2)
        assert (out, err) == (b"hello world", b"warn")


def test_streams_keep_exactly_the_cap_and_flag_truncation():
    streams = CappedStreams(stdout_limit=10, stderr_limit=4, stdout=bytearray(), stderr=bytearray())
    assert not streams.add(1, b"12345")
    assert streams.add(1, b"6789abcdef")
    assert bytes(streams.stdout) == b"123456789a" and streams.stdout_truncated
    assert streams.add(2, b"xxxxx") and bytes(streams.stderr) == b"xxxx"


def test_tool_error_class_comes_from_the_runner_json_only_in_runner_mode():
    body = b'{"ok": false, "error": {"class": "rate_limited", "message": "slow down", "retry_after_s": 2}}\n'
    assert read_failure(body, 3, runner=True) == ToolFailure(ToolErrorClass.RATE_LIMITED, "slow down", 2.0)
    # A plain command that prints the same JSON is not trusted to classify itself.
    assert read_failure(body, 3, runner=False).error_class is ToolErrorClass.FATAL
    assert read_failure(b"not json", 3, runner=True).error_class is ToolErrorClass.FATAL


@pytest.mark.parametrize(
    "text, expected",
    [("1048576", 1 << 20), ("64m", 64 << 20), ("64M", 64 << 20), ("16MiB", 16 << 20), ("512k", 512 << 10),
     ("1g", 1 << 30)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text, expected", [("5s", 5.0), ("500ms", 0.5), ("2m", 120.0), ("3", 3.0)])
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1m", "5 parsecs"])
def test_bad_units_are_refused(text):
    with pytest.raises(ValueError):
        parse_size(text)
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    "exit_code, tool_ended, expected",
    [
        (2, True, Outcome.TOOL_ERROR),  # the tool exited 2 and tini said so
        (2, False, Outcome.KILLED),  # a gVisor sentry that died exits 2, and tini said nothing
        (1, False, Outcome.KILLED),
        (0, False, Outcome.OK),
        # 137 with no report and no OOM flag: the whole container was killed from outside
        # (another instance's kill_run). A real OOM sets the flag (checked on runc and gVisor)
        # or, when the tool alone was killed, comes with the init's report (the next test).
        (137, False, Outcome.KILLED),
        (137, True, Outcome.OOM),
    ],
)
def test_a_failure_without_the_inits_report_is_the_runtimes(exit_code, tool_ended, expected):
    assert classify_exit(exit_code=exit_code, killed_for=None, oom_killed=False, tool_ended=tool_ended) is expected


TINI_SPAWNED = b"[INFO  tini (1)] Spawned child process 'sh' with pid '7'\n"
TINI_EXITED = b"[INFO  tini (1)] Main child exited normally (with status '2')\n"


def test_witness_takes_tinis_lines_out_of_stdout_at_any_chunk_boundary():
    raw = TINI_SPAWNED + b"tool says\npartial" + TINI_EXITED
    for cut in range(len(raw) + 1):
        streams = CappedStreams(stdout_limit=100, stderr_limit=10, stdout=bytearray(), stderr=bytearray())
        streams.add(1, raw[:cut])
        streams.add(1, raw[cut:])
        streams.finish()
        assert bytes(streams.stdout) == b"tool says\npartial", cut
        assert streams.witness.tool_ended and streams.witness.status == 2


def test_witness_reads_a_signal_and_leaves_lookalikes_alone():
    from ringfence_server.sandbox.witness import InitWitness

    w = InitWitness()
    out = w.feed(b"[INFO  tini (1)] Main child exited with signal (with signal 'Killed')\n")
    assert out == b"" and w.tool_ended and w.signal == "Killed"
    w = InitWitness()
    # Not tini's mark exactly: the tool's own text, passed through; a mark at the very end is
    # held back, then given back when nothing completes it.
    assert w.feed(b"[INFO tini (1)] Main child exited\n") == b"[INFO tini (1)] Main child exited\n"
    assert w.feed(b"[INFO  tini (x)] not tini\n") == b"[INFO  tini (x)] not tini\n"
    # In the host's pid namespace (a red check) tini's pid is not 1.
    assert w.feed(b"[INFO  tini (4242)] Main child exited normally (with status '0')\n") == b""
    assert w.tool_ended and w.status == 0
    w = InitWitness()
    assert w.feed(b"tail [INFO  tin") == b"tail "
    assert w.finish() == b"[INFO  tin" and not w.tool_ended


def test_tinis_lines_do_not_count_against_the_stdout_cap():
    streams = CappedStreams(stdout_limit=4, stderr_limit=4, stdout=bytearray(), stderr=bytearray())
    assert not streams.add(1, TINI_SPAWNED + b"abcd" + TINI_EXITED)
    streams.finish()
    assert bytes(streams.stdout) == b"abcd" and not streams.stdout_truncated


# -- an unexplained SIGKILL: the engine's events say whose it was -------------------------------


@pytest.mark.parametrize(
    "actions, expected",
    [
        (["oom"], True),  # gVisor: the OOM killer took the sentry; `oom` comes after `die`
        (["kill"], False),  # docker kill, another instance's kill_run
        (["kill", "oom"], False),  # killed from outside while near its limit: not the kernel's
        ([], None),
    ],
)
def test_the_engines_events_explain_a_sigkill(actions, expected):

    assert oom_in_events(actions) is expected


class _EventsClient:
    """Answers events() with what the engine has logged by the n-th question."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.asked = 0

    def events(self, **kwargs):
        assert kwargs["filters"]["event"] == ["oom", "kill"] and kwargs["filters"]["container"] == "c1"
        self.asked += 1
        actions = self.answers[min(self.asked, len(self.answers)) - 1]
        return iter([{"Action": a} for a in actions])


def test_a_late_oom_event_is_waited_for():
    import time


    client = _EventsClient([], [], ["oom"])
    assert engine_reported_oom(client, "c1", time.monotonic(), wait_s=30) is True
    assert client.asked == 3


def test_no_account_from_the_engine_leaves_the_kill_unexplained():
    import time


    client = _EventsClient([])
    assert engine_reported_oom(client, "c1", time.monotonic(), wait_s=0) is False
    assert engine_reported_oom(_EventsClient(["kill"]), "c1", time.monotonic(), wait_s=30) is False
