"""What the file desk does with each report of the copy-in helper, and with names that are not
UTF-8 (second attack review, findings 4 and 8).

The harness is test_files_desk.py's `Desk` (the real Orchestrator on a real SQLite log, the helper
containers played by a FakeBackend); the real helper on the real engine is
tests/integration/test_review2_upload_atomic.py. Pinned here: a move that stopped part way is
recorded (`files_uploaded` with the files that arrived and `incomplete`) and answered
FAILED_PRECONDITION, never hidden; every refusal the helper reports before anything moved maps to
its code (a member: INVALID_ARGUMENT naming it; a full workspace: RESOURCE_EXHAUSTED; a directory
it may not write in: FAILED_PRECONDITION) with no event; an archive member, a downloaded file and
a declared output whose name is not UTF-8 are refused, skipped and reported missing, escaped.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from control_support import AGENT
from module_support import load_module

from ringfence.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from ringfence_server.control.state import EventType
from ringfence_server.sandbox.result import Outcome

ROOT = Path(__file__).resolve().parents[2]


desk_harness = load_module("files_desk_harness", ROOT / "tests" / "unit" / "test_files_desk.py")
desk = desk_harness.desk  # the fixture
result, tar_of, sha = desk_harness.result, desk_harness.tar_of, desk_harness.sha


def helper_says(marker: str, payload: object, stdout: bytes = b"", exit_code: int = 3):
    line = f"{marker}{json.dumps(payload)}\n".encode()
    return result(Outcome.TOOL_ERROR, stdout=stdout, stderr=line, exit_code=exit_code)


ARCHIVE = tar_of(("a.txt", b"a\n"), ("new/x.txt", b"x\n"), ("new/y.txt", b"y\n"), ("z.txt", b"z\n"))


def test_a_move_that_stopped_part_way_is_recorded_with_the_files_that_arrived(desk):
    run = desk.run()
    # The helper moved "in/a.txt" and the new directory "in/new" whole, then failed on "in/z.txt".
    desk.ws.answer = helper_says("rf-partly-applied ", [2, 3, "[Errno 5] Input/output error"],
                                 stdout=json.dumps({"applied": ["in/a.txt", "in/new"]}).encode(), exit_code=4)
    with pytest.raises(FailedPrecondition, match=r"stopped after 2 of 3 moves.*lists the 3 file\(s\) that arrived"):
        desk.orch.upload_files(AGENT, run, "in", ARCHIVE)
    [event] = desk.events(run, EventType.FILES_UPLOADED)
    assert event == {"dest": "in", "by": AGENT.subject, "files": [
        {"path": "in/a.txt", "size": 2, "sha256": sha(b"a\n")},
        {"path": "in/new/x.txt", "size": 2, "sha256": sha(b"x\n")},
        {"path": "in/new/y.txt", "size": 2, "sha256": sha(b"y\n")}],
        "incomplete": "the copy stopped after 2 of 3 moves into place: [Errno 5] Input/output error"}

    # A report cut short still says that the copy stopped, and that what arrived is unknown.
    desk.ws.answer = helper_says("rf-partly-applied ", [1, 3, "[Errno 5] Input/output error"],
                                 stdout=b'{"applied": ["in/a.t', exit_code=4)
    with pytest.raises(FailedPrecondition, match="is not known"):
        desk.orch.upload_files(AGENT, run, "in", ARCHIVE)
    second = desk.events(run, EventType.FILES_UPLOADED)[1]
    assert second["files"] == [] and "which files arrived is not known" in second["incomplete"]


@pytest.mark.parametrize(("marker", "payload", "error", "says"), [
    ("rf-refused-member ", ["l_root/pwned.txt", "'l_root' is a link in the workspace: links are never followed"],
     InvalidArgument, "'l_root' is a link"),
    ("rf-not-staged ", ["No space left on device", True], ResourceExhausted, "workspace is full"),
    ("rf-not-staged ", ["Permission denied", False], FailedPrecondition, "Permission denied; nothing was copied"),
    ("rf-not-writable ", ["ro"], FailedPrecondition, "'ro' cannot be written in"),
    ("rf-not-writable ", [""], FailedPrecondition, "the workspace itself cannot be written in"),
])
def test_each_refusal_of_the_helper_has_its_code_and_no_event(desk, marker, payload, error, says):
    run = desk.run()
    desk.ws.answer = helper_says(marker, payload, exit_code=1 if marker == "rf-not-staged " else 3)
    with pytest.raises(error, match="nothing was copied") as caught:
        desk.orch.upload_files(AGENT, run, "", ARCHIVE)
    assert says in str(caught.value) + "".join(v.description for v in getattr(caught.value, "violations", ()))
    if error is InvalidArgument:
        [violation] = caught.value.violations
        assert violation.field == "tar_chunk" and violation.description.startswith("member 'l_root/pwned.txt'")
    assert desk.events(run, EventType.FILES_UPLOADED) == []


def _gnu_tar(*names: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT, errors="surrogateescape") as tar:
        for name in names:
            info = tarfile.TarInfo(name.decode("utf-8", "surrogateescape"))
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
    return buf.getvalue()


def test_a_member_not_in_utf8_is_refused_before_any_helper_runs(desk):
    run = desk.run()
    with pytest.raises(InvalidArgument) as caught:
        desk.orch.upload_files(AGENT, run, "", _gnu_tar(b"ok.txt", b"dir\xff/caf\xe9.txt"))
    [violation] = caught.value.violations
    assert violation.field == "tar_chunk"
    assert violation.description.startswith("member 'dir\\xff/caf\\xe9.txt': the name is not valid UTF-8")
    assert desk.helpers() == [] and desk.ws.files == {}


def test_files_named_not_in_utf8_are_skipped_by_a_download_and_missing_as_outputs(desk):
    run = desk.run()
    latin = "caf\udce9.txt"  # the bytes b"caf\xe9.txt", as os and tarfile hand them over
    desk.ws.files.update({f"src/{latin}": b"latin-1\n", "src/ok.txt": b"ok\n",
                          "reports/summary.txt": b"fine\n", f"reports/plots/{latin}": b"p\n"})
    got = {f.path: f for f in desk.orch.download_files(AGENT, run, ["src"], False)}
    assert got["src/ok.txt"].data == b"ok\n"
    assert got["src/caf\\xe9.txt"].data is None and "not valid UTF-8" in got["src/caf\\xe9.txt"].skipped
    [event] = desk.events(run, EventType.FILES_DOWNLOADED)
    assert event["files"] == [{"path": "src/ok.txt", "size": 3, "sha256": sha(b"ok\n")}]

    state = desk.orch.runs.get("acme", run)
    with desk.orch.runs.writing(state):
        desk.orch.files.collect_outputs(state, "c1", desk.orch.registry.get("report_writer"))
    [collected] = desk.events(run, EventType.ARTIFACT_COLLECTED)
    assert [f["path"] for f in collected["files"]] == ["reports/summary.txt"]
    assert collected["missing"] == ["reports/absent.txt", "reports/plots/caf\\xe9.txt"]
