"""Approval binding (admission step 6).

An approval is for one exact call: its digest covers the tenant, the run, the tool, the
canonical arguments, the image digest the call will run on and the policy version. The
orchestrator recomputes the digest when it resumes the call; any difference (other arguments,
a rebuilt image, a changed policy) and the approval does not apply. Approvals expire and are
used once; their lifecycle lives in the run's events (see ringfence_server.control.state).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from ringfence_server.control.validation import canonical_json, sha256_hex


def approval_digest(*, tenant: str, run_id: str, tool: str, arguments: Mapping[str, Any],
                    image_digest: str, policy_version: str) -> str:
    return sha256_hex("approval/v1", tenant, run_id, tool, canonical_json(arguments), image_digest,
                      policy_version)


def new_approval_id() -> str:
    return "apr-" + uuid.uuid4().hex[:20]
