"""The version handshake (client/ringfence/wire/version.py): the rule as a table, then a real
server on a real port answering clients of other versions.

A client's version is changed in two ways only, neither a knob a user has: raw calls through
`client.stubs` with hand-built metadata, and `monkeypatch.setattr` on ringfence._wire.CLIENT_VERSION
(what call_metadata reads; restored after each test). The CLI test keeps its client real and moves
the in-process server's version instead (monkeypatch on the edge's SERVER_VERSION).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from api_support import TOKENS, StubOrchestrator, make_config
from google.rpc import error_details_pb2
from grpc_status import rpc_status

import ringfence._wire
from ringfence import AsyncClient, Client, VersionMismatch
from ringfence._version import __version__
from ringfence.errors import FailedPrecondition, InvalidArgument
from ringfence.model import Role, RunView
from ringfence.v1 import runs_pb2
from ringfence.wire import version
from ringfence.wire.status import from_rpc_error
from ringfence_server.control.api import servicer
from ringfence_server.control.api.background import BackgroundServer

ROOT = Path(__file__).resolve().parents[2]
AGENT = TOKENS[("acme", Role.AGENT)]
SERVER = servicer.SERVER_VERSION


def older_refused(server: version.Version) -> str:
    """A client version older than `server` that it refuses (under either arm of the rule)."""
    if server.major == 0:
        assert server.minor > 0, "a 0.0 server has no older minor"
        return f"0.{server.minor - 1}.9"
    return f"{server.major - 1}.{server.minor + 5}.0"


def newer_refused(server: version.Version) -> str:
    return f"{server.major}.{server.minor + 1}.0"


# --- the rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("server", "client", "served"), [
    # major 0: exactly the server's major.minor, any patch
    ("0.2.0", "0.2.0", True),
    ("0.2.0", "0.2.7", True),
    ("0.2.3", "0.2.0", True),
    ("0.2.0", "0.1.9", False),
    ("0.2.0", "0.3.0", False),
    ("0.2.0", "1.2.0", False),
    ("0.0.4", "0.0.1", True),
    # from 1.0: the same major, client minor <= server minor
    ("1.3.0", "1.3.9", True),
    ("1.3.0", "1.0.0", True),
    ("1.3.0", "1.4.0", False),
    ("1.3.0", "0.3.0", False),
    ("1.3.0", "2.0.0", False),
    ("2.0.0", "1.9.0", False),
    # PEP 440 suffixes are shown, never compared
    ("0.3.0rc1", "0.3.0", True),
    ("0.2.0", "0.2.1.dev3", True),
    ("0.2.0+local.1", "0.3.0a1", False),
])
def test_the_rule(server, client, served):
    assert version.serves(server, client) is served


@pytest.mark.parametrize("garbage", [
    "", "0.2", "0.2.0.0", "v0.2.0", "0.02.0", " 0.2.0", "0.2.0 ", "0.2.x", "\u0660.\u0662.\u0660", "0.2.0-beta",
    "latest",
])
def test_garbage_is_not_a_version(garbage):
    with pytest.raises(ValueError, match=r"is not a version of the form X\.Y\.Z"):
        version.parse(garbage)


def test_a_long_value_is_refused_and_not_echoed_whole():
    with pytest.raises(ValueError) as e:
        version.parse("0.2.0" + "9" * 1000)
    assert len(str(e.value)) < 200 and "..." in str(e.value)


def test_a_version_keeps_its_suffix_for_display():
    assert str(version.parse("0.3.0rc1.post2.dev3+abc.1")) == "0.3.0rc1.post2.dev3+abc.1"
    assert version.parse("0.2.0").series == "0.2"


def test_the_advice_names_the_side_to_upgrade_and_the_command():
    assert version.advice("0.2.0", "0.1.4") == 'upgrade the client: pip install -U "ringfence==0.2.*"'
    newer = version.advice("0.2.0", "0.3.1")
    assert newer.startswith('upgrade the server: pip install -U "ringfence-server==0.3.*"')
    assert 'pip install -U "ringfence==0.2.*"' in newer  # the client side's way out meanwhile
    assert version.advice("1.3.0", "1.5.2").startswith('upgrade the server: pip install -U "ringfence-server>=1.5,<2"')
    assert version.advice("2.1.0", "1.9.0") == 'upgrade the client: pip install -U "ringfence==2.1.*"'
    assert version.served_clients("0.2.5") == "ringfence==0.2.*"
    assert version.served_clients("1.3.0") == "ringfence>=1.0,<1.4"
    text = version.message("0.2.0", "0.1.4")
    assert "0.2.0" in text and "0.1.4" in text and "upgrade the client" in text


def test_both_distributions_run_one_version():
    assert str(SERVER) == __version__ == ringfence._wire.CLIENT_VERSION
    assert version.serves(SERVER, __version__)


# --- a real server -------------------------------------------------------------------------------


@pytest.fixture
def stub():
    return StubOrchestrator()


@pytest.fixture
def server(stub, tmp_path):
    with BackgroundServer(stub, make_config(tmp_path)) as s:
        yield s


def received(stub: StubOrchestrator, name: str) -> int:
    """How many calls of `name` reached the core (the receiver's own count)."""
    return sum(1 for called, _ in stub.calls if called == name)


def get_run_raw(client: Client, announced: list[str]):
    """GetRun with hand-built metadata: the token and `announced` as the client's version(s)."""
    metadata = [("authorization", f"Bearer {AGENT}"), *((version.KEY, v) for v in announced)]
    return client.stubs.runs.GetRun(runs_pb2.GetRunRequest(run_id="r1"), metadata=metadata, timeout=10)


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    assert isinstance(error, grpc.Call), error
    status = rpc_status.from_call(error)
    assert status is not None, "no google.rpc.Status in the trailers"
    infos = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            infos.append(info)
    [info] = infos
    return info


@pytest.mark.parametrize(("announced", "side"), [
    (older_refused(SERVER), "upgrade the client"),
    (newer_refused(SERVER), "upgrade the server"),
])
def test_a_client_the_server_does_not_serve_is_failed_precondition_naming_both_versions(
        server, stub, announced, side):
    with Client(server.address, AGENT) as c:
        c.start_run("g", "r1")
        with pytest.raises(grpc.RpcError) as e:
            get_run_raw(c, [announced])
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = e.value.details()
    assert announced in details and str(SERVER) in details and side in details
    info = error_info(e.value)
    assert (info.reason, info.domain) == ("VERSION_MISMATCH", "ringfence")
    assert dict(info.metadata) == {"client_version": announced, "server_version": str(SERVER),
                                   "upgrade": version.advice(SERVER, announced)}
    # The SDK's translation of that very error.
    mismatch = from_rpc_error(e.value)
    assert isinstance(mismatch, VersionMismatch) and isinstance(mismatch, FailedPrecondition)
    assert (mismatch.client_version, mismatch.server_version) == (announced, str(SERVER))
    assert side in str(mismatch) and "pip install" in str(mismatch)
    assert received(stub, "get_run") == 0, "a refused client's call reached the core"
    assert server.server.edge.unexpected_errors == 0


@pytest.mark.parametrize("announced", [
    [__version__],  # equal
    [f"{SERVER.major}.{SERVER.minor}.{SERVER.patch + 3}"],  # another patch of the same series
    [],  # absent: grpcurl, another language
])
def test_a_client_the_server_serves_is_served(server, stub, announced):
    with Client(server.address, AGENT) as c:
        c.start_run("g", "r1")
        assert get_run_raw(c, announced).run_id == "r1"
    assert received(stub, "get_run") == 1
    assert server.server.edge.unexpected_errors == 0


@pytest.mark.parametrize(("announced", "problem"), [
    (["latest"], "'latest' is not a version of the form X.Y.Z"),
    (["0.2"], "'0.2' is not a version of the form X.Y.Z"),
    ([__version__, __version__], "send it once"),
])
def test_a_version_that_is_not_one_is_invalid_argument_naming_the_key(server, stub, announced, problem):
    with Client(server.address, AGENT) as c, pytest.raises(grpc.RpcError) as e:
        get_run_raw(c, announced)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert version.KEY in e.value.details()
    translated = from_rpc_error(e.value)
    assert isinstance(translated, InvalidArgument)
    [violation] = translated.violations
    assert violation.field == version.KEY and problem in violation.description
    assert stub.calls == []
    assert server.server.edge.unexpected_errors == 0


def test_the_sdk_raises_version_mismatch_saying_what_to_upgrade(server, stub, monkeypatch):
    older = older_refused(SERVER)
    monkeypatch.setattr(ringfence._wire, "CLIENT_VERSION", older)
    with Client(server.address, AGENT) as c:
        assert (version.KEY, older) in c.metadata()
        with pytest.raises(VersionMismatch) as e:
            c.list_runs()
        assert str(e.value).endswith(f'upgrade the client: pip install -U "ringfence=={SERVER.series}.*"')
        assert (e.value.client_version, e.value.server_version) == (older, str(SERVER))
        with pytest.raises(VersionMismatch):  # a server stream: refused the same way
            list(c.watch_run("r1"))
        with pytest.raises(VersionMismatch):  # a client stream: before a message is read
            c.upload_files("r1", {"a.txt": b"a"})
    assert stub.calls == []
    assert server.server.edge.unexpected_errors == 0


def test_the_sdk_of_this_version_is_served(server, stub):
    with Client(server.address, AGENT) as c:
        assert (version.KEY, __version__) in c.metadata()
        assert isinstance(c.start_run("g", "r1"), RunView)
        assert [r.run_id for r in c.list_runs()] == ["r1"]
    assert received(stub, "list_runs") == 1


def test_the_async_sdk_raises_version_mismatch(server, stub, monkeypatch):
    newer = newer_refused(SERVER)
    monkeypatch.setattr(ringfence._wire, "CLIENT_VERSION", newer)

    async def main() -> VersionMismatch:
        async with AsyncClient(server.address, AGENT) as c:
            with pytest.raises(VersionMismatch) as e:
                await c.get_run("r1")
            return e.value

    mismatch = asyncio.run(main())
    assert (mismatch.client_version, mismatch.server_version) == (newer, str(SERVER))
    assert "upgrade the server" in str(mismatch) and newer in str(mismatch) and str(SERVER) in str(mismatch)
    assert stub.calls == []
    assert server.server.edge.unexpected_errors == 0


def test_a_server_that_omits_the_advice_still_gets_one_from_the_rule():
    from google.protobuf import any_pb2
    from google.rpc import status_pb2

    info = error_details_pb2.ErrorInfo(reason=version.REASON, domain=version.DOMAIN,
                                       metadata={"client_version": "0.1.0", "server_version": "0.2.0"})
    packed = any_pb2.Any()
    packed.Pack(info)
    status = status_pb2.Status(code=grpc.StatusCode.FAILED_PRECONDITION.value[0], details=[packed])
    from ringfence.wire.status import mismatch_of

    mismatch = mismatch_of(status, "refused")
    assert mismatch is not None
    assert str(mismatch) == 'refused: upgrade the client: pip install -U "ringfence==0.2.*"'


def test_the_cli_says_what_to_upgrade(server, stub, monkeypatch):
    """The real `ringfence` command (its own process, this version) against a server that
    is a minor release ahead: the edge's version is moved in this process, the client's is not."""
    ahead = version.parse(newer_refused(SERVER))
    monkeypatch.setattr(servicer, "SERVER_VERSION", ahead)
    proc = subprocess.run([sys.executable, "-m", "ringfence.cli", "runs", "--server", server.address],
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin", "RINGFENCE_TOKEN": AGENT, "PYTHONUNBUFFERED": "1"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert __version__ in proc.stderr and str(ahead) in proc.stderr
    assert f'upgrade the client: pip install -U "ringfence=={ahead.series}.*"' in proc.stderr
    assert "Traceback" not in proc.stderr
    assert stub.calls == []
