"""A sandbox backend that runs each call on an attached sandbox worker instead of this host's
engine: what `ringfence serve` uses when `[workers] enabled`.

To dispatch it is a backend like the Docker one (SandboxBackend): `run` returns a classified
SandboxResult, so retries, reconciliation and the log work exactly as for a local call. What
changes is where the container runs, and what a lost call means:

- no worker can take the call within `place_timeout_s` (none attached, all busy, none with the
  image or runtime): START_FAILED, nothing ran (transient: the retry policy tries again);
- the worker refused the envelope: START_FAILED with its reason (it ran nothing);
- the worker was lost while the call was out (its stream ended, it was fenced, it attached
  again) or no report came by the envelope's deadline: UNCERTAIN, it may have run. Dispatch
  retries a read (on whichever worker placement picks: the retry is a new attempt, a new
  logical call) and reconciles a mutation exactly as after a control plane crash;
- the worker's report says uncertain (its restart recovery could not say how the call ended):
  UNCERTAIN likewise.

The tool's output reaches the call's live output listener at the end, in one piece, not as it is
written (the stream carries whole results), so the run's call_output events hold the same bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from opentelemetry import propagate

from ringfence_server.control.workers.placement import Need
from ringfence_server.control.workers.registry import Outcome, WorkerRegistry
from ringfence_server.control.workers.sealing import NotForWorkers, Sealer, worker_call
from ringfence_server.sandbox.backend import SandboxBackend, SandboxRequest
from ringfence_server.sandbox.errors import EngineError
from ringfence_server.sandbox.pinned_images import Lock
from ringfence_server.sandbox.result import Outcome as SandboxOutcome
from ringfence_server.sandbox.result import SandboxResult

__all__ = ["RemoteBackend"]

log = logging.getLogger("ringfence.workers")

# How long past an envelope's deadline a report is still waited for: the worker's result
# crosses the network after the deadline its container was killed at.
_REPORT_MARGIN_S = 5.0


class RemoteBackend:
    """SandboxBackend over the attached workers (`registry`), sealing with `sealer`."""

    def __init__(self, registry: WorkerRegistry, sealer: Sealer, lock: Lock, *, place_timeout_s: float,
                 start_allowance_s: float, local: SandboxBackend | None = None,
                 tenant_labels: Mapping[str, Mapping[str, str]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.registry = registry
        self._sealer = sealer
        self._lock = lock
        self._place_timeout_s = place_timeout_s
        self._start_allowance_s = start_allowance_s
        self._local = local
        self._tenant_labels = dict(tenant_labels or {})
        self._clock = clock

    def run(self, request: SandboxRequest) -> SandboxResult:
        try:
            call = worker_call(request, self._lock)
        except NotForWorkers:
            if self._local is None:
                raise
            return self._local.run(request)
        labels = self._tenant_labels.get(call.tenant, {})
        need = Need(image_digest=call.image_digest, runtime=call.spec.runtime, egress=call.egress is not None,
                    labels=labels)
        attachment = self.registry.reserve(need, self._place_timeout_s)
        if attachment is None:
            return _not_started(f"no sandbox worker could take the call within {self._place_timeout_s:g} s "
                                f"(image {call.image_digest[:19]}, runtime {call.spec.runtime}"
                                f"{', egress' if call.egress else ''}"
                                f"{''.join(f', {k}={v}' for k, v in sorted(labels.items()))})", call.spec.runtime)
        pending = None
        try:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            placed = self._sealer.seal(call, worker_id=attachment.worker_id,
                                       start_allowance_s=self._start_allowance_s,
                                       traceparent=carrier.get("traceparent", ""))
            pending = self.registry.submit(attachment, placed)
            wait_s = max(0.0, placed.envelope.deadline - self._clock()) + _REPORT_MARGIN_S
            try:
                outcome = pending.future.result(timeout=wait_s)
            except TimeoutError:
                outcome = Outcome("lost", message=f"no report from worker {attachment.worker_id} by the "
                                                  "envelope's deadline")
                if not pending.settle(outcome):
                    outcome = pending.future.result()
        finally:
            self.registry.finish(attachment, pending)
        result = _result(outcome, attachment.worker_id, call.spec.runtime)
        if request.on_output is not None:
            for stream, data in (("stdout", result.stdout), ("stderr", result.stderr)):
                if data:
                    request.on_output(stream, data)
        return result

    def ping(self) -> None:
        if not self.registry.attached():
            raise EngineError("no sandbox worker is attached")
        if self._local is not None:
            self._local.ping()

    def expect(self, requests: list[SandboxRequest]) -> None:
        # The workers' pools fill on their own demand; nothing to announce across the stream yet.
        if self._local is not None:
            self._local.expect(requests)

    def kill_run(self, run_id: str, reason: str) -> int:
        killed = self.registry.kill_run(run_id, reason)
        if self._local is not None:
            killed += self._local.kill_run(run_id, reason)
        return killed

    def end_run(self, run_id: str) -> int:
        self.registry.end_run(run_id)
        return self._local.end_run(run_id) if self._local is not None else 0

    def kill_all(self, reason: str) -> int:
        killed = self.registry.kill_all(reason)
        if self._local is not None:
            killed += self._local.kill_all(reason)
        return killed

    def close(self) -> None:
        if self._local is not None:
            self._local.close()


def _not_started(message: str, runtime: str) -> SandboxResult:
    return SandboxResult(outcome=SandboxOutcome.START_FAILED, exit_code=None, stdout=b"", stderr=b"",
                         stdout_truncated=False, stderr_truncated=False, duration_ms=0, image_id="",
                         runtime=runtime, message=message)


def _result(outcome: Outcome, worker_id: str, runtime: str) -> SandboxResult:
    """The call's result as dispatch classifies it, naming the worker it was placed on (the
    attempt's event records it; the worker's own report cannot say which worker it is)."""
    if outcome.kind == "result" and outcome.result is not None:
        return replace(outcome.result, worker=worker_id)
    if outcome.kind == "refused":
        return replace(_not_started(f"worker {worker_id} refused the call: {outcome.message}", runtime),
                       worker=worker_id)
    what = "could not say how the call ended" if outcome.kind == "uncertain" else "was lost while the call was out"
    return SandboxResult(outcome=SandboxOutcome.UNCERTAIN, exit_code=None, stdout=b"", stderr=b"",
                         stdout_truncated=False, stderr_truncated=False, duration_ms=0, image_id="",
                         runtime=runtime, message=f"worker {worker_id} {what}: {outcome.message}", worker=worker_id)
