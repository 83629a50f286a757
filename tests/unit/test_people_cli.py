"""The command line for people, run as a real process against the real server on loopback.

Every command is `python -m ringfence.cli ...` in a subprocess whose environment names the
server (RINGFENCE_SERVER) and holds the token (RINGFENCE_TOKEN); the server is the real one
(BackgroundServer) over the real Orchestrator, SQLite store and a FakeBackend (api_support).
The tests read what a person reads (stdout, stderr, the exit code) and check it against what
the server recorded (the client and the store).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from api_support import TOKENS, RealCore, fake_backend, make_config

from ringfence import Client
from ringfence.cli.plan import PlanError, load_plan
from ringfence.model import ApprovalStatus, ObservationStatus, Role, RunOutcome, ToolRisk
from ringfence_server.control.api.background import BackgroundServer

ROOT = Path(__file__).resolve().parents[2]
AGENT = TOKENS[("acme", Role.AGENT)]
APPROVER = TOKENS[("acme", Role.APPROVER)]
EVENT_LINE = re.compile(r"^\s*(\d+)  (\w+)\s+(\S+)\s+(.*)$")
# The environment a person's shell could carry that would change where the command goes.
_STRIPPED = ("RINGFENCE_SERVER", "RINGFENCE_TOKEN", "RINGFENCE_TLS_CA", "http_proxy", "https_proxy",
             "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy", "all_proxy", "ALL_PROXY")


@pytest.fixture
def core(tmp_path):
    with RealCore(make_config(tmp_path / "state"), fake_backend()) as c:
        yield c


@pytest.fixture
def server(core):
    with BackgroundServer(core.orchestrator, core.config) as s:
        yield s


@pytest.fixture
def agent(server):
    with Client(server.address, AGENT) as c:
        yield c


@pytest.fixture
def approver(server):
    with Client(server.address, APPROVER) as c:
        yield c


def cli_env(server_address: str | None, token: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _STRIPPED}
    env["PYTHONUNBUFFERED"] = "1"
    if server_address is not None:
        env["RINGFENCE_SERVER"] = server_address
    if token is not None:
        env["RINGFENCE_TOKEN"] = token
    env.update(extra)
    return env


def cli(server, *args: str, token: str | None = AGENT, input: str | None = None, **extra: str):
    address = server.address if server is not None else None
    return subprocess.run([sys.executable, "-m", "ringfence.cli", *args], cwd=ROOT,
                          env=cli_env(address, token, **extra),
                          input=input, capture_output=True, text=True, timeout=120)


def write_plan(tmp_path: Path, text: str, name: str = "plan.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def event_lines(stdout: str) -> list[tuple[int, str, str, str]]:
    found = []
    for line in stdout.splitlines():
        m = EVENT_LINE.match(line)
        if m:
            found.append((int(m.group(1)), m.group(2), m.group(3), m.group(4)))
    return found


HELLO_AND_SHADOW = """\
goal: say hello, then try to read /etc/shadow
run_id: plan-1
steps:
  - {key: hello, tool: echo, arguments: {text: hi}}
  - key: secret
    tool: read_file
    arguments:
      path: /etc/shadow
