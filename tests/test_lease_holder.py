"""Results only from the lease holder, against a real server on SQLite and PostgreSQL: a
worker token speaks for one worker; results for a trial that worker does not hold are
refused whole (409, nothing stored) unless they repeat its own; deregistering gives the
trials back and shows the worker stopped; registering again reuses the row; a trial that
lost two workers is failed (error 8), not handed to a third; a corrupt worker row gets a
clear refusal, not a 500."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fixtures import BACKENDS, LiveServer, live_server
from sqlalchemy import create_engine, func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from schemas import MeasureErrorNo, MeasureResult, Record
from tuner_server.db.models import RecordRow, TrialRow, WorkerRow
from tuner_server.services import dispatch

pytestmark = pytest.mark.timeout(120)

TARGET = "opencl -model=pocl-cpu"
DENSE = "dense_small_batch.gpu"
DENSE_ARGS: list[Any] = [["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"],
                         None, "float32"]


def good(cost: float = 2e-5) -> dict[str, Any]:
    return MeasureResult(costs=(cost,), error_no=MeasureErrorNo.NO_ERROR, all_cost=0.1,
                         timestamp=time.time()).model_dump(mode="json")


def results(*trial_ids: int) -> dict[str, Any]:
    return {"results": [{"trial_id": t, "result": good()} for t in trial_ids]}


@dataclass
class Fleet:
    """A live server (scheduler passes run by hand), its database, and HTTP helpers."""

    server: LiveServer
    db: Engine

    def http(self, token: str) -> httpx.Client:
        return httpx.Client(base_url=self.server.url, timeout=30,
                            headers={"Authorization": f"Bearer {token}"})

    def call(self, token: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with self.http(token) as client:
            return client.request(method, path, **kwargs)

    def role(self, role: str) -> str:
        return self.server.tokens[role]

    def register(self, name: str, target: str = TARGET) -> tuple[int, str]:
        """(worker id, its own token), registered with the fleet's worker token."""
        response = self.call(self.role("worker"), "POST", "/api/v1/workers",
                             json={"name": name, "target": target})
        assert response.status_code == 201, response.text
        answer = response.json()
        return int(answer["id"]), str(answer["token"])

    def submit(self, n_trial: int) -> int:
        body = {"target": TARGET, "tasks": [{"template": DENSE, "args": DENSE_ARGS}],
                "n_trial": n_trial, "plan_size": n_trial,
                "measure": {"number": 1, "repeat": 1, "min_repeat_ms": 0}}
        response = self.call(self.role("client"), "POST", "/api/v1/jobs", json=body)
        assert response.status_code == 201, response.text
        return int(response.json()["id"])

    def run_pass(self) -> Any:
        return self.server._server.config.app.state.scheduler.run_pass()

    def lease(self, worker_id: int, token: str, n: int = 1) -> list[int]:
        response = self.call(token, "POST", f"/api/v1/workers/{worker_id}/lease",
                             json={"max_trials": n, "wait_s": 0})
        assert response.status_code == 200, response.text
        return [int(t["trial_id"]) for t in response.json()["trials"]]

    def trial(self, trial_id: int) -> TrialRow:
        with Session(self.db) as session:
            row = session.get(TrialRow, trial_id)
            assert row is not None
            return row

    def queued(self) -> list[int]:
        with Session(self.db) as session:
            return list(session.scalars(select(TrialRow.id).where(TrialRow.status == "queued")
                                        .order_by(TrialRow.id)))

    def records(self) -> list[tuple[int, Record]]:
        with Session(self.db) as session:
            return [(int(t), Record.from_json(line)) for t, line in session.execute(
                select(RecordRow.trial_id, RecordRow.line).order_by(RecordRow.id))]

    def worker_rows(self) -> int:
        with Session(self.db) as session:
            return int(session.scalar(select(func.count()).select_from(WorkerRow)) or 0)

    def workers(self) -> dict[int, dict[str, Any]]:
        response = self.call(self.role("client"), "GET", "/api/v1/workers")
        assert response.status_code == 200, response.text
        return {int(w["id"]): w for w in response.json()}


@pytest.fixture(params=BACKENDS)
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    with live_server(str(request.param), tmp_path) as server:
        db = create_engine(server.database_url, poolclass=NullPool)
        try:
            yield Fleet(server, db)
        finally:
            db.dispose()


