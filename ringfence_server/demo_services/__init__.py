"""The demo services: stdlib HTTP servers of ours (the ledger, the runbooks), each in its own
pinned image and container, that tools reach only through the egress proxy.

    container    ServiceContainer, the base: a service's container and its network
    ledger       Ledger: credits, once per idempotency key
    runbooks     Runbooks: fixed runbook documents

Not part of the sandbox runtime: they use it (its labels, seccomp profile, pinned images) as
any service behind the egress proxy would. Nothing here imports control.
"""
