"""`ringfence approvals [approve|decline ID]`: the pending approvals, and the decision on one;
`ringfence approvals withdraw RUN_ID ID`: the proposer takes its own pending call back."""

from __future__ import annotations

import argparse
import time

from ringfence.cli.connection import Settings, connect, option
from ringfence.cli.errors import EXIT_OK
from ringfence.cli.failures import Action, guarded
from ringfence.cli.options import SubParsers, add_command
from ringfence.cli.output import Output, compact, jsonable, short
from ringfence.cli.render import ago
from ringfence.model import ApprovalKind, ApprovalStatus


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
        kind = "  RECONCILE: approve = it did not happen, run it once" if a.kind == ApprovalKind.RECONCILE else ""
        state = f"expires in {ago(a.expires_at - now)}" if a.status == ApprovalStatus.PENDING else f"{a.status}"
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
