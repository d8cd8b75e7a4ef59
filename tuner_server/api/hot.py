"""The busiest calls the short way, below FastAPI: records/best, a worker's lease and
results.

A build asks records/best layer by layer and a fleet leases and reports many times a
second, so their per-request cost is the framework's as much as the work's: FastAPI's
dependency solving, its exit stack, the request and response objects, the response
model's validation and the exception wrappers cost about as much as a single lookup. A
request whose token has the role the route needs, whose body validates and whose path
parses is answered here, by the same service calls (``svc.best``, ``lease_trials``,
``store_results``: the routes call them too) and with the same JSON, their refusals
(404, 409) worded by the app's own handler; anything else (a missing or unknown token,
another worker's, a body FastAPI would not read or that does not validate) falls
through, with its body, to the FastAPI route, which answers it as it always has. So
the routes stay the one definition of each endpoint's contract and errors; this is
only a shortcut for the requests that pass them."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from fastapi import HTTPException
from pydantic import BaseModel
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from schemas import Target
from schemas.api import MAX_ID, BestRequest, LeaseRequest, Results, ResultsAccepted
from tuner_server.api.records import BEST_PATH, BEST_ROLES
from tuner_server.api.workers import lease_trials, store_results
from tuner_server.api.workers import router as workers_router
from tuner_server.middleware import refusal, replayed
from tuner_server.services import records as svc
from tuner_server.services.tokens import MISS, TokenInfo

# a shortcut's answer (None: the route must answer); database work goes to a thread
Answer = Callable[[], Awaitable[Response | None]]
_WORKER_CALL = re.compile(re.escape(workers_router.prefix)
                          + r"/([1-9][0-9]{0,9})/(lease|results)")


def _bearer(scope: Scope) -> str | None:
    """The request's bearer token, or None (no Authorization header, another scheme)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return (token.strip() or None) if scheme.lower() == "bearer" else None
    return None


def _json_body(scope: Scope) -> bool:
    """Whether FastAPI would read the body as JSON: no Content-Type, or a JSON one."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            kind = value.decode("latin-1").split(";", 1)[0].strip().lower()
            return kind == "application/json" or (kind.startswith("application/")
                                                   and kind.endswith("+json"))
    return True


def _info(state: State, token: str, session: Session | None = None) -> TokenInfo | None:
    """``token``'s role, from the process's cache or looked up (I/O: call it in a
    thread), in ``session`` when given (the request's one session, as the route's)."""
    info = state.tokens.cached(token)
    if info is MISS:
        info = state.tokens.lookup(token, session)
    return info if isinstance(info, TokenInfo) else None


def _own(worker_id: int) -> Callable[[object], bool]:
    """``require_worker_self``: an admin's token, or the one this worker was given."""
    return lambda info: isinstance(info, TokenInfo) and (
        info.role == "admin" or (info.role == "worker" and info.worker_id == worker_id))


def _json(answer: BaseModel | bytes) -> Response:
    return Response(answer if isinstance(answer, bytes) else answer.model_dump_json(),
                    media_type="application/json")


def _best(state: State, scope: Scope, token: str | None, body: bytes) -> Answer | None:
    """records/best's answer, or None where the route answers."""
    try:
        request = BestRequest.model_validate_json(body)
        target = Target.parse(request.target)
    except ValueError:  # ValidationError is one: the route words the 422
        return None

    def work() -> bytes | None:
        if token is not None and ((info := _info(state, token)) is None
                                  or info.role not in BEST_ROLES):
            return None
        with state.readers() as session:
            return svc.best_json(svc.best(session, request.workloads, target))

    async def answer() -> Response | None:
        found = await run_in_threadpool(work)
        return None if found is None else _json(found)

    return answer


def _results(state: State, scope: Scope, token: str | None, body: bytes, worker_id: int
             ) -> Answer | None:
    """A worker's results call (``store_results``), or None where the route answers; a
    refusal (404, 409: nothing stored) worded as the route's."""
    try:
        results = Results.model_validate_json(body)
    except ValueError:
        return None

    def work() -> ResultsAccepted | HTTPException | None:
        with state.sessions() as session:  # one session, the token check's too
            if token is not None and not _own(worker_id)(_info(state, token, session)):
                return None
            try:
                return store_results(state, session, worker_id, results)
            except HTTPException as err:
                return err

    async def answer() -> Response | None:
        done = await run_in_threadpool(work)
        if isinstance(done, HTTPException):
            return await refusal(Request(scope), done)
        return None if done is None else _json(done)

    return answer


def _lease(state: State, scope: Scope, token: str | None, body: bytes, worker_id: int
           ) -> Answer | None:
    """A worker's lease (``lease_trials``, long-poll included: it waits on the event
    loop as the route does), or None where the route answers; a refusal (404, 409:
    nothing leased, perhaps after a wait) worded as the route's."""
    try:
        request = LeaseRequest.model_validate_json(body)
    except ValueError:
        return None

    async def answer() -> Response | None:
        if token is not None:
            info = state.tokens.cached(token)
            if info is MISS:  # I/O: in a thread
                info = await run_in_threadpool(_info, state, token)
            if not _own(worker_id)(info):
                return None
        try:
            return _json(await lease_trials(state, worker_id, request))
        except HTTPException as err:
            return await refusal(Request(scope), err)

    return answer


Route = Callable[[State, Scope, str | None, bytes], Answer | None]


class Shortcuts:
    """The shortcuts, as the layer just inside ``Guard`` (which has read the body whole
    and answers any error that escapes)."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app = app
        self.state = state

    @staticmethod
    def _route(scope: Scope) -> Route | None:
        """The shortcut of the request's path, or None (the request goes on as it is)."""
        if scope["type"] != "http" or scope["method"] != "POST" or not _json_body(scope):
            return None
        path = scope["path"]
        if path == BEST_PATH:
            return _best
        match = _WORKER_CALL.fullmatch(path)
        if match and int(match[1]) <= MAX_ID:
            worker_id, call = int(match[1]), _lease if match[2] == "lease" else _results
            return lambda state, scope, token, body: call(state, scope, token, body,
                                                          worker_id)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        # Guard has read the body whole: it comes as one message
        body = (await receive()).get("body", b"")
        response = None
        token = _bearer(scope) if self.state.settings.require_auth else None
        if token is not None or not self.state.settings.require_auth:  # else: 401
            made = route(self.state, scope, token, body)
            response = None if made is None else await made()
        if response is None:
            await self.app(scope, replayed(body, receive), send)
            return
        await response(scope, receive, send)
