"""The MCP front door over both transports, with real parts only: a real `ringfence serve` on a
loopback port (the embedded defaults' demo tenant and rules, /input, the ledger as the egress
service that `credit` reaches, and its Streamable HTTP listener), real containers for every call,
and the MCP SDK's own client: over stdio, launching `python -m ringfence.cli mcp --server ADDR` as
a host would, and over Streamable HTTP to `serve --mcp-listen` with a bearer token. Every test
runs once per transport.

What is asserted is meaning: the schemas and hints tools/list gives against ListTools; the exact
events of each call in the session's run's log; the effects counted at the ledger itself; the
observation SubmitBatch gives for the same call over gRPC.

Red checks (each done by hand, see the report): the idempotency key dropped from _meta handling
-> the ledger counts two; the withdrawal skipped on cancel -> the withdrawn-approval test fails;
a risk field exposed in the schema -> the tools/list test fails.
"""

from __future__ import annotations

import itertools
from typing import Any, cast

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from mcp_support import (
    APPROVER,
    HELLO,
    Progress,
    client_name,
    events_of,
    hello_inputs,
    http_session,
    observation_meta,
    run_events,
    session_run_id,
    stdio_session,
    text_of,
    write_config,
)
from mcp_types import RequestParamsMeta
from serve_support import Served

from ringfence import AsyncClient, Client
from ringfence.model import ObservationStatus, RunStatus
from ringfence.models._common import clean_schema

pytestmark = pytest.mark.docker

AGENT = "demo-agent-token"
# Risk metadata a manifest carries beside its schema: none of it may reach an MCP client.
RISK_KEYS = {"mutates", "reversible", "cost", "paths", "egress_hosts", "limits", "reconcile", "approval", "image",
             "roots", "serial", "workspace"}
_accounts = itertools.count(100)  # the module's ledger is its own: every account starts empty


def account() -> str:
    """An account of its own for one test: the ledger's counts for it are that test's alone."""
    return f"acme-{next(_accounts)}"


MCP_LINE = "ringfence: MCP (Streamable HTTP) on "


@pytest.fixture(scope="module", params=["stdio", "http"])
def world(request, docker_client, pinned_images, tmp_path_factory):
    """(served, ledger): `ringfence serve` whose `credit` reaches the ledger, with its MCP listener;
    `served.transport` is the transport this module's tests use. Both removed at the end."""
    from ringfence_server.demo_services.ledger.container import Ledger

    tmp = tmp_path_factory.mktemp("mcp")
    inputs = hello_inputs(tmp)
    with Ledger(docker_client, lock=pinned_images) as ledger:
        config = write_config(tmp / "ringfence.toml", inputs=inputs, ledger_services=ledger.services(),
                              ledger_network=ledger.network)
        served = Served(config, tmp / "state", "--mcp-listen", "127.0.0.1:0")
        try:
            line = served.line_starting(MCP_LINE)
            served.transport = request.param  # type: ignore[attr-defined]
            served.mcp_url = line[len(MCP_LINE):].split()[0]  # type: ignore[attr-defined]
            yield served, ledger
        finally:
            served.stop()


def mcp_session(served: Any, name: str) -> Any:
    """An initialized MCP session over the world's transport (closed at exit)."""
    if served.transport == "http":
        return http_session(served.mcp_url, name)
    return stdio_session(served.address, name)


def run(coro_fn: Any, *args: Any) -> Any:
    return anyio.run(coro_fn, *args)


def credits_at_ledger(ledger: Any, acct: str) -> int:
    return int(ledger.balance(acct)["credits"])


# --- tools/list -----------------------------------------------------------------------------------


def _keys_outside_property_names(schema: Any) -> set[str]:
    """Every key of a JSON document but the names under `properties` (an argument may be called anything)."""
    keys: set[str] = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            keys.add(key)
            if key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(value, dict):
                for sub in value.values():
                    keys |= _keys_outside_property_names(sub)
            else:
                keys |= _keys_outside_property_names(value)
    elif isinstance(schema, list):
        for item in schema:
            keys |= _keys_outside_property_names(item)
    return keys


