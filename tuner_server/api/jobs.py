"""Jobs routes: submit, list, follow (a task's trials, incrementally), cancel."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from schemas import MeasureOptions, Target, Workload
from tuner_server.api.deps import MAX_ID, Caller, PathId, get_session, require
from tuner_server.search import DEFAULT_TUNER, TUNERS
from tuner_server.services import jobs as svc

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


class JobRequest(BaseModel):
    target: Target
    tasks: list[Workload] = Field(min_length=1, max_length=1000)
    n_trial: int = Field(64, ge=1, le=1_000_000, description="trials per task")
    tuner: str = Field(DEFAULT_TUNER, max_length=32,
                       description="one of: " + ", ".join(sorted(TUNERS)))
    early_stopping: int | None = Field(None, ge=1, le=MAX_ID)
    plan_size: int = Field(16, ge=1, le=4096)
    measure: MeasureOptions = MeasureOptions()


class JobCreated(BaseModel):
    id: int


class TrialPoint(BaseModel):
    trial: int = Field(description="1-based, in the order results were stored")
    id: int = Field(description="the trial's id (what `after` takes)")
    gflops: float | None = Field(description="null when the trial failed")
    error_no: int = Field(description="AutoTVM's MeasureErrorNo; 0 is success")
    cost: float | None = Field(description="mean seconds; null when the trial failed")


class TrialPage(BaseModel):
    task_id: int
    status: str
    trials_done: int
    items: list[TrialPoint]


@router.post("", response_model=JobCreated, status_code=201)
def submit(body: JobRequest, session: Session = Depends(get_session),
           _caller: Caller = Depends(require("client"))) -> JobCreated:
    spec = svc.JobSpec(target=body.target, workloads=body.tasks, n_trial=body.n_trial,
                       tuner=body.tuner, early_stopping=body.early_stopping,
                       plan_size=body.plan_size, measure=body.measure)
    try:
        job_id = svc.submit(session, spec)
    except svc.JobError as err:
        raise HTTPException(422, str(err)) from None
    session.commit()
    return JobCreated(id=job_id)


@router.get("")
def list_jobs(request: Request, limit: int = Query(100, ge=1, le=1000),
              offset: int = Query(0, ge=0, le=MAX_ID),
              session: Session = Depends(get_session),
              _caller: Caller = Depends(require("client"))) -> list[dict[str, Any]]:
    return svc.list_jobs(session, limit, offset,
                         lease_s=request.app.state.settings.lease_seconds)


@router.get("/{job_id}")
def get_job(job_id: PathId, request: Request,
            curves: bool = Query(True, description="each task's tuning curve (improvements)"),
            session: Session = Depends(get_session),
            _caller: Caller = Depends(require("client"))) -> dict[str, Any]:
    job = svc.describe(session, job_id, with_curves=curves,
                       lease_s=request.app.state.settings.lease_seconds)
    if job is None:
        raise HTTPException(404, f"job {job_id} not found")
    return job


@router.get("/{job_id}/tasks/{task_id}/trials", response_model=TrialPage)
def task_trials(job_id: PathId, task_id: PathId,
                after: int | None = Query(None, ge=1, le=MAX_ID,
                                          description="only trials stored after this one"),
                limit: int = Query(svc.MAX_TRIAL_PAGE, ge=1, le=svc.MAX_TRIAL_PAGE),
                session: Session = Depends(get_session),
                _caller: Caller = Depends(require("client"))) -> TrialPage:
    try:
        page = svc.task_trials(session, job_id, task_id, after, limit)
    except svc.JobError as err:
        raise HTTPException(422, str(err)) from None
    if page is None:
        raise HTTPException(404, f"job {job_id} has no task {task_id}")
    return TrialPage(task_id=page.task_id, status=page.status, trials_done=page.trials_done,
                     items=[TrialPoint(**asdict(p)) for p in page.items])


@router.post("/{job_id}/cancel")
def cancel(job_id: PathId, session: Session = Depends(get_session),
           _caller: Caller = Depends(require("client"))) -> dict[str, Any]:
    status = svc.cancel(session, job_id)
    if status is None:
        raise HTTPException(404, f"job {job_id} not found")
    session.commit()
    return {"id": job_id, "status": status}
