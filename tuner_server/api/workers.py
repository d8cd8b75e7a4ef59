"""Worker routes: list (with stats), register, lease (long-poll), heartbeat, results,
release, deregister. Registering hands out a token bound to that worker; every later
call for it needs that token (or an admin's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field, ValidationInfo, field_validator
from sqlalchemy.orm import Session

from schemas import DeviceLimits, MeasureResult, Target
from schemas.measure import MAX_INFO_CHARS, check_info, check_measurement
from schemas.target import check_text
from tuner_server.api.deps import (
    BodyId,
    Caller,
    PathId,
    get_session,
    require,
    require_worker_self,
)
from tuner_server.db.models import WorkerRow
from tuner_server.services import dispatch, fleet

router = APIRouter(prefix="/api/v1/workers", tags=["workers"])


class WorkerRegistration(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    target: Target
    limits: DeviceLimits = DeviceLimits()
    device: str | None = Field(None, min_length=1, max_length=255,
                               description="the device's own name, e.g. NVIDIA H200")

    @field_validator("name", "device")
    @classmethod
    def _printable(cls, value: str | None, info: ValidationInfo) -> str | None:
        # stored in VARCHAR columns and shown on terminals: PostgreSQL refuses NUL
        return value if value is None else check_text(value, str(info.field_name))


class WorkerInfo(BaseModel):
    id: int
    name: str
    target: str
    device: str = Field(description="the device's name, else the target's model")
    last_heartbeat: float = Field(description="unix seconds of its last contact")
    alive: bool = Field(description="serving: not deregistered, and seen within the "
                                    "server's lease time")
    stopped: bool = Field(description="deregistered (the worker stopped)")
    trials_per_minute: float = Field(description="results in the last 10 minutes / 10")
    error_rate: float | None = Field(
        description="share of the last 10 minutes' results with error_no != 0; "
                    "null without results")
    trials_done: int


class LeaseRequest(BaseModel):
    max_trials: int = Field(1, ge=1, le=1024)
    wait_s: float = Field(10.0, ge=0, le=60, description="long-poll: wait this long for work")


class TrialIds(BaseModel):
    trial_ids: list[BodyId] = Field(max_length=4096)


class TrialResult(BaseModel):
    trial_id: BodyId
    result: MeasureResult
    info: dict[str, Any] | None = Field(
        None, description=f"kept with the record; at most {MAX_INFO_CHARS} characters of JSON")

    @field_validator("info")
    @classmethod
    def _small(cls, info: dict[str, Any] | None) -> dict[str, Any] | None:
        return info if info is None else check_info(info)

    @field_validator("result")
    @classmethod
    def _measured(cls, result: MeasureResult) -> MeasureResult:
        check_measurement(result)  # the rule records import applies too
        return result


class Results(BaseModel):
    results: list[TrialResult] = Field(max_length=4096)


def _worker(session: Session, worker_id: int) -> WorkerRow:
    worker = dispatch.get_worker(session, worker_id)
    if worker is None:
        raise HTTPException(404, f"worker {worker_id} is not registered")
    return worker


@contextmanager
def _refusals() -> Iterator[None]:
    """A request at odds with the worker's state or leases: 409 with the reason."""
    try:
        yield
    except dispatch.WorkerRefused as err:
        raise HTTPException(409, str(err)) from None


@router.get("", response_model=list[WorkerInfo])
def list_workers(request: Request, session: Session = Depends(get_session),
                 _caller: Caller = Depends(require("client"))) -> list[WorkerInfo]:
    stats = fleet.list_workers(session, request.app.state.settings.lease_seconds)
    return [WorkerInfo(**asdict(s)) for s in stats]


@router.post("", status_code=201)
def register(body: WorkerRegistration, request: Request,
             session: Session = Depends(get_session),
             _caller: Caller = Depends(require("worker"))) -> dict[str, Any]:
    """Any worker token may register; the answer's token is the worker's own.

    Any worker token may also take over the row of a worker of the same name and target
    that is not alive (a restart): that row's older tokens stop working and the trials it
    still held are handled as expired leases."""
    done = dispatch.register(session, body.name, body.target, body.limits, body.device,
                             request.app.state.settings.lease_seconds)
    session.commit()
    request.app.state.queue.returned(done.requeued)
    request.app.state.queue.finished(done.failed)
    return {"id": done.id, "token": done.token}


