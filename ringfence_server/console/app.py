"""The console's ASGI app: its routes, and the few rules every route follows.

- A page needs a signed-in session (else: to the sign-in page); everything it shows comes from
  the control plane's public API, asked with the signed-in person's own token. The console has
  no authority of its own: what the API refuses, the console cannot do either, and it shows the
  server's reason.
- A state-changing request (a POST) must pass the CSRF checks (csrf.py), else 403.
- Sign-in attempts are throttled per client address and in all (throttle.py): a refused one
  gets 429 and never reaches the control plane.
- Every response carries the security headers (headers.py); every page is rendered with
  autoescape on (render.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ringfence import AsyncClient
from ringfence.errors import (
    ControlError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from ringfence.model import Approval, ApprovalKind, ApprovalStatus, Event, Identity, RunOutcome, RunStatus
from ringfence.options import TlsConfig
from ringfence_server.console import csrf, waterfall
from ringfence_server.console.headers import SecurityHeaders
from ringfence_server.console.render import Pages, approval_summary
from ringfence_server.console.runview import artifacts_of, egress_of, turns_of
from ringfence_server.console.sessions import COOKIE, Session, SessionStore
from ringfence_server.console.throttle import Admitted, SignInThrottle, ThrottleSettings
from ringfence_server.control.tracing import trace_from_events

__all__ = ["ConsoleSettings", "create_app"]

STATIC = Path(__file__).with_name("static")
RUNS_PAGE_SIZE = 25
EVENT_PAGE_SIZE = 500
MAX_EVENT_PAGES = 40
"""A run page reads at most this many pages of its log (20,000 events) and says when it stopped."""
LIVE_RESYNC_S = 5.0
"""The inbox's live stream sends the pending ids this often, so decided and expired asks leave."""
_MAX_TOKEN_CHARS = 4096
_MAX_REASON_CHARS = 4096


@dataclass(frozen=True)
class ConsoleSettings:
    server: str
    """The control plane's gRPC address, HOST:PORT."""
    tls: TlsConfig | None = None
    """How to reach it over TLS; None: plaintext (a loopback server)."""
    https: bool = False
    """The console itself is served over TLS: the session cookie is Secure."""
    timeout: float = 30.0
    idle_s: float = 8 * 3600
    """A session unused this long is signed out."""
    signin: ThrottleSettings = field(default_factory=ThrottleSettings)
    """The limits on failed sign-ins, per client address and across all (throttle.py)."""


Handler = Callable[[Request, Session], Awaitable[Response]]