"""


# --- submit ----------------------------------------------------------------------------------------


def test_submit_prints_the_run_id_first_then_every_event_then_the_outcome(server, agent, core, tmp_path):
    done = cli(server, "submit", write_plan(tmp_path, HELLO_AND_SHADOW))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("run plan-1 ") and "started" in lines[0]

    # One line per event, in order, exactly the events the plan appended to the log.
    logged = core.store.read("plan-1")
    printed = event_lines(done.stdout)
    assert [(seq, typ) for seq, typ, _, _ in printed] == [(e.seq, e.type) for e in logged[1:]]
    decided = {call: detail for _, typ, call, detail in printed if typ == "call_decided"}
    assert decided["hello"] == "echo: allow"
    assert decided["secret"].startswith("read_file: deny") and "outside /input" in decided["secret"]
    assert any(typ == "observation" and call == "secret" and "denied" in d for _, typ, call, d in printed)

    # Then the run's outcome and its trajectory, as the server has them.
    view = agent.get_run("plan-1")
    assert {o.call_id: o.status for o in view.trajectory} == {
        "hello": ObservationStatus.EXECUTED, "secret": ObservationStatus.DENIED}
    tail = done.stdout.split("\n\n", 1)[1]
    assert "run plan-1: status running, outcome none yet" in tail
    assert re.search(r"^\s+hello\s+echo\s+executed\s+\{\"text\":\"hi\"\}$", tail, re.M)
    assert re.search(r"^\s+secret\s+read_file\s+denied\s+path: '/etc/shadow'", tail, re.M)
    assert core.backend.starts == 1  # only the echo ran


def test_submit_json_is_one_object_per_line(server, agent, core, tmp_path):
    plan = write_plan(tmp_path, json.dumps({
        "goal": "hello and a credit", "run_id": "json-1",
        "steps": [{"key": "hello", "tool": "echo", "arguments": {"text": "hi"}},
                  {"key": "pay", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}}]}), "plan.json")
    done = cli(server, "submit", plan, "--json")
    assert done.returncode == 0, done.stderr
    objects = [json.loads(line) for line in done.stdout.splitlines()]  # every line parses
    first, events, last = objects[0], objects[1:-1], objects[-1]
    assert first == {"kind": "run", "run_id": "json-1", "status": "running", "reused": False}
    assert {o["kind"] for o in events} == {"event"}
    assert [(o["seq"], o["type"]) for o in events] == [(e.seq, e.type) for e in core.store.read("json-1")[1:]]
    requested = next(o for o in events if o["type"] == "approval_requested")
    assert requested["call_id"] == "pay" and requested["data"]["arguments"] == {"account": "acme-9", "amount": 50}
    assert last["kind"] == "outcome"
    run = last["run"]
    assert (run["run_id"], run["status"], run["outcome"]) == ("json-1", "waiting_approval", None)
    statuses = [(o["call_id"], o["status"]) for o in run["trajectory"]]
    assert statuses == [("hello", "executed"), ("pay", "pending_approval")]
    assert run["pending_approvals"][0]["digest"] == agent.get_run("json-1").pending_approvals[0].digest


def test_submit_finish_completes_the_run_and_a_finished_run_takes_no_plan(server, agent, tmp_path):
    plan = write_plan(tmp_path, "goal: just hello\nsteps:\n  - {key: hello, tool: echo, arguments: {text: hi}}\n")
    done = cli(server, "submit", plan, "--run-id", "fin-1", "--finish")
    assert done.returncode == 0, done.stderr
    assert "run fin-1: status finished, outcome completed" in done.stdout
    assert agent.get_run("fin-1").outcome is RunOutcome.COMPLETED

    again = cli(server, "submit", plan, "--run-id", "fin-1")
    assert again.returncode == 1
    assert again.stdout.splitlines()[0].startswith("run fin-1 ") and "reused" in again.stdout
    assert "run fin-1 is finished" in again.stderr and "without --run-id" in again.stderr


# --- watch -----------------------------------------------------------------------------------------


def test_watch_replays_then_follows_live_until_the_run_finishes(server, agent, core):
    agent.start_run("watch me", "watched")
    agent.submit_batch("watched", [{"call_id": "c1", "tool": "echo", "arguments": {"text": "1"}}])
    last = core.store.read("watched")[-1].seq
    proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "watch", "watched"], cwd=ROOT,
                            env=cli_env(server.address, AGENT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, bufsize=1)
    try:
        replayed = []
        while True:  # the replay, up to the last event logged before the watch started
            line = proc.stdout.readline()
            assert line, f"the watch ended early: {proc.stderr.read()}"
            replayed.append(line)
            m = EVENT_LINE.match(line)
            if m and int(m.group(1)) == last:
                break
        agent.finish_run("watched")  # a live event: the watch prints it and ends
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    seqs = [seq for seq, *_ in event_lines("".join(replayed) + rest)]
    assert seqs == list(range(1, last + 2))
    assert event_lines(rest)[-1][1] == "run_finished"
    assert rest.splitlines()[-1] == "run watched finished: completed (finished by the agent)"

    # From a sequence number, as JSON lines: only the events from there.
    tail = cli(server, "watch", "watched", "--from", "3", "--json")
    assert tail.returncode == 0, tail.stderr
    objects = [json.loads(line) for line in tail.stdout.splitlines()]
    assert [o["seq"] for o in objects] == list(range(3, last + 2))
    assert objects[-1]["type"] == "run_finished" and objects[-1]["data"]["outcome"] == "completed"


# --- approvals -------------------------------------------------------------------------------------


def test_approvals_list_shows_exact_arguments_and_digest_then_approve_and_decline(server, agent, approver, core):
    agent.start_run("two credits", "pay-1")
    agent.submit_batch("pay-1", [
        {"call_id": "small", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}},
        {"call_id": "other", "tool": "credit", "arguments": {"account": "acme-7", "amount": 20}},
    ])
    pending = {a.call_id: a for a in approver.list_approvals("pay-1")}
    assert set(pending) == {"small", "other"} and core.backend.starts == 0

    listed = cli(server, "approvals", token=APPROVER)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    for a, args in ((pending["small"], '{"account":"acme-9","amount":50}'),
                    (pending["other"], '{"account":"acme-7","amount":20}')):
        block = listed.stdout.split(a.approval_id, 1)[1].split("\n  digest")[0]
        assert "run pay-1" in block and f"call {a.call_id}" in block and "tool credit" in block
        assert f"  arguments {args}" in block
        assert f"  digest    {a.digest}" in listed.stdout
        # The header, who proposed it and the rule that asked, the arguments, the digest: in that order.
        i = next(n for n, line in enumerate(lines) if line.startswith(a.approval_id + "  "))
        assert re.fullmatch(rf"{a.approval_id}  run pay-1  call {a.call_id}  tool credit  expires in \S+", lines[i])
        assert a.proposer == "acme-agent" and re.fullmatch(r"policy:rule\[\d+\]:ask", a.policy_rule)
        assert lines[i + 1:i + 4] == [f"  proposed by acme-agent  asked by {a.policy_rule}", f"  arguments {args}",
                                      f"  digest    {a.digest}"]
    as_json = [json.loads(line) for line in cli(server, "approvals", "--json", token=APPROVER).stdout.splitlines()]
    assert {(o["approval_id"], o["digest"], o["status"]) for o in as_json} == {
        (a.approval_id, a.digest, "pending") for a in pending.values()}
    for o in as_json:
        assert o["proposer"] == "acme-agent" and o["policy_rule"] == pending[o["call_id"]].policy_rule
        assert o["tool_risk"]["mutates"] is True and o["tool_risk"]["paths"] == {}

    # Whoever proposed the call cannot list or decide approvals: the error says which token to use.
    refused = cli(server, "approvals", "approve", pending["small"].approval_id, token=AGENT)
    assert refused.returncode == 1
    assert "approver" in refused.stderr and "RINGFENCE_TOKEN" in refused.stderr

    approved = cli(server, "approvals", "approve", pending["small"].approval_id, "--reason", "known customer",
                   token=APPROVER)
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.startswith(f"approved {pending['small'].approval_id}: credit")
    assert "the call is now: executed" in approved.stdout
    small = {o.call_id: o for o in agent.get_run("pay-1").trajectory}["small"]
    assert small.status is ObservationStatus.EXECUTED and small.executed
    assert small.content["arguments"] == {"account": "acme-9", "amount": 50}
    assert core.backend.starts == 1

    declined = cli(server, "approvals", "decline", pending["other"].approval_id, "--reason", "not today",
                   token=APPROVER)
    assert declined.returncode == 0, declined.stderr
    assert declined.stdout.startswith(f"declined {pending['other'].approval_id}")
    other = {o.call_id: o for o in agent.get_run("pay-1").trajectory}["other"]
    assert other.status is ObservationStatus.DECLINED and not other.executed and "not today" in other.error
    assert core.backend.starts == 1
    statuses = {a.call_id: (a.status, a.decided_by, a.reason) for a in approver.list_approvals("pay-1")}
    assert statuses["other"] == (ApprovalStatus.DECLINED, "acme-approver", "not today")

    nothing = cli(server, "approvals", token=APPROVER)
    assert nothing.returncode == 0 and nothing.stdout.strip() == "no pending approvals"
    twice = cli(server, "approvals", "approve", pending["small"].approval_id, token=APPROVER)
    assert twice.returncode == 1 and "nothing to decide" in twice.stderr


def _show_lines(a, status: str) -> list[str]:
    """What `ringfence approvals show` prints for the credit approval `a` (in its state `status`)
    down to its tool's risk, the times matched loosely."""
    return [
        f"approval {a.approval_id}",
        f"  status    {status}",
        "  kind      call",
        "  tool      credit",
        f"  run       {a.run_id}",
        f"  call      {a.call_id}",
        "  tenant    acme",
        "  proposer  acme-agent",
        f"  rule      {a.policy_rule}",
        r"  created   \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(\S+ ago\)",
        r"  expires   \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(in \S+\)",
        f"  digest    {a.digest}",
        "  arguments",
        "    {",
        '      "account": "acme-9",',
        '      "amount": 50',
        "    }",
        "  tool risk (credit)",
    ]


