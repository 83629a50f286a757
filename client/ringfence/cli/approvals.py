"""`ringfence approvals [approve|decline ID]`: the pending approvals, and the decision on one;
`ringfence approvals show ID`: one approval, in any state, with everything an approver judges;
`ringfence approvals withdraw RUN_ID ID`: the proposer takes its own pending call back;
`ringfence whoami`: who the server takes this shell's token to be."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

from ringfence.cli.connection import Settings, connect, option
from ringfence.cli.errors import EXIT_OK
from ringfence.cli.failures import Action, guarded
from ringfence.cli.options import SubParsers, add_command
from ringfence.cli.output import Output, compact, jsonable, short
from ringfence.cli.render import ago
from ringfence.model import Approval, ApprovalKind, ApprovalStatus, ToolRisk

RECONCILE_MEANING = "approve = it did not happen, run it once"
"""What deciding a reconciliation task means, as the listing and `approvals show` say it."""


def _who(a: Approval) -> str:
    """Who proposed the call, for a person: a reconciliation task has no proposer."""
    if a.proposer:
        return a.proposer
    return "(no one: a reconciliation task)" if a.kind == ApprovalKind.RECONCILE else "(unknown)"


def _state(a: Approval, now: float) -> str:
    """pending (how long it has left), or what became of it, by whom and why."""
    state = f"expires in {ago(a.expires_at - now)}" if a.status == ApprovalStatus.PENDING else f"{a.status}"
    if a.decided_by:
        state += f" by {a.decided_by}" + (f": {a.reason}" if a.reason else "")
    return state


def cmd_approvals_list(args: argparse.Namespace, s: Settings, out: Output) -> int:
    """The tenant's pending approvals (with --all: every one), each with its arguments and digest."""
    with connect(s) as client:
        approvals = client.list_approvals(option(args, "run"))
    if not option(args, "all"):
        approvals = [a for a in approvals if a.status == ApprovalStatus.PENDING]
    if out.json:
        for a in approvals:
            out.obj(jsonable(a))
        return EXIT_OK
    if not approvals:
        out.line("no pending approvals" if not option(args, "all") else "no approvals")
        return EXIT_OK
    now = time.time()
    for a in approvals:
        kind = f"  RECONCILE: {RECONCILE_MEANING}" if a.kind == ApprovalKind.RECONCILE else ""
        out.line(f"{a.approval_id}  run {a.run_id}  call {a.call_id}  tool {a.tool}  {_state(a, now)}{kind}")
        out.line(f"  proposed by {_who(a)}  asked by {a.policy_rule or '(unknown)'}")
        out.line(f"  arguments {compact(a.arguments)}")
        out.line(f"  digest    {a.digest}")
    n = len(approvals)
    out.line(f"{n} approval{'s' if n != 1 else ''}; decide with `ringfence approvals approve|decline ID "
             "[--reason TEXT]`")
    return EXIT_OK


def _when(t: float, now: float) -> str:
    """An instant in UTC, and how far it is from now."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    return f"{stamp} ({ago(now - t)} ago)" if t <= now else f"{stamp} (in {ago(t - now)})"


def _risk_value(value: Any) -> str:
    """One ToolRisk field, for a person: yes/no, lists joined, a mapping as `key: a, b; ...`."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {_risk_value(v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) if value != "" else "-"


def risk_lines(risk: ToolRisk | None) -> list[str]:
    """Every field of the tool's risk, one a line (a field added to ToolRisk shows without a change here)."""
    if risk is None:
        return ["  (the server did not say)"]
    fields = dataclasses.fields(risk)
    width = max(len(f.name) for f in fields) + 2
    return [f"  {f.name:<{width}}{_risk_value(getattr(risk, f.name))}" for f in fields]


def cmd_approvals_show(args: argparse.Namespace, s: Settings, out: Output) -> int:
    """One approval by its id, whatever its state (also a finished run's), with the tool's risk."""
    with connect(s) as client:
        a = client.get_approval(args.approval_id)
    if out.json:
        out.obj(jsonable(a))
        return EXIT_OK
    now = time.time()
    status = f"{a.status}"
    if a.status == ApprovalStatus.PENDING:
        status += f", expires in {ago(a.expires_at - now)}"
    if a.decided_by:
        status += f", by {a.decided_by}" + (f": {a.reason}" if a.reason else " (no reason given)")
    kind = (f"reconcile: did the interrupted call happen? {RECONCILE_MEANING}; decline = leave it uncertain"
            if a.kind == ApprovalKind.RECONCILE else f"{a.kind}")
    rows = (("status", status), ("kind", kind), ("tool", a.tool), ("run", a.run_id), ("call", a.call_id),
            ("tenant", a.tenant), ("proposer", _who(a)), ("rule", a.policy_rule or "(unknown)"),
            ("created", _when(a.created_at, now)), ("expires", _when(a.expires_at, now)), ("digest", a.digest))
    out.line(f"approval {a.approval_id}")
    for label, value in rows:
        out.line(f"  {label:<10}{value}")
    out.line("  arguments")
    for line in json.dumps(jsonable(a.arguments), indent=2, sort_keys=True, ensure_ascii=False,
                           default=str).splitlines():
        out.line(f"    {line}")
    out.line(f"  tool risk ({a.tool})")
    for line in risk_lines(a.tool_risk):
        out.line(f"  {line}")
    if a.status == ApprovalStatus.PENDING:
        out.line(f"decide with `ringfence approvals approve|decline {a.approval_id} --digest {a.digest} "
                 "[--reason TEXT]`")
    return EXIT_OK


