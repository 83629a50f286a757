"""The client SDK (ringfence) through the real server on a real loopback port.

The real Orchestrator, SQLite log and a FakeBackend (api_support) stand behind the server
where behaviour matters; the stub core is used where a test needs the edge to answer
UNAVAILABLE, block, or raise on demand. What is pinned: the SDK imports nothing of the server,
typed values both ways, the approver helper, which calls are retried (reads, and submit_batch
with its batch id) and which are not, the trace context reaching the server, field violations,
deadlines, TLS, and the async client.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from api_support import TOKENS, RealCore, StubOrchestrator, fake_backend, make_config
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_architecture import ROOT, imports_of

from ringfence import (
    ApprovalDecision,
    Approver,
    AsyncClient,
    Client,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    RetryPolicy,
    TlsConfig,
    Unavailable,
)
from ringfence.model import (
    ApprovalStatus,
    Event,
    Observation,
    ObservationStatus,
    Role,
    RunOutcome,
    RunStatus,
    RunView,
    ToolView,
)
from ringfence_server.control.api.background import BackgroundServer

AGENT = TOKENS[("acme", Role.AGENT)]
APPROVER = TOKENS[("acme", Role.APPROVER)]
FAST = RetryPolicy(attempts=4, initial_backoff_s=0.0, max_backoff_s=0.0, jitter_s=0.0)
PAY = {"call_id": "pay", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}}


def echo(call_id: str, text: str = "hi") -> dict:
    return {"call_id": call_id, "tool": "echo", "arguments": {"text": text}}


def wait_until(predicate, what: str, attempts: int = 400) -> None:
    """Wait for a condition (not a timing assertion: it only bounds a hang)."""
    pause = threading.Event()
    for _ in range(attempts):
        if predicate():
            return
        pause.wait(0.025)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture
def config(tmp_path):
    return make_config(tmp_path / "state")


@pytest.fixture
def core(config):
    with RealCore(config, fake_backend()) as c:
        yield c


@pytest.fixture
def server(core):
    with BackgroundServer(core.orchestrator, core.config) as s:
        yield s


@pytest.fixture
def agent(server):
    with Client(server.address, AGENT, retry=FAST) as c:
        yield c


@pytest.fixture
def approver(server):
    with Client(server.address, APPROVER, retry=FAST) as c:
        yield c


class FlakyStub(StubOrchestrator):
    """The stub core, where `fail_next[method] = n` makes that method answer UNAVAILABLE n
    times before it works; `counts` says how often each method was reached."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def _hook(self, name, p):
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + 1
            failing = self.fail_next.get(name, 0)
            if failing:
                self.fail_next[name] = failing - 1
        if failing:
            raise Unavailable(f"{name}: the engine is not reachable (simulated)")
        super()._hook(name, p)

    # The stub's finish and cancel read through get_run; give them their own names here.
    def finish_run(self, p, run_id):
        self._hook("finish_run", p)
        return self.runs[run_id]

    def cancel_run(self, p, run_id):
        self._hook("cancel_run", p)
        return self.runs[run_id]

    def decide_approval(self, p, approval_id, approve, reason, *more):
        return super().decide_approval(p, approval_id, approve, reason)


class LostFirstResponse:
    """The real core, except the first submit_batch's response is lost after the batch ran:
    its effects are recorded and the caller is told UNAVAILABLE (a dropped connection)."""

    def __init__(self, orchestrator) -> None:
        self._orchestrator = orchestrator
        self.batch_ids: list[str | None] = []

    def __getattr__(self, name):
        return getattr(self._orchestrator, name)

    def submit_batch(self, p, run_id, calls, batch_id=None):
        self.batch_ids.append(batch_id)
        observations = self._orchestrator.submit_batch(p, run_id, calls, batch_id)
        if len(self.batch_ids) == 1:
            raise Unavailable("connection lost after the batch ran (simulated)")
        return observations


# --- the boundary: what the SDK may import ---------------------------------------------------

