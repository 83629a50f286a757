"""Evals of agents on ringfence: cases, scoring, repeats and paired comparison, and the
contract suite (`ringfence eval SUITE`).

    ringfence_server.control.evals.scoring     Case, Expect, LoopOptions, Judge, score(): one run's checks
    ringfence_server.control.evals.semantics   record(): a run as behaviour (no ids, times, tokens); diff()
    ringfence_server.control.evals.compare     runs grouped by case (k/N), baselines, the paired comparison
    ringfence_server.control.evals.runner      EvalStack (the demo's stack + two input files), run_suite()
    ringfence_server.control.evals.contract    CASES: the contract suite; baselines/contract.json its recording
    ringfence_server.control.evals.cli         `ringfence eval`

Importing this package starts nothing and needs no Docker: the runner (and the stack) are
imported only when a suite is run.
"""