def test_results_only_from_the_lease_holder(fleet: Fleet) -> None:
    """Another worker's trial, a trial nobody leased, an unknown id: 409 naming the
    trial, and nothing of the request stored, not even its good part. The holder's own
    result is stored once; its repeat is a duplicate (200)."""
    fleet.submit(n_trial=3)
    assert fleet.run_pass().planned == 3
    (alice, alice_token), (bob, bob_token) = fleet.register("alice"), fleet.register("bob")
    [mine] = fleet.lease(alice, alice_token)
    [theirs] = fleet.lease(bob, bob_token)
    [queued] = fleet.queued()
    path = f"/api/v1/workers/{alice}/results"
    cases = [((theirs,), f"trial {theirs} is leased to worker {bob}"),
             ((queued,), f"trial {queued} is queued"),
             ((424242,), "trial 424242 does not exist"),
             ((mine, theirs), f"trial {theirs} is leased to worker {bob}")]
    for trial_ids, why in cases:
        response = fleet.call(alice_token, "POST", path, json=results(*trial_ids))
        assert response.status_code == 409, (trial_ids, response.text)
        detail = response.json()["detail"]
        assert why in detail and "nothing stored" in detail, detail
    assert fleet.records() == []
    assert (fleet.trial(theirs).status, fleet.trial(theirs).worker_id) == ("leased", bob)
    assert fleet.trial(queued).status == "queued"
    # the holder's result, then its retry
    first = fleet.call(alice_token, "POST", path, json=results(mine))
    assert first.status_code == 200 and first.json() == {"accepted": 1, "duplicates": 0}
    again = fleet.call(alice_token, "POST", path, json=results(mine))
    assert again.status_code == 200 and again.json() == {"accepted": 0, "duplicates": 1}
    # bob may not post alice's measured trial either, with his own token or hers
    late = fleet.call(bob_token, "POST", f"/api/v1/workers/{bob}/results", json=results(mine))
    assert late.status_code == 409 and f"trial {mine} is done" in late.json()["detail"]
    posing = fleet.call(alice_token, "POST", f"/api/v1/workers/{bob}/results",
                        json=results(theirs))
    assert posing.status_code == 403, posing.text
    assert [t for t, _ in fleet.records()] == [mine]


def test_many_refused_trials_name_twenty(fleet: Fleet) -> None:
    """A refusal's detail names the first 20 trials and counts the rest."""
    worker_id, token = fleet.register("w")
    response = fleet.call(token, "POST", f"/api/v1/workers/{worker_id}/results",
                          json=results(*range(1000, 1030)))
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert detail == ("results refused, nothing stored: trials "
                      + ", ".join(str(t) for t in range(1000, 1020))
                      + " do not exist; and 10 more")


def test_a_token_speaks_for_its_own_worker(fleet: Fleet) -> None:
    """Heartbeat, release, lease and deregister with another worker's token, or the
    fleet's registration token: 403, and the lease is untouched. Admin may act."""
    fleet.submit(n_trial=2)
    fleet.run_pass()
    (alice, alice_token), (bob, bob_token) = fleet.register("alice"), fleet.register("bob")
    [held] = fleet.lease(alice, alice_token)
    deadline = fleet.trial(held).lease_deadline
    base = f"/api/v1/workers/{alice}"
    for token, who in ((bob_token, f"belongs to worker {bob}"),
                       (fleet.role("worker"), "only registers")):
        for method, path, body in (("POST", f"{base}/heartbeat", {"trial_ids": [held]}),
                                   ("POST", f"{base}/release", {"trial_ids": [held]}),
                                   ("POST", f"{base}/lease", {"wait_s": 0}),
                                   ("DELETE", base, None)):
            response = fleet.call(token, method, path, json=body)
            assert response.status_code == 403, (method, path, response.text)
            assert who in response.json()["detail"]
    row = fleet.trial(held)
    assert (row.status, row.worker_id, row.lease_deadline) == ("leased", alice, deadline)
    # the holder extends its lease; an admin may act for any worker
    beat = fleet.call(alice_token, "POST", f"{base}/heartbeat", json={"trial_ids": [held]})
    assert beat.status_code == 200 and beat.json() == {"extended": 1}
    beat = fleet.call(fleet.role("admin"), "POST", f"{base}/heartbeat",
                      json={"trial_ids": [held]})
    assert beat.status_code == 200 and beat.json() == {"extended": 1}
    # bob's heartbeat for alice's trial, on his own path: refused, her lease untouched
    deadline = fleet.trial(held).lease_deadline
    other = fleet.call(bob_token, "POST", f"/api/v1/workers/{bob}/heartbeat",
                       json={"trial_ids": [held]})
    assert other.status_code == 409
    assert other.json()["detail"] == (f"heartbeat refused, nothing extended: trial {held} "
                                      f"is leased to worker {alice}")
    assert fleet.trial(held).lease_deadline == deadline
    # an unknown worker: 404 for an admin, 403 for a worker's token
    assert fleet.call(fleet.role("admin"), "POST", "/api/v1/workers/424242/lease",
                      json={"wait_s": 0}).status_code == 404
    assert fleet.call(alice_token, "POST", "/api/v1/workers/424242/lease",
                      json={"wait_s": 0}).status_code == 403


