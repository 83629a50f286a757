"""A tool the operator opted out of the pool ([pool] exclude) always gets a container created
for its call: the dispatcher says so on each request (SandboxRequest.warm); every other tool's
requests may be pooled."""

from __future__ import annotations

import dataclasses

from control_support import Harness

from ringfence_server.control.config import PoolConfig


def test_excluded_tools_are_never_warm_and_the_others_may_be(tmp_path):
    h = Harness(tmp_path)
    h.config = dataclasses.replace(h.config, pool=PoolConfig(exclude=("write_note",)))
    h.orch = h.new_orchestrator()
    run = h.run()
    h.submit(run, ("echo", {"text": "a"}), ("write_note", {"name": "n", "text": "x"}))
    warm = {r.call_id.split(".")[0]: r.warm for r in h.backend.requests}
    assert warm == {"c1": True, "c2": False}
