"""`ringfence submit|watch|approvals|runs|run|tools`: the command line for people, over gRPC.

These commands talk to a running `ringfence serve` (unlike `ringfence runs show|export|verify|
prune`, which read the event store directly, see control/store/cli.py):

    submit PLAN.yaml        start (or reuse) a run, execute a plan, follow its events live
    watch RUN_ID            follow a run's events until it finishes (a call's output live)
    files put|get RUN_ID    put local files into a run's workspace, get files (or artifacts) out
    approvals [approve|decline ID]   list pending approvals, decide one
    runs [list]             the runs this token's tenant can see
    run RUN_ID              one run: status, outcome, trajectory, pending approvals
    tools [QUERY]           the tools, their descriptions and JSON Schemas (`tools new|check`,
                            your own tools without a server, are control/toolpkg/cli.py's)

Common options: --server HOST:PORT (default $RINGFENCE_SERVER, else 127.0.0.1:50051), the bearer
token from an environment variable ($RINGFENCE_TOKEN, or the one --token-env names; never on
the command line), TLS (--tls-ca, --tls-cert/--tls-key for mTLS, --tls-server-name), --timeout,
--json (one JSON object per line on stdout; errors as one JSON object on stderr).

Exit codes: 0 done (for submit: the plan ran, whatever its calls' verdicts), 1 the server
answered with an error or could not be reached, 2 bad usage, a bad plan file, a missing token,
or a request the server refused as INVALID_ARGUMENT (each field violation on its own line).

This module lives in control/api/ because it is an edge: it speaks gRPC through
control.api.client (see tests/unit/test_architecture.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import io
import json
import math
import os
import posixpath
import re
import stat
import sys
import tarfile
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from control.model import ApprovalKind, ApprovalStatus, ObservationStatus
from control.state import AdmissionVerdict, EventType

if TYPE_CHECKING:  # loaded by the commands that need them: the CLI starts without grpc or yaml
    import yaml

    from control.api.client import RingfenceClient
    from control.model import PlanStep

DEFAULT_SERVER = "127.0.0.1:50051"
SERVER_ENV = "RINGFENCE_SERVER"
TOKEN_ENV = "RINGFENCE_TOKEN"
TLS_CA_ENV = "RINGFENCE_TLS_CA"
DEFAULT_TIMEOUT_S = 30.0

EXIT_OK = 0
EXIT_SERVER = 1
EXIT_USAGE = 2

PLAN_KEYS = ("goal", "run_id", "max_steps", "steps")
STEP_KEYS = ("key", "tool", "arguments")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")  # as the server's run ids and step keys
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What a transport failure (nothing answered, or not the protocol we speak) looks like in
# grpc's UNAVAILABLE details, as opposed to an UNAVAILABLE the server itself sent.
_TRANSPORT_MARKERS = (
    "failed to connect", "connection refused", "errors resolving", "dns resolution", "socket closed",
    "handshake", "connection reset", "broken pipe", "connections to all backends failing", "ssl",
    "tls", "end of tcp stream", "goaway",
)

_COMMON_EPILOG = """
defaults:
  the server is --server, else $RINGFENCE_SERVER, else 127.0.0.1:50051; the bearer token is
  read from $RINGFENCE_TOKEN (or the variable --token-env names), never from the command line.

exit codes: 0 done; 1 the server answered with an error or could not be reached;
  2 bad usage, a missing token, or a request the server refused as invalid.