def test_heartbeat_and_release_only_for_trials_the_worker_holds(fleet: Fleet) -> None:
    """A heartbeat or release naming a trial the worker does not hold (another's, queued,
    unknown) is a 409 naming it, and changes nothing, not even the trials it does hold;
    a trial it already reported is left alone, not refused (a beat racing its report)."""
    fleet.submit(n_trial=3)
    fleet.run_pass()
    (w1, t1), (w2, t2) = fleet.register("w1"), fleet.register("w2")
    a, b = fleet.lease(w1, t1, n=2)
    [c] = fleet.lease(w2, t2)
    base = f"/api/v1/workers/{w1}"
    deadline = fleet.trial(a).lease_deadline
    for path, head in (("heartbeat", "heartbeat refused, nothing extended"),
                       ("release", "release refused, nothing released")):
        response = fleet.call(t1, "POST", f"{base}/{path}", json={"trial_ids": [a, c, 4242]})
        assert response.status_code == 409, response.text
        assert response.json()["detail"] == (f"{head}: trial {c} is leased to worker {w2}; "
                                             "trial 4242 does not exist")
        row = fleet.trial(a)
        assert (row.status, row.worker_id, row.lease_deadline) == ("leased", w1, deadline)
    assert fleet.call(t1, "POST", f"{base}/results", json=results(a)).status_code == 200
    beat = fleet.call(t1, "POST", f"{base}/heartbeat", json={"trial_ids": [a, b]})
    assert beat.status_code == 200 and beat.json() == {"extended": 1}
    back = fleet.call(t1, "POST", f"{base}/release", json={"trial_ids": [a, b]})
    assert back.status_code == 200 and back.json() == {"released": 1}
    row = fleet.trial(b)
    assert (row.status, row.worker_id, row.attempts) == ("queued", None, 0)
    for token, worker, trial_id, why in ((t1, w1, b, f"queued, not leased to worker {w1}"),
                                         (t2, w2, a, f"done, not leased to worker {w2}")):
        response = fleet.call(token, "POST", f"/api/v1/workers/{worker}/heartbeat",
                              json={"trial_ids": [trial_id]})
        assert response.status_code == 409
        assert response.json()["detail"].endswith(f"trial {trial_id} is {why}")


def test_deregister_returns_trials_and_shows_the_worker_stopped(fleet: Fleet) -> None:
    """DELETE: the worker's leased trials are queued again without counting an attempt,
    it shows stopped and not alive, its token stops working, and it may not lease until
    it registers again, which reuses its id."""
    fleet.submit(n_trial=4)
    fleet.run_pass()
    worker_id, token = fleet.register("leaver")
    held = fleet.lease(worker_id, token, n=3)
    assert len(held) == 3
    response = fleet.call(token, "DELETE", f"/api/v1/workers/{worker_id}")
    assert response.status_code == 200, response.text
    assert response.json() == {"id": worker_id, "released": 3}
    for trial_id in held:
        row = fleet.trial(trial_id)
        assert (row.status, row.worker_id, row.attempts) == ("queued", None, 0)
    shown = fleet.workers()[worker_id]
    assert (shown["alive"], shown["stopped"]) == (False, True)
    assert fleet.call(token, "POST", f"/api/v1/workers/{worker_id}/lease",
                      json={"wait_s": 0}).status_code == 401
    refused = fleet.call(fleet.role("admin"), "POST", f"/api/v1/workers/{worker_id}/lease",
                         json={"wait_s": 0})
    assert refused.status_code == 409
    assert refused.json()["detail"] == f"worker {worker_id} deregistered; register again"
    # deregistering again changes nothing
    again = fleet.call(fleet.role("admin"), "DELETE", f"/api/v1/workers/{worker_id}")
    assert again.status_code == 200 and again.json() == {"id": worker_id, "released": 0}
    # back: the same row, serving again, and the returned trials are leased anew
    back_id, back_token = fleet.register("leaver")
    assert back_id == worker_id and back_token != token
    shown = fleet.workers()[worker_id]
    assert (shown["alive"], shown["stopped"]) == (True, False)
    assert set(held) < set(fleet.lease(worker_id, back_token, n=4))