class Console:
    """The app's state: settings, sessions, templates; its methods are the routes."""

    def __init__(self, settings: ConsoleSettings, pages: Pages | None = None,
                 throttle: SignInThrottle | None = None) -> None:
        self.settings = settings
        self.sessions = SessionStore(idle_s=settings.idle_s)
        self.pages = pages or Pages()
        # `is not None`, not `or`: a throttle with no failures yet has length 0, so it is falsy
        self.throttle = throttle if throttle is not None else SignInThrottle(settings.signin)

    def open_client(self, token: str) -> AsyncClient:
        """A client of the control plane with `token`: the console's one way to reach it (the
        throttle's tests count the clients made here and the RPCs they send)."""
        return AsyncClient(self.settings.server, token, tls=self.settings.tls, timeout=self.settings.timeout,
                           stream_timeout=None)

    # -- plumbing -------------------------------------------------------------------------

    def session_of(self, request: Request) -> Session | None:
        return self.sessions.get(request.cookies.get(COOKIE))

    def set_cookie(self, response: Response, session: Session) -> None:
        response.set_cookie(COOKIE, session.session_id, httponly=True, samesite="strict",
                            secure=self.settings.https, path="/")

    def render(self, request: Request, session: Session | None, name: str, status_code: int = 200,
               **context: Any) -> Response:
        flash = list(session.flash) if session is not None else []
        if session is not None:
            session.flash.clear()
        response = self.pages.render(name, status_code, session=session, flash=flash,
                                     csrf_token=session.csrf if session is not None else "",
                                     path=request.url.path, **context)
        return response

    def error(self, request: Request, session: Session | None, status_code: int, title: str,
              message: str) -> Response:
        return self.render(request, session, "error.html", status_code, title=title, message=message)

    def signed_in(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """The route needs a signed-in session; its API errors become pages with the server's reason."""

        async def route(request: Request) -> Response:
            session = self.session_of(request)
            await self.sessions.close_retired()
            if session is None or not session.signed_in:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"/signin?next={quote(target, safe='/?=&')}", status_code=303)
            try:
                return await handler(request, session)
            except Unauthenticated:
                # The token stopped working (revoked, rotated): the session is over.
                self.sessions.end(session)
                return RedirectResponse("/signin", status_code=303)
            except PermissionDenied as e:
                return self.error(request, session, 403, "Not allowed", f"The control plane refused: {e}")
            except NotFound as e:
                return self.error(request, session, 404, "Not found", str(e))
            except Unavailable as e:
                return self.error(request, session, 503, "The control plane cannot be reached", str(e))
            except InvalidArgument as e:
                return self.error(request, session, 400, "Refused as invalid", str(e))
            except ControlError as e:
                return self.error(request, session, 502, "The control plane answered with an error", str(e))

        return route

    def state_changing(self, handler: Handler) -> Handler:
        """A POST: refused with 403 unless it passes the CSRF checks."""

        async def route(request: Request, session: Session) -> Response:
            form = await request.form()
            try:
                csrf.check(request, session.csrf, form.get("csrf_token"))
            except csrf.CsrfRefused as e:
                return self.error(request, session, 403, "Refused", f"This request was refused: {e}.")
            request.state.form = form
            return await handler(request, session)

        return route

    @staticmethod
    def client(session: Session) -> AsyncClient:
        assert session.client is not None  # signed_in() checked it
        return session.client

    # -- sign-in --------------------------------------------------------------------------

    async def signin_page(self, request: Request) -> Response:
        session = self.session_of(request)
        if session is None:
            session = self.sessions.new()
        elif session.signed_in:
            return RedirectResponse(_safe_next(request.query_params.get("next")), status_code=303)
        response = self.render(request, session, "signin.html", next=_safe_next(request.query_params.get("next")),
                               problem="")
        self.set_cookie(response, session)
        return response

    async def signin(self, request: Request) -> Response:
        session = self.session_of(request)
        if session is None:  # no session: the form was not ours (or it expired) - start again
            return RedirectResponse("/signin", status_code=303)
        form = await request.form()
        try:
            csrf.check(request, session.csrf, form.get("csrf_token"))
        except csrf.CsrfRefused as e:
            return self.error(request, session, 403, "Refused", f"This request was refused: {e}.")
        token = form.get("token")
        target = _safe_next(_text(form, "next"))
        if not isinstance(token, str) or not token.strip() or len(token) > _MAX_TOKEN_CHARS:
            return self.render(request, session, "signin.html", 400, next=target, problem="Enter your token.")
        # Throttled before the token goes anywhere: a refused attempt asks the control plane
        # nothing, so a right token then is refused alike (the refusal tells no guess apart).
        # Behind a reverse proxy every request has the proxy's address: the global cap holds then.
        attempt = self.throttle.admit(request.client.host if request.client is not None else "")
        if not isinstance(attempt, Admitted):
            response = self.render(request, session, "signin.html", 429, next=target, problem=attempt.message)
            response.headers["retry-after"] = str(attempt.retry_after_s)
            return response
        client = self.open_client(token.strip())
        problem = ""
        answered = True  # the control plane said something about this token (else: not a guess's failure)
        identity: Identity | None = None
        try:
            # Who the control plane takes this token to be (kept: the approval page compares its
            # principal with a call's proposer), then whether it may review: the server's word,
            # from its own role table, never a guess of the console's.
            identity = await client.whoami()
            await client.list_approvals()
        except Unauthenticated:
            problem = "The control plane does not know this token."
        except PermissionDenied:
            who = f" ({identity.principal}, {identity.role}, tenant {identity.tenant})" if identity else ""
            problem = f"This token{who} cannot review approvals (it is not an approver's or an admin's)."
        except ControlError as e:
            problem = f"The control plane could not be asked: {e}"
            answered = identity is not None
        if problem or identity is None:
            if not answered:  # unreachable, timed out: no oracle, and a reviewer retrying is not locked out
                self.throttle.succeeded(attempt)
            await client.close()
            return self.render(request, session, "signin.html", 401, next=target, problem=problem)
        self.throttle.succeeded(attempt)
        self.sessions.end(session)  # a new id once signed in: an id planted before is worth nothing
        fresh = self.sessions.new(client, identity)
        response = RedirectResponse(target, status_code=303)
        self.set_cookie(response, fresh)
        return response

    async def signout(self, request: Request, session: Session) -> Response:
        self.sessions.end(session)
        await self.sessions.close_retired()
        response = RedirectResponse("/signin", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=self.settings.https)
        return response

    # -- approvals ------------------------------------------------------------------------

    async def inbox(self, request: Request, session: Session) -> Response:
        approvals = [a for a in await self.client(session).list_approvals() if a.status is ApprovalStatus.PENDING]
        approvals.sort(key=lambda a: (a.created_at, a.approval_id))
        return self.render(request, session, "inbox.html", approvals=[approval_summary(a) for a in approvals])

    async def live(self, request: Request) -> Response:
        """Server-Sent Events for the inbox: `approval` for each new ask (from WatchApprovals),
        `pending` with the ids still pending every few seconds."""
        session = self.session_of(request)
        if session is None or not session.signed_in:
            return Response("sign in first", status_code=401, media_type="text/plain")
        client = self.client(session)
        return EventSourceResponse(_live_events(client), ping=15)

    async def approval_page(self, request: Request, session: Session, *, status_code: int = 200,
                            problem: str = "", stale: bool = False) -> Response:
        client = self.client(session)
        # GetApproval: this one approval, pending or not, of a live or a finished run; another
        # tenant's is NotFound (the 404 page), as an id nobody has.
        approval = await client.get_approval(request.path_params["approval_id"])
        run = await client.get_run(approval.run_id)
        events, complete = await _events(client, approval.run_id)
        turns = turns_of(run, events)
        return self.render(request, session, "approval.html", status_code, approval=approval,
                           summary=approval_summary(approval), run=run, turns=turns, events_complete=complete,
                           pending=approval.status is ApprovalStatus.PENDING,
                           reconcile=approval.kind is ApprovalKind.RECONCILE, problem=problem, stale=stale,
                           # Four eyes: the server refuses the proposer's decision, so none is offered.
                           own=session.identity is not None and session.identity.proposed(approval))

    async def decide(self, request: Request, session: Session) -> Response:
        form: FormData = request.state.form
        approval_id = request.path_params["approval_id"]
        choice = _text(form, "decision")
        digest = _text(form, "digest")
        reason = _text(form, "reason").strip()
        if choice not in ("approve", "remember", "decline") or not digest:
            return self.error(request, session, 400, "Refused as invalid", "The form is incomplete.")
        if len(reason) > _MAX_REASON_CHARS:
            return await self.approval_page(request, session, status_code=400, problem="The reason is too long.")
        if choice == "decline" and not reason:
            return await self.approval_page(request, session, status_code=400,
                                            problem="Say why you decline: the agent is told your reason.")
        try:
            decided = await self.client(session).decide_approval(
                approval_id, choice != "decline", reason, remember=choice == "remember", digest=digest)
        except FailedPrecondition as e:
            return await self.approval_page(request, session, status_code=409, stale=True,
                                            problem=f"This request changed — look again. The server said: {e}")
        except PermissionDenied as e:
            return await self.approval_page(request, session, status_code=403,
                                            problem=f"The control plane refused your decision: {e}")
        verb = {"approve": "approved", "remember": "approved and remembered", "decline": "declined"}[choice]
        session.flash.append(f"{decided.approval_id} {verb} ({decided.tool} in run {decided.run_id}).")
        return RedirectResponse(f"/runs/{quote(decided.run_id, safe='')}", status_code=303)

    # -- runs -----------------------------------------------------------------------------

    async def runs(self, request: Request, session: Session) -> Response:
        q = request.query_params
        status = _enum(RunStatus, q.get("status"))
        outcome = _enum(RunOutcome, q.get("outcome"))
        token = q.get("page_token", "")
        page = await self.client(session).list_runs_page(status=status, outcome=outcome, page_size=RUNS_PAGE_SIZE,
                                                         page_token=token)
        return self.render(request, session, "runs.html", runs=page.runs, next_page_token=page.next_page_token,
                           status=status.value if status else "", outcome=outcome.value if outcome else "",
                           statuses=[s.value for s in RunStatus], outcomes=[o.value for o in RunOutcome],
                           first_page=not token)

    async def run_page(self, request: Request, session: Session) -> Response:
        run_id = request.path_params["run_id"]
        client = self.client(session)
        run = await client.get_run(run_id)
        events, complete = await _events(client, run_id)
        trace = waterfall.layout(trace_from_events(events)) if events else None
        audit = await client.verify_run(run_id)
        return self.render(request, session, "run.html", run=run, turns=turns_of(run, events),
                           egress=egress_of(events), artifacts=artifacts_of(events), trace=trace, audit=audit,
                           events_complete=complete, event_count=len(events),
                           pending=[approval_summary(a) for a in run.pending_approvals])

    async def artifact(self, request: Request, session: Session) -> Response:
        run_id, path = request.path_params["run_id"], request.path_params["path"]
        files = await self.client(session).download_files(run_id, [path], artifacts=True)
        if path not in files:
            raise NotFound(f"run {run_id} has no artifact {path}"
                           + (f" ({files.skipped[path]})" if path in files.skipped else ""))
        name = re.sub(r"[^A-Za-z0-9._-]", "_", path.rsplit("/", 1)[-1]) or "artifact"
        return Response(files[path], media_type="application/octet-stream",
                        headers={"content-disposition": f'attachment; filename="{name}"'})

    # -- tools ----------------------------------------------------------------------------

    async def tools(self, request: Request, session: Session) -> Response:
        tools = sorted(await self.client(session).list_tools(), key=lambda t: t.name)
        return self.render(request, session, "tools.html", tools=tools)

    async def home(self, request: Request) -> Response:
        return RedirectResponse("/approvals", status_code=303)

    async def close(self) -> None:
        await self.sessions.close()


