"""What the run and approval pages show of a run, from its view (GetRun) and its log (ListEvents).

Pure: no I/O. The events are read as the client gives them (type and a JSON mapping); the
console never imports the control plane's event classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ringfence.model import Event, Observation, RunView

__all__ = ["Artifact", "CallRow", "EgressRow", "Turn", "artifacts_of", "egress_of", "turns_of"]


@dataclass(frozen=True)
class CallRow:
    call_id: str
    tool: str
    status: str
    executed: bool
    verdict_path: tuple[str, ...]
    arguments: Mapping[str, Any] | None
    """As the log recorded them at admission (None when the log has no record of them)."""
    content: Any
    error: str | None
    approval_id: str | None


@dataclass
class Turn:
    number: int | None
    """The batch's turn, when it said; None for calls no batch listed (e.g. a plan's)."""
    calls: list[CallRow] = field(default_factory=list)


_EGRESS_SHOWN = ("decision", "host", "port", "method", "reason", "bytes_up", "bytes_down")


@dataclass(frozen=True)
class EgressRow:
    call_id: str
    attempt: int
    decision: Mapping[str, Any]

    def get(self, key: str) -> str:
        value = self.decision.get(key)
        return "—" if value is None or value == "" else str(value)

    @property
    def allowed(self) -> bool:
        return str(self.decision.get("decision", "")).startswith("allow")

    @property
    def rest(self) -> list[tuple[str, str]]:
        """The decision's other facts (whatever the proxy recorded), by name; facts it left empty
        (None, "") are left out, and its clock (`ts`) is shown as UTC time, not epoch seconds."""
        out = []
        for k, v in self.decision.items():
            if k in _EGRESS_SHOWN or k == "call_id" or v is None or v == "":
                continue
            if k == "ts" and isinstance(v, (int, float)) and not isinstance(v, bool):
                v = datetime.fromtimestamp(v, tz=UTC).strftime("%H:%M:%S.%f")[:-3] + " UTC"
            out.append((str(k), str(v)))
        return sorted(out)


@dataclass(frozen=True)
class Artifact:
    call_id: str
    path: str
    size: int
    sha256: str


def _str(value: object) -> str:
    return "" if value is None else str(value)


def turns_of(run: RunView, events: Sequence[Event]) -> list[Turn]:
    """The run's observations grouped by the turn (batch) that proposed them, in order."""
    turn_of: dict[str, int | None] = {}
    arguments: dict[str, Mapping[str, Any]] = {}
    for e in events:
        if e.type == "batch_started":
            turn = e.data.get("turn")
            for call in e.data.get("calls") or ():
                if isinstance(call, Mapping) and "call_id" in call:
                    turn_of.setdefault(_str(call["call_id"]), turn if isinstance(turn, int) else None)
        elif e.type == "call_decided":
            args = e.data.get("arguments")
            if isinstance(args, Mapping):
                arguments.setdefault(_str(e.data.get("call_id")), args)
    turns: list[Turn] = []
    for obs in run.trajectory:  # in the order the run observed them: a new turn when the number changes
        number = turn_of.get(obs.call_id)
        if not turns or turns[-1].number != number:
            turns.append(Turn(number))
        turns[-1].calls.append(_row(obs, arguments.get(obs.call_id)))
    return turns


def _row(obs: Observation, arguments: Mapping[str, Any] | None) -> CallRow:
    return CallRow(call_id=obs.call_id, tool=obs.tool, status=str(obs.status), executed=obs.executed,
                   verdict_path=tuple(obs.verdict_path), arguments=arguments, content=obs.content,
                   error=obs.error, approval_id=obs.approval_id)


def egress_of(events: Iterable[Event]) -> list[EgressRow]:
    """The egress proxy's decisions, per call and attempt, in log order."""
    rows = []
    for e in events:
        if e.type != "egress":
            continue
        for decision in e.data.get("decisions") or ():
            if isinstance(decision, Mapping):
                attempt = e.data.get("attempt")
                rows.append(EgressRow(call_id=_str(e.data.get("call_id")),
                                      attempt=attempt if isinstance(attempt, int) else 0, decision=decision))
    return rows


def artifacts_of(events: Iterable[Event]) -> list[Artifact]:
    """The artifacts the run's calls left (the latest record of each path)."""
    found: dict[str, Artifact] = {}
    for e in events:
        if e.type != "artifact_collected":
            continue
        for f in e.data.get("files") or ():
            if isinstance(f, Mapping) and f.get("path"):
                size = f.get("size")
                found[_str(f["path"])] = Artifact(call_id=_str(e.data.get("call_id")), path=_str(f["path"]),
                                                  size=size if isinstance(size, int) else 0,
                                                  sha256=_str(f.get("sha256")))
    return list(found.values())
