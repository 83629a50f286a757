"""Plan, execute, verify: evidence plans run by the executor and checked by an independent verifier.

    values.py     the plan's values (stdlib only: the SDK decodes into them)
    evidence.py   the two evidence stores (revisioned records; who may write and read which)
    service.py    PlanVerification: validate a plan, run it through the sandboxed evidence tool,
                  verify a report through the verifier's own path, and keep every assessment
"""