async def _events(client: AsyncClient, run_id: str) -> tuple[list[Event], bool]:
    """The run's log, page by page (ListEvents), up to MAX_EVENT_PAGES; and whether it is whole."""
    events: list[Event] = []
    seq = 0
    for _ in range(MAX_EVENT_PAGES):
        page = await client.list_events(run_id, from_seq=seq, page_size=EVENT_PAGE_SIZE)
        events.extend(page.events)
        if not page.next_seq:
            return events, True
        seq = page.next_seq
    return events, False


async def _live_events(client: AsyncClient) -> AsyncIterator[ServerSentEvent]:
    queue: asyncio.Queue[Approval | BaseException] = asyncio.Queue()
    stream = client.watch_approvals()

    async def follow() -> None:
        try:
            async for approval in stream:
                await queue.put(approval)
        except ControlError as e:
            await queue.put(e)

    task = asyncio.create_task(follow())
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), LIVE_RESYNC_S)
            except TimeoutError:
                try:
                    listed = await client.list_approvals()
                except ControlError as e:
                    yield ServerSentEvent(data=json.dumps(str(e)), event="problem")
                    return
                pending = [a.approval_id for a in listed if a.status is ApprovalStatus.PENDING]
                yield ServerSentEvent(data=json.dumps(pending), event="pending")
                continue
            if isinstance(item, BaseException):
                yield ServerSentEvent(data=json.dumps(str(item)), event="problem")
                return
            if item.status is ApprovalStatus.PENDING:
                yield ServerSentEvent(data=json.dumps(approval_summary(item)), event="approval")
    finally:
        stream.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ControlError):
            await task


