"""Guardrails (admission step 3 and result step 11): a secret scanner and a loop detector.

Action guardrails look at a proposed call: a private key in arguments HALTs the run
(`guardrail_stop`: a model that leaks key material is not to be trusted with the next call),
other secrets BLOCK the call, and the same canonical call proposed `loop_threshold` times in
one run HALTs it (`loop_detected`). The result guardrail scans returned content before the
caller sees it: a private key withholds the whole result, other secrets are redacted.
"""

from __future__ import annotations

import enum
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, overload


class Action(enum.StrEnum):
    PASS = "pass"
    BLOCK = "block"
    HALT = "halt"


@dataclass(frozen=True)
class Finding:
    kind: str
    """aws_access_key | private_key | bearer_token | high_entropy"""
    where: str
    """Dotted path of the string in the scanned value."""


_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private_key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    ("aws_access_key", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b")),
    ("bearer_token", re.compile(r"\b[Bb]earer\s+[A-Za-z0-9\-._~+/]{16,}=*")),
)
# Candidate tokens for the entropy check: whole runs of token characters, 32 to 200 long.
# Credentials are that size; a longer run is data (a base64 file from read_file, say), which
# the entropy rule would otherwise always flag. The named patterns above still apply to it.
_TOKEN = re.compile(r"(?<![A-Za-z0-9+/_\-=])[A-Za-z0-9+/_\-=]{32,200}(?![A-Za-z0-9+/_\-=])")
ENTROPY_BITS = 4.3  # bits per character; hex (max 4.0) such as sha256 digests stays below


def _entropy(s: str) -> float:
    counts = Counter(s)
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _looks_random(token: str) -> bool:
    # Require mixed character classes so long words, paths and hex digests pass.
    classes = sum(bool(re.search(p, token)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]"))
    return classes >= 3 and _entropy(token) >= ENTROPY_BITS


def _strings(value: Any, where: str) -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield f"{where}.{k}", str(k)
            yield from _strings(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")


def scan(value: Any, where: str = "arguments") -> list[Finding]:
    """Every secret-looking string in `value` (a JSON value), with where it was found."""
    findings = []
    for path, text in _strings(value, where):
        for kind, pattern in _PATTERNS:
            if pattern.search(text):
                findings.append(Finding(kind, path))
        for m in _TOKEN.finditer(text):
            if _looks_random(m.group(0)):
                findings.append(Finding("high_entropy", path))
                break
    return findings


def _redact_text(text: str) -> str:
    for kind, pattern in _PATTERNS:
        text = pattern.sub(f"[REDACTED:{kind}]", text)
    return _TOKEN.sub(lambda m: "[REDACTED:high_entropy]" if _looks_random(m.group(0)) else m.group(0), text)


@overload
def redact(value: str) -> str: ...


@overload
def redact(value: Any) -> Any: ...


def redact(value: Any) -> Any:
    """`value` with the secrets in its text replaced: a string, or the keys and values of a dict
    or list/tuple, copied (a tuple becomes a list); anything else is returned as is."""
    if isinstance(value, str):
        return _redact_text(value)
    if isinstance(value, dict):
        return {_redact_text(str(k)): redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


@dataclass(frozen=True)
class GuardrailDecision:
    action: Action
    reason: str = ""
    kind: str = ""
    """For HALT: `loop` or the secret kind, which names the run's outcome."""


def check_arguments(arguments: Any) -> GuardrailDecision:
    findings = scan(arguments)
    if any(f.kind == "private_key" for f in findings):
        f = next(f for f in findings if f.kind == "private_key")
        return GuardrailDecision(Action.HALT, f"private key material in {f.where}", "private_key")
    if findings:
        f = findings[0]
        return GuardrailDecision(Action.BLOCK, f"{f.kind.replace('_', ' ')} in {f.where}", f.kind)
    return GuardrailDecision(Action.PASS)


def check_loop(previous_count: int, threshold: int) -> GuardrailDecision:
    """`previous_count` = how often this canonical call was proposed before in the run."""
    if previous_count + 1 >= threshold:
        return GuardrailDecision(
            Action.HALT, f"the same call was proposed {previous_count + 1} times in this run", "loop")
    return GuardrailDecision(Action.PASS)


@dataclass(frozen=True)
class ResultDecision:
    action: Action  # PASS (content unchanged or redacted) or BLOCK (content withheld)
    content: Any
    redacted: tuple[str, ...] = ()
    reason: str = ""


def check_result(content: Any) -> ResultDecision:
    findings = scan(content, "content")
    if not findings:
        return ResultDecision(Action.PASS, content)
    kinds = tuple(sorted({f.kind for f in findings}))
    if "private_key" in kinds:
        return ResultDecision(Action.BLOCK, None, kinds, "result withheld: it contains private key material")
    return ResultDecision(Action.PASS, redact(content), kinds, "secrets redacted: " + ", ".join(kinds))
