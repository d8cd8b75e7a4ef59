"""The shortcuts below FastAPI (``tuner_server.api.hot``), records/best and a worker's
results: the requests they answer get the bytes the route gives, and every other request
(unknown or missing tokens, another worker's token, bodies that do not validate, targets
that do not parse, results the route refuses) reaches the route and gets its answer
unchanged, with nothing stored on the way."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import (
    BACKENDS,
    empty_database,
    make_tokens,
    migrate,
    migrated_sessions,
)
from sqlalchemy import func, select
from test_best_batch import ASKED, fill, workloads

from compiler.templates import get_template
from schemas import Config, MeasureErrorNo, MeasureResult, Record, Target
from schemas.api import LeaseAnswer
from tuner_server.api import hot
from tuner_server.db.models import RecordRow
from tuner_server.db.session import make_engine, session_factory
from tuner_server.services import records as svc

PATH = "/api/v1/records/best"


class Api:
    """The app under a TestClient, noting which requests the shortcut answered."""

    def __init__(self, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        from fastapi.testclient import TestClient

        from tuner_server.app import create_app
        from tuner_server.settings import Settings

        self.tokens = make_tokens(url)
        self.app = create_app(Settings(database_url=url, run_scheduler=False))
        self.client = TestClient(self.app)
        self.short: list[bool] = []  # per request that reached a shortcut: it answered
        self.shortcut = True  # False: the shortcuts step aside, as if they refused
        for name in ("_best", "_lease", "_results"):
            monkeypatch.setattr(hot, name, self._spy(getattr(hot, name)))

    def _spy(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def spied(*args: Any) -> Any:
            made = real(*args) if self.shortcut else None
            if made is None:
                self.short.append(False)
                return None

            async def answer() -> Any:
                got = await made()
                self.short.append(got is not None)
                return got

            return answer

        return spied

    def post(self, body: Any, token: str | None = None, *, shortcut: bool = True,
             cached: bool = True, raw: bytes | None = None,
             path: str = PATH) -> tuple[int, bytes, bool]:
        """(status, body, answered by a shortcut) of one request; ``cached``: whether
        the token is in the process's cache when it arrives (else forgotten first)."""
        if not cached:
            self.app.state.tokens.forget()
        self.shortcut = shortcut
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.short.clear()
        if raw is not None:
            response = self.client.post(path, content=raw, headers=headers | {
                "content-type": "application/json"})
        else:
            response = self.client.post(path, json=body, headers=headers)
        assert len(self.short) <= 1
        return response.status_code, response.content, self.short == [True]