def test_registering_again_reuses_a_stopped_or_lost_workers_row(fleet: Fleet) -> None:
    """Same name and target as a worker not seen within a lease: the same id (a restart,
    the next embedded run). A live namesake, or another target: a new worker."""
    first, first_token = fleet.register("box:opencl:0")
    twin, _ = fleet.register("box:opencl:0")  # the first is alive: another worker
    assert twin != first
    assert fleet.register("box:opencl:0", target="opencl -model=other")[0] not in (first, twin)
    with Session(fleet.db) as session, session.begin():
        session.execute(update(WorkerRow).where(WorkerRow.id == first)
                        .values(last_seen=time.time() - 3600))
    rows = fleet.worker_rows()
    again, token = fleet.register("box:opencl:0")
    assert again == first and fleet.worker_rows() == rows
    assert fleet.workers()[first]["alive"] is True
    # the lost incarnation's token was replaced by the new one
    assert fleet.call(first_token, "POST", f"/api/v1/workers/{first}/heartbeat",
                      json={"trial_ids": []}).status_code == 401
    assert fleet.call(token, "POST", f"/api/v1/workers/{first}/heartbeat",
                      json={"trial_ids": []}).status_code == 200


def test_taking_over_a_lost_workers_row_expires_its_leases(fleet: Fleet) -> None:
    """A worker registering as a lost one (same name and target, not seen within a
    lease) takes over its row; the trials the lost process held are handled as expired
    leases at once: queued again with the attempt counted, or failed (error 8) when it
    was the second worker the trial lost."""
    fleet.submit(n_trial=2)
    fleet.run_pass()
    lost, token = fleet.register("box")
    first, second = fleet.lease(lost, token, n=2)
    with Session(fleet.db) as session, session.begin():
        session.execute(update(TrialRow).where(TrialRow.id == second).values(attempts=2))
        session.execute(update(WorkerRow).where(WorkerRow.id == lost)
                        .values(last_seen=time.time() - 3600))
    again, new_token = fleet.register("box")
    assert again == lost
    row = fleet.trial(first)
    assert (row.status, row.worker_id, row.attempts) == ("queued", None, 1)
    row = fleet.trial(second)
    assert (row.status, row.error_no) == ("done", int(MeasureErrorNo.UNKNOWN_ERROR))
    [(recorded, record)] = fleet.records()
    assert recorded == second and "it lost 2 workers" in (record.result.error_msg or "")
    # the old process's late result is refused; the new one leases the requeued trial
    late = fleet.call(token, "POST", f"/api/v1/workers/{lost}/results", json=results(first))
    assert late.status_code == 401
    assert fleet.lease(lost, new_token, n=2) == [first]
    assert fleet.trial(first).attempts == 2


def _expire(fleet: Fleet, trial_id: int) -> None:
    with Session(fleet.db) as session, session.begin():
        session.execute(update(TrialRow).where(TrialRow.id == trial_id)
                        .values(lease_deadline=time.time() - 1))


def test_a_trial_that_lost_two_workers_is_failed(fleet: Fleet) -> None:
    """Leased, expired, leased by another, expired again: recorded as error 8 saying it
    lost two workers, not handed to a third; its last worker's late result is then a
    duplicate, the first worker's refused."""
    fleet.submit(n_trial=1)
    fleet.run_pass()
    (w1, t1), (w2, t2), (w3, t3) = (fleet.register(n) for n in ("w1", "w2", "w3"))
    [trial_id] = fleet.lease(w1, t1)
    _expire(fleet, trial_id)
    stats = fleet.run_pass()
    assert (stats.requeued, stats.given_up) == (1, 0)
    assert fleet.lease(w2, t2) == [trial_id]
    assert fleet.trial(trial_id).attempts == 2
    _expire(fleet, trial_id)
    stats = fleet.run_pass()
    assert (stats.requeued, stats.given_up) == (0, 1)
    row = fleet.trial(trial_id)
    assert (row.status, row.error_no) == ("done", int(MeasureErrorNo.UNKNOWN_ERROR))
    assert fleet.lease(w3, t3) == []
    [(recorded, record)] = fleet.records()
    assert recorded == trial_id and record.result.error_no == MeasureErrorNo.UNKNOWN_ERROR
    assert "lease expired twice: it lost 2 workers" in (record.result.error_msg or "")
    late = fleet.call(t2, "POST", f"/api/v1/workers/{w2}/results", json=results(trial_id))
    assert late.status_code == 200 and late.json() == {"accepted": 0, "duplicates": 1}
    first = fleet.call(t1, "POST", f"/api/v1/workers/{w1}/results", json=results(trial_id))
    assert first.status_code == 409
    assert len(fleet.records()) == 1


