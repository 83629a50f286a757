"""`ringfence conformance`: the escape and ceiling battery, run against a user's engine and image.

    run_conformance(client, lock, image="tool", runtime="runc", cases=None) -> Report
    Report.ok, .failed, .table(), .to_json()
    CASES (ringfence_server.conformance.cases): each case's number and title as in docs/escape-battery.md,
        the probes it reads and its check; NOT_INCLUDED: the cases that need the test harness

The probes (probes/, attacks.py) are the battery's own: tests/escape runs the same scripts, with
a red check beside each; here they run in a sandbox made by the real DockerBackend with the
user's pinned image, and each case's check says what the fail-closed outcome is.
"""

from ringfence_server.conformance.cases import CASES, NOT_INCLUDED, TITLES, Case
from ringfence_server.conformance.runner import FAIL, PASS, XFAIL, CaseResult, Report, run_conformance

__all__ = ["CASES", "FAIL", "NOT_INCLUDED", "PASS", "TITLES", "XFAIL", "Case", "CaseResult", "Report",
           "run_conformance"]
