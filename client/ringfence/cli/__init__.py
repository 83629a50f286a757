"""`ringfence submit|watch|files|approvals|runs|run|tools`: the command line for people, over gRPC.

These commands talk to a running `ringfence serve` over gRPC (the server's distribution adds
its own commands to the same `ringfence`: main.py, extension.py):

    submit PLAN.yaml        start (or reuse) a run, execute a plan, follow its events live
    watch RUN_ID            follow a run's events until it finishes (a call's output live)
    files put|get RUN_ID    put local files into a run's workspace, get files (or artifacts) out
    approvals [approve|decline ID]   list pending approvals, decide one
    runs [list]             the runs this token's tenant can see
    run RUN_ID              one run: status, outcome, trajectory, pending approvals
    tools [QUERY]           the tools, their descriptions and JSON Schemas

Common options: --server HOST:PORT (default $RINGFENCE_SERVER, else 127.0.0.1:50051), the bearer
token from an environment variable ($RINGFENCE_TOKEN, or the one --token-env names; never on
the command line), TLS (--tls-ca, --tls-cert/--tls-key for mTLS, --tls-server-name), --timeout,
--json (one JSON object per line on stdout; errors as one JSON object on stderr).

Exit codes: 0 done (for submit: the plan ran, whatever its calls' verdicts), 1 the server
answered with an error or could not be reached, 2 bad usage, a bad plan file, a missing token,
or a request the server refused as INVALID_ARGUMENT (each field violation on its own line).

The modules, each owning one thing (imports run down this list):

    errors       exit codes; UsageError, CommandFailed
    output       Output (human or JSON lines), jsonable, compact, short
    render       events, runs and durations as terminal lines
    plan         the plan file: strict YAML, every problem at once; precheck against the tools
    transfer     local files in (an archive, no links) and out (never outside --out)
    connection   Settings from options and environment; connect
    failures     report_failure and `guarded`, the wrapper every command runs in
    options      the connection options, the common epilog, add_command
    submit, files, approvals, runs, tools    one module per command group, each with register()
    extension    CommandLine: what an installed extension may add (entry point group ringfence.cli)
    main         the parser: these groups, then each extension; main()

Only grpc and the SDK are needed, and only once a command connects: `--help` starts without them.
"""
