"""The run's artifacts as MCP resources (pure): their URIs and their contents.

    ringfence://runs/RUN_ID/artifacts/PATH     PATH as DownloadFiles(artifacts=True) names it
"""

from __future__ import annotations

import base64
import mimetypes
from urllib.parse import quote, unquote

import mcp_types as types

__all__ = ["artifact_uri", "parse_artifact_uri", "resource_contents"]

_SCHEME = "ringfence://runs/"


def artifact_uri(run_id: str, path: str) -> str:
    """The URI of artifact `path` of run `run_id` (the path's segments percent-encoded)."""
    return f"{_SCHEME}{quote(run_id, safe='')}/artifacts/{quote(path, safe='/')}"


def parse_artifact_uri(uri: str, run_id: str) -> str | None:
    """The artifact path `uri` names in run `run_id`; None when it is not one of that run's (a
    session reads its own run's artifacts only)."""
    prefix = f"{_SCHEME}{quote(run_id, safe='')}/artifacts/"
    if not uri.startswith(prefix) or len(uri) == len(prefix):
        return None
    return unquote(uri[len(prefix):])


def resource_contents(uri: str, data: bytes) -> types.TextResourceContents | types.BlobResourceContents:
    """UTF-8 text as text, anything else as base64 (with the MIME type the name suggests)."""
    mime = mimetypes.guess_type(uri)[0]
    try:
        return types.TextResourceContents(uri=uri, mime_type=mime or "text/plain", text=data.decode("utf-8"))
    except UnicodeDecodeError:
        return types.BlobResourceContents(uri=uri, mime_type=mime or "application/octet-stream",
                                          blob=base64.b64encode(data).decode("ascii"))
