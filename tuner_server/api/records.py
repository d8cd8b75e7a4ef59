"""Records routes: list, search (the dashboard's), best, import, pretuned logs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, HTTPException, Query, Response
from pydantic import AfterValidator, ValidationError
from sqlalchemy.orm import Session

from schemas import Target, Workload
from schemas.api import (
    MAX_ID,
    BestRequest,
    BestResponse,
    ImportResponse,
    RecordPage,
    RecordSearchPage,
)
from schemas.text import check_text, first_problem, shown
from schemas.workload import MAX_TEMPLATE_CHARS
from tuner_server.api.deps import Caller, get_reader, get_session, refusals, require
from tuner_server.services import records as svc

router = APIRouter(prefix="/api/v1", tags=["records"], responses=refusals())
# the routes whose body may be large (a whole log; MAX_BEST_WORKLOADS workloads, 1.4 MB
# of conv2d ones): the Guard lets them through
IMPORT_ROUTE = "/records/import"
IMPORT_PATH = router.prefix + IMPORT_ROUTE
BEST_ROUTE = "/records/best"
BEST_PATH = router.prefix + BEST_ROUTE
BEST_ROLES = frozenset({"admin", "client", "worker"})  # who may ask (``api.hot`` too)
LARGE_BODY_PATHS = frozenset({IMPORT_PATH, BEST_PATH})

# A query string without control characters: PostgreSQL refuses NUL in a parameter.
Plain = Annotated[str, AfterValidator(lambda v: check_text(v, "text"))]


def _target(text: str, field: str = "target") -> Target:
    try:
        return Target.parse(text)
    except ValidationError as err:
        problem = first_problem(err)
        if problem.startswith("target"):  # Target's own messages name the target
            detail = field + problem.removeprefix("target")
        else:
            detail = f"{field}: {problem} (got {shown(text)})"
        raise HTTPException(422, detail) from None
    except ValueError as err:
        raise HTTPException(422, f"{field}: {err}") from None


@router.get("/records", response_model=RecordPage)
def list_records(
    target: str | None = None,
    template: Plain | None = Query(None, max_length=MAX_TEMPLATE_CHARS),
    workload: Plain | None = Query(None, max_length=64 * 1024,
                                   description="AutoTVM args list as JSON (needs template)"),
    limit: int = Query(100, ge=1, le=10000),
    offset: int = Query(0, ge=0, le=MAX_ID),
    session: Session = Depends(get_session),
    _caller: Caller = Depends(require("client")),
) -> RecordPage:
    wl = None
    if workload is not None:
        if template is None:
            raise HTTPException(422, "workload: filtering by workload needs template too")
        try:
            wl = Workload(template=template, args=workload)
        except ValidationError as err:
            raise HTTPException(422, f"workload: {first_problem(err)}") from None
    total, items = svc.query(session, _target(target) if target else None, template, wl,
                             limit, offset)
    return RecordPage(total=total, items=[r.to_json() for r in items])


@router.get("/records/search", response_model=RecordSearchPage)
def search_records(
    target: str | None = Query(None, description="a kind (every model) or kind + -model"),
    template: Plain | None = Query(None, max_length=MAX_TEMPLATE_CHARS),
    workload: Plain | None = Query(None, max_length=1000,
                                   description="a substring of the workload key, "
                                               "e.g. 1,64,56,56"),
    best: bool = Query(True, description="only the best record per device model and workload"),
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=MAX_ID),
    session: Session = Depends(get_session),
    _caller: Caller = Depends(require("client")),
) -> RecordSearchPage:
    total, items = svc.search(session, _target(target) if target else None, template or None,
                              workload or None, best, limit, offset)
    return RecordSearchPage(total=total, items=items)


@router.post(BEST_ROUTE, response_model=BestResponse)
def best_records(body: BestRequest, session: Session = Depends(get_reader),
                 _caller: Caller = Depends(require(*BEST_ROLES))) -> Response:
    # a BestResponse's JSON written directly (svc.best_json): FastAPI would validate
    # and serialise the answer's models again, the larger part of a big request's time.
    # Most requests are answered before they get here, by api.hot's shortcut.
    answers = svc.best(session, body.workloads, _target(body.target))
    return Response(svc.best_json(answers), media_type="application/json")


@router.post(IMPORT_ROUTE, response_model=ImportResponse)
def import_records(
    body: str = Body(..., media_type="text/plain",
                     description="AutoTVM JSON lines (32 MiB at most); stored as imported "
                                 "records, which never outrank this fleet's measurements "
                                 "of the same device model"),
    session: Session = Depends(get_session),
    _caller: Caller = Depends(require("client")),
) -> ImportResponse:
    # "\n" only: str.splitlines would also split inside a JSON string holding U+2028
    report = svc.import_lines(session, body.split("\n"))
    session.commit()
    return report.answer()


@router.get("/logs/{target:path}")
def pretuned_log(target: str, session: Session = Depends(get_session),
                 if_none_match: str | None = Header(None),
                 _caller: Caller = Depends(require("client", "worker"))) -> Response:
    lines, etag = svc.pretuned_log(session, _target(target))
    if if_none_match == etag:
        return Response(status_code=304, headers={"ETag": etag})
    body = "".join(line + "\n" for line in lines)
    return Response(body, media_type="text/plain", headers={"ETag": etag})
