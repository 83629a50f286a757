"""write_note: a mutating demo tool. Writes a note under /tmp, returns the idempotency key.

arguments: {"name": "[a-z0-9_-]{1,64}", "text": "..."}. The key is what a real receiver would
use to deduplicate a retried effect.
"""

import os
import re

from ringfence_tool import ToolError

NOTES_DIR = "/tmp/notes"
NAME = re.compile(r"[a-z0-9_-]{1,64}")
MAX_TEXT = 64 * 1024


def run(arguments, context):
    name, text = arguments.get("name"), arguments.get("text", "")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ToolError("invalid", "name must match [a-z0-9_-]{1,64}")
    if not isinstance(text, str) or len(text.encode()) > MAX_TEXT:
        raise ToolError("invalid", f"text must be a string of at most {MAX_TEXT} bytes")
    os.makedirs(NOTES_DIR, exist_ok=True)
    path = os.path.join(NOTES_DIR, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return {"path": path, "bytes": len(text.encode()), "idempotency_key": context.get("idempotency_key")}