def _assert_lines(printed: list[str], expected: list[str]) -> None:
    assert len(printed) >= len(expected), printed
    for got, want in zip(printed, expected, strict=False):
        assert got == want or re.fullmatch(want, got), (got, want)


def test_approvals_show_one_approval_pending_decided_and_not_anyone_elses(server, agent, approver):
    agent.start_run("one credit", "show-1")
    [obs] = agent.submit_batch("show-1", [
        {"call_id": "pay", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}}])
    a = approver.get_approval(obs.approval_id)

    pending = cli(server, "approvals", "show", a.approval_id, token=APPROVER)
    assert pending.returncode == 0, pending.stderr
    lines = pending.stdout.splitlines()
    _assert_lines(lines, _show_lines(a, r"pending, expires in \S+"))
    # Every field of the tool's risk, one a line, in the dataclass's order.
    risk = [line.split()[0] for line in lines[len(_show_lines(a, "")):-1]]
    assert risk == [f.name for f in dataclasses.fields(ToolRisk)]
    assert "    mutates       yes" in lines and "    irreversible  yes" in lines
    assert "    egress_hosts  ledger.ringfence.internal" in lines and "    paths         -" in lines
    assert lines[-1] == (f"decide with `ringfence approvals approve|decline {a.approval_id} --digest {a.digest} "
                         "[--reason TEXT]`")

    as_json = cli(server, "approvals", "show", a.approval_id, "--json", token=APPROVER)
    assert as_json.returncode == 0, as_json.stderr
    [obj] = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert obj["approval_id"] == a.approval_id and obj["status"] == "pending" and obj["proposer"] == "acme-agent"
    assert obj["policy_rule"] == a.policy_rule and obj["arguments"] == {"account": "acme-9", "amount": 50}
    assert obj["tool_risk"]["egress_hosts"] == ["ledger.ringfence.internal"] and obj["tool_risk"]["paths"] == {}

    # Decided, and its run finished: still shown, with who decided it and why.
    approver.decide_approval(a.approval_id, False, "not today")
    agent.finish_run("show-1")
    decided = cli(server, "approvals", "show", a.approval_id, token=APPROVER)
    assert decided.returncode == 0, decided.stderr
    _assert_lines(decided.stdout.splitlines(), _show_lines(a, "declined, by acme-approver: not today"))
    assert "decide with" not in decided.stdout

    # Another tenant's approval is not found; a malformed id is a usage error; an agent may not look.
    elsewhere = cli(server, "approvals", "show", a.approval_id, token=TOKENS[("globex", Role.APPROVER)])
    assert (elsewhere.returncode, elsewhere.stdout) == (1, "")
    assert elsewhere.stderr.splitlines()[0] == f"error: approval '{a.approval_id}' not found"
    malformed = cli(server, "approvals", "show", "not a valid id!", token=APPROVER)
    assert malformed.returncode == 2 and malformed.stdout == ""
    assert malformed.stderr.splitlines()[:2] == [
        "error: the server refused the request: the request is invalid",
        "  approval_id: must be 1-100 characters of [A-Za-z0-9_.:-], starting with a letter or digit"]
    as_agent = cli(server, "approvals", "show", a.approval_id, token=AGENT)
    assert as_agent.returncode == 1 and as_agent.stderr.startswith("error: permission denied: ")


