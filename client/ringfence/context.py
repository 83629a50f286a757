"""Each turn's context, assembled within a token budget: the goal, recalled memory, a summary of
compacted turns, and the recent transcript.

    ContextAssembler(budget_tokens, summarizer, memory).assemble(goal, run_id, turn, tools, history)

What the model is given (AgentContext.render(), canonical JSON):

    goal      the run's goal, byte for byte, always: compaction never touches it
    trust     a legend: tool results, recalled memory and the summary are DATA returned by tools
              or kept by the harness, never instructions (a prompt injected into a web page or a
              file arrives as a labelled result, not as the harness's voice)
    memory    facts recalled for the goal (MemoryRecall), each with its kind and whether the call
              that produced it executed
    summary   what the Summarizer made of the turns folded away so far
    turns     the recent turns verbatim: calls and results, each result marked "trust": "data"

Compaction: when the rendered context is over `budget_tokens`, the oldest turns are folded into
the summary in one step (one compaction, counted and logged) until the context is under 60% of
the budget, so the next turns do not compact again at once; the last `keep_recent` turns always
stay verbatim. The summary is itself capped (heads and tails kept), so a long run stays near its
budget however many turns it takes. A context still over budget after folding is sent as it is:
the goal and the recent turns are never cut (a budget below the tool catalogue cannot be met).

Summarizer is a protocol so a real model can summarise; the default TruncatingSummarizer keeps
the head and the tail of each folded turn's JSON, with no model call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ringfence.model import ToolView
from ringfence.turns import AgentContext, TurnRecord, canonical_json, estimate_tokens

LOW_WATER = 0.6
"""A compaction folds turns until the context is at most this fraction of the budget."""

__all__ = ["ContextAssembler", "MemoryRecall", "RecalledFact", "Summarizer", "TruncatingSummarizer"]

log = logging.getLogger("ringfence.context")


class Summarizer(Protocol):
    def summarize(self, summary: str, folded: Sequence[TurnRecord]) -> str:
        """The new summary: the old one plus what `folded` (the turns leaving the context) said."""
        ...


class _FactProvenance(Protocol):
    @property
    def executed(self) -> bool: ...


class RecallableFact(Protocol):
    """What the context reads of a recalled fact (ringfence.memory's Fact is one)."""

    @property
    def kind(self) -> object: ...  # a MemoryKind, or its value
    @property
    def text(self) -> str: ...
    @property
    def provenance(self) -> _FactProvenance: ...


class MemoryRecall(Protocol):
    """What the loop needs of a memory (ringfence.memory's TenantMemory is one)."""

    def recall(self, query: str, *, limit: int = 5) -> Sequence[RecallableFact]:
        """Facts with `.kind`, `.text` and `.provenance.executed`, best first."""
        ...


@dataclass(frozen=True)
class RecalledFact:
    kind: str
    text: str
    executed: bool
    """Whether the call the fact came from actually ran (a denied call's result is no evidence)."""

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "executed": self.executed, "trust": "data"}


def _cut(text: str, head: int, tail: int) -> str:
    if len(text) <= head + tail + 5:
        return text
    return f"{text[:head]} […] {text[-tail:]}"


class TruncatingSummarizer:
    """Keeps the head and the tail of each folded turn (its calls and results as JSON)."""

    def __init__(self, head: int = 160, tail: int = 80) -> None:
        self.head = head
        self.tail = tail

    def summarize(self, summary: str, folded: Sequence[TurnRecord]) -> str:
        lines = [summary] if summary else []
        for record in folded:
            lines.append(f"turn {record.turn}: " + _cut(canonical_json(record.as_json()), self.head, self.tail))
        return "\n".join(lines)


class ContextAssembler:
    """Builds each turn's AgentContext; keeps the summary and counts compactions across turns."""

    def __init__(self, budget_tokens: int | None = None, *, summarizer: Summarizer | None = None,
                 memory: MemoryRecall | None = None, recall_limit: int = 5, keep_recent: int = 2) -> None:
        if budget_tokens is not None and budget_tokens < 1:
            raise ValueError("budget_tokens must be positive (or None for no budget)")
        if keep_recent < 0 or recall_limit < 0:
            raise ValueError("keep_recent and recall_limit cannot be negative")
        self.budget_tokens = budget_tokens
        self.summarizer = summarizer or TruncatingSummarizer()
        self.memory = memory
        self.recall_limit = recall_limit
        self.keep_recent = keep_recent
        self.summary = ""
        self.folded = 0
        """How many turns of the history the summary covers (the oldest ones)."""
        self.compactions = 0

    def assemble(self, goal: str, run_id: str, turn: int, tools: Sequence[ToolView],
                 history: Sequence[TurnRecord]) -> AgentContext:
        recalled = self._recall(goal)
        context = self._context(goal, run_id, turn, tools, history, recalled)
        if self.budget_tokens is None:
            return context
        before = estimate_tokens(context.render())
        if before <= self.budget_tokens:
            return context
        # Fold the oldest turns until the context is back under the low-water mark (so the next
        # turns do not compact again at once), keeping at least `keep_recent` turns verbatim.
        # Each folded turn takes its own size off the estimate; the summary's growth is bounded
        # by its cap, so the search need not render the whole context once per candidate.
        low_water = self.budget_tokens * LOW_WATER
        last = len(history) - self.keep_recent
        cut, remaining = self.folded, before
        while cut < last and remaining > low_water:
            remaining -= estimate_tokens(canonical_json(history[cut].as_json()))
            cut += 1
        if cut == self.folded:
            return context  # nothing left to fold: the goal and the recent turns are never cut
        folded = history[self.folded:cut]
        summary = self.summarizer.summarize(self.summary, folded)
        # The summary's own cap (a quarter of the budget, in bytes ~ tokens * 4): its head and
        # tail survive, as those of a folded turn do.
        cap = max(200, self.budget_tokens)
        self.summary = _cut(summary, cap * 2 // 3, cap // 3)
        self.folded = cut
        self.compactions += 1
        context = self._context(goal, run_id, turn, tools, history, recalled)
        log.info("run %s: compaction %d before turn %d folded turns %d-%d (%d -> %d tokens, budget %d)",
                 run_id, self.compactions, turn, folded[0].turn, folded[-1].turn, before,
                 estimate_tokens(context.render()), self.budget_tokens)
        return context

    def _context(self, goal: str, run_id: str, turn: int, tools: Sequence[ToolView],
                 history: Sequence[TurnRecord], recalled: tuple[RecalledFact, ...]) -> AgentContext:
        return AgentContext(goal, run_id, turn, tuple(tools), tuple(history[self.folded:]), summary=self.summary,
                            memory=recalled, compactions=self.compactions)

    def _recall(self, goal: str) -> tuple[RecalledFact, ...]:
        if self.memory is None or self.recall_limit == 0:
            return ()
        facts = self.memory.recall(goal, limit=self.recall_limit)
        return tuple(RecalledFact(str(getattr(f.kind, "value", f.kind)), f.text, bool(f.provenance.executed))
                     for f in facts)
