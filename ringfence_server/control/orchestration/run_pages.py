"""ListRuns a page at a time: a tenant's runs newest first, filtered by status and outcome.

The store walks an index from a cursor (EventStore.run_page), so a page costs the page, never
the history. What the store can filter by itself, it does: finished or not, and the outcome
(run_finished carries it). Running and waiting_approval are both "not finished" to the store;
which one a run is needs its fold, so for those two the store's rows are folded and filtered
here, reading on until the page is full or the runs end. That walks unfinished runs only, the
ones this server keeps in memory anyway.

A page token is the cursor of the page's last run (its first event's `at` and row), bound to
the tenant and the filters it was issued for: sent with others it is refused, naming
page_token, rather than continuing some other listing from a meaningless place. It is not a
secret and needs no signature: every query is scoped to the caller's tenant whatever the token
says; the binding only makes a client's mistake an error instead of a wrong page.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Protocol

from ringfence.errors import FieldViolation, InvalidArgument
from ringfence.model import RunOutcome, RunPage, RunStatus, RunView
from ringfence_server.control.orchestration.runs import RunRepository
from ringfence_server.control.state import RunState
from ringfence_server.control.store.base import RunRow
from ringfence_server.control.validation import sha256_hex

__all__ = ["RunPages", "Sweeper"]

_TOKEN_VERSION = 1


class Sweeper(Protocol):
    """What a page needs of the approval desk: expire what is due before a run is shown, as
    GetRun does (ringfence_server.control.orchestration.approvals.ApprovalDesk)."""

    def try_sweep(self, state: RunState) -> None: ...


def _bad_token(why: str) -> InvalidArgument:
    return InvalidArgument("the page token cannot be used", [FieldViolation("page_token", why)])


def _binding(tenant: str, status: RunStatus | None, outcome: RunOutcome | None) -> str:
    return sha256_hex("runs-page", tenant, status or "", outcome or "")[:16]


def encode_token(row: RunRow, tenant: str, status: RunStatus | None, outcome: RunOutcome | None) -> str:
    # json keeps a float's repr, which reads back as the same float: the cursor is exact.
    body = json.dumps({"v": _TOKEN_VERSION, "b": _binding(tenant, status, outcome), "at": row.at, "id": row.id},
                      separators=(",", ":"))
    return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def decode_token(token: str, tenant: str, status: RunStatus | None, outcome: RunOutcome | None) -> RunRow:
    """The cursor a token carries; InvalidArgument naming page_token when it is not one this
    server issued for this tenant and these filters."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        body = json.loads(raw)
    except (binascii.Error, ValueError):
        raise _bad_token("is not a token this server issued") from None
    if not isinstance(body, dict) or body.get("v") != _TOKEN_VERSION:
        raise _bad_token("is not a token this server issued")
    at, row_id = body.get("at"), body.get("id")
    if (not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at)
            or not isinstance(row_id, int) or isinstance(row_id, bool)):
        raise _bad_token("is not a token this server issued")
    if body.get("b") != _binding(tenant, status, outcome):
        raise _bad_token("was issued for other filters (status, outcome) or another tenant: send the filters "
                         "of the first page, or start again with no token")
    return RunRow("", float(at), row_id)


class RunPages:
    """ListRuns' pages, over the run repository (its store and its live runs)."""

    def __init__(self, *, repo: RunRepository, desk: Sweeper) -> None:
        self.repo = repo
        self.desk = desk

    def page(self, tenant: str, status: RunStatus | None, outcome: RunOutcome | None, size: int,
             token: str) -> RunPage:
        """At most `size` runs after the token's cursor ("" = from the newest), and the token of
        the next page ("" when there is none)."""
        cursor = decode_token(token, tenant, status, outcome) if token else None
        if status in (RunStatus.RUNNING, RunStatus.WAITING_APPROVAL) and outcome is not None:
            return RunPage(())  # an unfinished run has no outcome
        finished = None if status is None else status is RunStatus.FINISHED
        # One more than the page: whether it exists decides whether there is a next page.
        found: list[tuple[RunRow, RunView]] = []
        while len(found) <= size:
            want = size + 1 - len(found)
            rows = self.repo.store.run_page(tenant, finished=finished, outcome=outcome, before=cursor, limit=want)
            for row in rows:
                view = self._view(tenant, row)
                if view is not None and (status is None or view.status is status):
                    found.append((row, view))
            if len(rows) < want:  # the store has no more
                break
            cursor = rows[-1]
        more = len(found) > size
        found = found[:size]
        next_token = encode_token(found[-1][0], tenant, status, outcome) if more else ""
        return RunPage(tuple(view for _, view in found), next_token)

    def _view(self, tenant: str, row: RunRow) -> RunView | None:
        state = self.repo.by_key(tenant, row.key)
        if state is None:  # pruned between the page's query and this read
            return None
        if not state.finished:
            self.desk.try_sweep(state)
        return self.repo.view(state)