def test_whoami_for_any_token(server):
    agent = cli(server, "whoami", token=AGENT)
    assert (agent.returncode, agent.stdout) == (0, "tenant acme  principal acme-agent  role agent\n"), agent.stderr
    approver = cli(server, "whoami", "--json", token=APPROVER)
    assert approver.returncode == 0, approver.stderr
    assert json.loads(approver.stdout) == {"tenant": "acme", "principal": "acme-approver", "role": "approver"}
    stranger = cli(server, "whoami", token="no-such-token")
    assert stranger.returncode == 1 and "did not accept the token in RINGFENCE_TOKEN" in stranger.stderr


def test_four_eyes_refusal_says_so_plainly(server, approver):
    """An admin token may propose calls and decide approvals, but never both for the same call:
    the server's PERMISSION_DENIED is shown as it is, with a hint about four eyes (not about roles)."""
    with Client(server.address, TOKENS[("acme", Role.ADMIN)]) as admin:
        admin.start_run("an admin's own credit", "eyes-1")
        [obs] = admin.submit_batch("eyes-1", [
            {"call_id": "pay", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}}])
    listed = cli(server, "approvals", token=APPROVER)
    assert f"  proposed by acme-admin  asked by {approver.get_approval(obs.approval_id).policy_rule}" in listed.stdout
    refused = cli(server, "approvals", "approve", obs.approval_id, token=TOKENS[("acme", Role.ADMIN)])
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr.splitlines() == [
        "error: permission denied: acme-admin proposed this call and cannot decide its approval",
        "four eyes: whoever proposed a call cannot decide it; someone else decides it with their own approver "
        "(or admin) token (`ringfence whoami` says whose token RINGFENCE_TOKEN holds)"]
    assert approver.get_approval(obs.approval_id).status is ApprovalStatus.PENDING


