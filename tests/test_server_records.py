"""The records server end to end: a real uvicorn server on a loopback port over SQLite
and PostgreSQL, fed the TopHub logs; best-record answers checked against an independent
re-implementation of AutoTVM's ApplyHistoryBest; export/import round trip; filters and
paging; ETags; the role matrix; bad input; the schema check; the CLI against a server."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_fixtures import (
    BACKENDS,
    REPO_ROOT,
    LiveServer,
    empty_database,
    free_port,
    live_server,
    make_tokens,
    migrate,
    start_server,
    tophub_lines,
    tophub_paths,
)
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool
from typer.testing import CliRunner

from cli.main import app as cli_app
from compiler.templates import (
    ConfigError,
    UnknownTemplateError,
    WorkloadError,
    get_template,
)
from schemas import Record
from tuner_server.db.models import record_hash

pytestmark = pytest.mark.timeout(300)

runner = CliRunner()
TEXT = {"content-type": "text/plain"}
# cuda_v0.10.log holds one line twice: it is stored once (import de-duplicates).
EXPECTED_COUNTS = {"cuda_v0.10.log": 824, "rocm_v0.05.log": 217,
                   "opencl_v0.04.log": 97, "llvm_v0.04.log": 35}

# Queried against every distinct TopHub workload. "vulkan" has TVM's keys (vulkan, gpu),
# so it falls back to any gpu record; "vulkan -keys=vulkan" has no record at all.
BEST_TARGETS = (
    "cuda -model=titanx", "cuda -model=h200", "rocm -model=gfx900",
    "opencl -model=1080ti", "opencl -model=unseen", "vulkan", "vulkan -keys=vulkan",
    "llvm -mcpu=skylake-avx512",
)


# --------------------------------------------------------------------------------------
# An independent ApplyHistoryBest (after tvm/autotvm/task/dispatcher.py), on raw JSON,
# with this project's two amendments: "same device" is kind and model, and a config that
# does not decode in our template's current space never wins.

# TVM's target keys by kind, written out here rather than taken from schemas.Target.
TVM_KEYS: dict[str, tuple[str, ...]] = {
    "cuda": ("cuda", "gpu"), "rocm": ("rocm", "gpu"), "opencl": ("opencl", "gpu"),
    "vulkan": ("vulkan", "gpu"), "llvm": ("cpu",),
}


def parse_target(target: str) -> tuple[str, str, tuple[str, ...]]:
    """(kind, model, keys) of a target string, the way TVM reads it."""
    kind, *words = target.split()
    opts = dict(w.lstrip("-").partition("=")[::2] for w in words)
    keys = tuple(opts["keys"].split(",")) if opts.get("keys") else TVM_KEYS.get(kind, (kind,))
    return kind, opts.get("model") or "unknown", keys


def workload_key(template: str, args: Any) -> str:
    return json.dumps([template, args], sort_keys=True)


def in_space(rec: dict[str, Any]) -> bool:
    """Whether the record's config decodes in its template's space (a template we lack
    cannot be checked: its records count as AutoTVM's do)."""
    record = Record.from_json(rec)
    try:
        get_template(record.workload.template).decode(record.workload, record.config)
    except UnknownTemplateError:
        return True
    except (ConfigError, WorkloadError):
        return False
    return True


class ReferenceBest:
    """AutoTVM's ApplyHistoryBest: lowest np.mean(costs) of error-free records in our
    space, keyed by (kind, model, workload) and by (target key, workload); ties keep the
    first seen."""

    def __init__(self, records: Iterable[dict[str, Any]]) -> None:
        self.by_model: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
        self.by_key: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
        for rec in records:
            if rec["result"][1] != 0 or not in_space(rec):
                continue
            kind, model, keys = parse_target(rec["input"][0])
            wkey = workload_key(rec["input"][1], rec["input"][2])
            cost = float(np.mean(rec["result"][0]))
            for key in keys:
                self._offer(self.by_key, (key, wkey), cost, rec)
            if model != "unknown":
                self._offer(self.by_model, (f"{kind} {model}", wkey), cost, rec)

    @staticmethod
    def _offer(table: dict[tuple[str, str], tuple[float, dict[str, Any]]],
               key: tuple[str, str], cost: float, rec: dict[str, Any]) -> None:
        if key not in table or table[key][0] > cost:
            table[key] = (cost, rec)

    def query(self, target: str, template: str, args: Any) -> tuple[str, dict[str, Any] | None]:
        """(rule, record) the way the server names its rules."""
        kind, model, keys = parse_target(target)
        wkey = workload_key(template, args)
        if model != "unknown" and (f"{kind} {model}", wkey) in self.by_model:
            return "model", self.by_model[(f"{kind} {model}", wkey)][1]
        for key in keys:
            if (key, wkey) in self.by_key:
                return f"target_key:{key}", self.by_key[(key, wkey)][1]
        return "none", None


# --------------------------------------------------------------------------------------
# Data and helpers


def all_tophub_records() -> list[dict[str, Any]]:
    """Every distinct TopHub record, in the order the files are imported: the records
    the database keeps (a line repeated is stored once)."""
    return distinct_lines(rec for path in tophub_paths() for rec in tophub_lines(path))


def distinct_lines(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return list({canon(r): r for r in records}.values())


def distinct_workloads(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for rec in records:
        seen.setdefault(workload_key(rec["input"][1], rec["input"][2]),
                        {"template": rec["input"][1], "args": rec["input"][2]})
    return [seen[k] for k in sorted(seen)]


def canon(rec: dict[str, Any]) -> str:
    return json.dumps(rec, sort_keys=True)


Answers = list[tuple[str, dict[str, Any] | None]]


def ask_best(server: LiveServer, target: str, workloads: list[dict[str, Any]]) -> Answers:
    with server.client("client") as client:
        resp = client.post("/api/v1/records/best", json={"target": target, "workloads": workloads})
    assert resp.status_code == 200, resp.text
    items = resp.json()["items"]
    assert len(items) == len(workloads)
    for item, wl in zip(items, workloads):
        assert item["workload"]["template"] == wl["template"]
    return [(item["rule"], item["record"]) for item in items]


def import_text(server: LiveServer, body: str, role: str = "client") -> dict[str, Any]:
    with server.client(role) as client:
        resp = client.post("/api/v1/records/import", content=body, headers=TEXT)
    assert resp.status_code == 200, resp.text
    return resp.json()


def log_lines(body: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def cli(*argv: str) -> Any:
    """Run ``tuner`` in-process; an unexpected exception fails the test."""
    result = runner.invoke(cli_app, list(argv))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


# --------------------------------------------------------------------------------------
# Fixtures


class Loaded:
    """A server holding all four TopHub logs, and what each import answered."""

    def __init__(self, server: LiveServer, answers: dict[str, dict[str, Any]]) -> None:
        self.server = server
        self.answers = answers


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def loaded(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    """All TopHub logs imported through POST /api/v1/records/import, in file order."""
    paths = tophub_paths()
    with live_server(backend, tmp_path_factory.mktemp(f"loaded_{backend}")) as server:
        answers = {p.name: import_text(server, p.read_text()) for p in paths}
        yield Loaded(server, answers)


@pytest.fixture()
def fresh(backend: str, tmp_path: Path) -> Iterator[LiveServer]:
    """An empty migrated database behind its own server, for tests that write."""
    with live_server(backend, tmp_path) as server:
        yield server


@pytest.fixture(scope="module")
def reference() -> ReferenceBest:
    return ReferenceBest(all_tophub_records())


@pytest.fixture(scope="module")
def workloads() -> list[dict[str, Any]]:
    return distinct_workloads(all_tophub_records())


@pytest.fixture(scope="module")
def full_best(loaded: Loaded, workloads: list[dict[str, Any]]) -> Callable[[str], Answers]:
    """The loaded server's answers for every TopHub workload, asked once per target."""
    cache: dict[str, Answers] = {}

    def answers(target: str) -> Answers:
        if target not in cache:
            cache[target] = ask_best(loaded.server, target, workloads)
        return cache[target]

    return answers


# --------------------------------------------------------------------------------------
# 1. Import


def test_import_tophub_counts(loaded: Loaded) -> None:
    """Every TopHub line is accepted, none refused, and the store holds them all."""
    assert {name: a["accepted"] for name, a in loaded.answers.items()} == EXPECTED_COUNTS
    assert all(a["errors"] == [] for a in loaded.answers.values()), loaded.answers
    with loaded.server.client() as client:
        total = client.get("/api/v1/records", params={"limit": 1}).json()["total"]
        metrics = client.get("/metrics").text
    assert total == sum(EXPECTED_COUNTS.values())
    assert f"tuner_records {total}" in metrics


# --------------------------------------------------------------------------------------
# 2. Best records against the reference


@pytest.mark.parametrize("target", BEST_TARGETS)
def test_best_matches_apply_history_best(full_best: Callable[[str], Answers],
                                         reference: ReferenceBest,
                                         workloads: list[dict[str, Any]], target: str) -> None:
    """POST /records/best picks the same record by the same rule as ApplyHistoryBest."""
    answers = full_best(target)
    mismatches = []
    for wl, (rule, record) in zip(workloads, answers):
        want_rule, want = reference.query(target, wl["template"], wl["args"])
        got = None if record is None else (record["config"], record["result"][0],
                                           record["input"][0])
        exp = None if want is None else (want["config"], want["result"][0], want["input"][0])
        if rule != want_rule or got != exp:
            mismatches.append((wl["template"], rule, want_rule, got, exp))
    assert not mismatches, f"{len(mismatches)} of {len(workloads)} differ, first: {mismatches[0]}"
    # The data must exercise the rule each target is meant to hit.
    rules = Counter(rule for rule, _ in answers)
    kind, model, _keys = parse_target(target)
    if model in ("titanx", "v100", "gfx900", "1080ti"):
        assert rules["model"] > 0, rules
    else:
        assert rules["model"] == 0, rules
    if target == "vulkan -keys=vulkan":
        assert set(rules) == {"none"}, rules
    elif kind == "llvm":
        assert rules["target_key:cpu"] == 35, rules
    else:
        assert rules["none"] > 0 and len(rules) >= 2, rules  # x86 workloads have no gpu record
    if target in ("cuda -model=h200", "opencl -model=unseen"):
        assert rules[f"target_key:{kind}"] > 0, rules


def test_best_ties_and_errors(fresh: LiveServer) -> None:
    """Equal costs keep the first record stored; records with error_no != 0 never win."""
    base = tophub_lines(tophub_paths()[0])[0]
    args = copy.deepcopy(base["input"][2])
    args[0][1][0] = 7  # batch 7: a workload no TopHub record has

    def rec(target: str, index: int, cost: float, error_no: int = 0) -> dict[str, Any]:
        r = copy.deepcopy(base)
        r["input"][0], r["input"][2] = target, args
        r["config"]["index"] = index
        r["result"][0], r["result"][1] = [cost, cost], error_no
        return r

    lines = [rec("cuda -model=b", 1, 2e-3), rec("cuda -model=a", 2, 1e-3),
             rec("cuda -model=b", 3, 1e-3), rec("cuda -model=a", 4, 1e-3),
             rec("cuda -model=a", 5, 1e-6, error_no=4), rec("cuda -model=c", 6, 1e-9, 1)]
    assert import_text(fresh, "\n".join(map(json.dumps, lines)))["accepted"] == 6
    ref = ReferenceBest(lines)
    wl = [{"template": base["input"][1], "args": args}]
    for target, want_index in (("cuda -model=a", 2), ("cuda -model=b", 3),
                               ("cuda -model=zz", 2), ("cuda -model=c", 2)):
        [(rule, record)] = ask_best(fresh, target, wl)
        want_rule, want = ref.query(target, wl[0]["template"], args)
        assert (rule, record["config"]["index"]) == (want_rule, want["config"]["index"])
        assert record["config"]["index"] == want_index, target


# --------------------------------------------------------------------------------------
# 3. Export the best, import into an empty database, same answers


def test_export_best_round_trip(loaded: Loaded, full_best: Callable[[str], Answers],
                                workloads: list[dict[str, Any]], backend: str,
                                tmp_path: Path) -> None:
    """GET /logs/<kind> and `tuner records export --best` give the best per (model,
    workload); those lines alone, in an empty database, answer every query the same."""
    server = loaded.server
    with server.client("worker") as client:
        logs = {kind: client.get(f"/api/v1/logs/{kind}") for kind in TVM_KEYS}
    assert all(r.status_code == 200 for r in logs.values())
    cuda_http = logs["cuda"].text

    result = cli("records", "export", "--target", "cuda", "--best",
                 "--database-url", server.database_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == cuda_http.splitlines()

    # The cuda export is exactly the first-seen cheapest record of each (model, workload).
    want: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
    for rec in all_tophub_records():
        kind, model, _ = parse_target(rec["input"][0])
        if kind == "cuda" and in_space(rec):
            ReferenceBest._offer(want, (model, workload_key(rec["input"][1], rec["input"][2])),
                                 float(np.mean(rec["result"][0])), rec)
    exported = log_lines(cuda_http)
    assert len(exported) == len(want)
    assert Counter(map(canon, exported)) == Counter(canon(r) for _, r in want.values())

    with empty_database(backend, tmp_path) as url:
        migrate(url)
        cuda_file = tmp_path / "cuda_best.log"
        cuda_file.write_text(result.stdout)
        imported = cli("records", "import", str(cuda_file), "--database-url", url)
        assert imported.exit_code == 0, imported.output
        assert f"{len(exported)} imported, 0 refused" in imported.stdout
        small = start_server(url, make_tokens(url))
        try:
            for kind in ("rocm", "opencl", "llvm"):
                answer = import_text(small, logs[kind].text)
                assert answer["errors"] == [] and answer["accepted"] == len(
                    log_lines(logs[kind].text))
            for target in BEST_TARGETS:
                assert ask_best(small, target, workloads) == full_best(target), target
            with small.client() as client:
                total = client.get("/api/v1/records", params={"limit": 1}).json()["total"]
            assert total < sum(EXPECTED_COUNTS.values())  # the export did drop records
        finally:
            small.stop()


# --------------------------------------------------------------------------------------
# 4. Filters and paging


def _count(records: list[dict[str, Any]], kind: str | None = None, model: str | None = None,
           template: str | None = None, wkey: str | None = None) -> int:
    n = 0
    for rec in records:
        k, m, _ = parse_target(rec["input"][0])
        if ((kind is None or k == kind) and (model is None or m == model)
                and (template is None or rec["input"][1] == template)
                and (wkey is None or workload_key(rec["input"][1], rec["input"][2]) == wkey)):
            n += 1
    return n


def test_list_filters_and_paging(loaded: Loaded) -> None:
    """target (bare kind or with model), template and workload filters count like the
    files do; limit/offset paging returns every record exactly once."""
    records = all_tophub_records()
    client = loaded.server.client("client")

    def total(**params: Any) -> int:
        resp = client.get("/api/v1/records", params={"limit": 1, **params})
        assert resp.status_code == 200, resp.text
        return int(resp.json()["total"])

    assert total(target="cuda") == 824 == _count(records, kind="cuda")
    for kind in ("rocm", "opencl", "llvm", "vulkan"):
        assert total(target=kind) == _count(records, kind=kind), kind
    assert total(target="opencl") == 97 + 20  # 1080ti from one file, gfx900 from rocm's
    v100 = total(target="cuda -model=v100")
    assert v100 == _count(records, kind="cuda", model="v100") == 137
    assert total(target="opencl -model=gfx900") == 20
    assert total(target="rocm -model=gfx900") == _count(records, kind="rocm", model="gfx900")

    wino = "conv2d_nchw_winograd.cuda"
    assert total(template=wino) == _count(records, template=wino) == 95 + 30 + 11
    assert total(target="rocm", template=wino) == _count(records, kind="rocm", template=wino)

    # The workload seen most often across models.
    by_key = Counter(workload_key(r["input"][1], r["input"][2]) for r in records)
    wkey, n = by_key.most_common(1)[0]
    template, args = json.loads(wkey)
    assert n > 2
    resp = client.get("/api/v1/records", params={"template": template,
                                                  "workload": json.dumps(args)})
    assert resp.json()["total"] == n
    assert {workload_key(i["input"][1], i["input"][2]) for i in resp.json()["items"]} == {wkey}
    assert total(template=template, workload=json.dumps(args), target="cuda") == _count(
        records, kind="cuda", wkey=wkey)

    # Paging with an odd page size covers the 824 cuda records exactly once.
    seen: list[dict[str, Any]] = []
    for offset in range(0, 824 + 97, 97):
        page = client.get("/api/v1/records", params={"target": "cuda", "limit": 97,
                                                      "offset": offset}).json()
        assert page["total"] == 824
        assert len(page["items"]) == max(0, min(97, 824 - offset))
        seen += page["items"]
    cuda_file = distinct_lines(tophub_lines(tophub_paths()[0]))
    assert Counter(map(canon, seen)) == Counter(map(canon, cuda_file))
    narrow = client.get("/api/v1/records", params={"target": "cuda -model=v100",
                                                    "limit": 10000}).json()["items"]
    assert len(narrow) == 137 and {i["input"][0] for i in narrow} == {"cuda -model=v100"}
    client.close()


# --------------------------------------------------------------------------------------
# 5. ETag


def test_pretuned_log_etag(fresh: LiveServer) -> None:
    """If-None-Match with the current ETag gets 304; a record that changes the best
    changes the ETag, one that does not leaves it; other kinds' logs are untouched."""
    cuda = tophub_lines(tophub_paths()[0])
    titanx = [r for r in cuda if r["input"][0] == "cuda -model=titanx"]
    rocm = tophub_lines(tophub_paths()[1])[:20]
    import_text(fresh, "\n".join(json.dumps(r) for r in titanx + rocm))
    client = fresh.client("worker")

    first = client.get("/api/v1/logs/cuda")
    etag = first.headers["etag"]
    assert first.status_code == 200 and etag
    rocm_etag = client.get("/api/v1/logs/rocm").headers["etag"]
    again = client.get("/api/v1/logs/cuda", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag

    best_line = log_lines(first.text)[0]
    worse = copy.deepcopy(best_line)
    worse["result"][0] = [c * 10 for c in worse["result"][0]]
    worse["config"]["index"] += 1
    import_text(fresh, json.dumps(worse))
    assert client.get("/api/v1/logs/cuda", headers={"If-None-Match": etag}).status_code == 304

    better = copy.deepcopy(best_line)
    better["result"][0] = [c / 2 for c in better["result"][0]]
    better["config"]["index"] += 2
    import_text(fresh, json.dumps(better))
    changed = client.get("/api/v1/logs/cuda", headers={"If-None-Match": etag})
    assert changed.status_code == 200
    new_etag = changed.headers["etag"]
    assert new_etag != etag
    lines = log_lines(changed.text)
    assert better in lines and best_line not in lines and len(lines) == len(log_lines(first.text))
    assert client.get("/api/v1/logs/cuda",
                      headers={"If-None-Match": new_etag}).status_code == 304
    assert client.get("/api/v1/logs/rocm",
                      headers={"If-None-Match": rocm_etag}).status_code == 304
    client.close()


# --------------------------------------------------------------------------------------
# 6. Roles and malformed requests


def _call(server: LiveServer, role: str | None, endpoint: str, token: str | None = None) -> int:
    client = server.client(role)
    if token is not None:
        client.headers["Authorization"] = f"Bearer {token}"
    workloads = [{"template": "conv2d_nchw.cuda", "args": [1]}]
    with client:
        if endpoint == "list":
            return client.get("/api/v1/records", params={"limit": 1}).status_code
        if endpoint == "import":  # a comment-only body stores nothing
            return client.post("/api/v1/records/import", content="# nothing\n",
                               headers=TEXT).status_code
        if endpoint == "best":
            return client.post("/api/v1/records/best",
                               json={"target": "cuda", "workloads": workloads}).status_code
        return client.get("/api/v1/logs/cuda").status_code


ROLE_MATRIX = {  # endpoint -> expected status for (none, admin, client, worker)
    "list": (401, 200, 200, 403),
    "import": (401, 200, 200, 403),
    "best": (401, 200, 200, 200),
    "logs": (401, 200, 200, 200),
}


@pytest.mark.parametrize("endpoint", sorted(ROLE_MATRIX))
def test_role_matrix(loaded: Loaded, endpoint: str) -> None:
    """No token 401, unknown token 401, admin everywhere, client everywhere, worker
    only on best and logs."""
    got = tuple(_call(loaded.server, role, endpoint)
                for role in (None, "admin", "client", "worker"))
    assert got == ROLE_MATRIX[endpoint]
    assert _call(loaded.server, None, endpoint, token="tun_admin_forged") == 401


WL = {"template": "conv2d_nchw.cuda", "args": [["TENSOR", [1, 64, 56, 56], "float32"]]}
MALFORMED: list[tuple[str, str, dict[str, Any], str]] = [
    # (method, path, request kwargs, a word the message must contain)
    ("post", "/api/v1/records/best",
     {"content": '{"target": "cuda", ', "headers": {"content-type": "application/json"}},
     "JSON"),
    ("post", "/api/v1/records/best", {"json": {"target": "cuda"}}, "workloads"),
    ("post", "/api/v1/records/best", {"json": {"workloads": [WL]}}, "target"),
    ("post", "/api/v1/records/best", {"json": {"target": "cuda model=x", "workloads": [WL]}},
     "target"),
    ("post", "/api/v1/records/best", {"json": {"target": "", "workloads": [WL]}}, "target"),
    ("post", "/api/v1/records/best", {"json": {"target": "CUDA", "workloads": [WL]}}, "target"),
    ("post", "/api/v1/records/best", {"json": {"target": "cuda", "workloads": []}},
     "workloads"),
    ("post", "/api/v1/records/best",
     {"json": {"target": "cuda", "workloads": [{"template": "x", "args": "not json"}]}},
     "args"),
    ("post", "/api/v1/records/best",
     {"json": {"target": "cuda", "workloads": [{"template": "x", "args": {"a": 1}}]}}, "args"),
    ("post", "/api/v1/records/best", {"json": {"target": "cuda", "workloads": [{"args": []}]}},
     "template"),
    ("post", "/api/v1/records/best", {"json": [1, 2]}, "body"),
    ("get", "/api/v1/records", {"params": {"workload": "[1]"}}, "template"),
    ("get", "/api/v1/records", {"params": {"limit": 0}}, "limit"),
    ("get", "/api/v1/records", {"params": {"limit": "ten"}}, "limit"),
    ("get", "/api/v1/records", {"params": {"offset": -1}}, "offset"),
    ("get", "/api/v1/records", {"params": {"target": "cuda -model=\"x"}}, "target"),
    ("get", "/api/v1/records", {"params": {"template": "x", "workload": "not json"}},
     "workload"),
    ("get", "/api/v1/records", {"params": {"template": "x", "workload": '{"a": 1}'}},
     "workload"),
    ("get", "/api/v1/logs/CUDA", {}, "target"),
    ("post", "/api/v1/records/import", {"content": b""}, "body"),
    ("post", "/api/v1/records/import", {"content": b"\xff\xfe", "headers": TEXT}, "body"),
    ("post", "/api/v1/records/import", {"json": {"input": []}}, "body"),
]


@pytest.mark.parametrize("method,path,kwargs,word", MALFORMED,
                         ids=[f"{m}-{p.rsplit('/', 1)[1]}-{i}"
                              for i, (m, p, _, _) in enumerate(MALFORMED)])
def test_malformed_requests_are_4xx(loaded: Loaded, method: str, path: str,
                                    kwargs: dict[str, Any], word: str) -> None:
    """Bad input is a 4xx whose one-line message names the field, never a 5xx."""
    with loaded.server.client("admin") as client:
        resp = getattr(client, method)(path, **kwargs)
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)
    detail = resp.json()["detail"]
    assert isinstance(detail, str) and word in detail, detail
    assert "\n" not in detail and "errors.pydantic.dev" not in detail, detail


# --------------------------------------------------------------------------------------
# 7. Bad lines in an import


V01_LINE = json.dumps({
    "i": ["cuda -model=titanx", "topi_nn_conv2d",
          [["TENSOR", [1, 3, 224, 224], "float32"], ["TENSOR", [64, 3, 7, 7], "float32"],
           [2, 2], [3, 3], "NCHW", "float32"], {}, ["conv2d", [1, 3, 224, 224], "float32"],
          {"i": 1, "t": "direct", "c": None, "e": [["tile_f", "sp", [1, 1, 8, 8]]]}],
    "r": [[0.001], 0, 1.0, 1530000000.0], "v": 0.1})


def test_import_bad_lines(fresh: LiveServer) -> None:
    """v0.1 lines and malformed lines are refused by line number with a reason; the
    valid lines of the same body are kept."""
    cuda = tophub_lines(tophub_paths()[0])
    good_a, good_b = cuda[0], cuda[1]
    no_result = {k: v for k, v in cuda[2].items() if k != "result"}
    nan_cost = json.dumps(cuda[3]).replace(json.dumps(cuda[3]["result"][0][0]), "NaN", 1)
    long_model = copy.deepcopy(cuda[4])
    long_model["input"][0] = "cuda -model=" + "m" * 200
    body = "\n".join([
        json.dumps(good_a),                     # 1
        V01_LINE,                               # 2
        json.dumps(good_b)[:60],                # 3 truncated
        "",                                     # 4 blank
        "# a comment",                          # 5
        json.dumps(no_result),                  # 6
        json.dumps(good_b),                     # 7
        nan_cost,                               # 8
        json.dumps(long_model),                 # 9: PostgreSQL's varchar(128) would refuse it
        "[1, 2, 3]",                            # 10
    ])
    answer = import_text(fresh, body)
    assert answer["accepted"] == 2
    errors = {e["line"]: e["error"] for e in answer["errors"]}
    assert sorted(errors) == [2, 3, 6, 8, 9, 10], errors
    assert "0.1" in errors[2] and "not supported" in errors[2]
    assert "JSON" in errors[3]
    assert "result" in errors[6]
    assert "finite" in errors[8]
    assert "model" in errors[9] and "128" in errors[9]
    assert "object" in errors[10]
    assert answer["refused"] == 6
    with fresh.client("client") as client:
        page = client.get("/api/v1/records").json()
    assert page["total"] == 2
    assert [canon(i) for i in page["items"]] == [canon(good_a), canon(good_b)]


def _mutated(base: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> str:
    row = copy.deepcopy(base)
    change(row)
    return json.dumps(row)


def test_import_refuses_what_a_worker_could_not_report(fresh: LiveServer) -> None:
    """Import takes a line only if a worker could have measured it: finite positive
    costs, error_no 0..8 with a cost when 0, and for a template we have, arguments it
    reads and a config shaped like a point of its space with an index inside it. A line
    for a template we do not have is checked as far as we can and kept. Imported rows are
    marked ``imported``."""
    cuda = tophub_lines(tophub_paths()[0])
    base = next(r for r in cuda if r["input"][1] == "conv2d_nchw.cuda")
    other = next(r for r in cuda if r["input"][1] == "batch_matmul.cuda")

    def setter(*path: Any) -> Callable[[Any], Callable[[dict[str, Any]], None]]:
        def value(v: Any) -> Callable[[dict[str, Any]], None]:
            def change(row: dict[str, Any]) -> None:
                node = row
                for key in path[:-1]:
                    node = node[key]
                node[path[-1]] = v
            return change
        return value

    costs, error_no = setter("result", 0), setter("result", 1)
    noise = np.random.default_rng(0)
    index, entity = setter("config", "index"), setter("config", "entity")
    tile_f = next(i for i, k in enumerate(base["config"]["entity"]) if k[0] == "tile_f")
    bad = {
        "negative cost": (costs([-1.0]), "cost"),
        "zero cost": (costs([0.0, 1e-3]), "cost"),
        "error_no 0 without costs": (costs([]), "at least one cost"),
        "error_no 9": (error_no(9), "error_no"),
        "index 2^70": (index(2**70), "index"),
        "index past the space": (index(10**15), "outside the space"),
        "unknown knob": (entity([*base["config"]["entity"], ["tile_zz", "ot", 1]]),
                         "tile_zz"),
        "split of 3 factors": (setter("config", "entity", tile_f, 2)([-1, 2, 2]), "tile_f"),
        "split of zero": (setter("config", "entity", tile_f, 2)([-1, 0, 2, 2]), "tile_f"),
        "knob of the wrong kind": (setter("config", "entity", tile_f, 1)("ot"), "kind"),
        "args the template cannot read": (setter("input", 2)([["TENSOR", [1], "float32"]]),
                                          "args"),
        "a 3 MB config": (entity([["k", "ot", "x" * 100]] * 30000), "longer than"),
        # within every bound on args, but past what PostgreSQL's records index holds
        "a key of 1,100 characters": (setter("input", 2)([*base["input"][2], *["x" * 100] * 9]),
                                      "characters as JSON"),
        # each within its bound, together past the index's row, incompressible (4-byte
        # target keys; a template we do not have, whose args no rule reads)
        "a 2.8 KB index row": (lambda row: [setter("input", 0)(
            "cuda -keys=" + "".join(chr(c) for c in noise.integers(0x20000, 0x2A6DF, 240)))(row),
            setter("input", 1)(other["input"][1])(row), setter("input", 2)(
            [*base["input"][2], *[noise.bytes(64).hex() for _ in range(6)]])(row)],
            "bytes of UTF-8"),
        "cost NaN": (costs([float("nan")]), "finite"),
    }
    lines = [_mutated(base, change) for change, _ in bad.values()]
    lines.append(_mutated(other, costs([-2.0])))
    good = [json.dumps(base), json.dumps(other)]
    answer = import_text(fresh, "\n".join(lines + good))
    assert answer["accepted"] == 2 and answer["refused"] == len(bad) + 1, answer
    errors = {e["line"]: e["error"] for e in answer["errors"]}
    for number, (what, (_, word)) in enumerate(bad.items(), start=1):
        assert word in errors.get(number, ""), (what, errors.get(number))
        assert len(errors[number]) <= 400, (what, errors[number])
    assert "cost" in errors[len(bad) + 1]
    engine = create_engine(fresh.database_url, poolclass=NullPool)
    with engine.connect() as conn:
        sources = conn.execute(text("SELECT source, count(*) FROM records GROUP BY source"))
        assert dict(sources.all()) == {"imported": 2}
    engine.dispose()


def test_import_answer_is_bounded(fresh: LiveServer) -> None:
    """Refused lines past the first 100 are only counted; 10 MB of junk answers within
    seconds with a small body."""
    many = "\n".join(f'{{"junk": {i}}}' for i in range(250))
    answer = import_text(fresh, many)
    assert (answer["accepted"], answer["refused"], len(answer["errors"])) == (0, 250, 100)
    assert [e["line"] for e in answer["errors"]] == list(range(1, 101))
    for junk in ("x" * 10_000_000, "not json at all\n" * 600_000):
        start = time.monotonic()
        with fresh.client("client") as client:
            resp = client.post("/api/v1/records/import", content=junk, headers=TEXT)
        took = time.monotonic() - start
        assert resp.status_code == 200 and len(resp.content) < 20_000, resp.text[:300]
        assert resp.json()["accepted"] == 0 and took < 20, took
    with fresh.client("client") as client:
        assert client.get("/api/v1/records").json()["total"] == 0


def _store(server: LiveServer, lines: list[dict[str, Any]], source: str) -> None:
    """Rows straight into the server's database, as dispatch stores a measurement."""
    from sqlalchemy.orm import Session

    from schemas import Record
    from tuner_server.services.records import add_records

    engine = create_engine(server.database_url, poolclass=NullPool)
    with Session(engine) as session, session.begin():
        add_records(session, [Record.from_json(r) for r in lines], source)
    engine.dispose()


def test_measured_outranks_imported_on_the_same_model(fresh: LiveServer) -> None:
    """On the asked device model a measurement wins over any imported record, however
    cheap; an import counts there only where nothing was measured; the target-key
    fallback (other devices) still goes by cost."""
    base = next(r for r in tophub_lines(tophub_paths()[0])
                if r["input"][1] == "conv2d_nchw.cuda")
    args_a = copy.deepcopy(base["input"][2])
    args_a[0][1][0] = 7  # batch 7 and 9: workloads no TopHub record has
    args_b = copy.deepcopy(base["input"][2])
    args_b[0][1][0] = 9

    def rec(target: str, args: Any, index: int, cost: float) -> dict[str, Any]:
        r = copy.deepcopy(base)
        r["input"][0], r["input"][2] = target, args
        r["config"]["index"], r["result"][0] = index, [cost]
        return r

    imported = [rec("cuda -model=h200", args_a, 1, 1e-9), rec("cuda -model=h200", args_b, 2, 1e-9),
                rec("cuda -model=a100", args_a, 3, 1e-8)]
    assert import_text(fresh, "\n".join(map(json.dumps, imported)))["accepted"] == 3
    _store(fresh, [rec("cuda -model=h200", args_a, 4, 1e-3), rec("cuda -model=h200", args_a, 5, 2e-3),
                   rec("cuda -model=a100", args_b, 6, 1e-2)], "measured")
    wl = [{"template": base["input"][1], "args": a} for a in (args_a, args_b)]
    answers = ask_best(fresh, "cuda -model=h200", wl)
    assert [(rule, r["config"]["index"]) for rule, r in answers] == [("model", 4), ("model", 2)]
    # another model: the target key "cuda" ranks every cuda record by cost alone
    answers = ask_best(fresh, "cuda -model=v100", wl)
    assert [(rule, r["config"]["index"]) for rule, r in answers] == [
        ("target_key:cuda", 1), ("target_key:cuda", 2)]


def test_best_logs_and_search_pick_the_same_winner(fresh: LiveServer) -> None:
    """One winner per (device model, workload) in records/best, the pretuned log and the
    search: measured first (an imported 1e-9 s record loses to a measured 1e-3 s one),
    then the cheapest, then the first stored; with nothing measured, the import wins."""
    base = next(r for r in tophub_lines(tophub_paths()[0])
                if r["input"][1] == "conv2d_nchw.cuda")
    batches = {"measured": 7, "imported only": 9}
    args = {}
    for name, batch in batches.items():
        args[name] = copy.deepcopy(base["input"][2])
        args[name][0][1][0] = batch  # workloads no TopHub record has

    def rec(name: str, index: int, cost: float) -> dict[str, Any]:
        r = copy.deepcopy(base)
        r["input"][0], r["input"][2] = "cuda -model=h200", args[name]
        r["config"]["index"], r["result"][0] = index, [cost]
        return r

    imported = [rec("measured", 1, 1e-9), rec("imported only", 2, 1e-9),
                rec("imported only", 3, 1e-9), rec("measured", 4, 1e-3)]
    assert import_text(fresh, "\n".join(map(json.dumps, imported)))["accepted"] == 4
    # index 4 (imported, as cheap, stored first) and 6 (measured, as cheap, later) lose to 5
    _store(fresh, [rec("measured", 5, 1e-3), rec("measured", 6, 1e-3)], "measured")
    want = {7: 5, 9: 2}  # batch -> the winner's config index

    wl = [{"template": base["input"][1], "args": args[name]} for name in batches]
    answers = ask_best(fresh, "cuda -model=h200", wl)
    assert [(rule, r["config"]["index"]) for rule, r in answers] == [
        ("model", want[7]), ("model", want[9])]
    with fresh.client("client") as client:
        for target in ("cuda -model=h200", "cuda"):
            log = client.get(f"/api/v1/logs/{target}")
            assert log.status_code == 200, log.text
            assert {r["input"][2][0][1][0]: r["config"]["index"]
                    for r in log_lines(log.text)} == want, target
            found = client.get("/api/v1/records/search",
                               params={"target": target, "template": base["input"][1]})
            assert found.status_code == 200, found.text
            items = [i for i in found.json()["items"] if i["args"][0][1][0] in want]
            assert {i["args"][0][1][0]: i["config"]["index"] for i in items} == want, target


def test_rows_stored_before_validation_never_break_reads(fresh: LiveServer) -> None:
    """A row whose target no longer parses (stored before targets had to read back) is
    skipped by GET /records and best, shown by the search, and left out of nothing else."""
    base = tophub_lines(tophub_paths()[0])[0]
    good = copy.deepcopy(base)
    broken = copy.deepcopy(base)
    broken["input"][0] = "cuda -model=a b"
    assert import_text(fresh, json.dumps(good))["accepted"] == 1
    engine = create_engine(fresh.database_url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO records (target, target_kind, target_model, target_keys, template, "
            "workload_key, line, mean_cost, error_no, timestamp, created_at, source, "
            "line_hash) "
            "SELECT 'cuda -model=a b', target_kind, 'a', target_keys, template, "
            "workload_key, :line, mean_cost / 2, 0, timestamp, created_at, 'imported', :hash "
            "FROM records"), {"line": json.dumps(broken), "hash": record_hash(broken)})
    engine.dispose()
    with fresh.client("client") as client:
        page = client.get("/api/v1/records")
        assert page.status_code == 200 and page.json()["total"] == 2
        assert [canon(i) for i in page.json()["items"]] == [canon(good)]
        search = client.get("/api/v1/records/search", params={"best": False})
        assert search.status_code == 200 and search.json()["total"] == 2
        assert client.get("/api/v1/logs/cuda").status_code == 200
        wl = [{"template": base["input"][1], "args": base["input"][2]}]
        best = client.post("/api/v1/records/best", json={"target": "cuda -model=a",
                                                          "workloads": wl})
        assert best.status_code == 200, best.text


# --------------------------------------------------------------------------------------
# 8. The schema check


def _serve(url: str) -> subprocess.CompletedProcess[str]:
    """`tuner serve` on ``url``; it must exit by itself, long before the timeout."""
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "serve", "--port", str(free_port()),
         "--database-url", url],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)


def _stamp(url: str, revision: str) -> None:
    from tuner_server.db.session import make_engine

    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    engine.dispose()


def test_refuses_unmigrated_and_unknown_schema(backend: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """create_app and `tuner serve` refuse a database without the schema (saying to run
    `tuner db upgrade`) and one stamped with a revision this code does not know."""
    import uvicorn

    from tuner_server.app import create_app
    from tuner_server.db.session import SchemaError, head_revision
    from tuner_server.settings import Settings

    with empty_database(backend, tmp_path) as url:
        with pytest.raises(SchemaError, match="tuner db upgrade"):
            create_app(Settings(database_url=url))
        proc = _serve(url)
        assert proc.returncode != 0
        assert "tuner db upgrade" in proc.stderr, proc.stderr

        migrate(url)
        head = head_revision()
        if head != "0001":  # a known older revision: upgrade is the fix
            _stamp(url, "0001")
            with pytest.raises(SchemaError, match="tuner db upgrade"):
                create_app(Settings(database_url=url))
        _stamp(url, "zzzz")
        with pytest.raises(SchemaError) as err:
            create_app(Settings(database_url=url))
        assert "'zzzz'" in str(err.value) and "does not know" in str(err.value)
        assert "tuner db upgrade" not in str(err.value)
        # In-process this time; a server that starts anyway fails instead of hanging.
        monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("serve started"))
        result = cli("serve", "--port", str(free_port()), "--database-url", url)
        assert result.exit_code == 1
        assert "'zzzz'" in result.stderr and "does not know" in result.stderr, result.output

        _stamp(url, str(head))
        create_app(Settings(database_url=url)).state.engine.dispose()  # head: accepted


# --------------------------------------------------------------------------------------
# 9. The CLI against a running server


def test_cli_against_server(fresh: LiveServer, tmp_path: Path) -> None:
    """`tuner records import/best/export --server --token` talk to a live server."""
    opencl = tophub_paths()[2]
    server = ["--server", fresh.url]
    client_tok = ["--token", fresh.tokens["client"]]

    result = cli("records", "import", str(opencl), *server, *client_tok)
    assert result.exit_code == 0, result.output
    assert "97 imported, 0 refused" in result.stdout

    bad = tmp_path / "bad.log"
    bad.write_text(opencl.read_text().splitlines()[2] + "\n" + V01_LINE + "\n")
    result = cli("records", "import", str(bad), *server, *client_tok)
    assert result.exit_code == 1
    # its good line was imported above: a duplicate, not stored again
    assert "0 imported, 1 refused, 1 duplicates" in result.stdout and "line 2:" in result.stderr
    result = cli("records", "import", str(bad), *server, "--token", fresh.tokens["worker"])
    assert result.exit_code == 1 and "403" in result.stderr

    records = tophub_lines(opencl)
    ref = ReferenceBest(records)
    target = "opencl -model=1080ti"
    conv = next(r for r in records if r["input"][1] == "conv2d_nchw.cuda")
    args = json.dumps(conv["input"][2])
    for role in ("client", "worker"):
        result = cli("records", "best", "--target", target, "--template", "conv2d_nchw.cuda",
                     "--args", args, *server, "--token", fresh.tokens[role])
        assert result.exit_code == 0, result.output
        rule, want = ref.query(target, "conv2d_nchw.cuda", conv["input"][2])
        assert f"rule: {rule}" in result.stderr
        assert canon(json.loads(result.stdout.splitlines()[-1])) == canon(want)
    result = cli("records", "best", "--target", "vulkan -keys=vulkan", "--template",
                 "conv2d_nchw.cuda", "--args", args, *server, *client_tok)
    assert result.exit_code == 1 and "no record" in result.stderr
    result = cli("records", "best", "--target", target, "--template", "conv2d_nchw.cuda",
                 "--args", args, *server, "--token", "forged")
    assert result.exit_code == 1 and "401" in result.stderr

    result = cli("records", "export", "--target", "opencl", "--best", *server, *client_tok)
    assert result.exit_code == 0, result.output
    with fresh.client("client") as http:
        assert result.stdout == http.get("/api/v1/logs/opencl").text
    exported = log_lines(result.stdout)
    # one line per workload with a record in our space (the export applies the rule)
    assert len(exported) == sum(ref.query(target, w["template"], w["args"])[0] == "model"
                                for w in distinct_workloads(records))
    assert all(canon(r) == canon(ref.query(target, r["input"][1], r["input"][2])[1])
               for r in exported)
    result = cli("records", "export", "--target", "opencl", *server, *client_tok)
    assert result.exit_code == 0, result.output
    assert Counter(map(canon, log_lines(result.stdout))) == Counter(map(canon, records))
