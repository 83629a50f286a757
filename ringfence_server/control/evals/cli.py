"""`ringfence eval SUITE [--repeat N] [--baseline FILE] [--record] [--workdir DIR] [--json]
[--model PROVIDER:URL [--model-name NAME]]`."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from ringfence_server.control.evals.models import ModelComparison, ModelSpec
    from ringfence_server.control.evals.runner import CaseRun
    from ringfence_server.control.evals.scoring import Case

CASE_TYPE = "ringfence_server.control.evals.scoring.Case"  # named in errors (loaded lazily: see eval_command)
BUILTIN = "contract"
CONTRACT_BASELINE = Path(__file__).with_name("baselines") / "contract.json"

EPILOG = f"""\
what it does:
  Starts its own stack, as `ringfence demo` does (a real gRPC server on a loopback port, a fresh
  container per executed call, the egress proxy, the runbooks and ledger services), runs every
  case of SUITE through the agent loop (progress lines on stderr), scores each run and prints:

    a table      case | runs passed k/N | outcome | executed calls | notes of failed checks
    a comparison with the baseline, PAIRED by case: both pass, both fail, only the baseline
                 passes, only this build passes; the discordant cases by name; McNemar's b and c
                 with an exact two-sided sign test (never a confidence interval over repeats:
                 repeats of one case are not independent samples)
    semantics    the cases whose runs differ from the baseline's record (outcome, ended_by,
                 turns, each call's tool, status, executed and dispatched, compacted, answered;
                 never ids, timestamps, durations, tokens or costs)

  With --model PROVIDER:URL, every case runs a second time by that real model, directed by the
  case's script (its turns as directions in the goal, tool_choice set to the script's tool on a
  turn that calls one), and a third section compares the two PAIRED by case: a row per case
  (scripted k/N, model k/N, the model's outcome and proposals), the discordant cases, McNemar's b
  and c, and a class for every case whose runs differ: infrastructure (a run raised or ended
  `error`: the provider unreachable or refusing, a server fault), adapter (an `invalid`
  observation: arguments that were not JSON; a response cut by the length limit), policy (the
  same proposal given another status), model (other calls, turns or answer); the first that
  holds (ringfence_server/control/evals/models.py). A small local model takes seconds a turn.

  Exit status: 0 when every case passed every run and no case differs from the baseline (and,
  with --model, no case is discordant); 1 when a case failed or differs (or a case is on one
  side only, or the real model's verdict differs from the script's); 2 on a usage error.

SUITE:
  {BUILTIN}        the built-in contract suite (ringfence_server/control/evals/contract.py): every terminal outcome
                  this stack can reach, each resource class allowed and denied, an approval, a
                  duplicate effect, a parallel batch, a compaction, a withheld result. Its
                  baseline is ringfence_server/control/evals/baselines/contract.json.
  PATH.py         a Python file defining CASES, a list of ringfence_server.control.evals.scoring.Case; its
                  baseline defaults to PATH.baseline.json beside it (compared when it exists).

examples:
  ringfence eval contract                         run the contract suite, compare with its baseline
  ringfence eval contract --repeat 3              each case 3 times (k/3 per case: finds flaky cases)
  ringfence eval contract --record                re-record ringfence_server/control/evals/baselines/contract.json
  ringfence eval contract --baseline old.json     compare with another recording
  ringfence eval ./my_cases.py --record           run your cases, write ./my_cases.baseline.json
  ringfence eval contract --json > report.json    the report as JSON on stdout
  ringfence eval contract --workdir ./ev          keep the event log: ringfence runs show RUN_ID \\
                                                    --state-dir ./ev/state
  ringfence eval contract --model openai:http://127.0.0.1:8080/v1
                                                  each case also by the model that server serves
  ringfence eval contract --model anthropic:https://api.anthropic.com --model-name claude-sonnet-4-5
                                                  the same with Anthropic's (ANTHROPIC_API_KEY)

Needs a Docker engine and the pinned images (`make images`)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "eval", help="run an eval suite of scripted agents on a real stack, compare with a baseline",
        description="Run an eval suite end to end on this machine's Docker engine, score every run "
                    "(outcome, trajectory of executed calls, efficiency, rubric, optional judge) and "
                    "compare it, paired by case, with a stored baseline.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", metavar="SUITE", help=f"'{BUILTIN}' or a path to a Python file defining CASES")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run each case N times (default 1); a case passes only when all N runs pass")
    p.add_argument("--baseline", type=Path, default=None, metavar="FILE",
                   help="the baseline to compare with (and to write with --record); default: the "
                        "contract suite's stored one, or PATH.baseline.json for a file suite")
    p.add_argument("--record", action="store_true",
                   help="write this run as the baseline (after comparing with the old one, if any)")
    p.add_argument("--workdir", type=Path, default=None, metavar="DIR",
                   help="keep the stack's state (event log, /input) here instead of a temporary folder")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--model", default=None, metavar="PROVIDER:URL",
                   help="also run every case by a real model, beside its script, and compare them paired by case: "
                        "openai:URL (an OpenAI-compatible server; OPENAI_API_KEY when set) or anthropic:URL "
                        "(ANTHROPIC_API_KEY)")
    p.add_argument("--model-name", default=None, metavar="NAME",
                   help="the model to ask for (openai: default the one the server lists; anthropic: required)")
    p.set_defaults(func=eval_command)


