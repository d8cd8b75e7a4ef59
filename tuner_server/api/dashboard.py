"""What the dashboard page asks the server about itself, and the read-only guard of the
local dashboard (``tuner dashboard``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from schemas.api import DashboardInfo

router = APIRouter(prefix="/api/v1/dashboard", tags=["dashboard"])

# Methods a read-only server answers: nothing it does on them writes.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
READ_ONLY_DETAIL = ("this dashboard is read-only (tuner dashboard): submit and cancel jobs "
                    "with `tuner tune`, or on a tuning server (`tuner serve`)")


@router.get("", response_model=DashboardInfo)
def info(request: Request) -> DashboardInfo:
    """Whether the page needs a token, and whether it may offer to cancel jobs. Open to
    anyone: it says nothing about the data."""
    return DashboardInfo(token_required=request.app.state.settings.require_auth,
                         read_only=bool(getattr(request.app.state, "read_only", False)))


class ReadOnly:
    """Refuses (405, one line) every request that could write: the local dashboard
    shows a database; it never changes it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in READ_METHODS:
            answer = JSONResponse({"detail": READ_ONLY_DETAIL}, status_code=405,
                                  headers={"Allow": ", ".join(sorted(READ_METHODS))})
            await answer(scope, receive, send)
            return
        await self.app(scope, receive, send)