def test_the_sdk_imports_without_the_server_installed():
    """In a fresh interpreter where the server's package and its dependencies (docker, psycopg,
    jsonschema, the OpenTelemetry SDK) cannot be imported at all, the SDK, the agent loop and
    the CLI's parser load and a client can be built. (tests/e2e/test_distributions.py proves the
    same with a real install of the client wheel alone.)"""
    poisoned = ["ringfence_server", "docker", "psycopg", "jsonschema", "opentelemetry.sdk", "prometheus_client"]
    code = (
        "import sys, json\n"
        f"for name in {poisoned!r}: sys.modules[name] = None\n"
        "import ringfence, ringfence.agent, ringfence.memory, ringfence.skills, ringfence.cli.main\n"
        "c = ringfence.Client('127.0.0.1:9', 'token'); c.close()\n"
        "print(json.dumps(sorted(m for m, v in sys.modules.items() if v is not None)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert [m for m in loaded if m.split(".")[0] in ("ringfence_server", "docker", "psycopg", "jsonschema")] == []


def test_the_sdk_sources_import_nothing_of_the_server():
    offenders = [f"{path.relative_to(ROOT)} imports {name}"
                 for path in sorted((ROOT / "client" / "ringfence").rglob("*.py"))
                 for name in imports_of(path)
                 if name.split(".")[0] in ("ringfence_server", "docker", "psycopg")]
    assert offenders == []


def test_public_exports_are_pinned():
    import ringfence
    import ringfence.agent

    assert sorted(ringfence.__all__) == sorted([
        "Client", "AsyncClient", "Stream", "AsyncStream", "TlsConfig", "RetryPolicy", "Approver", "ApprovalDecision",
        "ControlError", "FieldViolation", "InvalidArgument", "NotFound", "AlreadyExists", "FailedPrecondition",
        "Unauthenticated", "PermissionDenied", "ResourceExhausted", "Unavailable", "Internal", "VersionMismatch",
        "WorkspaceOptions", "UploadResult", "UploadedFile", "DownloadedFiles",
        # the values of ringfence.model a client handles
        "AdmissionVerdict", "Approval", "ApprovalKind", "ApprovalStatus", "Event", "EventType", "Observation",
        "ObservationStatus", "PlanStep", "ProposedCall", "RunOutcome", "RunStatus", "RunView", "ToolView", "Usage",
        # the pages and reports a console reads (ListRuns, ListEvents, VerifyRun, an approver's tools)
        "RunPage", "EventPage", "AuditReport", "ToolRisk",
        # who the server takes the token to be (WhoAmI)
        "Identity",
        "__version__"])
    assert sorted(ringfence.agent.__all__) == sorted([
        "AgentLoop", "AgentResult", "AgentContext", "ModelClient", "ModelTurn", "ScriptedModel",
        "ScriptExhausted", "TokenUsage", "ToolCall", "TurnRecord", "estimate_tokens", "batch_id_for",
        "AsyncAgentLoop", "AsyncModelClient", "StopReason"])
    for name in ringfence.__all__:
        assert getattr(ringfence, name) is not None
    # One hierarchy: the SDK's exceptions are ringfence.errors' own classes.
    import ringfence.errors

    assert ringfence.InvalidArgument is ringfence.errors.InvalidArgument


# --- typed values through the real server -----------------------------------------------------


def test_every_method_speaks_control_model_values(agent, core):
    tools = agent.list_tools()
    assert all(isinstance(t, ToolView) for t in tools) and "echo" in {t.name for t in tools}
    run = agent.start_run("typed", "typed-1")
    assert isinstance(run, RunView) and (run.run_id, run.status) == ("typed-1", RunStatus.RUNNING)
    [obs] = agent.submit_batch(run.run_id, [echo("a", "hello")])
    assert isinstance(obs, Observation) and obs.status is ObservationStatus.EXECUTED
    assert obs.content == {"text": "hello"}
    assert agent.get_run(run.run_id).trajectory == (obs,)
    assert "typed-1" in [r.run_id for r in agent.list_runs()]
    events = list(agent.execute_plan(run.run_id, [{"key": "s1", "tool": "echo", "arguments": {"text": "p"}}]))
    assert all(isinstance(e, Event) for e in events) and "observation" in [e.type for e in events]
    finished = agent.finish_run(run.run_id)
    assert finished.outcome is RunOutcome.COMPLETED
    log = [e.type for e in agent.watch_run(run.run_id)]
    assert log[0] == "run_started" and log[-1] == "run_finished"
    other = agent.start_run("to cancel")
    assert agent.cancel_run(other.run_id).outcome is RunOutcome.CANCELLED
    with pytest.raises(FailedPrecondition):
        agent.submit_batch(run.run_id, [echo("late")])
    with pytest.raises(NotFound):
        agent.get_run("no-such-run")
    assert core.backend.starts == 2


def test_field_violations_reach_the_caller_as_invalid_argument(agent, core):
    with pytest.raises(InvalidArgument) as bad_id:
        agent.start_run("goal", "not a valid id!")
    assert [v.field for v in bad_id.value.violations] == ["run_id"]
    run = agent.start_run("violations")
    # NaN is not JSON: the edge names the field instead of guessing a value.
    with pytest.raises(InvalidArgument) as nan:
        agent.submit_batch(run.run_id, [{"call_id": "n", "tool": "echo", "arguments": {"text": float("nan")}}])
    assert [v.field for v in nan.value.violations] == ["calls[0].arguments_json"]
    steps = [{"key": f"s{i}", "tool": "echo", "arguments": {"text": str(i)}} for i in range(11)]
    with pytest.raises(InvalidArgument) as plan:
        list(agent.execute_plan(run.run_id, steps))
    assert [(v.field, v.description) for v in plan.value.violations] == [("steps", "11 steps is over max_steps 10")]
    assert core.backend.starts == 0


# --- the approver helper ------------------------------------------------------------------------


def test_the_approver_helper_decides_an_ask(agent, approver, core):
    seen = []

    def decide(approval):
        seen.append(approval)
        return approval.arguments["amount"] <= 100, "within the limit"

    run = agent.start_run("pay acme-9", "approve-1")
    with Approver(approver, decide) as helper:
        [asked] = agent.submit_batch(run.run_id, [PAY])
        assert asked.status is ObservationStatus.PENDING_APPROVAL
        wait_until(lambda: helper.decided, "the helper decided the approval")
    [decided] = helper.decided
    assert decided.approval_id == asked.approval_id
    assert decided.status in (ApprovalStatus.APPROVED, ApprovalStatus.USED)  # used at once: it ran
    assert decided.decided_by == "acme-approver" and decided.reason == "within the limit"
    assert [(a.tool, dict(a.arguments)) for a in seen] == [("credit", {"account": "acme-9", "amount": 50})]
    [done] = agent.get_run(run.run_id).trajectory
    assert done.status is ObservationStatus.EXECUTED and done.content["arguments"]["amount"] == 50
    assert core.backend.starts == 1
    assert helper.errors == []


def test_the_approver_helper_declines_and_survives_a_failing_callable(agent, approver, core):
    def decide(approval):
        if approval.call_id == "boom":
            raise RuntimeError("the approver's own bug")
        return False

    run = agent.start_run("two asks")
    helper = Approver(approver, decide).start()
    try:
        agent.submit_batch(run.run_id, [dict(PAY, call_id="boom"), dict(PAY, call_id="no", arguments={
            "account": "acme-1", "amount": 5})])
        wait_until(lambda: helper.decided and helper.errors, "one declined, one failed")
    finally:
        helper.stop()
    assert [a.status for a in helper.decided] == [ApprovalStatus.DECLINED]
    assert isinstance(helper.errors[0], RuntimeError)
    trajectory = {o.call_id: o.status for o in agent.get_run(run.run_id).trajectory}
    assert trajectory == {"boom": ObservationStatus.PENDING_APPROVAL, "no": ObservationStatus.DECLINED}
    assert core.backend.starts == 0


def test_the_approver_helper_can_approve_and_remember_for_the_run(agent, approver, core):
    asked = []

    def decide(approval):
        asked.append(dict(approval.arguments))
        return ApprovalDecision(True, "small and known", remember=True)

    run = agent.start_run("pay acme-9 twice", "remember-1")
    with Approver(approver, decide) as helper:
        [first] = agent.submit_batch(run.run_id, [PAY])
        assert first.status is ObservationStatus.PENDING_APPROVAL
        wait_until(lambda: helper.decided, "the helper decided the approval")
        # The exact call again: the session grant admits it without a second ask.
        [again] = agent.submit_batch(run.run_id, [dict(PAY, call_id="pay-again")])
    assert asked == [{"account": "acme-9", "amount": 50}]
    assert again.status is ObservationStatus.DEDUPLICATED and again.executed is False
    assert "grant:session" in " ".join(again.verdict_path), again.verdict_path
    events = [e.type for e in core.store.read(run.run_id)]
    assert events.count("approval_requested") == 1 and events.count("grant_added") == 1
    assert core.backend.starts == 1
    assert helper.errors == []


# --- retries ------------------------------------------------------------------------------------


def test_a_lost_submit_batch_response_is_retried_with_its_batch_id_and_runs_once(tmp_path):
    config = make_config(tmp_path / "state")
    with RealCore(config, fake_backend()) as core:
        flaky = LostFirstResponse(core.orchestrator)
        with BackgroundServer(flaky, config) as s, Client(s.address, AGENT, retry=FAST) as c:
            run = c.start_run("lose a response")
            [obs] = c.submit_batch(run.run_id, [echo("once", "only once")])
            assert obs.status is ObservationStatus.EXECUTED and obs.content == {"text": "only once"}
            c.submit_batch(run.run_id, [echo("next")])
            log = [e for e in core.store.read(run.run_id) if e.type == "batch_started"]
    first, retried, fresh = flaky.batch_ids
    assert first == retried and first  # the retry resent the same batch id
    assert fresh not in (None, first)  # a new call of the method gets a fresh one
    assert len(core.backend.requests) == 2  # "once" ran once, "next" once
    assert [e.data["batch_id"] for e in log] == [first, fresh]


def test_reads_are_retried_on_unavailable_mutations_are_not(tmp_path):
    stub = FlakyStub()
    with BackgroundServer(stub, make_config(tmp_path)) as s, Client(s.address, AGENT, retry=FAST) as c:
        c.start_run("g", "r1")
        for method, call in [
            ("get_run", lambda: c.get_run("r1")),
            ("list_runs", c.list_runs),
            ("list_tools", c.list_tools),
            ("submit_batch", lambda: c.submit_batch("r1", [echo("x")])),
        ]:
            stub.fail_next[method] = 1
            before = stub.counts.get(method, 0)
            call()
            assert stub.counts[method] - before == 2, method  # the failure, then the retry
        for method, call in [
            ("finish_run", lambda: c.finish_run("r1")),
            ("cancel_run", lambda: c.cancel_run("r1")),
            ("start_run", lambda: c.start_run("g", "r1")),
        ]:
            stub.fail_next[method] = 1
            before = stub.counts.get(method, 0)
            with pytest.raises(Unavailable):
                call()
            assert stub.counts[method] - before == 1, method  # never sent again
        with Client(s.address, APPROVER, retry=FAST) as a:
            stub.fail_next["list_approvals"] = 1
            assert a.list_approvals() == []
            assert stub.counts["list_approvals"] == 2
            stub.fail_next["decide_approval"] = 1
            with pytest.raises(Unavailable):
                a.decide_approval("ap-1", True)
            assert stub.counts["decide_approval"] == 1


def test_retries_stop_after_the_policys_attempts_and_never_for_a_server_fault(tmp_path):
    stub = FlakyStub()
    policy = RetryPolicy(attempts=3, initial_backoff_s=0.0, max_backoff_s=0.0, jitter_s=0.0)
    with BackgroundServer(stub, make_config(tmp_path)) as s, Client(s.address, AGENT, retry=policy) as c:
        c.start_run("g", "r1")
        stub.fail_next["get_run"] = 10
        with pytest.raises(Unavailable):
            c.get_run("r1")
        assert stub.counts["get_run"] == 3
        stub.fail_next["get_run"] = 0
        stub.raise_in["list_runs"] = RuntimeError("a bug")
        with pytest.raises(Internal):
            c.list_runs()
        assert stub.counts["list_runs"] == 1


def test_a_channel_that_cannot_connect_is_unavailable_after_the_retries(tmp_path):
    # Nothing listens on a port we just released: the channel itself answers UNAVAILABLE.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    policy = RetryPolicy(attempts=2, initial_backoff_s=0.0, max_backoff_s=0.0, jitter_s=0.0)
    with Client(f"127.0.0.1:{port}", AGENT, retry=policy, timeout=10) as c, pytest.raises(Unavailable):
        c.get_run("r1")


# --- deadlines ----------------------------------------------------------------------------------


def test_every_call_and_stream_has_a_deadline(tmp_path):
    stub = StubOrchestrator()
    stub.gate = threading.Event()  # submit_batch blocks until released
    with BackgroundServer(stub, make_config(tmp_path)) as s:
        try:
            with Client(s.address, AGENT, retry=FAST, timeout=0.5, stream_timeout=0.5) as c:
                with pytest.raises(grpc.RpcError) as unary:
                    c.submit_batch("r1", [echo("x")])  # the constructor's default deadline
                assert unary.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                stream = iter(c.watch_run("r1"))  # the stub sends one event, then waits
                assert next(stream).type == "run_started"
                with pytest.raises(grpc.RpcError) as streamed:
                    next(stream)
                assert streamed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            with Client(s.address, AGENT, retry=FAST, timeout=60) as c:
                with pytest.raises(grpc.RpcError) as override:
                    c.submit_batch("r1", [echo("y")], timeout=0.5)  # the per-call override
                assert override.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        finally:
            stub.gate.set()  # before the server stops: it waits for the blocked calls


# --- trace context ------------------------------------------------------------------------------


def test_the_callers_trace_context_reaches_the_server(tmp_path):
    exporter = InMemorySpanExporter()
    server_provider = TracerProvider()
    server_provider.add_span_processor(SimpleSpanProcessor(exporter))
    client_tracer = TracerProvider().get_tracer("the-agent")
    stub = StubOrchestrator()
    with BackgroundServer(stub, make_config(tmp_path), tracer_provider=server_provider) as s, \
            Client(s.address, AGENT, retry=FAST) as c:
        assert not any(k == "traceparent" for k, _ in c.metadata())  # no span, no header
        c.start_run("g", "r1")
        with client_tracer.start_as_current_span("agent-turn") as span:
            here = span.get_span_context()
            sent = dict(c.metadata())["traceparent"]
            assert sent.startswith(f"00-{here.trace_id:032x}-{here.span_id:016x}-")
            c.get_run("r1")
            list(c.execute_plan("r1", [{"key": "s1", "tool": "echo", "arguments": {}}]))
    spans = {sp.name.rsplit("/", 1)[-1]: sp for sp in exporter.get_finished_spans()}
    for name in ("GetRun", "ExecutePlan"):
        continued = spans[name]
        assert continued.context.trace_id == here.trace_id, name
        assert continued.parent is not None and continued.parent.span_id == here.span_id, name
        assert continued.parent.is_remote
    assert spans["StartRun"].parent is None and spans["StartRun"].context.trace_id != here.trace_id


# --- TLS --------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_and_mtls(tmp_path):
    from ringfence_server.control.api.server import TlsOptions

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=sdk test CA",
            "-keyout", "ca.key", "-out", "ca.pem")
    (tmp_path / "server.ext").write_text("subjectAltName=DNS:ringfence.test\n")
    (tmp_path / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                "-out", f"{name}.csr")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    p = Path(tmp_path)
    tls = TlsOptions(p / "server.pem", p / "server.key", client_ca=p / "ca.pem")
    with BackgroundServer(StubOrchestrator(), make_config(tmp_path / "state"), tls=tls) as s:
        # The certificate names ringfence.test, the target is an IP: server_name bridges them.
        mutual = TlsConfig.from_files(p / "ca.pem", certificate_chain=p / "client.pem",
                                      private_key=p / "client.key", server_name="ringfence.test")
        with Client(s.address, AGENT, tls=mutual, retry=FAST) as c:
            assert [t.name for t in c.list_tools()] == ["echo"]
        no_cert = TlsConfig.from_files(p / "ca.pem", server_name="ringfence.test")
        once = RetryPolicy(attempts=1)
        with Client(s.address, AGENT, tls=no_cert, retry=once, timeout=10) as c, \
                pytest.raises(Unavailable):  # the handshake fails: no client certificate
            c.list_tools()
    with pytest.raises(ValueError):
        TlsConfig(private_key=b"key only")