def load_cases(suite: str) -> tuple[str, list[Any], Path | None]:
    """(suite name, its cases, its default baseline path)."""
    if suite == BUILTIN:
        from ringfence_server.control.evals.contract import CASES

        return BUILTIN, list(CASES), CONTRACT_BASELINE
    path = Path(suite)
    if not path.is_file():
        raise SystemExit(f"error: SUITE must be '{BUILTIN}' or a Python file defining CASES; {suite!r} is neither")
    spec = importlib.util.spec_from_file_location(f"ringfence_eval_suite_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cases = getattr(module, "CASES", None)
    if not isinstance(cases, (list, tuple)) or not cases:
        raise SystemExit(f"error: {path} defines no CASES (a non-empty list of {CASE_TYPE})")
    return path.stem, list(cases), path.with_suffix(".baseline.json")


def eval_command(args: argparse.Namespace) -> int:
    from ringfence_server.control.evals.compare import BaselineError, load_baseline
    from ringfence_server.control.evals.runner import check_unique
    from ringfence_server.control.evals.scoring import Case

    if args.repeat < 1:
        print("error: --repeat must be at least 1", file=sys.stderr)
        return 2
    name, cases, default_baseline = load_cases(args.suite)
    bad = [c for c in cases if not isinstance(c, Case)]
    if bad:
        print(f"error: CASES holds {len(bad)} item(s) that are not {CASE_TYPE}", file=sys.stderr)
        return 2
    try:
        check_unique(cases)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    baseline_path = args.baseline or default_baseline
    baseline = None
    if baseline_path is not None and Path(baseline_path).exists():
        try:
            baseline = load_baseline(baseline_path)
        except BaselineError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    elif args.baseline is not None and not args.record:
        print(f"error: no baseline at {args.baseline}", file=sys.stderr)
        return 2
    spec = None
    if args.model is not None or args.model_name is not None:
        from ringfence_server.control.evals.models import ModelSpec, ModelSpecError

        try:
            if args.model is None:
                raise ModelSpecError("--model-name needs --model PROVIDER:URL")
            spec = ModelSpec.parse(args.model, args.model_name)
        except ModelSpecError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

    started = time.monotonic()
    runs, model_runs = _run(cases, args.workdir, args.repeat, spec)
    elapsed = time.monotonic() - started
    comparison = None
    if spec is not None:
        from ringfence_server.control.evals.models import model_comparison

        comparison = model_comparison(spec, runs, model_runs)
    return report(name, runs, baseline, baseline_path, elapsed, record=args.record, as_json=args.json,
                  repeat=args.repeat, model=comparison)


def _run(cases: Sequence[Case], workdir: Path | None, repeat: int,
         spec: ModelSpec | None = None) -> tuple[list[CaseRun], list[CaseRun]]:
    """The scripted runs, and the real model's (none without `spec`), on one stack."""
    from ringfence_server.control.evals.runner import EvalEnv, EvalStack, run_suite

    with tempfile.TemporaryDirectory(prefix="ringfence-eval-") as tmp:
        where = Path(workdir) if workdir is not None else Path(tmp)
        print(f"eval: starting the stack (workdir {where})", file=sys.stderr, flush=True)
        try:
            with EvalStack(where) as stack:
                env = EvalEnv(stack.address, ledger=stack.ledger, workdir=where)
                print(f"eval: control plane {stack.address}; {len(cases)} case(s) x {repeat}",
                      file=sys.stderr, flush=True)
                runs = run_suite(cases, env, repeat=repeat)
                if spec is None:
                    return runs, []
                from ringfence_server.control.evals.models import directed

                print(f"eval: the same cases by {spec.label()} at {spec.url}", file=sys.stderr, flush=True)
                return runs, run_suite([directed(c, spec) for c in cases], env, repeat=repeat, label="model")
        except Exception as e:
            from ringfence_server.sandbox.errors import SandboxError

            if isinstance(e, SandboxError):
                raise SystemExit(f"error: {e}\n(is the Docker engine up, and are the images built? `make images`)"
                                 ) from e
            raise


def report(name: str, runs: Sequence[CaseRun], baseline: dict[str, Any] | None, baseline_path: Path | None,
           elapsed: float, *, record: bool, as_json: bool, repeat: int, out: TextIO | None = None,
           model: ModelComparison | None = None) -> int:
    """Print the table and the comparison (and the real model's, `model`); write the baseline
    when asked; the exit status."""
    from ringfence_server.control.evals.compare import (
        baseline_verdicts,
        compare,
        save_baseline,
        semantic_differences,
        summarize,
    )

    out = out or sys.stdout
    records = [r.as_record() for r in runs]
    summaries = summarize(records)
    first: dict[str, CaseRun] = {}
    for r in runs:
        first.setdefault(r.case, r)
    comparison = differences = None
    if baseline is not None:
        comparison = compare(baseline_verdicts(baseline), {s.case: s.passed for s in summaries},
                             "baseline", "this build")
        differences = semantic_differences(baseline, records)
    failed = [s for s in summaries if not s.passed]
    recorded = None
    if record and baseline_path is not None:
        save_baseline(baseline_path, name, summaries)
        recorded = str(baseline_path)
    ok = not failed and (record or not differences) and (model is None or not model.discordant)

    if as_json:
        doc = {
            "suite": name, "repeat": repeat, "elapsed_s": round(elapsed, 1), "ok": ok,
            "cases": [{"case": s.case, "runs": s.runs, "passed": s.passed_runs, "pass": s.passed,
                       "outcome": first[s.case].semantics.get("outcome"),
                       "executed": first[s.case].executed(), "variants": s.variants, "notes": list(s.notes),
                       "semantics": dict(s.semantics)} for s in summaries],
            "baseline": str(baseline_path) if baseline is not None else None,
            "comparison": comparison.as_json() if comparison is not None else None,
            "semantic_differences": ({d.case: list(d.differences) for d in differences}
                                     if differences is not None else None),
            "recorded": recorded,
        }
        if model is not None:
            doc["real_model"] = model.as_json()
        print(json.dumps(doc, indent=2), file=out)
        return 0 if ok else 1

    rows = [("case", "runs", "outcome", "executed calls", "notes")]
    for s in summaries:
        notes = list(s.notes)
        if s.variants > 1:
            notes.append(f"{s.variants} different behaviours across runs")
        rows.append((s.case, f"{s.passed_runs}/{s.runs} {'pass' if s.passed else 'FAIL'}",
                     str(first[s.case].semantics.get("outcome", "raised")),
                     _calls(first[s.case].executed()), "; ".join(notes) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print(f"eval {name}: {len(summaries)} case(s), {repeat} run(s) each, {elapsed:.1f} s", file=out)
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) if i < 4 else cell for i, cell in enumerate(row)).rstrip(), file=out)
    print(file=out)
    passed = len(summaries) - len(failed)
    print(f"cases passed {passed} of {len(summaries)}" + (f"; failed: {', '.join(s.case for s in failed)}"
                                                          if failed else ""), file=out)
    if comparison is None:
        print("baseline: none" + (f" at {baseline_path}" if baseline_path else "") + "; nothing to compare",
              file=out)
    else:
        print(f"\ncomparison with the baseline {baseline_path}", file=out)
        for line in comparison.lines():
            print(f"  {line}", file=out)
        if differences:
            print(f"semantics: {len(differences)} case(s) differ from the baseline", file=out)
            for d in differences:
                print(f"  {d.line()}", file=out)
        else:
            print(f"semantics: all {len(summaries)} case(s) as recorded", file=out)
    if model is not None:
        print(file=out)
        for line in model.lines():
            print(line, file=out)
    if recorded:
        print(f"recorded the baseline {recorded}", file=out)
    print(f"\nresult: {'ok' if ok else 'FAILED'}", file=out)
    out.flush()
    return 0 if ok else 1


def _calls(tools: list[str]) -> str:
    if not tools:
        return "-"
    out: list[str] = []
    for t in tools:
        if out and out[-1].split(" x")[0] == t:
            n = int(out[-1].split(" x")[1]) + 1 if " x" in out[-1] else 2
            out[-1] = f"{t} x{n}"
        else:
            out.append(t)
    return ", ".join(out)
