"""What a tool module may import from the runner: the classified error it can raise.

A tool's `run(arguments, context)` returns JSON-able content, or raises ToolError with one of
CLASSES. Any other exception is reported as "fatal" (never retried).
"""

CLASSES = ("invalid", "transient", "rate_limited", "fatal")


class ToolError(Exception):
    def __init__(self, cls, message, retry_after_s=None):
        if cls not in CLASSES:
            raise ValueError(f"error class must be one of {CLASSES}, not {cls!r}")
        if retry_after_s is not None and (
            isinstance(retry_after_s, bool) or not isinstance(retry_after_s, (int, float)) or retry_after_s < 0
        ):
            raise ValueError("retry_after_s must be a non-negative number or None")
        super().__init__(message)
        self.cls = cls
        self.message = str(message)
        self.retry_after_s = retry_after_s