# --- runs, run, tools ------------------------------------------------------------------------------


def test_runs_lists_over_grpc_and_the_store_actions_stay(server, agent, core):
    agent.start_run("first goal", "r-1")
    agent.start_run("second goal", "r-2")
    agent.finish_run("r-2")

    listed = cli(server, "runs")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split()[1:3] for line in listed.stdout.splitlines()[1:]}
    assert rows == {"r-1": ["running", "-"], "r-2": ["finished", "completed"]}
    as_json = [json.loads(line) for line in cli(server, "runs", "list", "--json").stdout.splitlines()]
    assert sorted((o["run_id"], o["goal"]) for o in as_json) == [("r-1", "first goal"), ("r-2", "second goal")]

    shown = cli(server, "run", "r-2")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("run r-2: status finished, outcome completed")

    # `runs show` still reads the store directly (no server, no token) ...
    store = cli(None, "runs", "show", "r-2", "--state-dir", str(core.config.state_dir), token=None)
    assert store.returncode == 0, store.stderr
    assert store.stdout.startswith("run r-2  tenant acme") and "chain intact" in store.stdout
    # ... and says so when given a server.
    mixed = cli(server, "runs", "--server", server.address, "show", "r-2")
    assert mixed.returncode == 2
    assert "reads the event store directly" in mixed.stderr and "ringfence run RUN_ID" in mixed.stderr


