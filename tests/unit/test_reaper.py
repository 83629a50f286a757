"""Which labelled objects the reaper considers orphans (no Docker needed)."""

import os
import socket
import subprocess

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.reaper import orphan_reason

HOST = socket.gethostname()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_past_deadline_is_an_orphan_whoever_owns_it():
    labels = {L.DEADLINE_LABEL: "100", L.HOST_LABEL: "elsewhere", L.PID_LABEL: "1"}
    assert orphan_reason(labels, now=200, host=HOST) == "past its deadline"


def test_object_of_a_dead_process_on_this_host_is_an_orphan():
    labels = {L.DEADLINE_LABEL: "999999999999", L.HOST_LABEL: HOST, L.PID_LABEL: str(dead_pid())}
    assert "is gone" in orphan_reason(labels, now=0, host=HOST)


def test_live_instance_within_deadline_is_left_alone():
    labels = {L.DEADLINE_LABEL: "999999999999", L.HOST_LABEL: HOST, L.PID_LABEL: str(os.getpid())}
    assert orphan_reason(labels, now=0, host=HOST) is None


def test_other_hosts_objects_are_only_reaped_past_their_deadline():
    labels = {L.DEADLINE_LABEL: "999999999999", L.HOST_LABEL: "other-host", L.PID_LABEL: str(dead_pid())}
    assert orphan_reason(labels, now=0, host=HOST) is None