def cmd_whoami(args: argparse.Namespace, s: Settings, out: Output) -> int:
    """The tenant, principal and role the server takes this token to be."""
    with connect(s) as client:
        me = client.whoami()
    if out.json:
        out.obj(jsonable(me))
        return EXIT_OK
    out.line(f"tenant {me.tenant}  principal {me.principal}  role {me.role}")
    return EXIT_OK


def _decide(approve: bool) -> Action:
    """The body of `approvals approve` (or `decline`): decide, then show what became of the call."""

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


def cmd_approvals_withdraw(args: argparse.Namespace, s: Settings, out: Output) -> int:
    """Withdraw a pending approval of a call you proposed (or, as an admin, anyone's): the call never runs."""
    with connect(s) as client:
        observation = client.withdraw_approval(args.run_id, args.approval_id, args.reason or "")
    if out.json:
        out.obj(jsonable(observation))
        return EXIT_OK
    out.line(f"withdrew {args.approval_id}: {observation.tool} (run {args.run_id}, call {observation.call_id}) "
             f"is now {observation.status} - {short(observation.error or '', 70)}")
    return EXIT_OK


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    """`approvals` (list) and its actions approve and decline, with the connection options `common`."""
    p = add_command(
        subparsers, "approvals", common, help="list pending approvals; show, approve or decline one (gRPC)",
        description=("With no ACTION: the pending approvals of this token's tenant, each with its id, run, "
                     "call, tool, the exact arguments it would run with (canonical JSON) and the digest the "
                     "approval is bound to, who proposed the call and the policy rule that asked. `show ID` "
                     "shows one approval in any state, with the tool's risk. `approve ID` lets that exact call "
                     "run (it runs now); `decline ID` "
                     "refuses it. Needs an approver (or admin) token; whoever proposed a call can never "
                     "decide it. A RECONCILE approval asks whether an interrupted call happened: approve = "
                     "it did not, run it once; decline = leave it uncertain."),
        examples=("  export RINGFENCE_TOKEN=demo-approver-token\n"
                  "  ringfence approvals\n"
                  "  ringfence approvals show apr-2129bb1f0a8c46bab262\n"
                  "  ringfence approvals approve apr-2129bb1f0a8c46bab262 --reason 'known customer'\n"
                  "  ringfence approvals decline apr-2129bb1f0a8c46bab262 --reason 'not today'"))
    p.add_argument("--run", metavar="RUN_ID", default=argparse.SUPPRESS, help="only this run's approvals")
    p.add_argument("--all", action="store_true", default=argparse.SUPPRESS,
                   help="also decided, used and expired approvals of unfinished runs")
    p.set_defaults(func=guarded("approvals", cmd_approvals_list))
    actions = p.add_subparsers(dest="approvals_command", metavar="ACTION", required=False)
    for name, approve in (("approve", True), ("decline", False)):
        a = add_command(
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
        a.set_defaults(func=guarded("approvals", _decide(approve)))
    show = add_command(
        actions, "show", common, help="one approval in any state, with everything to judge it by",
        description=("The approval ID (from `ringfence approvals`, or a run's events), pending or not, also "
                     "of a finished run: its status (who decided it and why), kind, tool, run, call, tenant, "
                     "who proposed the call, the policy rule that asked, when it was created and expires, the "
                     "exact arguments (pretty-printed), the digest a decision is bound to, and what the tool "
                     "may do (its declared risk). Needs an approver (or admin) token; another tenant's id is "
                     "not found."),
        examples="  ringfence approvals show apr-2129bb1f0a8c46bab262")
    show.add_argument("approval_id", metavar="ID")
    show.set_defaults(func=guarded("approvals", cmd_approvals_show))
    w = add_command(
        actions, "withdraw", common, help="withdraw a pending approval of a call you proposed",
        description=("Take back the call that approval ID of run RUN_ID waits for, before anyone decides it: "
                     "it never runs, and its observation says declined (approval_withdrawn). Needs the token "
                     "that proposed the call (or an admin's); a reconciliation task is for approvers only."),
        examples="  ringfence approvals withdraw run-1 apr-2129bb1f0a8c46bab262 --reason 'no longer needed'")
    w.add_argument("run_id", metavar="RUN_ID")
    w.add_argument("approval_id", metavar="ID")
    w.add_argument("--reason", default="", help="why (recorded in the run's log and the call's observation)")
    w.set_defaults(func=guarded("approvals", cmd_approvals_withdraw))


def register_whoami(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    """`whoami`: any token's tenant, principal and role."""
    p = add_command(
        subparsers, "whoami", common,
        help="whose token this shell holds (tenant, principal, role): check before deciding (gRPC)",
        description=("Who the server takes the token in $RINGFENCE_TOKEN (or --token-env NAME) to be: its "
                     "tenant, its principal (the subject an approval's `proposed by` names) and its role. Any "
                     "role may ask. Check it before deciding: four eyes, an approver cannot decide a call its "
                     "own principal proposed."),
        examples="  ringfence whoami\n  RINGFENCE_TOKEN=demo-approver-token ringfence whoami --json")
    p.set_defaults(func=guarded("whoami", cmd_whoami))
