"""The approval lifecycle (step 6): requested for an ASK verdict, decided by a person who did
not propose the call, withdrawn by the one who did (or an admin) while nobody has decided yet,
expired when its time is up, used once by the dispatch it authorizes.

Every transition is an event, so a restart finds each approval where it was; an approved call
that was not dispatched yet is resumed from the log alone (ringfence_server.control.orchestration.recovery).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace

from ringfence.errors import FailedPrecondition, NotFound, PermissionDenied
from ringfence.model import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Observation,
    ObservationStatus,
    Principal,
    Role,
    RunOutcome,
)
from ringfence_server.control.approvals import approval_digest, new_approval_id
from ringfence_server.control.config import Limits
from ringfence_server.control.events import (
    ApprovalDecided,
    ApprovalExpired,
    ApprovalRequested,
    ApprovalUsed,
    ApprovalWithdrawn,
    DispatchStarted,
    GrantAdded,
)
from ringfence_server.control.orchestration import spans
from ringfence_server.control.orchestration.admission import Decision
from ringfence_server.control.orchestration.dispatch import Admitted, Dispatcher
from ringfence_server.control.orchestration.runs import BusyElsewhere, RunRepository
from ringfence_server.control.policy import PolicyEngine
from ringfence_server.control.registry import Registry, ToolManifest
from ringfence_server.control.state import PendingCall, RunState
from ringfence_server.control.validation import signature
from ringfence_server.sandbox.pinned_images import lock_for

_tracer = trace.get_tracer("ringfence.control")


def approval_key(approval_id: str) -> str:
    """The store key (ringfence_server.control.store) an approval id is claimed under: any instance finds its run."""
    return f"approval:{approval_id}"


def locked_image_ids(images_dir: Path | None = None) -> Callable[[str], str]:
    """An image name's pinned ID, as dispatch will resolve it (the config's images dir over the
    built-in images), cached per name: what an approval's digest binds the call to."""
    cache: dict[str, str] = {}

    def image_id(name: str) -> str:
        if name not in cache:
            try:
                cache[name] = lock_for(images_dir).image_id(name)
            except Exception:  # noqa: BLE001 - no lock: the digest says so, dispatch will refuse
                cache[name] = f"unpinned:{name}"
        return cache[name]

    return image_id


class ApprovedCallRunner(Protocol):
    """What the desk needs to run a call once it is approved (ringfence_server.control.orchestration.execution)."""

    def deadline_passed(self, state: RunState) -> tuple[RunOutcome, str] | None:
        """The outcome and reason to end the run with when its deadline has passed, else None."""
        ...

    def execute(self, state: RunState, admitted: list[Admitted], ctx: otel_context.Context) -> dict[str, Observation]:
        """Each call's observation, by call id (the run ends when dispatch cannot finish them)."""
        ...


