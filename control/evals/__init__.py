"""Evals of agents on ringfence: cases, scoring, repeats and paired comparison, and the
contract suite (`ringfence eval SUITE`).

    control.evals.scoring     Case, Expect, LoopOptions, Judge, score(): one run's checks
    control.evals.semantics   record(): a run as behaviour (no ids, times, tokens); diff()
    control.evals.compare     runs grouped by case (k/N), baselines, the paired comparison
    control.evals.runner      EvalStack (the demo's stack + two input files), run_suite()
    control.evals.contract    CASES: the contract suite; baselines/contract.json its recording
    control.evals.cli         `ringfence eval`

Importing this package starts nothing and needs no Docker: the runner (and the stack) are
imported only when a suite is run.
"""
