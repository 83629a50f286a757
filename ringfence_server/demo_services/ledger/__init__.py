"""The ledger: a real receiver for effects, so "effects happen once" is counted where they land.

    ringfence_server.demo_services.ledger.server      the service itself (stdlib only; laid into images/ledger as
                               /opt/ringfence/ledger.py): POST /credits applies a credit once
                               per idempotency key, GET /credits/<key> looks one up
    ringfence_server.demo_services.ledger.container   Ledger: its container on a Docker network, queried from the
                               host through `docker exec` (no packet from the host)

Tools reach it as LEDGER_HOST through the egress proxy, which pins the name to the ledger's
address (ringfence_server.sandbox.egress.proxy.ProxySettings.services). Nothing here imports control.

Errors: LedgerError (an EngineError) when the container cannot be started or asked; its
message carries the container's status and recent logs.
"""

from ringfence_server.demo_services.ledger.container import (
    LEDGER_HOST,
    LEDGER_PORT,
    Ledger,
    LedgerError,
    LedgerSettings,
)

__all__ = ["LEDGER_HOST", "LEDGER_PORT", "Ledger", "LedgerError", "LedgerSettings"]