def test_released_trials_do_not_count_as_attempts(fleet: Fleet) -> None:
    """A trial given back (SIGTERM) twice and then lost once is queued again, not
    failed: only expiries count."""
    fleet.submit(n_trial=1)
    fleet.run_pass()
    (w1, t1), (w2, t2) = fleet.register("w1"), fleet.register("w2")
    [trial_id] = fleet.lease(w1, t1)
    assert fleet.call(t1, "POST", f"/api/v1/workers/{w1}/release",
                      json={"trial_ids": [trial_id]}).json() == {"released": 1}
    assert fleet.lease(w2, t2) == [trial_id]
    assert fleet.call(t2, "DELETE", f"/api/v1/workers/{w2}").json()["released"] == 1
    assert fleet.lease(w1, t1) == [trial_id]
    assert fleet.trial(trial_id).attempts == 1
    _expire(fleet, trial_id)
    stats = fleet.run_pass()
    assert (stats.requeued, stats.given_up) == (1, 0)
    assert fleet.trial(trial_id).status == "queued"


def test_a_corrupt_worker_row_is_refused_not_a_500(fleet: Fleet) -> None:
    """A worker whose stored target no longer parses (written before targets were
    checked): its lease and results are a 409 saying to register again, and the
    reclaim of expired leases still fails (the second time) the trial it held."""
    fleet.submit(n_trial=2)
    fleet.run_pass()
    (broken, token), (helper, helper_token) = fleet.register("broken"), fleet.register("ok")
    [held] = fleet.lease(broken, token)
    with Session(fleet.db) as session, session.begin():
        session.execute(update(WorkerRow).where(WorkerRow.id == broken)
                        .values(target="opencl -model=a b"))
        session.execute(update(TrialRow).where(TrialRow.id == held).values(attempts=2))
    for path, body in (("lease", {"wait_s": 0}), ("results", results(held))):
        response = fleet.call(token, "POST", f"/api/v1/workers/{broken}/{path}", json=body)
        assert response.status_code == 409, response.text
        detail = response.json()["detail"]
        assert f"worker {broken}'s target" in detail and "register again" in detail
    _expire(fleet, held)
    with Session(fleet.db) as session, session.begin():
        requeued, given_up = dispatch.reclaim_expired(session)
    assert (requeued, given_up) == ([], 1)
    [(recorded, record)] = fleet.records()
    assert recorded == held and str(record.target) == TARGET  # the job's target
    assert fleet.queued() and held not in fleet.lease(helper, helper_token, n=2)


def test_a_lease_or_report_marks_the_worker_seen_and_a_refusal_does_not(fleet: Fleet) -> None:
    """A lease or results call sets the worker's last_seen (what ``alive`` reads); one
    refused with 409 (deregistered, or results for a trial it does not hold) leaves it
    as it was: the refusal stores nothing."""
    fleet.submit(n_trial=2)
    fleet.run_pass()
    worker_id, token = fleet.register("seen")

    def last_seen() -> float:
        with Session(fleet.db) as session:
            return float(session.scalar(select(WorkerRow.last_seen)
                                        .where(WorkerRow.id == worker_id)) or 0.0)

    def age() -> float:
        with Session(fleet.db) as session, session.begin():
            session.execute(update(WorkerRow).where(WorkerRow.id == worker_id)
                            .values(last_seen=time.time() - 3600))
        return last_seen()

    old = age()
    [held] = fleet.lease(worker_id, token)
    assert last_seen() > old + 3000
    old = age()
    refused = fleet.call(token, "POST", f"/api/v1/workers/{worker_id}/results",
                         json=results(424242))
    assert refused.status_code == 409 and last_seen() == old
    stored = fleet.call(token, "POST", f"/api/v1/workers/{worker_id}/results",
                        json=results(held))
    assert stored.status_code == 200 and last_seen() > old + 3000
    assert fleet.call(fleet.role("admin"), "DELETE",
                      f"/api/v1/workers/{worker_id}").status_code == 200
    old = age()
    refused = fleet.call(fleet.role("admin"), "POST", f"/api/v1/workers/{worker_id}/lease",
                         json={"wait_s": 0})
    assert refused.status_code == 409 and last_seen() == old
