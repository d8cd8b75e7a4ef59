"""records/best's shortcut below FastAPI (``tuner_server.api.hot``): the requests it
answers get the bytes the route gives, and every other request (unknown or missing
tokens, bodies that do not validate, targets that do not parse) reaches the route and
gets its answer unchanged."""

from __future__ import annotations

from collections.abc import Iterator
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
from test_best_batch import ASKED, fill, workloads

from compiler.templates import get_template
from schemas import Config, MeasureErrorNo, MeasureResult, Record, Target
from tuner_server.api.hot import HotBest
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
        self.short: list[bool] = []  # per request: answered by the shortcut
        self.shortcut = True  # False: the shortcut steps aside, as if it refused
        answer = HotBest._answer

        async def spied(hot: HotBest, scope: Any, body: bytes) -> bytes | None:
            found = await answer(hot, scope, body) if self.shortcut else None
            self.short.append(found is not None)
            return found

        monkeypatch.setattr(HotBest, "_answer", spied)

    def post(self, body: Any, token: str | None = None, *, shortcut: bool = True,
             cached: bool = True, raw: bytes | None = None) -> tuple[int, bytes, bool]:
        """(status, body, answered by the shortcut) of one request; ``cached``: whether
        the token is in the process's cache when it arrives (else forgotten first)."""
        if not cached:
            self.app.state.tokens.forget()
        self.shortcut = shortcut
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.short.clear()
        if raw is not None:
            response = self.client.post(PATH, content=raw, headers=headers | {
                "content-type": "application/json"})
        else:
            response = self.client.post(PATH, json=body, headers=headers)
        assert len(self.short) == 1
        return response.status_code, response.content, self.short[0]


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
    for body, token, raw, status in cases:
        got = api.post(body, token, raw=raw)
        assert got[2] is False, (body, raw)
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
