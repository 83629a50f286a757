"""Admission: the first six steps of a call's path (docs/ARCHITECTURE.md), for every call of a
batch, as a pure function of the batch and what the run has seen. Nothing here writes,
dispatches or reads a clock: the same batch against the same state gives the same verdicts,
which is what lets the log record them before anything runs.

    registry -> argument validation -> action guardrails (secrets, loop) -> resource policy
    (with the run's workspace) -> contextual policy (ALLOW / ASK / DENY)

The order is the safety property: a resource denial is final before any rule is consulted,
and a rule can only tighten what the resources allow.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ringfence.model import ObservationStatus, ProposedCall
from ringfence_server.control import guardrails
from ringfence_server.control.config import Config, Limits
from ringfence_server.control.policy import PolicyEngine, Verdict
from ringfence_server.control.registry import Registry, ToolManifest
from ringfence_server.control.resource_policy import check_resources

# Defined beside the event types (the log records it and the reducer reads it); named here too,
# where verdicts are made.
from ringfence_server.control.state import AdmissionVerdict as AdmissionVerdict
from ringfence_server.control.state import RunState
from ringfence_server.control.validation import signature, validate_arguments


@dataclass(frozen=True)
class Decision:
    """The admission result for one call."""

    call: ProposedCall
    verdict: AdmissionVerdict
    path: tuple[str, ...]
    """Every step crossed, in order (`registry:ok`, `validation:ok`, ...): the log's record."""

    status: ObservationStatus | None = None
    """The terminal observation status of a refused call; None when admitted or asked."""

    reason: str = ""
    error_class: str | None = None
    manifest: ToolManifest | None = None
    arguments: Mapping[str, Any] | None = None
    """Canonical arguments, once validated."""

    signature: str | None = None
    """tool + canonical arguments, once the call reached the loop detector."""

    halt_kind: str = ""

    @property
    def admitted(self) -> bool:
        return self.verdict is AdmissionVerdict.ALLOW


@dataclass(frozen=True)
class AdmissionContext:
    """What admission may look at: the configuration, and the run's grants and history."""

    registry: Registry
    config: Config
    policy: PolicyEngine
    grants: frozenset[str]
    seen_signatures: Mapping[str, int] = field(default_factory=dict)
    workspace: bool = False
    """The run has a live workspace (made at its start, not yet removed)."""

    @property
    def limits(self) -> Limits:
        return self.config.limits


@dataclass(frozen=True)
class AdmissionRules:
    """The server's side of admission (tools, configuration, policy), fixed for its lifetime."""

    registry: Registry
    config: Config
    policy: PolicyEngine

    def context_for(self, state: RunState) -> AdmissionContext:
        """The context a batch of this run is judged in: these rules, with the run's grants,
        the call signatures it has seen, and whether its workspace is live. A snapshot: the
        batch's own events do not change the verdicts of its other calls."""
        return AdmissionContext(registry=self.registry, config=self.config, policy=self.policy,
                                grants=frozenset(state.grants), seen_signatures=dict(state.signatures),
                                workspace=state.live_volume is not None)


def admit_batch(calls: Sequence[ProposedCall], ctx: AdmissionContext) -> list[Decision]:
    """Every call's verdict, in batch order, before any call runs. Repeats within the batch
    count towards the loop detector like repeats across batches."""
    counts: Counter[str] = Counter()
    return [_admit(call, ctx, counts) for call in calls]


def _admit(call: ProposedCall, ctx: AdmissionContext, counts: Counter[str]) -> Decision:
    path: list[str] = []
    # What is known about the call so far, carried into its Decision from the step that knows it.
    manifest: ToolManifest | None = None
    canon: dict[str, Any] | None = None
    sig: str | None = None

    def refuse(verdict: AdmissionVerdict, status: ObservationStatus | None, reason: str, step: str, *,
               error_class: str | None = None, halt_kind: str = "") -> Decision:
        return Decision(call, verdict, tuple([*path, step]), status=status, reason=reason, error_class=error_class,
                        manifest=manifest, arguments=canon, signature=sig, halt_kind=halt_kind)

    # 1 registry
    manifest = ctx.registry.get(call.tool)
    if manifest is None:
        return refuse(AdmissionVerdict.UNKNOWN, ObservationStatus.UNKNOWN_TOOL, f"unknown tool {call.tool!r}",
                      "registry:unknown", error_class="unknown_tool")
    path.append("registry:ok")
    # 2 argument validation
    canon, errs = validate_arguments(manifest, call.arguments, max_bytes=ctx.limits.max_argument_bytes)
    if canon is None:
        # jsonschema quotes the offending value: redact, a secret may be what failed to validate.
        reason = guardrails.redact("; ".join(f"{v.field}: {v.description}" for v in errs)[:2000])
        return refuse(AdmissionVerdict.INVALID, ObservationStatus.DENIED, reason, "validation:invalid",
                      error_class="invalid_arguments")
    path.append("validation:ok")
    # 3 action guardrails: secrets, then the loop detector
    g = guardrails.check_arguments(canon)
    if g.action is guardrails.Action.HALT:
        return refuse(AdmissionVerdict.HALT, None, g.reason, f"guardrail:halt:{g.kind}", halt_kind=g.kind)
    if g.action is guardrails.Action.BLOCK:
        return refuse(AdmissionVerdict.BLOCK, ObservationStatus.BLOCKED, g.reason, f"guardrail:block:{g.kind}",
                      error_class="secret")
    # Only calls that reach the loop detector are counted (and logged with their signature).
    sig = signature(manifest.name, canon)
    previous = ctx.seen_signatures.get(sig, 0) + counts[sig]
    counts[sig] += 1
    loop = guardrails.check_loop(previous, ctx.limits.loop_threshold)
    if loop.action is guardrails.Action.HALT:
        return refuse(AdmissionVerdict.HALT, None, loop.reason, "guardrail:halt:loop", halt_kind="loop")
    path.append("guardrail:pass")
    # 4 resource policy, before any rule; its DENY is final
    r = check_resources(manifest, canon, ctx.config.inputs, ctx.config.policy.egress_for(manifest.name))
    if not r.allowed:
        return refuse(AdmissionVerdict.DENY, ObservationStatus.DENIED, r.reason, "resource:deny",
                      error_class="resource")
    path.append("resource:ok")
    # 4b the run's workspace: a tool that uses one cannot run without it (nothing to ask about)
    if manifest.workspace is not None:
        if not ctx.workspace:
            return refuse(AdmissionVerdict.DENY, ObservationStatus.DENIED,
                          f"{manifest.name} uses the run's workspace, and this run has none (start the run with "
                          "a workspace)", "workspace:none", error_class="no_workspace")
        path.append(f"workspace:{manifest.workspace}")
    # 5 contextual policy
    decision = ctx.policy.decide(manifest, canon, ctx.grants)
    path.extend(f"policy:{x}" for x in decision.path)
    if decision.verdict is Verdict.DENY:
        return Decision(call, AdmissionVerdict.DENY, tuple(path), status=ObservationStatus.DENIED,
                        reason=decision.reason, error_class="policy", manifest=manifest, arguments=canon,
                        signature=sig)
    if decision.verdict is Verdict.ASK:
        return Decision(call, AdmissionVerdict.ASK, tuple(path), reason=decision.reason, manifest=manifest,
                        arguments=canon, signature=sig)
    return Decision(call, AdmissionVerdict.ALLOW, tuple([*path, "admitted"]), manifest=manifest, arguments=canon,
                    signature=sig)