class ApprovalDesk:
    """Approvals from request to use; `resume` hands an approved call to `execution`."""

    def __init__(self, *, repo: RunRepository, dispatcher: Dispatcher, registry: Registry, policy: PolicyEngine,
                 limits: Limits, clock: Callable[[], float], image_digest: Callable[[str], str],
                 execution: ApprovedCallRunner) -> None:
        self.repo = repo
        self.dispatcher = dispatcher
        self.registry = registry
        self.policy = policy
        self.limits = limits
        self._clock = clock
        self._image_digest = image_digest
        self._execution = execution

    def digest(self, state: RunState, manifest: ToolManifest, arguments: Mapping[str, Any]) -> str:
        return approval_digest(tenant=state.tenant, run_id=state.run_id, tool=manifest.name, arguments=arguments,
                               image_digest=self._image_digest(manifest.image), policy_version=self.policy.version)

    def request(self, state: RunState, d: Decision, proposed_by: str) -> Observation:
        """A durable request bound to the exact call, expiring."""
        assert d.manifest is not None and d.arguments is not None
        now = self._clock()
        approval_id = new_approval_id()
        path = (*d.path, "approval:requested")
        self.repo.append(state, ApprovalRequested(
            approval_id=approval_id, call_id=d.call.call_id, tool=d.manifest.name,
            arguments=dict(d.arguments), digest=self.digest(state, d.manifest, d.arguments),
            created_at=now, expires_at=now + self.limits.approval_ttl_s, mutates=d.manifest.mutates,
            idempotency_key=self.dispatcher.key_for(state, d.manifest, d.arguments, d.call.idempotency_key),
            client_key=d.call.idempotency_key if d.manifest.mutates else None,
            image_digest=self._image_digest(d.manifest.image), policy_version=self.policy.version,
            verdict_path=path, proposed_by=proposed_by), keys=[approval_key(approval_id)])
        return self.repo.observe(state, Observation(d.call.call_id, d.manifest.name, ObservationStatus.PENDING_APPROVAL,
                                                    False, error="waiting for approval", verdict_path=path,
                                                    approval_id=approval_id))

    def request_reconciliation(self, state: RunState, started: DispatchStarted, why: str) -> Observation:
        """A task for approvers: this mutating call (`started`, its dispatch) was interrupted
        mid-effect and nobody can look it up. Approve = it did not happen, run it once now;
        decline = leave it uncertain."""
        now = self._clock()
        approval_id = new_approval_id()
        call_id = started.call_id
        manifest = self.registry.get(started.tool)
        arguments = dict(started.arguments)
        digest = self.digest(state, manifest, arguments) if manifest is not None else "unknown-tool"
        path = (*started.verdict_path, "recovery:reconcile")
        self.repo.append(state, ApprovalRequested(
            approval_id=approval_id, call_id=call_id, tool=started.tool, arguments=arguments,
            digest=digest, created_at=now, expires_at=now + self.limits.approval_ttl_s, mutates=True,
            idempotency_key=started.idempotency_key, client_key=started.client_key,
            image_digest=self._image_digest(manifest.image) if manifest is not None else "",
            policy_version=self.policy.version, verdict_path=path, proposed_by=None,
            kind=ApprovalKind.RECONCILE, reason=why), keys=[approval_key(approval_id)])
        return self.repo.observe(state, Observation(
            call_id, started.tool, ObservationStatus.PENDING_APPROVAL, True,
            error=f"interrupted while it ran and {why}: whether it took effect is unknown; an approver decides "
                  "(approve = it did not happen, run it once; decline = leave it)",
            error_class="reconciliation_needed", verdict_path=path, approval_id=approval_id,
            attempts=state.attempts.get(call_id, 0)))

    @staticmethod
    def unresolved(pending: PendingCall, error: str, error_class: str | None, step: str) -> Observation:
        """A pending call that will not run now: declined (CALL: it never ran), or left uncertain
        (RECONCILE: it may have run, nobody knows)."""
        if pending.kind is ApprovalKind.RECONCILE:
            return Observation(pending.call_id, pending.tool, ObservationStatus.EXECUTED, True,
                               error=f"left uncertain: {error}", error_class="uncertain",
                               verdict_path=(*pending.verdict_path, step), approval_id=pending.approval_id)
        return Observation(pending.call_id, pending.tool, ObservationStatus.DECLINED, False, error=error,
                           error_class=error_class, verdict_path=(*pending.verdict_path, step),
                           approval_id=pending.approval_id)

    def refusal(self, pending: PendingCall, approval: Approval) -> Observation | None:
        """The observation of a pending call whose approval ended without letting it run
        (declined, withdrawn, expired), built from the approval as the log folds it; None while
        the call may still run. Written right after the approval's event, or by recovery when a
        crash came in between (the same observation either way)."""
        by = approval.decided_by or "?"
        because = f": {approval.reason}" if approval.reason else ""
        match approval.status:
            case ApprovalStatus.DECLINED:
                return self.unresolved(pending, f"declined by {by}{because}", None, "approval:declined")
            case ApprovalStatus.WITHDRAWN:
                return self.unresolved(pending, f"withdrawn by {by}{because}", "approval_withdrawn",
                                       "approval:withdrawn")
            case ApprovalStatus.EXPIRED:
                return self.unresolved(pending, "approval expired", "approval_expired", "approval:expired")
            case _:
                return None

    def _refuse(self, state: RunState, pending: PendingCall) -> Observation:
        """Write the refusal of `pending`, whose approval (in `state`) has just ended it."""
        refused = self.refusal(pending, state.approvals[pending.approval_id])
        assert refused is not None, "called right after the approval's declining event"
        return self.repo.observe(state, refused)

    def sweep_expired(self, state: RunState) -> None:
        """Expire pending approvals whose time is up (an event, so replay agrees)."""
        now = self._clock()
        for approval in list(state.approvals.values()):
            if approval.status is ApprovalStatus.PENDING and now >= approval.expires_at:
                pending = state.pending.get(approval.call_id)
                self.repo.append(state, ApprovalExpired(approval_id=approval.approval_id))
                spans.approval_wait(spans.run_context(state), approval, "expired", now)
                if pending is not None:
                    self._refuse(state, pending)

    def try_sweep(self, state: RunState) -> None:
        """Expire what is due, unless a batch holds the run (it sweeps itself; readers never wait)."""
        now = self._clock()
        if not any(a.status is ApprovalStatus.PENDING and now >= a.expires_at for a in state.approvals.values()):
            return  # nothing due: no lease round trip for a reader
        try:
            with self.repo.writing(state, wait=False):
                if not state.finished:
                    self.sweep_expired(state)
        except BusyElsewhere:
            pass

    def find(self, p: Principal, approval_id: str) -> RunState:
        """The run of a tenant's approval (NotFound for anyone else's)."""
        state = self.repo.approval_run(p.tenant, approval_id)
        if state is None:
            # Requested through another instance, or before a restart: the store knows its run.
            holder = self.repo.store.lookup_key(approval_key(approval_id))
            state = self.repo.by_key(p.tenant, holder[0]) if holder else None
        if state is None or approval_id not in state.approvals:
            raise NotFound(f"approval {approval_id!r} not found")
        return state

    def decide(self, p: Principal, state: RunState, approval_id: str, approve: bool, reason: str, *,
               remember: bool = False, digest: str | None = None) -> Approval:
        """Under the caller's writing(state). Every decision that cannot apply is refused the
        same way (FailedPrecondition), never answered OK with a status to inspect."""
        with self.repo.writing(state):
            if state.finished:
                raise FailedPrecondition(f"run {state.run_id} is finished ({state.outcome})")
            self.sweep_expired(state)
            approval = state.approvals[approval_id]
            if approval.status is not ApprovalStatus.PENDING:
                raise FailedPrecondition(f"approval {approval_id} is {approval.status}: nothing to decide")
            if digest is not None and digest != approval.digest:
                raise FailedPrecondition(f"approval {approval_id} is for another call than the one you saw "
                                         f"(digest {approval.digest[:16]}..., not {digest[:16]}...): look again")
            pending_now = state.pending[approval.call_id]
            manifest = self.registry.get(pending_now.tool)
            if approve and (manifest is None or self.digest(state, manifest, pending_now.arguments) != approval.digest):
                raise FailedPrecondition(f"approval {approval_id} no longer matches its call (the policy, the image "
                                         "or the tool changed since it was asked): it cannot be approved")
            pending = state.pending[approval.call_id]
            if pending.proposed_by is not None and pending.proposed_by == p.subject:
                # Four eyes: an admin holds the agent and approver roles, and would otherwise
                # approve what it proposed itself.
                raise PermissionDenied(f"{p.subject} proposed this call and cannot decide its approval")
            self.repo.append(state, ApprovalDecided(approval_id=approval_id, approved=bool(approve), by=p.subject,
                                                    reason=reason or "", remember=bool(remember)))
            if approve and remember and pending.kind is ApprovalKind.CALL:
                # The exact call (tool + canonical arguments) is granted for the rest of the run:
                # asked again, it is allowed without a second ask (and deduplicated if it mutates).
                self.repo.append(state, GrantAdded(
                    tool=pending.tool, arguments=dict(pending.arguments),
                    signature=signature(pending.tool, pending.arguments), by=p.subject, approval_id=approval_id))
            spans.approval_wait(spans.run_context(state), state.approvals[approval_id],
                                "approved" if approve else "declined", self._clock())
            if not approve:
                self._refuse(state, pending)
            else:
                self.resume(state, pending)
            return state.approvals[approval_id]

    def withdraw(self, p: Principal, state: RunState, approval_id: str, reason: str) -> Observation:
        """Take back a pending call before anyone decides it: the call never runs, and its
        observation (returned) is declined with "approval:withdrawn" on its path.

        Only the principal that proposed the call, or an admin, may (PermissionDenied): an
        agent of the tenant must not cancel another agent's call. A reconciliation task is
        the approvers' (the call may have run; only a person may say), and an approval no
        longer pending has nothing left to withdraw: both FailedPrecondition, as a finished run."""
        with self.repo.writing(state):
            if state.finished:
                raise FailedPrecondition(f"run {state.run_id} is finished ({state.outcome})")
            self.sweep_expired(state)  # an approval whose time is up is expired, not withdrawable
            approval = state.approvals[approval_id]
            if approval.kind is ApprovalKind.RECONCILE:
                raise FailedPrecondition(f"approval {approval_id} is a reconciliation task: only an approver "
                                         "may resolve it")
            if approval.status is not ApprovalStatus.PENDING:
                raise FailedPrecondition(f"approval {approval_id} is {approval.status}: nothing to withdraw")
            pending = state.pending[approval.call_id]
            if p.role is not Role.ADMIN and pending.proposed_by != p.subject:
                raise PermissionDenied(f"{p.subject} did not propose the call of approval {approval_id} "
                                       "and cannot withdraw it")
            self.repo.append(state, ApprovalWithdrawn(approval_id=approval_id, by=p.subject, reason=reason))
            spans.approval_wait(spans.run_context(state), state.approvals[approval_id], "withdrawn", self._clock())
            return self._refuse(state, pending)

    def resume(self, state: RunState, pending: PendingCall) -> Observation:
        """Dispatch an approved call, re-deriving everything from the log."""
        approval = state.approvals[pending.approval_id]
        manifest = self.registry.get(pending.tool)
        path = pending.verdict_path
        if manifest is None or self.digest(state, manifest, pending.arguments) != approval.digest:
            # The world changed since the approver looked (policy, image, tool): not this approval.
            return self.repo.observe(state, Observation(
                pending.call_id, pending.tool, ObservationStatus.DECLINED, False,
                error="the approval no longer matches this call (policy, image or tool changed)",
                error_class="approval_mismatch", verdict_path=(*path, "approval:mismatch"),
                approval_id=approval.approval_id))
        stop = self._execution.deadline_passed(state)
        if stop is not None:
            self.repo.finish(state, *stop)
            return state.trajectory[pending.call_id]
        if approval.status is ApprovalStatus.APPROVED:
            self.repo.append(state, ApprovalUsed(approval_id=approval.approval_id))
        item = Admitted(pending.call_id, manifest, dict(pending.arguments), (*path, "approval:approved", "admitted"),
                        approval_id=approval.approval_id, client_key=pending.client_key,
                        recorded_key=pending.idempotency_key)
        # After the approval_wait span (same parent, later in time): admission, wait, execution.
        with _tracer.start_as_current_span("batch", context=spans.run_context(state),
                                           attributes={"ringfence.run_id": state.run_id, "ringfence.resumed": True,
                                                       "ringfence.approval_id": approval.approval_id}):
            ctx = otel_context.get_current()
            return self._execution.execute(state, [item], ctx)[pending.call_id]