@pytest.fixture(params=BACKENDS)
def api(request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    with empty_database(request.param, tmp_path) as url:
        migrate(url)
        engine = make_engine(url)
        try:
            with session_factory(engine).begin() as session:
                fill(session, workloads(40))
        finally:
            engine.dispose()
        made = Api(url, monkeypatch)
        with made.client:
            yield made


def test_shortcut_answers_as_the_route(api: Api) -> None:
    """Each rule (this device, target keys, none), one workload and several, each role:
    the route's bytes and the shortcut's are the same, the token cached or not."""
    asked = workloads(40)
    bodies = [{"target": target, "workloads": [w.model_dump(mode="json") for w in chosen]}
              for target in ASKED
              for chosen in ([asked[0]], [asked[3]], asked[5:9], asked[:20])]
    for body in bodies:
        for role in ("client", "worker", "admin"):
            token = api.tokens[role]
            routed = api.post(body, token, shortcut=False)
            for cached in (False, True):
                short = api.post(body, token, cached=cached)
                assert routed[2] is False and short[2] is True
                assert routed[:2] == short[:2] and routed[0] == 200, body["target"]


def test_other_requests_reach_the_route(api: Api) -> None:
    """Refusals and 422s are the route's, word for word: the shortcut passes them on."""
    good = {"target": "cuda -model=h200",
            "workloads": [workloads(1)[0].model_dump(mode="json")]}
    client = api.tokens["client"]
    cases = [
        (good, None, None, 401),  # no token
        (good, "tun_client_not-a-token-anyone-made", None, 401),
        ({**good, "target": "no-such-kind -model=x"}, client, None, 422),
        ({**good, "target": ""}, client, None, 422),
        ({**good, "workloads": []}, client, None, 422),
        ({**good, "workloads": [{"args": [1]}]}, client,
         None, 422),
        ({"target": "cuda"}, client, None, 422),
        ({**good, "target": 5}, client, None, 422),
        (None, client, b"{not json", 422),
    ]
    # a body FastAPI would not read as JSON is the route's to refuse
    api.short.clear()
    plain = api.client.post(PATH, content=json.dumps(good), headers={
        "Authorization": f"Bearer {client}", "content-type": "text/plain"})
    assert plain.status_code == 422 and api.short == []
    for body, token, raw, status in cases:
        got = api.post(body, token, raw=raw)
        assert got[2] is False, (body, token, raw, got)
        assert got[0] == status, (body, raw, got)
        assert "detail" in got[1].decode()


def test_like_characters_in_target_keys_match_only_themselves(
        tmp_path: Path) -> None:
    """The few-workload query matches a target key inside ``target_keys`` with LIKE: a
    key holding ``_`` or ``%`` matches that key, not any character or run of them."""
    with migrated_sessions("sqlite", tmp_path) as sessions:
        workload = workloads(1)[0]
        config: Config = get_template(workload.template).space(workload).get(0)
        result = MeasureResult(costs=(1e-4,), error_no=MeasureErrorNo.NO_ERROR,
                               all_cost=0.1, timestamp=1.7e9)
        with sessions.begin() as session:
            svc.add_records(session, [Record(target=Target.parse(t), workload=workload,
                                             config=config, result=result)
                                      for t in ("opencl -keys=abc -model=m1",
                                                "opencl -keys=xyyy -model=m2")])
        with sessions() as session:
            for asked, rule in (("opencl -keys=a_c -model=q", "none"),
                                ("opencl -keys=x%y -model=q", "none"),
                                ("opencl -keys=abc -model=q", "target_key:abc"),
                                ("opencl -keys=xyyy -model=q", "target_key:xyyy")):
                (answer,) = svc.best(session, [workload], Target.parse(asked))
                assert answer.rule == rule, asked


CONV_ARGS: list[Any] = [["TENSOR", [1, 16, 8, 8], "float32"],
                        ["TENSOR", [16, 16, 3, 3], "float32"],
                        [1, 1], [1, 1, 1, 1], [1, 1], "float32"]


def _leased(api: Api, n: int) -> tuple[int, str, list[int]]:
    """A registered worker (id, own token) holding ``n`` leased trials of a new job."""
    target = "opencl -model=pocl-cpu"
    client = api.client
    answer = client.post("/api/v1/workers", json={"name": "w", "target": target},
                         headers={"Authorization": f"Bearer {api.tokens['worker']}"})
    assert answer.status_code == 201, answer.text
    worker_id, own = answer.json()["id"], answer.json()["token"]
    answer = client.post("/api/v1/jobs", headers={"Authorization": f"Bearer {api.tokens['admin']}"},
                         json={"target": target, "n_trial": n, "plan_size": n, "tuner": "random",
                               "tasks": [{"template": "conv2d_nchw.cuda", "args": CONV_ARGS}]})
    assert answer.status_code == 201, answer.text
    api.app.state.scheduler.run_pass()
    answer = client.post(f"/api/v1/workers/{worker_id}/lease", json={"max_trials": n,
                                                                     "wait_s": 0},
                         headers={"Authorization": f"Bearer {own}"})
    assert answer.status_code == 200, answer.text
    trials = [t["trial_id"] for t in answer.json()["trials"]]
    assert len(trials) == n
    return worker_id, own, trials


def _records(api: Api) -> int:
    with api.app.state.sessions() as session:
        return session.scalar(select(func.count()).select_from(RecordRow)) or 0


def _refusals_are_the_routes(api: Api, cases: list[tuple[Any, str | None, str, int]]
                             ) -> None:
    """Each case refused with ``status`` and the route's very answer: 401, 403 and 422
    by the route itself (the shortcut steps aside), 404 and 409 by the shortcut in the
    route's words (its service call refused)."""
    for sent, token, where, status in cases:
        got = api.post(sent, token, path=where)
        routed = api.post(sent, token, path=where, shortcut=False)
        assert got[:2] == routed[:2] and got[0] == status, (where, status, got, routed)
        assert got[2] is (status in (404, 409)), (where, status)
        assert b"detail" in got[1]


def test_results_take_the_shortcut_and_refusals_reach_the_route(api: Api) -> None:
    """A worker's results: stored by the shortcut (token cached or not), a repeat
    answered alike by the route and the shortcut; every refusal (401, 403, 404, 409,
    422) the route's answer, with nothing stored."""
    worker_id, own, trials = _leased(api, 6)
    path = f"/api/v1/workers/{worker_id}/results"
    result = MeasureResult(costs=(2e-5,), error_no=MeasureErrorNo.NO_ERROR, all_cost=0.1,
                           timestamp=1.7e9).model_dump(mode="json")

    def body(ids: list[int]) -> dict[str, Any]:
        return {"results": [{"trial_id": t, "result": result} for t in ids]}

    before = _records(api)
    assert api.post(body(trials[:2]), own, path=path, cached=False) == (
        200, b'{"accepted":2,"duplicates":0}', True)
    assert api.post(body(trials[2:4]), own, path=path) == (
        200, b'{"accepted":2,"duplicates":0}', True)
    assert _records(api) == before + 4
    routed = api.post(body(trials[:4]), own, path=path, shortcut=False)
    assert routed == (200, b'{"accepted":0,"duplicates":4}', False)
    assert api.post(body(trials[:4]), own, path=path)[:2] == routed[:2]
    other = api.client.post("/api/v1/workers", json={"name": "x", "target": "opencl"},
                            headers={"Authorization": f"Bearer {api.tokens['worker']}"})
    refusals = [
        (body(trials[4:]), None, path, 401),
        (body(trials[4:]), other.json()["token"], path, 403),  # another worker's token
        (body(trials[4:]), api.tokens["client"], path, 403),
        (body(trials[4:]), api.tokens["admin"], "/api/v1/workers/99999/results", 404),
        (body([trials[4], 10**6]), own, path, 409),  # a trial it does not hold
        ({"results": [{"trial_id": trials[4]}]}, own, path, 422),
        (body(trials[4:]), own, "/api/v1/workers/0/results", 422),
    ]
    _refusals_are_the_routes(api, refusals)
    assert _records(api) == before + 4  # the 409's good trial was not stored either
    assert api.post(body(trials[4:]), api.tokens["admin"], path=path)[::2] == (200, True)
    assert _records(api) == before + 6


def test_leases_take_the_shortcut_and_refusals_reach_the_route(api: Api) -> None:
    """A worker's lease: answered by the shortcut (a contract-valid LeaseAnswer, the
    same JSON as the route's when both find nothing), every refusal the route's answer,
    with nothing leased on the way."""
    worker_id, own, held = _leased(api, 2)
    path = f"/api/v1/workers/{worker_id}/lease"
    empty = {"max_trials": 4, "wait_s": 0}
    routed = api.post(empty, own, path=path, shortcut=False)
    short = api.post(empty, own, path=path, cached=False)
    assert routed[0] == short[0] == 200 and (routed[2], short[2]) == (False, True)
    assert json.loads(routed[1]) == json.loads(short[1]) == {
        "trials": [], "lease_seconds": api.app.state.settings.lease_seconds}
    api.client.post("/api/v1/jobs", headers={"Authorization": f"Bearer {api.tokens['admin']}"},
                    json={"target": "opencl -model=pocl-cpu", "n_trial": 3, "plan_size": 3,
                          "tasks": [{"template": "conv2d_nchw.cuda", "args": CONV_ARGS}]})
    api.app.state.scheduler.run_pass()
    other = api.client.post("/api/v1/workers", json={"name": "x", "target": "opencl"},
                            headers={"Authorization": f"Bearer {api.tokens['worker']}"})
    _refusals_are_the_routes(api, [
        (empty, None, path, 401),
        (empty, other.json()["token"], path, 403),
        (empty, api.tokens["client"], path, 403),
        (empty, api.tokens["admin"], "/api/v1/workers/99999/lease", 404),
        ({"max_trials": 0, "wait_s": 0}, own, path, 422),
        ({"wait_s": "soon"}, own, path, 422)])
    got = api.post({"max_trials": 5, "wait_s": 0}, own, path=path)
    assert got[0] == 200 and got[2]
    leased = LeaseAnswer.model_validate_json(got[1])
    assert len(leased.trials) == 3 and not {t.trial_id for t in leased.trials} & set(held)
