"""Labels on every Docker object ringfence creates, and the identity of this server instance.

Every container, network and volume carries the product label, so leftovers can be listed and
reaped by label; the instance label names the process that owns it, so the reaper can tell the
orphans of a dead instance from the live calls of a running one.
"""

from __future__ import annotations

import os
import socket
import time
import uuid

PRODUCT = "ringfence"
PRODUCT_LABEL = "ringfence.product"
INSTANCE_LABEL = "ringfence.instance"  # host:pid:uuid of the owning process
HOST_LABEL = "ringfence.host"
PID_LABEL = "ringfence.pid"
RUN_LABEL = "ringfence.run"
CALL_LABEL = "ringfence.call"
DEADLINE_LABEL = "ringfence.deadline"  # unix time after which the object is an orphan
# call | pool | network | proxy | test | workspace | workspace-view | workspace-keeper |
# workspace-stray (ringfence_server.sandbox.workspace, ringfence_server.sandbox.hardening)
PURPOSE_LABEL = "ringfence.purpose"

# Set by the test suite so every object a test run creates can be removed by one label.
TEST_SESSION_ENV = "RINGFENCE_TEST_SESSION"
TEST_SESSION_LABEL = "ringfence.test-session"

_INSTANCE = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def instance_id() -> str:
    return _INSTANCE


def base_labels(purpose: str, deadline_s: float | None = None) -> dict[str, str]:
    labels = {
        PRODUCT_LABEL: PRODUCT,
        INSTANCE_LABEL: _INSTANCE,
        HOST_LABEL: socket.gethostname(),
        PID_LABEL: str(os.getpid()),
        PURPOSE_LABEL: purpose,
    }
    if deadline_s is not None:
        labels[DEADLINE_LABEL] = str(int(time.time() + deadline_s))
    session = os.environ.get(TEST_SESSION_ENV)
    if session:
        labels[TEST_SESSION_LABEL] = session
    return labels
