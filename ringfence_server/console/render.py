"""The templates and the pure helpers they use.

Autoescape is on for every template, whatever its name: every argument, output, goal, reason
and id reaches the page as text. Data is never marked safe; JSON is pretty-printed here and
escaped by the template like any other string, inside a <pre>.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from starlette.responses import HTMLResponse

from ringfence.model import Approval, ApprovalKind, ToolRisk

__all__ = ["FOLD_CHARS", "ArgumentView", "Pages", "approval_summary", "arguments_view", "pretty", "risk_rows"]

TEMPLATES = Path(__file__).with_name("templates")
FOLD_CHARS = 160
"""A value whose JSON is longer than this is folded: its start shown, the rest one click away."""


def pretty(value: Any) -> str:
    """JSON, indented and with non-ASCII kept (as text; the template escapes it)."""
    try:
        return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


@dataclass(frozen=True)
class ArgumentView:
    name: str
    text: str
    """The value's pretty JSON."""
    folded: bool
    """Long: shown folded (<details>), its start as the summary."""

    @property
    def head(self) -> str:
        return self.text[:FOLD_CHARS]


def arguments_view(arguments: Mapping[str, Any]) -> list[ArgumentView]:
    """Each argument, in name order, pretty-printed and folded when long."""
    out = []
    for name in sorted(arguments):
        text = pretty(arguments[name])
        out.append(ArgumentView(name=str(name), text=text, folded=len(text) > FOLD_CHARS or text.count("\n") > 12))
    return out


def risk_rows(risk: ToolRisk | None) -> list[tuple[str, str]]:
    """Every field of the tool's risk, as (name, text): generic, so a field added later shows."""
    if risk is None:
        return []
    rows = []
    for f in dataclasses.fields(risk):
        value = getattr(risk, f.name)
        if isinstance(value, Mapping):
            text = pretty({k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}) if value else "—"
        elif isinstance(value, tuple):
            text = ", ".join(str(v) for v in value) if value else "none"
        elif isinstance(value, bool):
            text = "yes" if value else "no"
        else:
            text = str(value) if value not in ("", None) else "—"
        rows.append((f.name.replace("_", " "), text))
    return rows


def approval_summary(a: Approval) -> dict[str, Any]:
    """What the inbox shows of one approval (also sent as JSON to the live script)."""
    return {
        "approval_id": a.approval_id, "tool": a.tool, "run_id": a.run_id, "tenant": a.tenant,
        "proposer": a.proposer, "policy_rule": a.policy_rule,
        "created_at": a.created_at, "expires_at": a.expires_at, "status": str(a.status),
        "kind": str(a.kind), "reconcile": a.kind is ApprovalKind.RECONCILE,
    }


def age(at: float, now: float | None = None) -> str:
    """"42 s", "3 min", "2 h" since `at` (epoch seconds)."""
    return duration(max(0.0, (time.time() if now is None else now) - at))


def until(at: float, now: float | None = None) -> str:
    left = at - (time.time() if now is None else now)
    return "expired" if left <= 0 else duration(left)


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


class Pages:
    """The Jinja environment: autoescape on for every template, undefined names an error."""

    def __init__(self, directory: Path = TEMPLATES, *, autoescape: bool = True) -> None:
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(directory)), autoescape=autoescape,
                                      undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        self.env.filters.update(pretty=pretty, age=age, until=until, clock=clock)
        self.env.globals.update(arguments_view=arguments_view, risk_rows=risk_rows)

    def render(self, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(self.env.get_template(name).render(**context), status_code=status_code)
