"""The MCP front door: any MCP client (a coding agent, a desktop assistant, an agent SDK) calls
the tenant's tools through ringfence's whole admission path.

    ringfence.mcp.mapping     pure: ToolView -> mcp Tool, Observation -> CallToolResult or a
                              JSON-RPC error, ringfence errors -> JSON-RPC errors
    ringfence.mcp.frontdoor   FrontDoor: the MCP lowlevel Server whose handlers turn one MCP
                              session into one ringfence run (tools/list = ListTools,
                              tools/call = one SubmitBatch of one call, ASK = wait with progress)

Transports: stdio (`ringfence mcp`, ringfence.cli.mcp) and Streamable HTTP (`ringfence serve
--mcp-listen`, the server's), both on the same FrontDoor.

The MCP SDK is an optional extra: importing `ringfence` never imports it; importing this package
without it raises an ImportError that says what to install.
"""

from __future__ import annotations

try:
    import mcp as _mcp  # noqa: F401 - only checked for: the error below names the extra
except ImportError as e:  # pragma: no cover - exercised in a venv without the extra
    raise ImportError(
        "ringfence.mcp needs the MCP Python SDK, an optional extra: pip install 'ringfence[mcp]'"
    ) from e

from ringfence.mcp.frontdoor import FrontDoor
from ringfence.mcp.mapping import IDEMPOTENCY_KEY_META, OUTPUT_CAP

__all__ = ["IDEMPOTENCY_KEY_META", "OUTPUT_CAP", "FrontDoor"]
