"""`ringfence demo plan` and `ringfence demo routing`: the two platform patterns, end to end.

Each starts a real control plane on a loopback port (the embedded defaults, a temporary state
directory, the Docker engine's sandboxes) and drives it with the SDK's Client, as a user would:

    plan      the executor (demo-agent-token) runs a one-step evidence plan; the verifier
              (demo-verifier-token) checks the report against its own evidence store
              -> steps=1 verified=true remediation=none
    routing   an agent routes a ticket; the router sees only the symptom, the latency
              specialist only the incident and the service
              -> status=review route=latency evidence=fixture:L1

The narration goes to stderr; stdout is the one closing line, byte for byte.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ringfence import Client

AGENT, VERIFIER = "demo-agent-token", "demo-verifier-token"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _server(workdir: Path | None) -> Iterator[str]:
    """A control plane on the embedded defaults; its address. Everything goes with it."""
    from ringfence_server.control.api.background import BackgroundServer
    from ringfence_server.control.api.serve import pool_settings, workspaces
    from ringfence_server.control.config import load_config
    from ringfence_server.control.orchestration import Orchestrator
    from ringfence_server.control.store import open_store
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.pinned_images import load_lock

    with contextlib.ExitStack() as es:
        if workdir is None:
            workdir = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="ringfence-demo-")))
        config = load_config(overrides={"state_dir": str(Path(workdir) / "state")})
        lock = load_lock()
        backend = DockerBackend(lock=lock, pool=pool_settings(config))  # as `ringfence serve` runs
        es.callback(backend.close)
        store = open_store(config.db_path)
        es.callback(store.close)
        # Workspaces (the coding demo's runs ask for one), scoped to this demo's own store.
        orchestrator = Orchestrator.from_config(config, backend, store,
                                                workspaces=workspaces(backend, lock, str(config.db_path)))
        es.callback(orchestrator.close)
        server = es.enter_context(BackgroundServer(orchestrator, config))
        yield server.address


def plan(workdir: Path | None = None) -> int:
    with _server(workdir) as address, Client(address, AGENT) as agent, Client(address, VERIFIER) as verifier:
        ref = "checkout/p99-latency"
        _say(f"executor writes its evidence:    {ref} = high   (store: executor)")
        agent.put_evidence("executor", ref, "high")
        _say(f"verifier writes its own evidence: {ref} = high   (store: verifier; the agent's token cannot)")
        verifier.put_evidence("verifier", ref, "high")
        report = agent.run_evidence_plan([("p99", ref)], max_steps=1)
        for c in report.claims:
            _say(f"executor's report:  {c.key}  {c.evidence_ref}  -> {c.claim} (revision {c.revision}, "
                 f"read by assess_evidence in a sandbox, run {report.run_id})")
        verdict = verifier.verify_report(report.plan_id, report.claims)
        _say(f"verifier's verdict: assessment {verdict.assessment}: {verdict.reason} (run {verdict.run_id})")
        line = (f"steps={len(report.claims)} verified={str(verdict.verified).lower()} "
                f"remediation={verdict.remediation}")
    print(line, flush=True)
    return 0 if line == "steps=1 verified=true remediation=none" else _unexpected(line)


def routing(workdir: Path | None = None) -> int:
    with _server(workdir) as address, Client(address, AGENT) as agent:
        ticket = ("T-1001", "INC-4471", "checkout", "checkout p99 latency is up, pages are slow")
        _say(f"ticket {ticket[0]}: incident {ticket[1]}, service {ticket[2]}, symptom {ticket[3]!r}")
        decision = agent.route_ticket(*ticket)
        _say(f"decision v{decision.version} under {decision.correlation_id}: {decision.reason} "
             f"(router {decision.router_version}, specialist {decision.specialist_version}, run {decision.run_id})")
        again = agent.route_ticket(*ticket)
        _say(f"the same ticket again: {'the recorded decision, nothing re-run' if again.replayed else 'RE-ROUTED'}")
        line = f"status={decision.status} route={decision.route} evidence={decision.evidence}"
    print(line, flush=True)
    ok = line == "status=review route=latency evidence=fixture:L1" and again.replayed
    return 0 if ok else _unexpected(line)


def _unexpected(line: str) -> int:
    print(f"UNEXPECTED: {line}", file=sys.stderr)
    return 1
