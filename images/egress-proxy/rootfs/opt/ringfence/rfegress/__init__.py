"""The ringfence egress proxy (copied from sandbox/egress by `python -m sandbox.egress.sync`)."""
