"""The control plane's half of sandbox workers (docs/workers.md): the Attach service workers
hold a stream open to (hub), who is attached and what each can run (registry, placement), the
envelopes this control plane signs for them (sealing), and the sandbox backend that runs a call
on a worker instead of this host's engine (remote)."""
