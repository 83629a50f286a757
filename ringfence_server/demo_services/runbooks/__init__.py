"""The runbooks service: fixed runbook documents that tools read over the network, for the demo.

    ringfence_server.demo_services.runbooks.server      the service itself (stdlib only; laid into images/runbooks as
                                 /opt/ringfence/runbooks.py): GET /runbooks/<name>
    ringfence_server.demo_services.runbooks.container   Runbooks: its container on a Docker network, asked from the
                                 host through `docker exec` (no packet from the host)

Tools reach it as RUNBOOKS_HOST through the egress proxy, which pins the name to its address
(ringfence_server.sandbox.egress.proxy.ProxySettings.services). Nothing here imports control.

Errors: RunbooksError (an EngineError) when the container cannot be started or asked; its
message carries the container's status and recent logs.
"""

from ringfence_server.demo_services.runbooks.container import (
    RUNBOOKS_HOST,
    RUNBOOKS_PORT,
    Runbooks,
    RunbooksError,
    RunbooksSettings,
)

__all__ = ["RUNBOOKS_HOST", "RUNBOOKS_PORT", "Runbooks", "RunbooksError", "RunbooksSettings"]
