"""The request path (issue 18, point 3): a request opens one database session (the token
check and the route share it), and PostgreSQL connections are not pre-pinged on
checkout, yet one the server dropped while it sat in the pool is replaced, not handed
to a request."""

from __future__ import annotations

from collections.abc import Iterator
from json import dumps, loads
from pathlib import Path
from typing import Any

import psycopg
import pytest
from server_fixtures import PG_ADMIN_DSN, make_tokens, migrate, postgres_database
from sqlalchemy import event, func, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session
from test_best_batch import fill, workloads

from schemas import Target
from tuner_server.db.session import make_engine, reader_engine, session_factory
from tuner_server.middleware import error_answer
from tuner_server.services import records as svc

LIMITS = {"max_threads_per_block": 256, "max_thread_x": 256, "max_thread_y": 256,
          "max_thread_z": 64, "max_shared_memory_per_block": 49152, "warp_size": 32,
          "compute_units": 1}
TARGET = "opencl -model=pocl-cpu"
DENSE_ARGS: list[Any] = [["TENSOR", [1, 256], "float32"], ["TENSOR", [64, 256], "float32"],
                         None, "float32"]


class Api:
    """The app under a TestClient, recording which sessions began a transaction."""

    def __init__(self, url: str) -> None:
        from fastapi.testclient import TestClient

        from tuner_server.app import create_app
        from tuner_server.settings import Settings

        self.tokens = make_tokens(url)
        self.app = create_app(Settings(database_url=url, run_scheduler=False))
        self.client = TestClient(self.app)
        self.began: list[int] = []  # id() of each session, once per transaction it began

        def began(session: Session, _transaction: Any, _connection: Any) -> None:
            self.began.append(id(session))

        event.listen(self.app.state.sessions, "after_begin", began)

    def call(self, method: str, path: str, token: str | None,
             json: Any = None) -> tuple[int, Any, int]:
        """(status, body, sessions used) of one request, its token not in the cache."""
        self.app.state.tokens.forget()
        self.began.clear()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = self.client.request(method, path, headers=headers, json=json)
        return response.status_code, response.json(), len(set(self.began))


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate(url)
    made = Api(url)
    try:
        yield made
    finally:
        made.client.close()
        made.app.state.engine.dispose()


def test_each_request_uses_one_session(api: Api) -> None:
    """The token looked up (the cache forgotten) and the route's work: one session, which
    began a transaction for each (the token check's ends before the route's)."""
    client, worker = api.tokens["client"], api.tokens["worker"]
    job = {"target": TARGET, "tasks": [{"template": "dense_small_batch.gpu",
                                        "args": DENSE_ARGS}], "n_trial": 4}
    status, body, used = api.call("POST", "/api/v1/jobs", client, job)
    assert (status, used) == (201, 1), body
    assert len(api.began) == 2  # the token's read, then the submission
    job_id = body["id"]
    status, body, used = api.call("POST", "/api/v1/workers", worker,
                                  {"name": "w", "target": TARGET, "limits": LIMITS})
    assert (status, used) == (201, 1), body
    own = body["token"]
    wid = body["id"]
    for method, path, token, json in [
            ("GET", "/api/v1/jobs", client, None),
            ("GET", f"/api/v1/jobs/{job_id}", client, None),
            ("GET", "/api/v1/workers", client, None),
            ("POST", f"/api/v1/workers/{wid}/heartbeat", own, {"trial_ids": []}),
            ("POST", f"/api/v1/workers/{wid}/release", own, {"trial_ids": []}),
            ("GET", "/api/v1/records", client, None)]:
        status, body, used = api.call(method, path, token, json)
        assert (status, used) == (200, 1), (method, path, body)
    # refused at the token: the one session that looked it up
    status, _, used = api.call("GET", "/api/v1/jobs", "tun_client_not-a-token-at-all", None)
    assert (status, used) == (401, 1)
    status, _, used = api.call("GET", f"/api/v1/jobs/{job_id}", worker, None)
    assert (status, used) == (403, 1)


def test_a_cached_token_costs_no_transaction(api: Api) -> None:
    """Within the cache's second a refusal by role needs no database at all."""
    worker = api.tokens["worker"]
    assert api.call("GET", "/api/v1/jobs", worker)[0] == 403  # looked up, now cached
    api.began.clear()
    response = api.client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {worker}"})
    assert response.status_code == 403
    assert api.began == []


