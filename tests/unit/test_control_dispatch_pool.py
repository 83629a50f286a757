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


def test_a_batch_announces_its_reads_to_the_sandbox_before_they_run(tmp_path):
    """Several reads: the sandbox hears of all of them (expect) before the first runs, with the
    profile and pool eligibility each will ask for, so a warm pool makes for them ahead. A lone
    read and the writes are not announced (nothing to make ahead of: they run one at a time)."""
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("echo", {"text": "a"}), ("echo", {"text": "b"}), ("echo", {"text": "c"}),
             ("write_note", {"name": "n", "text": "x"}))
    assert len(h.backend.expected) == 1
    announced = h.backend.expected[0]
    reads = [r for r in h.backend.requests if r.call_id.split(".")[0] in ("c1", "c2", "c3")]
    assert len(announced) == 3 and len(reads) == 3
    assert all(a.profile == r.profile and a.warm == r.warm and a.run_id == r.run_id
               for a, r in zip(announced, reads, strict=True))
    h.submit(run, ("echo", {"text": "d"}))
    assert len(h.backend.expected) == 1