# --- the async client ---------------------------------------------------------------------------


def test_the_async_client_against_the_real_server(server, core):
    tracer = TracerProvider().get_tracer("async-agent")

    async def main():
        async with AsyncClient(server.address, AGENT, retry=FAST) as c:
            assert "echo" in {t.name for t in await c.list_tools()}
            run = await c.start_run("async", "async-1")
            [obs] = await c.submit_batch(run.run_id, [echo("a", "from asyncio")])
            assert obs.status is ObservationStatus.EXECUTED and obs.content == {"text": "from asyncio"}
            assert (await c.get_run(run.run_id)).trajectory == (obs,)
            with pytest.raises(InvalidArgument) as bad:
                await c.start_run("g", "bad id!")
            assert [v.field for v in bad.value.violations] == ["run_id"]
            with tracer.start_as_current_span("async-turn") as span:
                assert any(k == "traceparent" and f"{span.get_span_context().trace_id:032x}" in v
                           for k, v in c.metadata())
            await c.finish_run(run.run_id)
            types = [e.type async for e in c.watch_run(run.run_id)]
            assert types[0] == "run_started" and types[-1] == "run_finished"
            return run.run_id

    assert asyncio.run(main()) == "async-1"
    assert core.backend.starts == 1


def test_the_async_client_retries_reads_only_and_carries_the_trace(tmp_path):
    stub = FlakyStub()
    exporter = InMemorySpanExporter()
    server_provider = TracerProvider()
    server_provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = TracerProvider().get_tracer("async-agent")

    async def main(address):
        async with AsyncClient(address, AGENT, retry=FAST) as c:
            await c.start_run("g", "r1")
            stub.fail_next["get_run"] = 1
            with tracer.start_as_current_span("async-turn") as span:
                assert (await c.get_run("r1")).run_id == "r1"
            here = span.get_span_context()
            stub.fail_next["finish_run"] = 1
            with pytest.raises(Unavailable):
                await c.finish_run("r1")
            stream = c.watch_run("r1")
            async for event in stream:
                assert event.type == "run_started"
                stream.cancel()
            return here

    with BackgroundServer(stub, make_config(tmp_path), tracer_provider=server_provider) as s:
        here = asyncio.run(main(s.address))
    assert (stub.counts["get_run"], stub.counts["finish_run"]) == (2, 1)
    # Both attempts of the retried read continued the caller's trace.
    attempts = [sp for sp in exporter.get_finished_spans() if sp.name.endswith("/GetRun")]
    assert len(attempts) == 2
    assert all(sp.context.trace_id == here.trace_id and sp.parent.span_id == here.span_id for sp in attempts)
