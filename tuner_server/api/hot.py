"""The busiest calls the short way, below FastAPI: records/best, a worker's lease and
results.

A build asks records/best layer by layer and a fleet leases and reports many times a
second, so their per-request cost is the framework's as much as the work's: FastAPI's
dependency solving, its exit stack, the request and response objects, the response
model's validation and the exception wrappers cost about as much as a single lookup. A
request whose token has the role the route needs, whose body validates and whose path
parses is answered here, by the same service calls and with the same JSON; anything
else (a missing or unknown token, a bad body, a refusal: 404, 409) falls through, with
its body, to the FastAPI route, which answers it as it always has. So the routes stay
the one definition of each endpoint's contract and errors; this is only a shortcut for
the requests that pass them."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from fastapi import HTTPException
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State
from starlette.types import ASGIApp, Receive, Scope, Send

from schemas import Target
from schemas.api import MAX_ID, BestRequest, LeaseRequest, Results
from tuner_server.api.records import BEST_PATH, BEST_ROLES
from tuner_server.api.workers import lease_trials, store_results
from tuner_server.api.workers import router as workers_router
from tuner_server.middleware import replayed
from tuner_server.services import records as svc
from tuner_server.services.tokens import MISS, TokenInfo

_JSON = [(b"content-type", b"application/json")]
# a shortcut's answer (None: the route must answer); database work goes to a thread
Answer = Callable[[], Awaitable[bytes | None]]
_WORKER_CALL = re.compile(re.escape(workers_router.prefix)
                          + r"/([1-9][0-9]{0,9})/(lease|results)")


def _bearer(scope: Scope) -> str | None:
    """The request's bearer token, or None (no Authorization header, another scheme)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() or None if scheme.lower() == "bearer" else None
    return None


def _admitted(state: State, token: str | None, admits: Callable[[TokenInfo], bool]) -> bool:
    """Whether the request may take the shortcut: ``token`` (None: the server asks for
    none) is known, from the process's cache or looked up (call it in a thread), and
    its role passes ``admits``, the route's own check."""
    if token is None:
        return True
    info = state.tokens.cached(token)
    if info is MISS:
        info = state.tokens.lookup(token)
    return isinstance(info, TokenInfo) and admits(info)


def _own(worker_id: int) -> Callable[[TokenInfo], bool]:
    """``require_worker_self``: an admin's token, or the one this worker was given."""
    return lambda info: info.role == "admin" or (info.role == "worker"
                                                 and info.worker_id == worker_id)


def _best(state: State, token: str | None, body: bytes) -> Answer | None:
    """records/best's answer, or None where the route answers."""
    try:
        request = BestRequest.model_validate_json(body)
        target = Target.parse(request.target)
    except ValueError:  # ValidationError is one: the route words the 422
        return None

    def work() -> bytes | None:
        if not _admitted(state, token, lambda info: info.role in BEST_ROLES):
            return None
        with state.readers() as session:
            return svc.best_json(svc.best(session, request.workloads, target))

    return lambda: run_in_threadpool(work)


def _results(state: State, token: str | None, body: bytes, worker_id: int
             ) -> Answer | None:
    """A worker's results call (``store_results``), or None where the route answers."""
    try:
        results = Results.model_validate_json(body)
    except ValueError:
        return None

    def work() -> bytes | None:
        if not _admitted(state, token, _own(worker_id)):
            return None
        with state.sessions() as session:
            try:
                accepted = store_results(state, session, worker_id, results)
            except HTTPException:  # an unknown worker, a refused result: nothing stored
                return None
        return accepted.model_dump_json().encode()

    return lambda: run_in_threadpool(work)


def _lease(state: State, token: str | None, body: bytes, worker_id: int) -> Answer | None:
    """A worker's lease (``lease_trials``, long-poll included: it waits on the event
    loop as the route does), or None where the route answers."""
    try:
        request = LeaseRequest.model_validate_json(body)
    except ValueError:
        return None

    async def answer() -> bytes | None:
        if token is not None and state.tokens.cached(token) is MISS:
            await run_in_threadpool(state.tokens.lookup, token)  # I/O: it caches the role
        if not _admitted(state, token, _own(worker_id)):
            return None
        try:
            leased = await lease_trials(state, worker_id, request)
        except HTTPException:  # an unknown worker, a refused lease: nothing leased
            return None
        return leased.model_dump_json().encode()

    return answer


class Shortcuts:
    """The shortcuts, as the layer just inside ``Guard`` (which has read the body whole
    and answers any error that escapes)."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app = app
        self.state = state

    @staticmethod
    def _route(scope: Scope) -> Callable[[State, str | None, bytes], Answer | None] | None:
        """The shortcut of the request's path, or None (the request goes on as it is)."""
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        path = scope["path"]
        if path == BEST_PATH:
            return _best
        match = _WORKER_CALL.fullmatch(path)
        if match and int(match[1]) <= MAX_ID:
            worker_id, call = int(match[1]), _lease if match[2] == "lease" else _results
            return lambda state, token, body: call(state, token, body, worker_id)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        body = await _read(receive)
        answer = None
        token = _bearer(scope) if self.state.settings.require_auth else None
        if token is not None or not self.state.settings.require_auth:  # else: 401
            made = route(self.state, token, body)
            answer = None if made is None else await made()
        if answer is None:
            await self.app(scope, replayed(body, receive), send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_JSON, (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})


async def _read(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return b"".join(chunks)