@router.delete("/{worker_id}")
def deregister(worker_id: PathId, request: Request, session: Session = Depends(get_session),
               _caller: Caller = Depends(require_worker_self)) -> dict[str, int]:
    """The worker stops: its leased trials go back to the queue (not failed attempts)."""
    trials = dispatch.deregister(session, _worker(session, worker_id))
    session.commit()
    request.app.state.queue.returned(trials)
    return {"id": worker_id, "released": len(trials)}


@router.post("/{worker_id}/lease")
async def lease(worker_id: PathId, body: LeaseRequest, request: Request,
                _caller: Caller = Depends(require_worker_self)) -> dict[str, Any]:
    app = request.app
    deadline = time.time() + body.wait_s
    while True:
        # the database work runs in a thread: the event loop keeps serving others
        trials = await asyncio.to_thread(_lease_once, app, worker_id, body.max_trials)
        if trials or time.time() >= deadline:
            # the worker paces its heartbeats by this
            return {"trials": trials, "lease_seconds": app.state.settings.lease_seconds}
        await asyncio.sleep(min(0.05, max(deadline - time.time(), 0)))


def _lease_once(app: FastAPI, worker_id: int, max_trials: int) -> list[dict[str, Any]]:
    with app.state.sessions() as session:
        worker = _worker(session, worker_id)
        with _refusals():
            trials, failed = dispatch.lease(session, app.state.queue, worker, max_trials,
                                            app.state.settings.lease_seconds)
        session.commit()
    app.state.queue.finished(failed)
    app.state.metrics.leased(len(trials))
    return trials


@router.post("/{worker_id}/heartbeat")
def heartbeat(worker_id: PathId, body: TrialIds, request: Request,
              session: Session = Depends(get_session),
              _caller: Caller = Depends(require_worker_self)) -> dict[str, int]:
    """Extend the leases of trials this worker holds. 409 (nothing extended) naming
    the trials that are not its own (unknown, queued again, leased to or measured by
    another): the worker stops measuring those. Trials it already reported (or that
    were cancelled while it held them) are left alone, not refused: a beat may race
    its own report."""
    worker = _worker(session, worker_id)
    with _refusals():
        extended = dispatch.heartbeat(session, worker, body.trial_ids,
                                      request.app.state.settings.lease_seconds)
    session.commit()
    return {"extended": extended}


@router.post("/{worker_id}/results")
def results(worker_id: PathId, body: Results, request: Request,
            session: Session = Depends(get_session),
            _caller: Caller = Depends(require_worker_self)) -> dict[str, int]:
    """All or nothing: 409 when any result is for a trial not leased to this worker."""
    worker = _worker(session, worker_id)
    with _refusals():
        counts = dispatch.report(session, worker,
                                 [(r.trial_id, r.result, r.info) for r in body.results])
    session.commit()
    request.app.state.queue.finished([r.trial_id for r in body.results])
    request.app.state.metrics.recorded(counts.accepted)
    return {"accepted": counts.accepted, "duplicates": counts.duplicates}


@router.post("/{worker_id}/release")
def release(worker_id: PathId, body: TrialIds, request: Request,
            session: Session = Depends(get_session),
            _caller: Caller = Depends(require_worker_self)) -> dict[str, int]:
    """Give trials back unmeasured (not a failed attempt). 409 (nothing released)
    naming the trials that are not this worker's; trials it already reported (or that
    were cancelled while it held them) are harmless no-ops, not counted in
    ``released``."""
    worker = _worker(session, worker_id)
    with _refusals():
        trials = dispatch.release(session, worker, body.trial_ids)
    session.commit()
    request.app.state.queue.returned(trials)
    return {"released": len(trials)}
