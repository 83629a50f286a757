"""latency_specialist: the specialist for latency tickets. Receives exactly {incident, service}.

result: a `fixture:` evidence locator naming the latency fixture of the service, for review.
A service it has no fixture for is an `invalid` tool error (the ticket becomes worker_error).
"""

from ringfence_tool import ToolError

FIXTURES = {"checkout": "fixture:L1", "payments": "fixture:L2", "search": "fixture:L3"}


def run(arguments, context):
    service = arguments.get("service")
    if service not in FIXTURES:
        raise ToolError("invalid", f"no latency fixture for service {service!r}")
    return FIXTURES[service]