def test_tools_lists_names_descriptions_and_schemas(server, agent):
    echo = {t.name: t for t in agent.list_tools()}["echo"]
    listed = cli(server, "tools")
    assert listed.returncode == 0, listed.stderr
    block = listed.stdout.split("echo: ", 1)[1].split("\n\n", 1)[0]
    assert block.startswith(echo.description)
    assert json.loads(block.split("schema: ", 1)[1]) == dict(echo.schema)

    as_json = [json.loads(line) for line in cli(server, "tools", "--json").stdout.splitlines()]
    by_name = {o["name"]: o for o in as_json}
    assert by_name["echo"] == {"name": "echo", "description": echo.description, "schema": dict(echo.schema),
                               "read_only_hint": True, "destructive_hint": False,
                               "risk": None}  # an agent's token: no risk metadata (approvers get it)
    assert {"credit", "read_file"} <= set(by_name)
    assert (by_name["credit"]["read_only_hint"], by_name["credit"]["destructive_hint"]) == (False, True)


# --- errors ----------------------------------------------------------------------------------------


def test_a_missing_or_wrong_token_says_which_variable_to_set(server):
    missing = cli(server, "tools", token=None)
    assert missing.returncode == 2 and missing.stdout == ""
    assert "RINGFENCE_TOKEN is not set" in missing.stderr and "--token-env" in missing.stderr

    wrong = cli(server, "tools", token="not-a-token")
    assert wrong.returncode == 1
    assert "did not accept the token in RINGFENCE_TOKEN" in wrong.stderr and "set RINGFENCE_TOKEN" in wrong.stderr
    assert "not-a-token" not in wrong.stderr + wrong.stdout

    other_var = cli(server, "tools", "--token-env", "MY_RF_TOKEN", token=None, MY_RF_TOKEN=AGENT)
    assert other_var.returncode == 0 and "echo: " in other_var.stdout
    unset_var = cli(server, "tools", "--token-env", "MY_RF_TOKEN")
    assert unset_var.returncode == 2 and "MY_RF_TOKEN is not set" in unset_var.stderr
    # A token where a variable name belongs is refused without being echoed.
    leaked = cli(server, "tools", "--token-env", "sk-live.0123456789")
    assert leaked.returncode == 2 and "NAME of an environment variable" in leaked.stderr
    assert "sk-live" not in leaked.stderr


def test_a_wrong_server_asks_whether_serve_is_running():
    # Bound but not listening: a connection to it is refused, deterministically, on loopback.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        done = subprocess.run([sys.executable, "-m", "ringfence.cli", "runs"], cwd=ROOT, env=cli_env(address, AGENT),
                              capture_output=True, text=True, timeout=120)
        as_json = subprocess.run([sys.executable, "-m", "ringfence.cli", "tools", "--server", address, "--json"],
                                 cwd=ROOT, env=cli_env("127.0.0.1:1", AGENT), capture_output=True, text=True,
                                 timeout=120)
    assert done.returncode == 1
    assert f"cannot reach a ringfence server at {address}" in done.stderr
    assert f"is `ringfence serve` running on {address}?" in done.stderr
    assert as_json.returncode == 1 and as_json.stdout == ""
    error = json.loads(as_json.stderr)["error"]
    assert error["code"] == "UNAVAILABLE" and address in error["hint"]


