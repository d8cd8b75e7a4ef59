"""Jobs routes: submit, list, follow (a task's trials, incrementally), cancel."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from sqlalchemy.orm import Session

from schemas.api import (
    MAX_ID,
    JobCancelled,
    JobCreated,
    JobRequest,
    JobView,
    ModelView,
    TrialPage,
)
from tuner_server.api.deps import Caller, PathId, get_session, refusals, require
from tuner_server.services import jobs as svc
from tuner_server.services.model_view import model_view

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"], responses=refusals(404))


@router.post("", response_model=JobCreated, status_code=201)
def submit(body: JobRequest, session: Session = Depends(get_session),
           _caller: Caller = Depends(require("client"))) -> JobCreated:
    try:
        job_id = svc.submit(session, body)
    except svc.JobError as err:
        raise HTTPException(422, str(err)) from None
    session.commit()
    return JobCreated(id=job_id)


# ``exclude_unset``: a task's ``curve`` is in the JSON only where it was asked for.
@router.get("", response_model=list[JobView], response_model_exclude_unset=True)
def list_jobs(request: Request, limit: int = Query(100, ge=1, le=1000),
              offset: int = Query(0, ge=0, le=MAX_ID),
              session: Session = Depends(get_session),
              _caller: Caller = Depends(require("client"))) -> list[JobView]:
    return svc.list_jobs(session, limit, offset,
                         lease_s=request.app.state.settings.lease_seconds)


@router.get("/{job_id}", response_model=JobView, response_model_exclude_unset=True)
def get_job(job_id: PathId, request: Request,
            curves: bool = Query(True, description="each task's tuning curve (improvements)"),
            session: Session = Depends(get_session),
            _caller: Caller = Depends(require("client"))) -> JobView:
    job = svc.describe(session, job_id, with_curves=curves,
                       lease_s=request.app.state.settings.lease_seconds)
    if job is None:
        raise HTTPException(404, f"job {job_id} not found")
    return job


@router.get("/{job_id}/model", response_model=ModelView)
def get_model_view(job_id: PathId, request: Request, session: Session = Depends(get_session),
                   _caller: Caller = Depends(require("client"))) -> ModelView:
    """The job as a model's tuning: per task its layers, default and best cost, failures
    and share of the model's estimated latency (largest first), and that estimate as
    the results arrived. Each job's figures are kept between calls (per process): a
    call reads only the results stored since the last."""
    view = model_view(session, job_id, views=request.app.state.model_views)
    if view is None:
        raise HTTPException(404, f"job {job_id} not found")
    return view


# ``exclude_unset``: a trial's ``record`` is in the JSON only where it was asked for.
@router.get("/{job_id}/tasks/{task_id}/trials", response_model=TrialPage,
            response_model_exclude_unset=True)
def task_trials(job_id: PathId, task_id: PathId,
                after: int | None = Query(None, ge=1, le=MAX_ID,
                                          description="only trials stored after this one"),
                limit: int = Query(svc.MAX_TRIAL_PAGE, ge=1, le=svc.MAX_TRIAL_PAGE),
                records: bool = Query(True, description="each trial's stored AutoTVM line"),
                session: Session = Depends(get_session),
                _caller: Caller = Depends(require("client"))) -> TrialPage:
    try:
        page = svc.task_trials(session, job_id, task_id, after, limit, with_records=records)
    except svc.JobError as err:
        raise HTTPException(422, str(err)) from None
    if page is None:
        raise HTTPException(404, f"job {job_id} has no task {task_id}")
    return page


@router.post("/{job_id}/cancel", response_model=JobCancelled)
def cancel(job_id: PathId, session: Session = Depends(get_session),
           _caller: Caller = Depends(require("client"))) -> JobCancelled:
    status = svc.cancel(session, job_id)
    if status is None:
        raise HTTPException(404, f"job {job_id} not found")
    session.commit()
    return JobCancelled(id=job_id, status=status)