def test_initialize_and_tools_list_match_list_tools(world):
    served, _ = world
    name = client_name("list")

    async def go():
        async with mcp_session(served, name) as session:
            assert session.initialize_result.server_info.name == "ringfence"
            return (await session.list_tools()).tools

    tools = run(go)
    with Client(served.address, AGENT) as client:
        views = client.list_tools()
    assert [t.name for t in tools] == [v.name for v in views]
    for tool, view in zip(tools, views, strict=True):
        expected = clean_schema(view.schema) or {"type": "object", "properties": {}}
        expected.setdefault("type", "object")
        assert tool.input_schema == expected, tool.name
        assert tool.description == view.description
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is view.read_only_hint, tool.name
        assert tool.annotations.destructive_hint == (None if view.read_only_hint else view.destructive_hint)
        assert tool.annotations.idempotent_hint is None and tool.annotations.open_world_hint is None
        # No risk metadata anywhere in what the client receives (the tool's whole wire form).
        wire = tool.model_dump(by_alias=True, exclude_none=True)
        assert not _keys_outside_property_names(wire) & RISK_KEYS, (tool.name, wire)
    by_name = {t.name: t.annotations for t in tools}
    # read-only, reversible mutation, irreversible mutation
    assert (by_name["read_file"].read_only_hint, by_name["read_file"].destructive_hint) == (True, None)
    assert (by_name["write_note"].read_only_hint, by_name["write_note"].destructive_hint) == (False, False)
    assert (by_name["credit"].read_only_hint, by_name["credit"].destructive_hint) == (False, True)


# --- an allowed read, the session = the run ------------------------------------------------------


def test_an_allowed_read_runs_in_a_container_and_the_sessions_end_finishes_its_run(world):
    served, _ = world
    name = client_name("read")

    async def go():
        async with mcp_session(served, name) as session:
            result = await session.call_tool("read_file", {"path": "/input/hello.txt"})
            with Client(served.address, AGENT) as client:
                during = client.get_run(session_run_id(client, name))
            return result, during

    result, during = run(go)
    assert not result.is_error, text_of(result)
    assert result.structured_content["content"] == HELLO and '"content": "hello from /input' in text_of(result)
    meta = observation_meta(result)
    assert meta["status"] == "executed" and meta["executed"] is True
    assert during.status is RunStatus.RUNNING  # started at initialize, not yet finished
    assert during.run_id == meta["run_id"]  # the session's run is the call's
    with Client(served.address, AGENT) as client:
        # The log first: it ends at run_finished. Over HTTP the session's end (DELETE) is answered
        # before the server has finished the run, so the run's status is read once it has.
        events = run_events(client, meta["run_id"])
        view = client.get_run(meta["run_id"])
    assert view.status is RunStatus.FINISHED
    [observation] = view.trajectory
    assert result.structured_content == dict(observation.content)
    # It ran in a sandbox: dispatched, one attempt, completed.
    assert events_of(events, meta["call_id"]) == ["call_decided", "dispatch_started", "attempt", "call_completed",
                                                  "observation"]
    assert events[0].type == "run_started" and events[0].data["goal"] == f"MCP session: {name} 1.2.3"
    assert events[-1].type == "run_finished"


# --- denied: the same observation as over gRPC ----------------------------------------------------


@pytest.mark.parametrize("tool, arguments, step", [
    ("read_file", {"path": "/etc/passwd"}, "resource:deny"),  # a denied path
    ("credit", {"account": "acme-1", "amount": 500}, "policy:"),  # a denied call (amount > 100)
])
def test_a_denied_call_is_an_error_result_equal_to_submit_batchs_observation(world, tool, arguments, step):
    served, _ = world
    name = client_name("deny")

    async def go():
        async with mcp_session(served, name) as session:
            return await session.call_tool(tool, arguments)

    result = run(go)
    with Client(served.address, AGENT) as client:
        other = client.start_run("the same call over gRPC")
        [grpc_obs] = client.submit_batch(other.run_id, [{"call_id": "c1", "tool": tool, "arguments": arguments}])
        client.finish_run(other.run_id)
        meta = observation_meta(result)
        events = run_events(client, meta["run_id"])
    assert grpc_obs.status is ObservationStatus.DENIED and not grpc_obs.executed
    assert result.is_error
    assert meta["status"] == grpc_obs.status.value and meta["executed"] is False
    assert meta["verdict_path"] == list(grpc_obs.verdict_path) and any(p.startswith(step) for p in meta["verdict_path"])
    assert meta.get("error_class") == grpc_obs.error_class
    text = text_of(result)
    assert grpc_obs.error in text and " > ".join(grpc_obs.verdict_path) in text
    assert events_of(events, meta["call_id"]) == ["call_decided", "observation"]  # never dispatched


