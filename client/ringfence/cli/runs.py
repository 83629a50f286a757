"""`ringfence runs [list]` and `ringfence run RUN_ID`: the runs a server shows this token's
tenant, one run (and ending it). Actions on local state are added under `runs` by an extension
(the server's event store actions: extension.CommandLine.extend_runs)."""

from __future__ import annotations

import argparse

from ringfence.cli.connection import Settings, connect
from ringfence.cli.errors import EXIT_OK
from ringfence.cli.failures import guarded
from ringfence.cli.options import SubParsers, add_command
from ringfence.cli.output import Output, jsonable, short
from ringfence.cli.render import print_run


def cmd_runs_list(args: argparse.Namespace, s: Settings, out: Output) -> int:
    """The tenant's runs, one a line (ListRuns)."""
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
    """One run (GetRun), after finishing or cancelling it if asked."""
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


def register_run(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    """`run RUN_ID`, with the connection options `common`."""
    p = add_command(
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
    p.set_defaults(func=guarded("run", cmd_run_show))


_RUNS_HELP = "list the runs of this token's tenant (gRPC)"
_RUNS_DESCRIPTION = (
    "With no ACTION (or `list`): the runs of this token's tenant, asked of a running server over "
    "gRPC (--server, $RINGFENCE_SERVER); for one run as the server sees it, use `ringfence run RUN_ID`.")
_RUNS_EXAMPLES = ("  ringfence runs                      # over gRPC\n"
                  "  ringfence runs --json\n")


def register_runs(subparsers: SubParsers,
                  common: argparse.ArgumentParser) -> tuple[argparse.ArgumentParser, SubParsers]:
    """`ringfence runs`: with no action (or `list`) the runs over gRPC. Returns the parser and
    the place its actions go, for extensions to add local ones (extension.CommandLine)."""
    runs = add_command(subparsers, "runs", common, help=_RUNS_HELP, description=_RUNS_DESCRIPTION,
                       examples=_RUNS_EXAMPLES)
    actions = runs.add_subparsers(dest="runs_command", metavar="ACTION", required=False)
    lister = add_command(actions, "list", common, help="the runs of this token's tenant, over gRPC",
                         description="List the runs of this token's tenant (ListRuns): id, status, outcome, turns, "
                                     "calls, pending approvals, goal.",
                         examples="  ringfence runs list\n  ringfence runs list --json | jq -r .run_id")
    lister.set_defaults(func=guarded("runs", cmd_runs_list))
    runs.set_defaults(func=guarded("runs", cmd_runs_list))
    return runs, actions