def test_bad_plan_files_exit_2_with_what_is_wrong_and_start_nothing(server, agent, tmp_path):
    cases = {
        "goal: typo\nstpes:\n  - {key: a, tool: echo}\n": [
            "  stpes: unknown key (a plan has: goal, run_id, max_steps, steps)",
            "  steps: missing (a plan needs at least one step: {key, tool, arguments})"],
        "goal: x\nsteps:\n  - {key: a, tool: echo, argument: {}}\n  - {key: a, tool: echo}\n": [
            "  steps[0]: unknown key 'argument' (a step has: key, tool, arguments)",
            "  steps[1].key: duplicate key 'a'"],
        "goal: x\ngoal: y\nsteps: []\n": ["duplicate key 'goal'"],
        "- just a list\n": ["  the file is a list; a plan is a mapping with goal and steps"],
        # Against the server's published tools, before a run is started:
        "goal: x\nsteps:\n  - {key: a, tool: launch_missiles}\n"
        "  - {key: b, tool: credit, arguments: {account: acme-9, amount: -5}}\n": [
            "  steps[0].tool: unknown tool 'launch_missiles'",
            "  steps[1].arguments.amount: -5 is less than or equal to the minimum of 0"],
    }
    for i, (text, expected) in enumerate(cases.items()):
        done = cli(server, "submit", write_plan(tmp_path, text, f"bad-{i}.yaml"))
        assert done.returncode == 2, (text, done.stderr)
        assert done.stdout == ""
        for line in expected:
            assert line in done.stderr, (line, done.stderr)
    assert cli(server, "submit", str(tmp_path / "nope.yaml")).returncode == 2
    assert agent.list_runs() == []  # nothing was started

    # What only the server knows (its max_steps) comes back as INVALID_ARGUMENT, one violation
    # a line, and exits 2; nothing ran.
    steps = "".join(f"  - {{key: s{i}, tool: echo}}\n" for i in range(11))
    done = cli(server, "submit", write_plan(tmp_path, f"goal: too long\nrun_id: long-1\nsteps:\n{steps}"))
    assert done.returncode == 2
    assert "error: the server refused the request" in done.stderr
    assert "\n  steps: 11 steps is over max_steps 10\n" in done.stderr
    assert agent.get_run("long-1").trajectory == ()

    bad_id = cli(server, "run", "not a valid id!")
    assert bad_id.returncode == 2 and re.search(r"^  run_id: ", bad_id.stderr, re.M)


def test_every_command_has_help_with_an_example():
    for argv in (["submit"], ["watch"], ["approvals"], ["approvals", "approve"], ["approvals", "decline"],
                 ["approvals", "withdraw"], ["approvals", "show"], ["whoami"],
                 ["runs"], ["runs", "list"], ["run"], ["tools"]):
        done = subprocess.run([sys.executable, "-m", "ringfence.cli", *argv, "--help"], cwd=ROOT,
                              env=cli_env(None, None), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (argv, done.stderr)
        assert re.search(r"^examples:\n(  .*\n)*?  ringfence " + re.escape(" ".join(argv)), done.stdout, re.M), argv
        for option in ("--server", "--token-env", "--tls-ca", "--json", "RINGFENCE_TOKEN"):
            assert option in done.stdout, (argv, option)
    top = subprocess.run([sys.executable, "-m", "ringfence.cli", "--help"], cwd=ROOT, env=cli_env(None, None),
                         capture_output=True, text=True, timeout=120)
    for command in ("submit", "watch", "approvals", "whoami", "runs", "run", "tools", "serve", "sandbox"):
        assert re.search(rf"^    {command}\b", top.stdout, re.M), command


# --- TLS -------------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_with_a_ca_file_and_the_hint_without_one(tmp_path, core):
    from ringfence_server.control.api.server import TlsOptions

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=cli test CA",
            "-keyout", "ca.key", "-out", "ca.pem")
    (tmp_path / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=server", "-keyout", "server.key",
            "-out", "server.csr")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-extfile", "server.ext", "-out", "server.pem")
    tls = TlsOptions(tmp_path / "server.pem", tmp_path / "server.key")
    with BackgroundServer(core.orchestrator, core.config, tls=tls) as s:
        ok = cli(s, "tools", "--json", "--tls-ca", str(tmp_path / "ca.pem"))
        assert ok.returncode == 0, ok.stderr
        assert "echo" in {json.loads(line)["name"] for line in ok.stdout.splitlines()}
        from_env = cli(s, "runs", RINGFENCE_TLS_CA=str(tmp_path / "ca.pem"))
        assert from_env.returncode == 0, from_env.stderr
        plaintext = cli(s, "tools", "--timeout", "10")
        assert plaintext.returncode == 1
        assert "is `ringfence serve` running on" in plaintext.stderr and "--tls-ca" in plaintext.stderr


