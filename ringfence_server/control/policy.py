"""Contextual policy (admission step 5): exact-call grants, then rules, then risk tightening.

    decide(manifest, arguments, grants) -> PolicyDecision(verdict, path, reason)

- The default is never ALLOW: no matching rule is DENY.
- Among matching rules the most restrictive verdict wins (deny > ask > allow), so adding a rule
  can only narrow what a broader rule permits.
- An exact-call grant (tool + canonical arguments, from the policy file or granted in the run)
  turns the call into ALLOW unless a rule DENIES it.
- Risk metadata tightens ALLOW to ASK, by autonomy level: `supervised` every tool, `standard`
  mutating or irreversible tools, `autonomous` irreversible tools only. Nothing loosens it.

Resource policy (ringfence_server.control.resource_policy) has already run: this module only sees calls whose
resources are inside their roots and allowlists, and cannot overturn a resource DENY.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ringfence_server.control.config import PolicyConfig, RuleConfig, Verdict, tool_matches
from ringfence_server.control.registry import ToolManifest
from ringfence_server.control.validation import canonical_json, sha256_hex, signature

__all__ = ["PolicyDecision", "PolicyEngine", "Verdict", "rule_matches"]

_RANK = {Verdict.ALLOW: 0, Verdict.ASK: 1, Verdict.DENY: 2}


@dataclass(frozen=True)
class PolicyDecision:
    verdict: Verdict
    path: tuple[str, ...]
    """How the verdict was reached, e.g. ("rule[5]:ask", "risk:irreversible->ask")."""
    reason: str = ""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _holds(op: str, operand: Any, present: bool, value: Any) -> bool:
    """One predicate. A missing argument satisfies only `ne` and `not_in` (it is not equal)."""
    if not present:
        return op in ("ne", "not_in")
    if op == "eq":
        # true is not 1 here, whatever Python says.
        if isinstance(value, bool) or isinstance(operand, bool):
            return value is operand
        return bool(value == operand)
    if op == "ne":
        return not _holds("eq", operand, True, value)
    if op in ("lt", "lte", "gt", "gte"):
        if not _number(value):
            return False
        return bool({"lt": value < operand, "lte": value <= operand, "gt": value > operand,
                     "gte": value >= operand}[op])
    if op == "in":
        return any(_holds("eq", o, True, value) for o in operand)
    if op == "not_in":
        return not _holds("in", operand, True, value)
    if op == "matches":
        return isinstance(value, str) and re.fullmatch(operand, value) is not None
    if op == "prefix":
        return isinstance(value, str) and value.startswith(operand)
    return False


def rule_matches(rule: RuleConfig, tool: str, arguments: Mapping[str, Any]) -> bool:
    if not tool_matches(rule.tool, tool):
        return False
    for arg, preds in rule.when.items():
        present = arg in arguments
        value = arguments.get(arg)
        if not all(_holds(op, operand, present, value) for op, operand in preds.items()):
            return False
    return True


def _tighten(verdict: Verdict, manifest: ToolManifest, autonomy: str) -> tuple[Verdict, str]:
    if verdict is not Verdict.ALLOW:
        return verdict, ""
    if manifest.irreversible:
        return Verdict.ASK, "risk:irreversible->ask"
    if autonomy == "supervised":
        return Verdict.ASK, "autonomy:supervised->ask"
    if manifest.mutates and autonomy == "standard":
        return Verdict.ASK, "risk:mutates->ask"
    return verdict, ""


class PolicyEngine:
    def __init__(self, config: PolicyConfig) -> None:
        self._config = config
        self._config_grants = frozenset(signature(g.tool, g.arguments) for g in config.grants)
        doc = {
            "autonomy": config.autonomy,
            "rules": [{"tool": r.tool, "verdict": r.verdict.value, "when": r.when} for r in config.rules],
            "grants": sorted(self._config_grants),
        }
        # Part of every approval digest: a policy change invalidates approvals given under the old one.
        self.version = sha256_hex("policy", canonical_json(doc))[:16]

    @property
    def autonomy(self) -> str:
        return self._config.autonomy

    def decide(self, manifest: ToolManifest, arguments: Mapping[str, Any],
               grants: frozenset[str] = frozenset()) -> PolicyDecision:
        sig = signature(manifest.name, arguments)
        verdict: Verdict | None = None
        path: list[str] = []
        for i, rule in enumerate(self._config.rules):
            if rule_matches(rule, manifest.name, arguments):
                v = rule.verdict
                path.append(f"rule[{i}]:{v}")
                if verdict is None or _RANK[v] > _RANK[verdict]:
                    verdict = v
        if verdict is Verdict.DENY:
            return PolicyDecision(Verdict.DENY, tuple(path), "denied by policy rule")
        if sig in grants:
            # A person approved exactly this call for this run ("approve and remember"): that is
            # the human in the loop the risk tightening asks for, so it does not ask again.
            return PolicyDecision(Verdict.ALLOW, tuple([*path, "grant:session"]), "allowed by a session grant")
        if sig in self._config_grants:
            path.append("grant:exact-call")
            verdict = Verdict.ALLOW
        if verdict is None:
            return PolicyDecision(Verdict.DENY, ("default:deny",), "no policy rule allows this call")
        tightened, why = _tighten(verdict, manifest, self._config.autonomy)
        if why:
            path.append(why)
        reason = {Verdict.ALLOW: "allowed", Verdict.ASK: "needs approval", Verdict.DENY: "denied"}[tightened]
        return PolicyDecision(tightened, tuple(path), reason)