def _text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


def _safe_next(target: str | None) -> str:
    """A local path to go to after sign-in; anything else (another site, `//host`) is the inbox."""
    if target and target.startswith("/") and not target.startswith(("//", "/\\")) and "\n" not in target:
        return target
    return "/approvals"


def _enum(kind: Any, value: str | None) -> Any:
    if not value:
        return None
    try:
        return kind(value)
    except ValueError:
        return None


def create_app(settings: ConsoleSettings, *, pages: Pages | None = None,
               headers: dict[str, str] | None = None, throttle: SignInThrottle | None = None) -> Starlette:
    """The console for the control plane at `settings.server`. `pages` and `headers` replace the
    templates and the security headers (the tests' red checks weaken them to show the attack then
    lands); `throttle` replaces the sign-in throttle made from `settings.signin` (the tests give
    one a clock they move by hand)."""
    console = Console(settings, pages, throttle)
    s = console.signed_in
    post = console.state_changing

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await console.close()

    routes = [
        Route("/", console.home),
        Route("/signin", console.signin_page, methods=["GET"]),
        Route("/signin", console.signin, methods=["POST"]),
        Route("/signout", s(post(console.signout)), methods=["POST"]),
        Route("/approvals", s(console.inbox)),
        Route("/approvals/live", console.live),
        Route("/approvals/{approval_id}", s(console.approval_page)),
        Route("/approvals/{approval_id}/decide", s(post(console.decide)), methods=["POST"]),
        Route("/runs", s(console.runs)),
        Route("/runs/{run_id}", s(console.run_page)),
        Route("/runs/{run_id}/artifacts/{path:path}", s(console.artifact)),
        Route("/tools", s(console.tools)),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.console = console
    app.add_middleware(SecurityHeaders, headers=headers)
    return app