# --- the plan reader (in process) ------------------------------------------------------------------


def test_plans_are_read_with_yaml_1_2_scalars_and_plain_json_values():
    plan = load_plan(
        "goal: g\nmax_steps: 3\nsteps:\n"
        "  - key: a\n    tool: echo\n    arguments: {n: 010, b: no, t: true, d: 2024-01-01, x: 0x10, f: 1.5, z: ~, "
        "s: '010', e: 1e3, c: 1:20}\n"
    )
    assert plan.max_steps == 3 and plan.run_id is None and plan.goal == "g"
    assert dict(plan.steps[0].arguments) == {"n": 10, "b": "no", "t": True, "d": "2024-01-01", "x": 16, "f": 1.5,
                                             "z": None, "s": "010", "e": 1000.0, "c": "1:20"}
    assert load_plan('{"goal": "g", "steps": [{"key": "a", "tool": "echo"}]}').steps[0].arguments == {}
    for text, problem in (
        ("goal: g\nsteps:\n  - {key: a, tool: echo, arguments: {x: .nan}}\n", "steps[0].arguments.x: nan"),
        ("goal: g\nsteps:\n  - {key: a, tool: echo, arguments: {x: !!binary aGk=}}\n", "a bytes is not JSON"),
        ("goal: g\nsteps:\n  - {key: a, tool: echo, arguments: {1: x}}\n", "the key 1 must be a string"),
        ("goal: g\nsteps:\n  - {key: a, tool: echo, arguments: {x: 1, x: 2}}\n", "duplicate key 'x'"),
        ("goal: g\nmax_steps: 1\nsteps:\n  - {key: a, tool: echo}\n  - {key: b, tool: echo}\n",
         "2 steps is over max_steps 1"),
        ("goal: ''\nsteps: [{key: 'bad key', tool: echo, arguments: []}]\n", "goal: must be non-empty text"),
    ):
        with pytest.raises(PlanError) as e:
            load_plan(text)
        assert problem in str(e.value) + "\n".join(e.value.details), (text, e.value.details)


def test_approve_remember_and_digest_from_the_command_line(server, agent, approver):
    """`approvals approve ID --remember --digest D`: refused for a digest the person did not see;
    remembered for the run when it applies (the same call again is not asked again)."""
    run = agent.start_run("remember", "rem-1")
    pay = {"call_id": "pay", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}}
    [obs] = agent.submit_batch(run.run_id, [pay])
    wrong = cli(server, "approvals", "approve", obs.approval_id, "--digest", "0" * 64, token=APPROVER)
    assert wrong.returncode == 1 and "another call than the one you saw" in wrong.stderr, wrong.stderr
    [seen] = approver.list_approvals(run.run_id)
    ok = cli(server, "approvals", "approve", obs.approval_id, "--remember", "--digest", seen.digest, token=APPROVER)
    assert ok.returncode == 0, ok.stderr
    [again] = agent.submit_batch(run.run_id, [{**pay, "call_id": "pay-again"}])
    assert again.status is ObservationStatus.DEDUPLICATED and again.approval_id is None