# --- ASK ------------------------------------------------------------------------------------------


async def _decide_when_asked(address: str, progress: Progress, approve: bool, reason: str,
                             remember: bool = False) -> str:
    """As a second client (the approver's token, over gRPC): wait until the call's first progress
    notification names its approval, then decide it. The approval id."""
    await progress.first.wait()
    approval_id = progress.approval_id()
    async with AsyncClient(address, APPROVER) as approver:
        await approver.decide_approval(approval_id, approve, reason, remember=remember)
    return approval_id


def test_an_ask_approved_by_a_second_client_runs_while_progress_arrives(world):
    served, ledger = world
    name, acct = client_name("approve"), account()

    async def go():
        progress = Progress()
        decided: dict[str, str] = {}
        async with mcp_session(served, name) as session, anyio.create_task_group() as tg:
            async def approve() -> None:
                decided["id"] = await _decide_when_asked(served.address, progress, True, "known customer")

            tg.start_soon(approve)
            result = await session.call_tool("credit", {"account": acct, "amount": 50}, progress_callback=progress)
        return result, progress, decided["id"]

    result, progress, approval_id = run(go)
    assert not result.is_error, text_of(result)
    assert progress.messages and all(approval_id in m for m in progress.messages), progress.messages
    assert progress.values == sorted(progress.values)
    meta = observation_meta(result)
    assert meta["status"] == "executed" and meta["approval_id"] == approval_id
    assert result.structured_content is not None and result.structured_content.get("account") == acct
    assert credits_at_ledger(ledger, acct) == 1
    with Client(served.address, AGENT) as client:
        events = run_events(client, meta["run_id"])
    # Asked, then (once the second client approved it) dispatched to a sandbox, reaching the ledger.
    assert events_of(events, meta["call_id"]) == [
        "call_decided", "approval_requested", "observation", "dispatch_started", "egress", "attempt",
        "call_completed", "observation"]
    [decided] = [e.data for e in events if e.type == "approval_decided" and e.data["approval_id"] == approval_id]
    assert decided["approved"] is True and decided["by"] == "demo-approver" and decided["reason"] == "known customer"


def test_an_ask_declined_is_an_error_result_with_the_reason(world):
    served, ledger = world
    name, acct = client_name("decline"), account()

    async def go():
        progress = Progress()
        async with mcp_session(served, name) as session, anyio.create_task_group() as tg:
            tg.start_soon(_decide_when_asked, served.address, progress, False, "not this customer")
            return await session.call_tool("credit", {"account": acct, "amount": 60}, progress_callback=progress)

    result = run(go)
    assert result.is_error
    text = text_of(result)
    assert "declined" in text and "not this customer" in text and "verdict path:" in text
    meta = observation_meta(result)
    assert meta["status"] == "declined" and meta["executed"] is False
    assert credits_at_ledger(ledger, acct) == 0
    with Client(served.address, AGENT) as client:
        events = run_events(client, meta["run_id"])
    assert "dispatch_started" not in events_of(events, meta["call_id"])


