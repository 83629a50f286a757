"""Sandbox workers: processes on sandbox hosts that run admitted calls and hold no
secret of the control plane. docs/workers.md says what exists and what is still to build.

The foundation: `envelope` (the signed work envelope, naming the worker it was placed on and the
attempt it is), `keys` (the control plane's Ed25519 keys and a worker's trusted set), `admission`
(what a worker checks before it runs anything: pure, no Docker, network or database), `results`
(the worker's durable record of claims, start marks, results and releases, in SQLite, with its
restart recovery and pruning) and `errors` (the layer's one exception hierarchy). On it:
`engine` (the images a worker verified on its own engine, and what its sandbox can run), `wire`
(a sandbox result's canonical wire form, and the control plane's strict reader of it) and
`executor` (from a sealed envelope to a result on the worker's own engine).
"""
