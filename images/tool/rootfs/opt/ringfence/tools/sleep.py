"""sleep: sleeps `seconds` (for wall-time limit tests)."""

import time

from ringfence_tool import ToolError

MAX_S = 3600


def run(arguments, context):
    s = arguments.get("seconds", 1)
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s <= MAX_S:
        raise ToolError("invalid", f"seconds must be a number in [0, {MAX_S}]")
    time.sleep(s)
    return {"slept": s}
