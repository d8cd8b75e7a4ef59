"""records/best the short way: a lookup in the common shape is answered below FastAPI.

A build asks records/best layer by layer, so its per-request cost is the framework's as
much as the query's: FastAPI's dependency solving, its exit stack, the request and
response objects and their exception wrappers cost about as much as the lookup itself.
A request whose token has an allowed role, whose body validates and whose target
parses is answered here (the same service calls, the same bytes); anything else (a
missing or unknown token, a bad body, a refusal) falls through
to the FastAPI route with its body, which answers it as it always has. So the route stays
the one definition of the endpoint's contract and errors, this is only a shortcut for
the requests that pass it."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schemas import Target
from schemas.api import BestRequest
from tuner_server.api.records import BEST_PATH, BEST_ROLES
from tuner_server.services import records as svc
from tuner_server.services.tokens import MISS, TokenInfo

_JSON = [(b"content-type", b"application/json")]


def _bearer(scope: Scope) -> str | None:
    """The request's bearer token, or None (no Authorization header, another scheme)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() or None if scheme.lower() == "bearer" else None
    return None


class HotBest:
    """The shortcut, as the layer just inside ``Guard`` (which has read the body whole
    and answers any error that escapes)."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["path"] != BEST_PATH
                or scope["method"] != "POST"):
            await self.app(scope, receive, send)
            return
        body = await self._body(receive)
        answer = await self._answer(scope, body)
        if answer is None:
            await self.app(scope, _replay(body, receive), send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_JSON, (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    @staticmethod
    async def _body(receive: Receive) -> bytes:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                return b"".join(chunks)

    async def _answer(self, scope: Scope, body: bytes) -> bytes | None:
        """The route's answer, or None where the route must answer (it refuses)."""
        token = None
        if self.state.settings.require_auth:
            token = _bearer(scope)
            if token is None:
                return None
        try:
            request = BestRequest.model_validate_json(body)
            target = Target.parse(request.target)
        except ValueError:  # ValidationError is one: the route words the 422
            return None
        tokens, readers = self.state.tokens, self.state.readers

        def lookup() -> bytes | None:
            if token is not None:  # a token the cache has forgotten: looked up here
                info = tokens.cached(token)
                if info is MISS:
                    info = tokens.lookup(token)
                if not isinstance(info, TokenInfo) or info.role not in BEST_ROLES:
                    return None
            with readers() as session:
                return svc.best_json(svc.best(session, request.workloads, target))

        return await run_in_threadpool(lookup)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with ``body`` given again first (this layer read it)."""
    replayed = False

    async def again() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again

