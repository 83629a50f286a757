"""`ringfence submit PLAN` and `ringfence watch RUN_ID`: run a plan and follow a run's events live."""

from __future__ import annotations

import argparse
import sys

from ringfence.cli.connection import Settings, connect
from ringfence.cli.errors import EXIT_OK, CommandFailed, UsageError
from ringfence.cli.failures import guarded, report_failure
from ringfence.cli.options import SubParsers, add_command
from ringfence.cli.output import Output, short
from ringfence.cli.plan import PlanError, precheck, read_plan
from ringfence.cli.render import print_event, print_run
from ringfence.errors import InvalidArgument, NotFound
from ringfence.model import EventType


def cmd_submit(args: argparse.Namespace, s: Settings, out: Output) -> int:
    """Read the plan, precheck it, start (or reuse) its run, execute it and follow its events."""
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
    """Follow a run's events from --from until run_finished (exit 1 if the stream ends first)."""
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


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    """`submit` and `watch`, with the connection options `common`."""
    p = add_command(
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
    p.set_defaults(func=guarded("submit", cmd_submit))

    p = add_command(
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
    p.set_defaults(func=guarded("watch", cmd_watch))
