"""Worker routes: list (with stats), register, lease (long-poll), heartbeat, results,
release, deregister. Registering hands out a token bound to that worker; every later
call for it needs that token (or an admin's)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from fastapi import APIRouter, Depends, HTTPException, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State

from schemas.api import (
    Deregistered,
    HeartbeatAnswer,
    LeaseAnswer,
    LeasedTrial,
    LeaseRequest,
    Registered,
    Released,
    Results,
    ResultsAccepted,
    TrialIds,
    WorkerInfo,
    WorkerRegistration,
)
from tuner_server.api.deps import (
    Caller,
    PathId,
    get_session,
    refusals,
    require,
    require_worker_self,
)
from tuner_server.db.models import WorkerRow
from tuner_server.services import dispatch, fleet

router = APIRouter(prefix="/api/v1/workers", tags=["workers"], responses=refusals(404, 409))


def _worker(session: Session, worker_id: int) -> WorkerRow:
    """The worker's row (a 404 when it is not registered), to change it."""
    return _found(dispatch.get_worker(session, worker_id), worker_id)


def _seen(session: Session, worker_id: int) -> dispatch.SeenWorker:
    """The worker as a lease or a report reads it, its last_seen set to now."""
    return _found(dispatch.seen_worker(session, worker_id), worker_id)


W = TypeVar("W", WorkerRow, dispatch.SeenWorker)


def _found(worker: W | None, worker_id: int) -> W:
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
    return fleet.list_workers(session, request.app.state.settings.lease_seconds)


@router.post("", response_model=Registered, status_code=201)
def register(body: WorkerRegistration, request: Request,
             session: Session = Depends(get_session),
             _caller: Caller = Depends(require("worker"))) -> Registered:
    """Any worker token may register; the answer's token is the worker's own.

    Any worker token may also take over the row of a worker of the same name and target
    that is not alive (a restart): that row's older tokens stop working and the trials it
    still held are handled as expired leases."""
    done = dispatch.register(session, body.name, body.target, body.limits, body.device,
                             request.app.state.settings.lease_seconds)
    session.commit()
    request.app.state.tokens.forget(done.id)  # the row's older tokens were revoked
    request.app.state.queue.returned(done.requeued)
    request.app.state.queue.finished(done.failed)
    return Registered(id=done.id, token=done.token)


@router.delete("/{worker_id}", response_model=Deregistered)
def deregister(worker_id: PathId, request: Request, session: Session = Depends(get_session),
               _caller: Caller = Depends(require_worker_self)) -> Deregistered:
    """The worker stops: its leased trials go back to the queue (not failed attempts)."""
    trials = dispatch.deregister(session, _worker(session, worker_id))
    session.commit()
    request.app.state.tokens.forget(worker_id)  # its tokens were revoked
    request.app.state.queue.returned(trials)
    return Deregistered(id=worker_id, released=len(trials))


@router.post("/{worker_id}/lease", response_model=LeaseAnswer)
async def lease(worker_id: PathId, body: LeaseRequest, request: Request,
                _caller: Caller = Depends(require_worker_self)) -> LeaseAnswer:
    """Lease up to ``max_trials``; with none queued, wait up to ``wait_s`` for some.

    The wait costs nothing: the lease parks on its queues (``queue.notify``) and tries
    again only when woken (trials pushed or returned there, in this process or another)
    or ends empty at its deadline. It parks before each attempt, so a wake landing
    during the attempt is kept."""
    return await lease_trials(request.app.state, worker_id, body)


async def lease_trials(state: State, worker_id: int, body: LeaseRequest) -> LeaseAnswer:
    """The lease route's work (``api.hot`` answers most calls with it too); raises
    HTTPException, with nothing leased, for an unknown worker or a refused lease."""
    hub = state.queue.hub
    deadline = time.monotonic() + body.wait_s
    queues = hub.queues_of(worker_id)
    while True:
        waiter = (hub.register(queues, body.max_trials, state.sessions)
                  if queues is not None and body.wait_s > 0 else None)
        try:
            # the database work runs in a thread: the event loop keeps serving others.
            # The pool the sync routes use (40 threads), not asyncio's default (cores + 4
            # = 6 here): behind 6 threads leases queued for seconds while reports passed.
            trials, queues = await run_in_threadpool(_lease_once, state, worker_id,
                                                     body.max_trials)
            hub.remember(worker_id, queues)
            left = deadline - time.monotonic()
            if not trials and left > 0:
                if waiter is None:  # the worker's first lease here: park, then try again
                    continue
                if await waiter.wait(left):
                    continue  # woken: try again (another may have taken it)
        finally:
            if waiter is not None:
                hub.unregister(waiter)
        # the worker paces its heartbeats by this
        return LeaseAnswer(trials=trials, lease_seconds=state.settings.lease_seconds)


def _lease_once(state: State, worker_id: int, max_trials: int
                ) -> tuple[list[LeasedTrial], tuple[str, ...]]:
    """One lease attempt in a session of its own: (trials leased, queues the worker
    serves)."""
    with state.sessions() as session:
        worker = _seen(session, worker_id)
        with _refusals():
            trials, failed = dispatch.lease(session, state.queue, worker, max_trials,
                                            state.settings.lease_seconds)
            queues = dispatch.served_queues(worker)  # parsed above, cached
        session.commit()
    state.queue.finished(failed)
    state.metrics.leased(len(trials))
    return trials, queues


@router.post("/{worker_id}/heartbeat", response_model=HeartbeatAnswer)
def heartbeat(worker_id: PathId, body: TrialIds, request: Request,
              session: Session = Depends(get_session),
              _caller: Caller = Depends(require_worker_self)) -> HeartbeatAnswer:
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
    return HeartbeatAnswer(extended=extended)


@router.post("/{worker_id}/results", response_model=ResultsAccepted)
def results(worker_id: PathId, body: Results, request: Request,
            session: Session = Depends(get_session),
            _caller: Caller = Depends(require_worker_self)) -> ResultsAccepted:
    """All or nothing: 409 when any result is for a trial not leased to this worker."""
    return store_results(request.app.state, session, worker_id, body)


def store_results(state: State, session: Session, worker_id: int,
                  body: Results) -> ResultsAccepted:
    """The results route's work (``api.hot`` answers most calls with it too); raises
    HTTPException, with nothing stored, for an unknown worker or a refused result."""
    worker = _seen(session, worker_id)
    with _refusals():
        counts = dispatch.report(session, worker,
                                 [(r.trial_id, r.result, r.info) for r in body.results])
    session.commit()
    state.queue.finished([r.trial_id for r in body.results])
    state.metrics.recorded(counts.accepted)
    return ResultsAccepted(accepted=counts.accepted, duplicates=counts.duplicates)


@router.post("/{worker_id}/release", response_model=Released)
def release(worker_id: PathId, body: TrialIds, request: Request,
            session: Session = Depends(get_session),
            _caller: Caller = Depends(require_worker_self)) -> Released:
    """Give trials back unmeasured (not a failed attempt). 409 (nothing released)
    naming the trials that are not this worker's; trials it already reported (or that
    were cancelled while it held them) are harmless no-ops, not counted in
    ``released``."""
    worker = _worker(session, worker_id)
    with _refusals():
        trials = dispatch.release(session, worker, body.trial_ids)
    session.commit()
    request.app.state.queue.returned(trials)
    return Released(released=len(trials))