def test_a_cancelled_request_withdraws_its_approval_and_the_call_never_runs(world):
    served, ledger = world
    name, acct = client_name("cancel"), account()

    async def go():
        progress = Progress()
        async with mcp_session(served, name) as session:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    async def cancel_when_waiting() -> None:
                        await progress.first.wait()
                        scope.cancel()  # the SDK's client sends notifications/cancelled

                    tg.start_soon(cancel_when_waiting)
                    await session.call_tool("credit", {"account": acct, "amount": 70}, progress_callback=progress)
            assert scope.cancelled_caught
            approval_id = progress.approval_id()
            with Client(served.address, AGENT) as client:
                run_id = session_run_id(client, name)
            # The log says the approval was withdrawn (bounded: a missing withdrawal fails here).
            async with AsyncClient(served.address, AGENT) as agent:
                with anyio.fail_after(30):
                    async for event in agent.watch_run(run_id):
                        if event.type == "approval_withdrawn" and event.data.get("approval_id") == approval_id:
                            break
            # The session goes on: the next call is served.
            after = await session.call_tool("echo", {"text": "still here"})
            assert not after.is_error, text_of(after)
        return run_id, approval_id

    run_id, approval_id = run(go)
    with Client(served.address, AGENT) as client:
        events = run_events(client, run_id)
    [asked] = [e for e in events if e.type == "approval_requested" and e.data["approval_id"] == approval_id]
    [withdrawn] = [e for e in events if e.type == "approval_withdrawn" and e.data["approval_id"] == approval_id]
    assert withdrawn.data["by"] == "demo-agent" and withdrawn.data["reason"] == "the MCP client cancelled the request"
    call_id = asked.data["call_id"]
    # Asked, pending, then declined as withdrawn: never dispatched, nothing at the ledger.
    assert events_of(events, call_id) == ["call_decided", "approval_requested", "observation", "observation"]
    [_, final] = [e.data for e in events if e.type == "observation" and e.data["call_id"] == call_id]
    assert final["status"] == "declined" and final["error_class"] == "approval_withdrawn", final
    assert credits_at_ledger(ledger, acct) == 0


# --- idempotency ----------------------------------------------------------------------------------


def test_a_mutation_sent_twice_with_the_same_meta_key_takes_effect_once(world):
    """Two sessions (a host that reconnected), the same credit with the same _meta key: one credit
    at the ledger. Without the key the two runs' derived keys differ, and the ledger counts two."""
    served, ledger = world
    acct, key = account(), f"mcp-test-key-{account()}"

    async def one_session() -> Any:
        progress = Progress()
        async with mcp_session(served, client_name("key")) as session, anyio.create_task_group() as tg:
            tg.start_soon(_decide_when_asked, served.address, progress, True, "ok")
            result = await session.call_tool("credit", {"account": acct, "amount": 20}, progress_callback=progress,
                                             meta=cast(RequestParamsMeta, {"io.ringfence/idempotency-key": key}))
            tg.cancel_scope.cancel()  # a call that was not asked leaves the approver waiting
            return result

    first, second = run(one_session), run(one_session)
    assert not first.is_error and not second.is_error, (text_of(first), text_of(second))
    assert credits_at_ledger(ledger, acct) == 1  # counted at the receiver
    assert observation_meta(first)["status"] == "executed"
    assert observation_meta(second)["status"] == "deduplicated"
    assert second.structured_content == first.structured_content


# --- bad input ------------------------------------------------------------------------------------


def test_unknown_tool_and_invalid_arguments_are_json_rpc_errors_with_the_schema_path(world):
    served, _ = world

    async def go():
        errors: dict[str, MCPError] = {}
        async with mcp_session(served, client_name("bad")) as session:
            for label, tool, arguments in (("unknown", "no_such_tool", {}),
                                           ("invalid", "credit", {"account": "acme-1", "amount": "lots"})):
                with pytest.raises(MCPError) as caught:
                    await session.call_tool(tool, arguments)
                errors[label] = caught.value
        return errors

    errors = run(go)
    unknown, invalid = errors["unknown"], errors["invalid"]
    assert unknown.code == -32602 and "no_such_tool" in unknown.message
    assert invalid.code == -32602 and "'credit'" in invalid.message and "arguments.amount" in invalid.message
    assert [v["field"] for v in invalid.data["violations"]] == ["arguments.amount"]
    assert "Traceback" not in unknown.message + invalid.message
