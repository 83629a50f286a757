"""The demos `make demo` runs: `ringfence demo showcase` (the sandbox alone: ordinary calls and
attacks, each in a fresh hardened container) and `ringfence demo` (the reference incident-response
agent through the real control plane, ringfence_server/control/demo/reference.py).
`python -m ringfence_server.control.demo` runs
both, in that order."""