def _backend_pid(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(text("SELECT pg_backend_pid()")))


def test_a_pooled_connection_the_server_dropped_is_replaced() -> None:
    """No pre-ping: a healthy pooled connection is handed out again as it is (the same
    backend), and one whose backend was terminated while it sat in the pool is noticed
    at checkout and replaced, so the next use succeeds."""
    with postgres_database() as url:
        engine = make_engine(url)
        pings: list[object] = []
        real_ping = engine.dialect.do_ping

        def ping(dbapi_connection: object) -> bool:
            pings.append(dbapi_connection)
            return bool(real_ping(dbapi_connection))

        engine.dialect.do_ping = ping  # type: ignore[method-assign]
        try:
            first = _backend_pid(engine)
            assert _backend_pid(engine) == first  # reused, not reconnected
            with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s, 5000)", (first,))  # waits
            second = _backend_pid(engine)  # no OperationalError: replaced at checkout
            assert second != first
            assert _backend_pid(engine) == second
            assert pings == []  # three checkouts, no round trip spent on any
        finally:
            engine.dispose()


def _plans(notices: list[str]) -> list[tuple[str, str]]:
    """(query text, plan as JSON) of each statement auto_explain logged."""
    out = []
    for notice in notices:
        found = notice[notice.find("{"):]
        if found:
            logged = loads(found)
            out.append((logged["Query Text"], dumps(logged["Plan"])))
    return out


def test_reader_plans_a_batch_for_its_values_and_a_single_lookup_once() -> None:
    """psycopg prepared any statement run 5 times on a connection, after which
    PostgreSQL may run it with a generic plan: one made for a few workloads took 17 s
    for a batch of 10,000 that its own plan answers in 0.07 s. On the reader's
    connections every statement of a batch is planned for its values, each time (as
    auto_explain logs them: the values in the plan, no $n); the one statement prepared is
    a single workload's lookup, which runs its generic plan after its first 5 (its
    planning cost as much as its run). A batch and a single lookup answer alike."""
    with postgres_database() as url:
        migrate(url)
        engine = make_engine(url)
        reader = reader_engine(engine)
        try:
            asked = workloads(40)
            with session_factory(engine).begin() as session:
                fill(session, asked)
            sessions = session_factory(reader)
            notices: list[str] = []
            answers = {}
            with sessions() as session:
                raw = session.connection().connection.dbapi_connection
                raw.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
                for sql in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                            "SET auto_explain.log_level = notice",
                            "SET auto_explain.log_format = json"):
                    raw.execute(sql)
                for _ in range(8):  # batches (one query per tier) and single lookups
                    for target in ("cuda -model=h200", "cuda -model=l4"):
                        batch = svc.best(session, asked, Target.parse(target))
                        single = svc.best(session, asked[:1], Target.parse(target))
                        answers[target] = (batch[0], single[0])
                raw.execute("SET auto_explain.log_min_duration = -1")
                prepared = raw.execute("SELECT statement, generic_plans, custom_plans"
                                       " FROM pg_prepared_statements").fetchall()
        finally:
            reader.dispose()
            engine.dispose()
    plans = _plans(notices)
    batch_plans = [plan for query, plan in plans if "string_to_array" in query]
    assert len(batch_plans) >= 8 * 2, plans[:3]
    for plan in batch_plans:
        assert "$1" not in plan, plan[:300]  # planned for the keys asked
    assert prepared, "the single lookup's statement was not prepared"
    for statement, generic, custom in prepared:
        assert "string_to_array" not in statement  # one key's statement only
    assert sum(generic for _, generic, _ in prepared) >= 8, prepared
    for target, (in_batch, alone) in answers.items():
        assert alone.record is not None and alone == in_batch, target


def test_a_lookup_query_that_fails_is_a_database_error() -> None:
    """A few workloads' lookup runs on the driver's cursor (``records._run``): a driver
    error comes out as SQLAlchemy's, which Guard answers as an outage (503, retried),
    not as a bug (500)."""
    with postgres_database() as url:
        migrate(url)
        engine = make_engine(url)
        try:
            with session_factory(engine)() as session:
                session.execute(text("SET statement_timeout = 1"))
                slow = select(func.pg_sleep(0.5)).compile(dialect=engine.dialect)
                with pytest.raises(sa_exc.OperationalError) as caught:
                    svc._run(session, slow, {})
        finally:
            engine.dispose()
    assert error_answer(caught.value)[0] == 503
