"""route_symptom: the supervisor's router. Sees only the symptom; answers a route name.

arguments: {"symptom": "..."}
result:    "latency" | "errors" | "capacity" | "unclassified"

Keyword rules, first match wins. "unclassified" is not a route of any taxonomy: the server
escalates such a ticket to a person instead of guessing.
"""

RULES = (
    ("latency", ("slow", "latency", "timeout", "p99", "lag")),
    ("errors", ("error", "5xx", "exception", "failing", "crash")),
    ("capacity", ("disk", "memory", "capacity", "quota", "full")),
)


def run(arguments, context):
    symptom = str(arguments.get("symptom", "")).lower()
    for route, words in RULES:
        if any(word in symptom for word in words):
            return route
    return "unclassified"
