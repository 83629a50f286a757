"""fail: raises the error class it is given, for tests of retries and classification.

arguments: {"class": "invalid|transient|rate_limited|fatal|crash", "message"?, "retry_after_s"?}
"crash" raises a plain exception (which the runner reports as fatal).
"""

from ringfence_tool import ToolError


def run(arguments, context):
    cls = arguments.get("class", "fatal")
    message = arguments.get("message", f"requested {cls} failure")
    if cls == "crash":
        raise RuntimeError(message)
    raise ToolError(cls, message, retry_after_s=arguments.get("retry_after_s"))