"""


# --- errors ------------------------------------------------------------------------------------


class UsageError(Exception):
    """The command cannot be sent as given (exit 2); `details` are printed one per line."""

    def __init__(self, message: str, details: Sequence[str] = (), hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = tuple(details)
        self.hint = hint


class CommandFailed(Exception):
    """A failure this module diagnosed itself (exit 1 unless `code` says otherwise)."""

    def __init__(self, message: str, hint: str | None = None, code: int = EXIT_SERVER) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code


# --- the plan file -------------------------------------------------------------------------------


class PlanError(UsageError):
    pass


@dataclass(frozen=True)
class Plan:
    goal: str
    steps: tuple[PlanStep, ...]
    run_id: str | None = None
    max_steps: int | None = None


def _yaml_loader() -> type[yaml.SafeLoader]:
    """A safe YAML loader with the YAML 1.2 core schema's scalars and no duplicate keys.

    PyYAML's default (YAML 1.1) would turn `no` into False, `010` into 8, `1:20` into 80 and
    `2024-01-01` into a date: an approver would see a call other than the one the author wrote.
    Here only true/false are booleans, integers are decimal (or 0o / 0x), dates stay strings,
    merge keys are not special, and a key given twice is an error (two readers could disagree
    on which value counts). JSON is valid input too.
    """
    import yaml

    class PlanLoader(yaml.SafeLoader):
        yaml_implicit_resolvers: dict[Any, Any] = {}

    resolvers = [
        ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
        ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
        ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
        ("tag:yaml.org,2002:float",
         r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
         list("-+.0123456789")),
    ]
    for tag, pattern, first in resolvers:
        PlanLoader.add_implicit_resolver(tag, re.compile(pattern), first)

    def construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
        text = loader.construct_scalar(node)
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        if digits.startswith("0o"):
            return sign * int(digits[2:], 8)
        if digits.startswith("0x"):
            return sign * int(digits[2:], 16)
        return sign * int(digits, 10)

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _value in node.value:
                key = loader.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        None, None, "a mapping key must be a plain value", key_node.start_mark) from None
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark)
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    PlanLoader.add_constructor("tag:yaml.org,2002:int", construct_int)
    def construct_map(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Iterator[dict[Any, Any]]:
        return _mapping_from(loader, node, construct_mapping)

    PlanLoader.add_constructor("tag:yaml.org,2002:map", construct_map)
    return PlanLoader


def _mapping_from(loader: yaml.SafeLoader, node: yaml.MappingNode,
                  construct_mapping: Callable[[yaml.SafeLoader, yaml.MappingNode], dict[Any, Any]],
                  ) -> Iterator[dict[Any, Any]]:
    # As SafeConstructor.construct_yaml_map, with the duplicate check (a generator: anchors work).
    data: dict[Any, Any] = {}
    yield data
    data.update(construct_mapping(loader, node))


def _json_problems(value: Any, at: str) -> list[str]:
    """Why `value` is not plain JSON (what the server and the approver see), one line each."""
    problems: list[str] = []
    stack = [(value, at)]
    while stack:
        item, where = stack.pop()
        if item is None or isinstance(item, (bool, int, str)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                problems.append(f"{where}: {item} is not a JSON number")
            continue
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    problems.append(f"{where}: the key {key!r} must be a string (quote it)")
                stack.append((child, f"{where}.{key}"))
            continue
        if isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
            continue
        problems.append(f"{where}: a {type(item).__name__} is not JSON (quote it to send text)")
    return sorted(problems)


def load_plan(text: str, source: str = "the plan") -> Plan:
    """A plan from YAML (or JSON) text; PlanError lists every problem at once."""
    import yaml

    from control.model import PlanStep

    try:
        doc = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise PlanError(f"{source} is not valid YAML{where}: {e.problem or e.context}") from None
    except (yaml.YAMLError, ValueError) as e:
        raise PlanError(f"{source} is not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        kind = "empty" if doc is None else f"a {type(doc).__name__}"
        raise PlanError(f"{source} is not a plan",
                        [f"the file is {kind}; a plan is a mapping with goal and steps (and optionally "
                         "run_id, max_steps)"])
    problems: list[str] = []
    for key in doc:
        if key not in PLAN_KEYS:
            problems.append(f"{key}: unknown key (a plan has: {', '.join(PLAN_KEYS)})")
    goal = doc.get("goal")
    if "goal" not in doc:
        problems.append("goal: missing (what the run is for, in a sentence)")
    elif not isinstance(goal, str) or not goal.strip():
        problems.append("goal: must be non-empty text")
    run_id = doc.get("run_id")
    if run_id is not None and (not isinstance(run_id, str) or not _ID.fullmatch(run_id)):
        problems.append("run_id: 1-100 characters of [A-Za-z0-9_.:-], starting with a letter or digit")
    max_steps = doc.get("max_steps")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        problems.append("max_steps: must be a positive integer")
    steps: list[PlanStep] = []
    raw_steps = doc.get("steps")
    if "steps" not in doc or raw_steps is None:
        problems.append("steps: missing (a plan needs at least one step: {key, tool, arguments})")
    elif not isinstance(raw_steps, list):
        problems.append(f"steps: must be a list of steps, not a {type(raw_steps).__name__}")
    elif not raw_steps:
        problems.append("steps: empty (a plan needs at least one step)")
    else:
        seen: set[str] = set()
        for i, step in enumerate(raw_steps):
            at = f"steps[{i}]"
            if not isinstance(step, dict):
                problems.append(f"{at}: must be a mapping with key, tool and arguments")
                continue
            for key in step:
                if key not in STEP_KEYS:
                    problems.append(f"{at}: unknown key {key!r} (a step has: {', '.join(STEP_KEYS)})")
            key, tool, arguments = step.get("key"), step.get("tool"), step.get("arguments", {})
            if "key" not in step:
                problems.append(f"{at}.key: missing (the step's name; it becomes the call id)")
            elif not isinstance(key, str) or not _ID.fullmatch(key):
                problems.append(f"{at}.key: 1-100 characters of [A-Za-z0-9_.:-]")
            elif key in seen:
                problems.append(f"{at}.key: duplicate key {key!r}")
            else:
                seen.add(key)
            if "tool" not in step:
                problems.append(f"{at}.tool: missing (a tool name: see `ringfence tools`)")
            elif not isinstance(tool, str) or not tool:
                problems.append(f"{at}.tool: must be a tool name")
            if arguments is None:
                arguments = {}
            if not isinstance(arguments, dict):
                problems.append(f"{at}.arguments: must be a mapping, not a {type(arguments).__name__}")
            else:
                problems.extend(_json_problems(arguments, f"{at}.arguments"))
            # No problem at this step means key and tool were checked to be text.
            if not any(p.startswith(at) for p in problems) and isinstance(key, str) and isinstance(tool, str):
                steps.append(PlanStep(key, tool, arguments))
    if isinstance(max_steps, int) and not isinstance(max_steps, bool) and len(steps) > max_steps > 0:
        problems.append(f"steps: {len(steps)} steps is over max_steps {max_steps}")
    if problems:
        raise PlanError(f"{source} is not a valid plan", problems)
    assert isinstance(goal, str)  # checked above: a plan without problems has a text goal
    return Plan(goal=goal, steps=tuple(steps), run_id=run_id, max_steps=max_steps)


def read_plan(path: str) -> Plan:
    if path == "-":
        text, source = sys.stdin.read(), "the plan on stdin"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PlanError(f"there is no plan file {path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise PlanError(f"cannot read the plan file {path}: {e}") from None
        source = path
    return load_plan(text, source)


# --- output --------------------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """The model's frozen values as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def compact(value: Any) -> str:
    return json.dumps(jsonable(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def short(value: Any, limit: int = 90) -> str:
    text = value if isinstance(value, str) else compact(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Output:
    """Human lines or JSON lines on stdout, flushed at once (a pipe sees events as they come)."""

    def __init__(self, json_mode: bool) -> None:
        self.json = json_mode

    def line(self, text: str = "") -> None:
        if not self.json:
            print(text, flush=True)

    def obj(self, value: Mapping[str, Any]) -> None:
        if self.json:
            print(json.dumps(jsonable(value), sort_keys=False, ensure_ascii=False, default=str), flush=True)

    def error(self, message: str, details: Iterable[str] = (), hint: str | None = None,
              code: str | None = None) -> None:
        details = list(details)
        if self.json:
            doc = {"error": {"code": code, "message": message, "details": details, "hint": hint}}
            print(json.dumps(doc, ensure_ascii=False), file=sys.stderr, flush=True)
            return
        print(f"error: {message}", file=sys.stderr)
        for d in details:
            print(f"  {d}", file=sys.stderr)
        if hint:
            print(hint, file=sys.stderr)
        sys.stderr.flush()


def event_detail(event: Any) -> str:
    d, t = event.data, event.type
    if t == EventType.RUN_STARTED:
        return f"goal: {short(d.get('goal', ''), 70)}"
    if t == EventType.BATCH_STARTED:
        calls = d.get("calls") or []
        tools = ", ".join(str(c.get("tool")) for c in calls[:6]) + (", ..." if len(calls) > 6 else "")
        return f"turn {d.get('turn')}: {len(calls)} call{'s' if len(calls) != 1 else ''} ({tools})"
    if t == EventType.CALL_DECIDED:
        verdict, reason = d.get("verdict"), d.get("reason") or ""
        because = f" - {short(reason, 70)}" if reason and verdict != AdmissionVerdict.ALLOW else ""
        return f"{d.get('tool')}: {verdict}{because}"
    if t == EventType.APPROVAL_REQUESTED:
        kind = " (reconcile)" if d.get("kind") == ApprovalKind.RECONCILE else ""
        return f"{d.get('tool')} waits for approval {d.get('approval_id')}{kind}, digest {str(d.get('digest'))[:16]}..."
    if t == EventType.APPROVAL_DECIDED:
        word = "approved" if d.get("approved") else "declined"
        reason = d.get("reason") or ""
        return f"{d.get('approval_id')} {word} by {d.get('by')}" + (f": {short(reason, 50)}" if reason else "")
    if t == EventType.APPROVAL_EXPIRED:
        return f"{d.get('approval_id')} expired"
    if t == EventType.APPROVAL_USED:
        return f"{d.get('approval_id')} used"
    if t == EventType.GRANT_ADDED:
        return f"grant for {d.get('tool')} by {d.get('by')}"
    if t == EventType.DISPATCH_STARTED:
        return f"{d.get('tool')} dispatched" + (" (mutates)" if d.get("mutates") else "")
    if t == EventType.ATTEMPT:
        text = f"attempt {d.get('attempt')}: {d.get('outcome')}"
        if d.get("failure_class"):
            text += f" ({d.get('failure_class')})"
        if d.get("message"):
            text += f" {short(d.get('message'), 50)}"
        return text
    if t == EventType.EGRESS:
        decisions = d.get("decisions") or []
        return f"{len(decisions)} egress decision{'s' if len(decisions) != 1 else ''}"
    if t == EventType.CALL_COMPLETED:
        if d.get("ok"):
            return f"{d.get('tool')} ok: {short(d.get('content'), 60)}"
        return f"{d.get('tool')} failed ({d.get('error_class')}): {short(d.get('error') or '', 60)}"
    if t == EventType.OBSERVATION:
        text = f"{d.get('tool')}: {d.get('status')}"
        if d.get("error"):
            text += f" - {short(d.get('error'), 60)}"
        elif d.get("content") is not None:
            text += f" {short(d.get('content'), 60)}"
        return text
    if t == EventType.RUN_FINISHED:
        reason = d.get("reason") or ""
        return f"outcome {d.get('outcome')}" + (f": {short(reason, 60)}" if reason else "")
    if t == EventType.WORKSPACE_CREATED:
        return f"workspace {d.get('volume')}: {d.get('bytes')} bytes, {d.get('inodes')} inodes"
    if t == EventType.WORKSPACE_REMOVED:
        return f"workspace {d.get('volume')} removed ({d.get('reason')})"
    if t in (EventType.FILES_UPLOADED, EventType.FILES_DOWNLOADED, EventType.ARTIFACT_COLLECTED):
        files = d.get("files") or []
        size = sum(int(f.get("size") or 0) for f in files)
        names = ", ".join(str(f.get("path")) for f in files[:4]) + (", ..." if len(files) > 4 else "")
        text = f"{len(files)} file{'s' if len(files) != 1 else ''}, {size} bytes ({names})"
        if t == EventType.FILES_UPLOADED:
            return f"{text} into /workspace/{d.get('dest') or ''} by {d.get('by')}"
        if t == EventType.FILES_DOWNLOADED:
            return f"{text}{' (artifacts)' if d.get('artifacts') else ''} by {d.get('by')}"
        missing = d.get("missing") or []
        return text + (f"; missing: {', '.join(map(str, missing[:4]))}" if missing else "")
    return short(d)


def event_line(event: Any, progress: str = "") -> str:
    call = event.data.get("call_id") or "-"
    return f"{event.seq:>5}  {event.type:<18} {call:<12} {event_detail(event)}{progress}"


def _terminal_safe(line: str) -> str:
    # A tool's output is untrusted text: no escape sequence of it reaches the person's terminal.
    return "".join(ch if ch == "\t" or ch.isprintable() else f"\\x{ord(ch):02x}" for ch in line)


def output_lines(event: Any) -> list[str]:
    """A `call_output` event as the lines it holds, each prefixed by the call id and the stream
    (what the tool printed, as it printed it, after the server's secret redaction). The first
    line is the event's own line (seq, type); the others are aligned under it."""
    d = event.data
    call = str(d.get("call_id") or "-")
    tag = f"{call:<12} {d.get('stream')}| "
    head = f"{event.seq:>5}  {event.type:<18} {tag}"
    pad = " " * (5 + 2 + 18 + 1) + tag
    lines = str(d.get("text") or "").splitlines() or [""]
    return [(head if i == 0 else pad) + _terminal_safe(line) for i, line in enumerate(lines)]


def print_event(out: Output, event: Any, progress: str = "") -> None:
    if out.json:
        out.obj(event_obj(event))
    elif event.type == EventType.CALL_OUTPUT:
        for line in output_lines(event):
            out.line(line)
    else:
        out.line(event_line(event, progress))


def event_obj(event: Any) -> dict[str, Any]:
    return {"kind": "event", "run_id": event.run_id, "seq": event.seq, "type": event.type,
            "call_id": event.data.get("call_id"), "at": event.at, "data": jsonable(event.data)}


def observation_line(o: Any) -> str:
    if o.error:
        what = short(o.error, 70)
    elif o.content is not None:
        what = short(o.content, 70)
    else:
        what = ""
    if o.approval_id and o.status == ObservationStatus.PENDING_APPROVAL:
        what = f"approval {o.approval_id}"
    return f"  {o.call_id:<12} {o.tool:<12} {o.status:<17} {what}".rstrip()


def run_summary(run: Any) -> str:
    outcome = run.outcome if run.outcome else "none yet"
    u = run.usage
    return (f"run {run.run_id}: status {run.status}, outcome {outcome} "
            f"(turns {run.turns}, calls {u.calls}, cost {u.cost:g})")


def print_run(out: Output, run: Any) -> None:
    out.line(run_summary(run))
    out.line(f"goal: {run.goal}")
    if run.trajectory:
        out.line("trajectory:")
        for o in run.trajectory:
            out.line(observation_line(o))
    else:
        out.line("trajectory: (no calls yet)")
    if run.pending_approvals:
        out.line("pending approvals:")
        for a in run.pending_approvals:
            out.line(f"  {a.approval_id}  call {a.call_id}  {a.tool} {compact(a.arguments)}")


def _ago(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


# --- connection ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    server: str
    token_env: str
    token: str
    tls: bool
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    tls_server_name: str | None
    timeout: float
    json: bool


def _opt(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def settings_from(args: argparse.Namespace) -> Settings:
    server = _opt(args, "server") or os.environ.get(SERVER_ENV) or DEFAULT_SERVER
    if ":" not in server or server.startswith("-"):
        raise UsageError(f"--server wants HOST:PORT, e.g. 127.0.0.1:50051, not {server!r}")
    token_env = _opt(args, "token_env") or TOKEN_ENV
    if not _ENV_NAME.fullmatch(token_env):
        # Not echoed: someone may have put the token itself here.
        raise UsageError("--token-env takes the NAME of an environment variable that holds the token "
                         "(e.g. --token-env MY_TOKEN), never the token itself")
    token = os.environ.get(token_env, "")
    if not token.strip():
        state = "is empty" if token_env in os.environ else "is not set"
        raise UsageError(
            f"no token: {token_env} {state}",
            hint=(f"set {token_env} to your bearer token (export {token_env}=...), or name another "
                  "variable with --token-env NAME. A `ringfence serve` on the embedded defaults accepts "
                  "the public dev tokens demo-agent-token and demo-approver-token."))
    tls_ca = _opt(args, "tls_ca") or os.environ.get(TLS_CA_ENV) or None
    tls_cert, tls_key = _opt(args, "tls_cert"), _opt(args, "tls_key")
    if bool(tls_cert) != bool(tls_key):
        raise UsageError("--tls-cert and --tls-key go together (the client certificate for mTLS)")
    for flag, path in (("--tls-ca", tls_ca), ("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path and not Path(path).is_file():
            raise UsageError(f"{flag}: there is no file {path}")
    tls = bool(_opt(args, "tls") or tls_ca or tls_cert)
    timeout = _opt(args, "timeout", DEFAULT_TIMEOUT_S)
    if not timeout > 0:
        raise UsageError("--timeout wants a number of seconds above 0")
    return Settings(server=server, token_env=token_env, token=token.strip(), tls=tls, tls_ca=tls_ca,
                    tls_cert=tls_cert, tls_key=tls_key, tls_server_name=_opt(args, "tls_server_name"),
                    timeout=float(timeout), json=bool(_opt(args, "json")))


def connect(s: Settings) -> RingfenceClient:
    import grpc

    from control.api.client import RingfenceClient

    credentials = None
    options: list[tuple[str, Any]] = []
    if s.tls:
        kwargs: dict[str, Any] = {}
        if s.tls_ca:
            kwargs["root_certificates"] = Path(s.tls_ca).read_bytes()
        if s.tls_cert:
            kwargs["certificate_chain"] = Path(s.tls_cert).read_bytes()
            assert s.tls_key is not None  # settings() refuses a certificate without its key
            kwargs["private_key"] = Path(s.tls_key).read_bytes()
        credentials = grpc.ssl_channel_credentials(**kwargs)
        if s.tls_server_name:
            options.append(("grpc.ssl_target_name_override", s.tls_server_name))
    return RingfenceClient(s.server, s.token, credentials=credentials, timeout=s.timeout, options=options)


def _transport_failure(message: str) -> bool:
    low = message.lower()
    return any(marker in low for marker in _TRANSPORT_MARKERS)


def report_failure(out: Output, error: BaseException, s: Settings | None, command: str) -> int:
    """Say what went wrong and what to do; return the exit code."""
    import grpc

    from control import errors as E

    server = s.server if s else "the server"
    token_env = s.token_env if s else TOKEN_ENV
    if isinstance(error, E.InvalidArgument):
        details = [f"{v.field}: {v.description}" for v in error.violations]
        out.error(f"the server refused the request: {error.message}", details, code="INVALID_ARGUMENT",
                  hint=None if details else "check the command's arguments (--help)")
        return EXIT_USAGE
    if isinstance(error, E.Unauthenticated):
        out.error(f"the server at {server} did not accept the token in {token_env}: {error.message}",
                  code="UNAUTHENTICATED",
                  hint=f"set {token_env} to a bearer token that server's config lists "
                       "(or pick the variable with --token-env NAME)")
        return EXIT_SERVER
    if isinstance(error, E.PermissionDenied):
        role_hint = {
            "approvals": "deciding and listing approvals needs an approver (or admin) token",
            "submit": "starting runs and executing plans needs an agent (or admin) token",
            "files": "moving files in and out of a run needs an agent (or admin) token",
        }.get(command, "use a token with the role this command needs")
        out.error(f"permission denied: {error.message}", code="PERMISSION_DENIED",
                  hint=f"{role_hint}: set {token_env} to one")
        return EXIT_SERVER
    if isinstance(error, E.Unavailable):
        if _transport_failure(error.message):
            tls_hint = ("if it serves plaintext, drop --tls/--tls-ca; otherwise check --tls-ca and --tls-server-name"
                        if s is not None and s.tls else "if it serves TLS, pass --tls-ca CA.pem")
            out.error(f"cannot reach a ringfence server at {server}: {error.message}", code="UNAVAILABLE",
                      hint=f"is `ringfence serve` running on {server}? Choose the address with --server "
                           f"HOST:PORT or {SERVER_ENV}; {tls_hint}.")
        else:
            out.error(f"the server is unavailable: {error.message}", code="UNAVAILABLE",
                      hint="try again in a moment")
        return EXIT_SERVER
    if isinstance(error, E.NotFound):
        out.error(error.message, code="NOT_FOUND",
                  hint="ids are per tenant: `ringfence runs` lists this token's runs, `ringfence approvals` "
                       "its pending approvals")
        return EXIT_SERVER
    if isinstance(error, E.FailedPrecondition):
        hint = None
        if command == "submit" and "is finished" in error.message:
            hint = ("a finished run takes no more calls: submit without --run-id (and without run_id in the plan) "
                    "for a new run")
        out.error(error.message, code="FAILED_PRECONDITION", hint=hint)
        return EXIT_SERVER
    if isinstance(error, E.ResourceExhausted):
        out.error(error.message, code="RESOURCE_EXHAUSTED", hint="the tenant is at a limit: try again later")
        return EXIT_SERVER
    if isinstance(error, E.Internal):
        out.error(error.message, code="INTERNAL",
                  hint="a server fault, not your request: retrying will not help; report the incident id")
        return EXIT_SERVER
    if isinstance(error, E.ControlError):
        out.error(error.message, code=type(error).__name__)
        return EXIT_SERVER
    if isinstance(error, grpc.RpcError):
        code = error.code() if hasattr(error, "code") else None
        text = error.details() if hasattr(error, "details") else str(error)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            out.error(f"no answer from {server} within {s.timeout if s else DEFAULT_TIMEOUT_S:g}s",
                      code="DEADLINE_EXCEEDED", hint="raise --timeout, or check that the server is not stuck")
        else:
            name = code.name if code is not None else "UNKNOWN"
            out.error(f"{name}: {text}", code=name)
        return EXIT_SERVER
    raise error


Action = Callable[[argparse.Namespace, Settings, Output], int]
"""A command's body: (its arguments, connection settings, where to print) -> exit code."""
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _guarded(command: str, action: Action) -> Callable[[argparse.Namespace], int]:
    """The command's func: settings, client errors and exit codes in one place."""

    def run(args: argparse.Namespace) -> int:
        import grpc

        from control.errors import ControlError

        out = Output(bool(_opt(args, "json")))
        settings = None
        try:
            settings = settings_from(args)
            return int(action(args, settings, out) or EXIT_OK)
        except UsageError as e:
            out.error(e.message, e.details, e.hint, code="USAGE")
            return EXIT_USAGE
        except CommandFailed as e:
            out.error(e.message, hint=e.hint, code="FAILED")
            return e.code
        except (ControlError, grpc.RpcError) as e:
            return report_failure(out, e, settings, command)
        except BrokenPipeError:
            # The reader went away (`| head`): stop quietly.
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            except OSError:
                pass
            return EXIT_OK

    return run


# --- the commands --------------------------------------------------------------------------------


def precheck(plan: Plan, tools: Sequence[Any]) -> list[str]:
    """Unknown tools and arguments that break a tool's JSON Schema, validated as the server does
    (Draft 2020-12 with format checks), one line per problem."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    by_name = {t.name: t for t in tools}
    problems: list[str] = []
    for i, step in enumerate(plan.steps):
        tool = by_name.get(step.tool)
        if tool is None:
            problems.append(f"steps[{i}].tool: unknown tool {step.tool!r} (`ringfence tools` lists them: "
                            f"{', '.join(sorted(by_name))})")
            continue
        try:
            validator = Draft202012Validator(jsonable(tool.schema), format_checker=Draft202012Validator.FORMAT_CHECKER)
            errors = sorted(validator.iter_errors(jsonable(step.arguments)),
                            key=lambda e: (list(map(str, e.absolute_path)), e.message))
        except SchemaError:
            continue  # the server's to judge
        for e in errors:
            where = f"steps[{i}].arguments" + "".join(
                f"[{part}]" if isinstance(part, int) else f".{part}" for part in e.absolute_path)
            problems.append(f"{where}: {e.message[:500]}")
    return problems


def cmd_submit(args: argparse.Namespace, s: Settings, out: Output) -> int:
    from control.errors import InvalidArgument, NotFound

    plan = read_plan(args.plan)
    with connect(s) as client:
        # Checked against the tools the server publishes before a run is started, so that a
        # plan with a typo does not leave an empty run behind; the server checks it again
        # (and alone decides) when it executes the plan.
        problems = precheck(plan, client.list_tools())
        if problems:
            raise PlanError(f"{args.plan} does not fit this server's tools (nothing was started)", problems)
        run_id = args.run_id or plan.run_id
        reused = False
        if run_id:
            try:
                client.get_run(run_id)
                reused = True
            except NotFound:
                pass
        run = client.start_run(plan.goal, run_id)
        if out.json:
            out.obj({"kind": "run", "run_id": run.run_id, "status": run.status, "reused": reused})
        else:
            out.line(f"run {run.run_id}  ({'reused' if reused else 'started'}; goal: {short(run.goal, 70)})")
            if reused and run.goal != plan.goal:
                print(f"note: run {run.run_id} already existed with another goal; the plan runs in it",
                      file=sys.stderr, flush=True)
        total = len(plan.steps)
        settled = 0
        last_seq = 0
        stream = client.execute_plan(run.run_id, plan.steps, plan.max_steps)
        try:
            for event in stream:
                last_seq = event.seq
                progress = ""
                if event.type == EventType.OBSERVATION:
                    settled += 1
                    progress = f"  [{settled}/{total}]"
                print_event(out, event, progress)
        except KeyboardInterrupt:
            stream.cancel()
            print(f"\nstopped following; the plan goes on on the server: ringfence watch {run.run_id} "
                  f"--from {last_seq + 1}", file=sys.stderr, flush=True)
            return 130
        except InvalidArgument as e:
            code = report_failure(out, e, s, "submit")
            if not out.json:
                print(f"nothing ran; run {run.run_id} is open: fix the plan and submit it again with "
                      f"--run-id {run.run_id}", file=sys.stderr, flush=True)
            return code
        if args.finish:
            view = client.get_run(run.run_id)
            if view.pending_approvals:
                print(f"note: not finishing run {run.run_id}: {len(view.pending_approvals)} approval(s) pending",
                      file=sys.stderr, flush=True)
            elif view.status != "finished":
                client.finish_run(run.run_id)
        view = client.get_run(run.run_id)
    if out.json:
        out.obj({"kind": "outcome", "run": view})
        return EXIT_OK
    out.line()
    print_run(out, view)
    if view.pending_approvals:
        first = view.pending_approvals[0].approval_id
        n = len(view.pending_approvals)
        out.line(f"{n} call{'s' if n != 1 else ''} wait{'s' if n == 1 else ''} for approval: an approver runs "
                 f"`ringfence approvals approve {first}` (or decline); follow with "
                 f"`ringfence watch {view.run_id} --from {last_seq + 1}`")
    return EXIT_OK


def cmd_watch(args: argparse.Namespace, s: Settings, out: Output) -> int:
    if args.from_seq < 0:
        raise UsageError("--from takes a sequence number: 1 is the run's first event")
    finished = None
    last_seq = args.from_seq - 1
    with connect(s) as client:
        stream = client.watch_run(args.run_id, args.from_seq)
        try:
            for event in stream:
                last_seq = event.seq
                print_event(out, event)
                if event.type == EventType.RUN_FINISHED:
                    finished = event
        except KeyboardInterrupt:
            stream.cancel()
            print(f"\nstopped watching; resume with: ringfence watch {args.run_id} --from {last_seq + 1}",
                  file=sys.stderr, flush=True)
            return 130
    if finished is None:
        raise CommandFailed(f"the server ended the stream before run {args.run_id} finished "
                            f"(it may be shutting down)",
                            hint=f"resume with: ringfence watch {args.run_id} --from {last_seq + 1}")
    out.line(f"run {args.run_id} finished: {finished.data.get('outcome')}"
             + (f" ({finished.data.get('reason')})" if finished.data.get("reason") else ""))
    return EXIT_OK


# --- files -------------------------------------------------------------------------------------

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def pack_local(paths: Sequence[str]) -> tuple[bytes, int]:
    """An uncompressed tar of local files and directories (each under its own name, a
    directory with everything in it), and how many files it holds. Regular files and
    directories only: a link is refused here (it would be refused by the server too), and
    nothing is ever read through one."""
    buf = io.BytesIO()
    names: set[str] = set()
    count = 0

    def add(local: str, arcname: str, tar: tarfile.TarFile) -> None:
        nonlocal count
        try:
            st = os.lstat(local)
        except FileNotFoundError:
            raise UsageError(f"there is no file or directory {local}") from None
        except OSError as e:
            raise UsageError(f"cannot read {local}: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise UsageError(f"{local} is a symbolic link (to {os.readlink(local)!r}): links are never sent",
                             hint="name the file it points to, or copy it in place of the link")
        info = tarfile.TarInfo(arcname)
        info.mtime = 0
        if stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
            with os.scandir(local) as entries:
                children = sorted(entries, key=lambda e: e.name)
            for child in children:
                add(child.path, f"{arcname}/{child.name}", tar)
            return
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{local} is not a regular file or a directory: only those are sent")
        try:
            fd = os.open(local, _READ_FLAGS)
        except OSError as e:
            raise UsageError(f"cannot open {local} without following links: {e.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            now = os.fstat(f.fileno())
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise UsageError(f"{local} changed while it was being read")
            data = f.read()
        info.size = len(data)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(data))
        count += 1

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for given in paths:
            name = os.path.basename(os.path.normpath(os.path.abspath(given)))
            if not name:
                raise UsageError(f"{given} has no name to put in the workspace (name a directory inside it)")
            if name in names:
                raise UsageError(f"two LOCAL_PATHs are both named {name!r} in the workspace",
                                 hint="put them with two commands, each with its own --to DIR")
            names.add(name)
            add(given, name, tar)
    return buf.getvalue(), count


def _workspace_dir(text: str) -> str:
    """--to DIR as the server takes it: relative to /workspace, normalized ("" = the workspace)."""
    from control.workspace_paths import path_problem

    dest = posixpath.normpath(text.strip()) if text.strip() else ""
    dest = "" if dest == "." else dest
    problem = path_problem(dest, allow_root=True)
    if problem is not None:
        raise UsageError(f"--to {text!r} {problem}", hint="a directory relative to /workspace, e.g. --to src/pkg")
    return dest


def write_files(root: Path, files: Mapping[str, bytes]) -> None:
    """Each file under `root` (created if missing), never outside it and never through a link:
    every directory is opened relative to its parent with O_NOFOLLOW|O_DIRECTORY, every file
    created with O_CREAT|O_EXCL|O_NOFOLLOW (nothing existing is overwritten)."""
    from control.workspace_paths import path_problem

    for path in files:
        problem = path_problem(path)
        if problem is not None:  # the SDK refused it already; checked again where it is written
            raise CommandFailed(f"refusing to write {path!r}: it {problem}")
    existing = [p for p in files if os.path.lexists(root / p)]
    if existing:
        raise CommandFailed(f"{len(existing)} file(s) already exist under {root}: {', '.join(existing[:5])}; "
                            "nothing was written", hint="choose another --out DIR (nothing is ever overwritten)")
    root.mkdir(parents=True, exist_ok=True)
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # --out itself: the user's choice
    try:
        for path, data in sorted(files.items()):
            parts = path.split("/")
            fds: list[int] = []
            try:
                fd = root_fd
                for part in parts[:-1]:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                    fd = os.open(part, _DIR_FLAGS, dir_fd=fd)  # a link or a file here: ELOOP/ENOTDIR
                    fds.append(fd)
                out_fd = os.open(parts[-1], _NEW_FILE_FLAGS, 0o644, dir_fd=fd)
                with os.fdopen(out_fd, "wb") as f:
                    f.write(data)
            except OSError as e:
                raise CommandFailed(f"cannot write {root / path} safely: {e.strerror}",
                                    hint="nothing is written through a link or over an existing file") from None
            finally:
                for opened in fds:
                    os.close(opened)
    finally:
        os.close(root_fd)


def cmd_files_put(args: argparse.Namespace, s: Settings, out: Output) -> int:
    dest = _workspace_dir(args.to or "")
    archive, count = pack_local(args.local)
    with connect(s) as client:
        result = client.upload_tar(args.run_id, archive, dest)
    if out.json:
        out.obj({"kind": "uploaded", "run_id": args.run_id, "dest": dest, "seq": result.seq,
                 "files": [jsonable(f) for f in result.files]})
        return EXIT_OK
    for f in result.files:
        out.line(f"{f.size:>10}  {f.sha256[:16]}  /workspace/{f.path}")
    total = sum(f.size for f in result.files)
    out.line(f"put {len(result.files)} file{'s' if len(result.files) != 1 else ''} ({total} bytes) into run "
             f"{args.run_id}'s /workspace/{dest} (event {result.seq})")
    return EXIT_OK


def cmd_files_get(args: argparse.Namespace, s: Settings, out: Output) -> int:
    root = Path(args.out or ".")
    with connect(s) as client:
        got = client.download_files(args.run_id, args.paths, artifacts=bool(args.artifacts))
    write_files(root, got)
    if out.json:
        for path, data in sorted(got.items()):
            out.obj({"kind": "file", "path": path, "size": len(data), "written": str(root / path)})
        for path, why in sorted(got.skipped.items()):
            out.obj({"kind": "skipped", "path": path, "why": why})
        return EXIT_OK
    for path, data in sorted(got.items()):
        out.line(f"{len(data):>10}  {root / path}")
    for path, why in sorted(got.skipped.items()):
        print(f"skipped {path}: {why}", file=sys.stderr, flush=True)
    what = "artifact" if args.artifacts else "file"
    out.line(f"got {len(got)} {what}{'s' if len(got) != 1 else ''} of run {args.run_id} into {root}"
             + (f"; {len(got.skipped)} skipped" if got.skipped else ""))
    return EXIT_OK


def cmd_approvals_list(args: argparse.Namespace, s: Settings, out: Output) -> int:
    with connect(s) as client:
        approvals = client.list_approvals(_opt(args, "run"))
    if not _opt(args, "all"):
        approvals = [a for a in approvals if a.status == ApprovalStatus.PENDING]
    if out.json:
        for a in approvals:
            out.obj(jsonable(a))
        return EXIT_OK
    if not approvals:
        out.line("no pending approvals" if not _opt(args, "all") else "no approvals")
        return EXIT_OK
    now = time.time()
    for a in approvals:
        kind = "  RECONCILE: approve = it did not happen, run it once" if a.kind == ApprovalKind.RECONCILE else ""
        state = f"expires in {_ago(a.expires_at - now)}" if a.status == ApprovalStatus.PENDING else f"{a.status}"
        if a.decided_by:
            state += f" by {a.decided_by}" + (f": {a.reason}" if a.reason else "")
        out.line(f"{a.approval_id}  run {a.run_id}  call {a.call_id}  tool {a.tool}  {state}{kind}")
        out.line(f"  arguments {compact(a.arguments)}")
        out.line(f"  digest    {a.digest}")
    n = len(approvals)
    out.line(f"{n} approval{'s' if n != 1 else ''}; decide with `ringfence approvals approve|decline ID "
             "[--reason TEXT]`")
    return EXIT_OK


def _decide(approve: bool) -> Action:
    def action(args: argparse.Namespace, s: Settings, out: Output) -> int:
        with connect(s) as client:
            decided = client.decide_approval(args.approval_id, approve, args.reason or "",
                                             remember=bool(getattr(args, "remember", False)),
                                             digest=getattr(args, "digest", None) or None)
            observation = None
            try:
                view = client.get_run(decided.run_id)
                observation = next((o for o in view.trajectory if o.call_id == decided.call_id), None)
            except Exception:  # noqa: BLE001 - the decision stands; the follow-up is only a courtesy
                observation = None
        if out.json:
            out.obj({**jsonable(decided), "observation": jsonable(observation)})
            return EXIT_OK
        word = "approved" if approve else "declined"
        out.line(f"{word} {decided.approval_id}: {decided.tool} {compact(decided.arguments)} "
                 f"(run {decided.run_id}, call {decided.call_id}) by {decided.decided_by}")
        out.line(f"  digest {decided.digest}")
        if observation is not None:
            out.line(f"the call is now: {observation.status}"
                     + (f" - {short(observation.error, 70)}" if observation.error else "")
                     + (f" {short(observation.content, 70)}" if observation.content is not None else ""))
        return EXIT_OK

    return action


def cmd_runs_list(args: argparse.Namespace, s: Settings, out: Output) -> int:
    with connect(s) as client:
        runs = client.list_runs()
    if out.json:
        for r in runs:
            out.obj(jsonable(r))
        return EXIT_OK
    if not runs:
        out.line("no runs")
        return EXIT_OK
    out.line(f"{'RUN':<28} {'STATUS':<17} {'OUTCOME':<18} {'TURNS':>5} {'CALLS':>5} {'PENDING':>7}  GOAL")
    for r in runs:
        out.line(f"{r.run_id:<28} {r.status:<17} {(r.outcome or '-'):<18} {r.turns:>5} {r.usage.calls:>5} "
                 f"{len(r.pending_approvals):>7}  {short(r.goal, 50)}")
    return EXIT_OK


def cmd_run_show(args: argparse.Namespace, s: Settings, out: Output) -> int:
    with connect(s) as client:
        if args.finish:
            view = client.finish_run(args.run_id)
        elif args.cancel:
            view = client.cancel_run(args.run_id)
        else:
            view = client.get_run(args.run_id)
    if out.json:
        out.obj(jsonable(view))
    else:
        print_run(out, view)
    return EXIT_OK


def cmd_tools(args: argparse.Namespace, s: Settings, out: Output) -> int:
    with connect(s) as client:
        tools = client.list_tools(args.query or "")
    if out.json:
        for t in tools:
            out.obj(jsonable(t))
        return EXIT_OK
    for i, t in enumerate(tools):
        if i:
            out.line()
        out.line(f"{t.name}: {t.description}")
        schema = json.dumps(jsonable(t.schema), indent=2, ensure_ascii=False)
        out.line("  schema: " + schema.replace("\n", "\n  "))
    return EXIT_OK


# --- registration --------------------------------------------------------------------------------

_CONN_DESTS = ("server", "token_env", "tls", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "timeout", "json")


def _connection_options() -> argparse.ArgumentParser:
    """The common options. Defaults are SUPPRESSed so that an option given at `approvals` or
    `runs` level is not reset by the same option's default at the action's level; the real
    defaults (environment, then built-in) are applied in settings_from."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("connection")
    S = argparse.SUPPRESS
    g.add_argument("--server", metavar="HOST:PORT", default=S,
                   help=f"the ringfence server (default: ${SERVER_ENV}, else {DEFAULT_SERVER})")
    g.add_argument("--token-env", metavar="NAME", default=S,
                   help=f"environment variable holding the bearer token (default {TOKEN_ENV}); "
                        "the token is never taken from the command line")
    g.add_argument("--tls", action="store_true", default=S, help="use TLS with the system's CA roots")
    g.add_argument("--tls-ca", metavar="CA.pem", default=S,
                   help=f"use TLS, trusting this PEM CA (default: ${TLS_CA_ENV} if set)")
    g.add_argument("--tls-cert", metavar="CERT.pem", default=S, help="client certificate for mTLS (with --tls-key)")
    g.add_argument("--tls-key", metavar="KEY.pem", default=S, help="client private key for mTLS")
    g.add_argument("--tls-server-name", metavar="NAME", default=S,
                   help="the name to check the server's certificate against (when it differs from HOST)")
    g.add_argument("--timeout", metavar="SECONDS", type=float, default=S,
                   help=f"per request, not for followed streams (default {DEFAULT_TIMEOUT_S:g})")
    g.add_argument("--json", action="store_true", default=S,
                   help="machine-readable output: one JSON object per line (errors: one on stderr)")
    return common


def _wrap(text: str) -> str:
    """Paragraphs wrapped to 88 columns; indented blocks (examples) kept as they are."""
    out = []
    for para in text.split("\n\n"):
        out.append(para if para.startswith(" ") else textwrap.fill(" ".join(para.split()), 88))
    return "\n\n".join(out)


def _parser(sub: SubParsers, name: str, common: argparse.ArgumentParser, *, help: str, description: str,
            examples: str, **kw: Any) -> argparse.ArgumentParser:
    return sub.add_parser(
        name, parents=[common], help=help, description=_wrap(description), allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n" + examples.rstrip() + "\n" + _COMMON_EPILOG, **kw)


def register(subparsers: SubParsers) -> None:
    common = _connection_options()

    p = _parser(
        subparsers, "submit", common, help="start a run, execute a plan file and follow it live (gRPC)",
        description=(
            "Start a run (or reuse run_id), execute PLAN as one batch (ExecutePlan: every step is "
            "admitted or refused before any runs) and print each event as it happens: seq, type, "
            "call id, detail. The run id is printed first; the run's status, outcome and trajectory "
            "last. Exit 0 when the plan ran, whatever the calls' verdicts (denied, pending approval...).\n\n"
            "PLAN is YAML or JSON ('-' for stdin), YAML 1.2 scalars (only true/false are booleans, "
            "010 is ten, dates stay text), no duplicate keys:\n\n"
            "  goal: say hello, then read a file      # required\n"
            "  run_id: hello-1                        # optional: reuse or name the run\n"
            "  max_steps: 5                           # optional: the plan's step cap\n"
            "  steps:                                 # required, at least one\n"
            "    - {key: hello, tool: echo, arguments: {text: hi}}\n"
            "    - key: notes                         # the step key becomes the call id\n"
            "      tool: read_file\n"
            "      arguments: {path: /input/notes.txt}\n\n"
            "The run is left open (a later plan or batch may continue it) unless --finish."),
        examples=("  export RINGFENCE_TOKEN=demo-agent-token\n"
                  "  ringfence submit plan.yaml\n"
                  "  ringfence submit plan.yaml --run-id hello-2 --finish --json | jq .type"))
    p.add_argument("plan", metavar="PLAN", help="the plan file (YAML or JSON), '-' for stdin")
    p.add_argument("--run-id", default=None, help="run id to start or reuse (overrides the plan's run_id)")
    p.add_argument("--finish", action="store_true",
                   help="finish the run (outcome completed) after the plan, unless approvals are pending")
    p.set_defaults(func=_guarded("submit", cmd_submit))

    p = _parser(
        subparsers, "watch", common, help="follow a run's events until it finishes (gRPC)",
        description=("Print a run's events from --from on (default: all of them), then each new one as "
                     "it is appended, until the run finishes (run_finished). A running call's output arrives "
                     "as it is printed, each line prefixed by the call id and the stream ('c1 stdout| ...'; "
                     "secrets are redacted by the server before anything is written). Exit 0 then; 1 if the "
                     "server ends the stream first. Ctrl-C stops watching (the run goes on)."),
        examples=("  ringfence watch hello-1\n"
                  "  ringfence watch hello-1 --from 13 --json"))
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--from", dest="from_seq", type=int, default=0, metavar="SEQ",
                   help="first sequence number to print (default: the first event)")
    p.set_defaults(func=_guarded("watch", cmd_watch))

    _register_files(subparsers, common)

    p = _parser(
        subparsers, "approvals", common, help="list pending approvals; approve or decline one (gRPC)",
        description=("With no ACTION: the pending approvals of this token's tenant, each with its id, run, "
                     "call, tool, the exact arguments it would run with (canonical JSON) and the digest the "
                     "approval is bound to. `approve ID` lets that exact call run (it runs now); `decline ID` "
                     "refuses it. Needs an approver (or admin) token; whoever proposed a call can never "
                     "decide it. A RECONCILE approval asks whether an interrupted call happened: approve = "
                     "it did not, run it once; decline = leave it uncertain."),
        examples=("  export RINGFENCE_TOKEN=demo-approver-token\n"
                  "  ringfence approvals\n"
                  "  ringfence approvals approve apr-2129bb1f0a8c46bab262 --reason 'known customer'\n"
                  "  ringfence approvals decline apr-2129bb1f0a8c46bab262 --reason 'not today'"))
    p.add_argument("--run", metavar="RUN_ID", default=argparse.SUPPRESS, help="only this run's approvals")
    p.add_argument("--all", action="store_true", default=argparse.SUPPRESS,
                   help="also decided, used and expired approvals of unfinished runs")
    p.set_defaults(func=_guarded("approvals", cmd_approvals_list))
    actions = p.add_subparsers(dest="approvals_command", metavar="ACTION", required=False)
    for name, approve in (("approve", True), ("decline", False)):
        a = _parser(
            actions, name, common, help=f"{name} one pending approval",
            description=(f"{name.capitalize()} the pending approval ID (from `ringfence approvals`)."
                         + (" The call it names then runs, with exactly the arguments shown." if approve else
                            " The call it names is not run; its observation says declined, with the reason.")),
            examples=f"  ringfence approvals {name} apr-2129bb1f0a8c46bab262 --reason 'checked with finance'")
        a.add_argument("approval_id", metavar="ID")
        a.add_argument("--reason", default="", help="why (recorded in the run's log with your subject)")
        a.add_argument("--digest", default=None,
                       help="the digest you saw in the listing: refused if the pending call no longer has it")
        if approve:
            a.add_argument("--remember", action="store_true",
                           help="also approve this exact call for the rest of the run (asked again: not asked; "
                                "any other arguments still are)")
        a.set_defaults(func=_guarded("approvals", _decide(approve)))

    p = _parser(
        subparsers, "run", common, help="one run as the server sees it: status, outcome, trajectory (gRPC)",
        description=("Ask the server (GetRun) for one run of this token's tenant: status, outcome, usage, "
                     "every call's observation and the pending approvals. To read a run's events from the "
                     "event store itself, without a server, use `ringfence runs show RUN_ID`. --finish ends "
                     "the run (completed, or uncertain when a call's effect could not be confirmed); "
                     "--cancel ends it cancelled and kills its running containers."),
        examples="  ringfence run hello-1\n  ringfence run hello-1 --json\n  ringfence run hello-1 --finish")
    p.add_argument("run_id", metavar="RUN_ID")
    end = p.add_mutually_exclusive_group()
    end.add_argument("--finish", action="store_true", help="finish the run first (FinishRun), then show it")
    end.add_argument("--cancel", action="store_true", help="cancel the run first (CancelRun), then show it")
    p.set_defaults(func=_guarded("run", cmd_run_show))

    p = _parser(
        subparsers, "tools", common,
        help="the tools: names, descriptions, JSON Schemas (gRPC); `tools new|check`: your own tools",
        description=("List the tools an agent may propose, with each one's description and the JSON Schema "
                     "its arguments must satisfy. QUERY narrows the list to the tools that match it. Your own "
                     "tools, without a server: `ringfence tools new NAME` scaffolds a tool package, `ringfence "
                     "tools check DIR...` checks one (each has --help; docs/TOOLS.md). A QUERY that is "
                     "literally new or check: `ringfence tools -- new`."),
        examples="  ringfence tools\n  ringfence tools credit --json\n  ringfence tools new jq_table\n"
                 "  ringfence tools check tools/jq_table --config ringfence.toml")
    p.add_argument("query", metavar="QUERY", nargs="?", default="", help="narrow to tools matching this text")
    p.set_defaults(func=_guarded("tools", cmd_tools))

    _register_runs(subparsers, common)


def _register_files(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    p = _parser(
        subparsers, "files", common, help="put files into a run's workspace, or get them (or its artifacts) out (gRPC)",
        description=("A run started with a workspace has a directory, /workspace, that its workspace tools share "
                     "across calls. `put` copies local files into it; `get` copies files out of it, or with "
                     "--artifacts the files its tools declared as outputs (kept after the run ends). Every "
                     "transfer is checked on the server (no links, no `..`, no devices or set-id bits; sizes "
                     "capped by files.max_upload_bytes and files.max_download_bytes) and recorded in the run's "
                     "log with each file's sha256. Needs an agent (or admin) token."),
        examples=("  ringfence files put run-1 src/ tests/test_mod.py --to project\n"
                  "  ringfence files get run-1 project/src/mod.py --out ./fetched\n"
                  "  ringfence files get run-1 --artifacts --out ./artifacts"))
    actions = p.add_subparsers(dest="files_command", metavar="ACTION", required=True)
    put = _parser(
        actions, "put", common, help="copy local files and directories into the run's workspace",
        description=("Pack each LOCAL_PATH (a file, or a directory with everything in it) under its own name "
                     "into one archive and copy it into the run's /workspace, under --to DIR (created if "
                     "missing). Only regular files and directories are sent: a symbolic link, a device or a "
                     "fifo is refused here, before anything is sent. A file already in the workspace with the "
                     "same path is replaced. Prints each file's size and sha256 as the server recorded it."),
        examples="  ringfence files put run-1 data.csv\n  ringfence files put run-1 src/ --to project")
    put.add_argument("run_id", metavar="RUN_ID")
    put.add_argument("local", metavar="LOCAL_PATH", nargs="+", help="a file or directory to send")
    put.add_argument("--to", default="", metavar="DIR",
                     help="the directory in the workspace, relative to /workspace (default: /workspace itself)")
    put.set_defaults(func=_guarded("files", cmd_files_put))
    get = _parser(
        actions, "get", common, help="copy files (or artifacts) of the run out to a local directory",
        description=("Download PATHs (files or directories, relative to /workspace; none: the whole workspace) "
                     "or, with --artifacts, the run's artifacts (none: all of them), and write them under --out "
                     "DIR with the same relative paths. Each file is checked against the sha256 the server "
                     "sent. Nothing is written outside --out, through a link, or over an existing file (the "
                     "command refuses before writing anything). A link in the workspace is never followed: it "
                     "is reported as skipped."),
        examples="  ringfence files get run-1 project/src --out ./fetched\n  ringfence files get run-1 --artifacts")
    get.add_argument("run_id", metavar="RUN_ID")
    get.add_argument("paths", metavar="PATH", nargs="*", help="a file or directory relative to /workspace")
    get.add_argument("--out", default=".", metavar="DIR", help="where to write (created if missing; default: .)")
    get.add_argument("--artifacts", action="store_true",
                     help="the run's collected artifacts instead of the workspace (they outlive it)")
    get.set_defaults(func=_guarded("files", cmd_files_get))


_RUNS_DESCRIPTION = (
    "With no ACTION (or `list`): the runs of this token's tenant, asked of a running server over "
    "gRPC (--server, $RINGFENCE_SERVER). The ACTIONs show, export, verify and prune read the event "
    "store directly instead (no server, no token; --state-dir, --config or --database-url after the "
    "ACTION); for one run as the server sees it, use `ringfence run RUN_ID`.")
_RUNS_EXAMPLES = ("  ringfence runs                      # over gRPC\n"
                  "  ringfence runs --json\n"
                  "  ringfence runs show RUN_ID --state-dir ./.state   # the store, no server")


def _register_runs(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    """`ringfence runs` with no action lists runs over gRPC; its store actions stay as they are.

    control/store/cli.py registers `runs` with show|export|verify|prune required; here the
    action becomes optional, `list` is added, and the connection options at `runs` level are
    refused for the store actions (which would otherwise silently ignore them).
    """
    existing = subparsers.choices.get("runs")
    if existing is None:  # no store CLI: `runs` is ours alone
        existing = subparsers.add_parser("runs", help="list runs (gRPC)")
        existing.add_subparsers(dest="runs_command", metavar="ACTION")
    runs = existing
    actions = next(a for a in runs._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001 - argparse has no public way to reach a subparsers action
    actions.required = False
    runs._add_container_actions(common)  # noqa: SLF001 - the same options at `runs` level (as parents=)
    runs.allow_abbrev = False
    runs.description = _wrap(_RUNS_DESCRIPTION + ("\n\n" + runs.description if runs.description else ""))
    runs.formatter_class = argparse.RawDescriptionHelpFormatter
    runs.epilog = "examples:\n" + _RUNS_EXAMPLES + "\n" + _COMMON_EPILOG
    for choice in subparsers._choices_actions:  # noqa: SLF001 - the line in `ringfence --help`
        if choice.dest == "runs":
            choice.help = "list runs (gRPC); show, export, verify or prune them in the event store"
    for name, store_action in list(actions.choices.items()):
        original = store_action.get_default("func")
        if original is not None:
            store_action.set_defaults(func=_store_only(name, original))
    lister = _parser(actions, "list", common, help="the runs of this token's tenant, over gRPC",
                     description="List the runs of this token's tenant (ListRuns): id, status, outcome, turns, "
                                 "calls, pending approvals, goal.",
                     examples="  ringfence runs list\n  ringfence runs list --json | jq -r .run_id")
    lister.set_defaults(func=_guarded("runs", cmd_runs_list))
    runs.set_defaults(func=_guarded("runs", cmd_runs_list))


def _store_only(name: str, original: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        given = [f"--{d.replace('_', '-')}" for d in _CONN_DESTS if hasattr(args, d)]
        if given:
            print(f"error: `ringfence runs {name}` reads the event store directly and takes no {', '.join(given)}; "
                  f"to ask a server, use `ringfence run RUN_ID` (or `ringfence runs` to list)", file=sys.stderr)
            return EXIT_USAGE
        return original(args)

    return run
