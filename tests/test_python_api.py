"""The Python API (``import tuner``): the README's two scripts run as written (embedded,
and against a live server with a worker), and what they rest on: trials reach the
callbacks with their records, the log re-imports and applies, every records source,
``apply_history_best``, tasks as values, one-line errors, and the layering."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_fixtures import (
    REPO_ROOT,
    LiveServer,
    free_port,
    live_server,
    make_tokens,
    migrate,
    opencl_target,
    start_server,
)

import tuner
from compiler.records import (
    THIS_DEVICE,
    LogSource,
    MemorySource,
    RecordsError,
    choose_configs,
    parse_log,
)
from schemas import DeviceLimits, MeasureErrorNo, MeasureResult, Workload
from schemas.api import TrialResult, WorkerRegistration

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.timeout(300)

TARGET = "opencl -model=pocl-cpu"  # what the README's scripts name
LOCAL, WHY = opencl_target()
needs_pocl = pytest.mark.skipif(LOCAL != TARGET, reason=WHY or f"the OpenCL device is {LOCAL}")
FAST = tuner.MeasureOptions(number=1, repeat=1, min_repeat_ms=0)


def readme_scripts() -> list[str]:
    """The ```python blocks of the README's "Python API" section, as written."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def run_script(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    return namespace


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding ``model.onnx`` (one 3x3 conv + relu), the current directory,
    with the embedded database, tokens and caches inside it."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.uniform(-0.5, 0.5, (8, 4, 3, 3)).astype(np.float32),
                                     "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], "conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["y"], ["z"], "relu")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 8, 8])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
              tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNER_DATABASE_URL", f"sqlite:///{tmp_path / 'embedded.db'}")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("TUNER_SERVER", "TUNER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def reference(x: np.ndarray) -> np.ndarray:
    """The tiny model in numpy: conv 3x3 pad 1, relu."""
    model = onnx.load("model.onnx")
    w = numpy_helper.to_array(model.graph.initializer[0])
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((1, 8, 8, 8), np.float32)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", padded[:, :, i:i + 8, j:j + 8], w[:, :, i, j])
    return np.maximum(out, 0)


def check_log(path: Path, n_trial: int, workload: Workload) -> LogSource:
    """``path`` holds one AutoTVM line per trial of ``workload``; it re-imports as a
    LogSource whose best applies on this device."""
    lines = path.read_text().splitlines()
    assert len(lines) == n_trial, lines
    source = tuner.records.log(path)
    assert len(source) == n_trial
    assert {c.record.workload.key for c in source.candidates([workload], tuner.Target.parse(
        TARGET))} == {workload.key}
    return source


def test_readme_has_both_scripts_and_each_is_short() -> None:
    scripts = readme_scripts()
    assert len(scripts) == 2, scripts
    for code in scripts:
        assert len(code.strip().splitlines()) < 15, code
        imports = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Import | ast.ImportFrom)]
        assert {a.name for n in imports for a in n.names} == {"tuner"}  # only `import tuner`
    assert "tuner.Client(" in scripts[1] and "server=client" in scripts[1]
    assert "log_to_file" in scripts[0] and "server=" not in scripts[0]


@needs_pocl
def test_readme_embedded_script(workdir: Path) -> None:
    """Embedded: tunes one conv2d task with log_to_file, builds with the log, runs."""
    ns = run_script(readme_scripts()[0])
    result, module = ns["result"], ns["module"]
    assert result.ok and result.job.trials_done == 16
    best = result.best[0]
    assert best is not None and best.workload == ns["tasks"][0].workload
    source = check_log(workdir / "tuned.log", 16, best.workload)
    assert best.to_line() in {c.record.to_line() for c in source.candidates(
        [best.workload], best.target)}
    assert "this device 1, other device 0, default 0" in module.report()
    x = ns["module"].random_inputs()[0]  # the same seeded data the script ran on
    np.testing.assert_allclose(ns["y"], reference(x), rtol=1e-4, atol=1e-5)


@pytest.fixture
def fleet(workdir: Path) -> Iterator[tuner.Client]:
    """A live server (its scheduler running) on a fresh SQLite file, one worker on the
    local OpenCL device, and TUNER_SERVER / TUNER_TOKEN naming them."""
    from workers.agent import WorkerAgent

    url = f"sqlite:///{workdir / 'server.db'}"
    migrate(url)
    tokens = make_tokens(url)
    server = start_server(url, tokens, run_scheduler=True)
    agent = WorkerAgent(server.url, tokens["worker"], "opencl:0", name="api-test", wait_s=1.0)
    agent.register()
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    mp = pytest.MonkeyPatch()
    mp.setenv("TUNER_SERVER", server.url)
    mp.setenv("TUNER_TOKEN", tokens["client"])
    try:
        with tuner.Client() as client:
            yield client
    finally:
        mp.undo()
        agent.stopping.set()
        thread.join(60)
        server.stop()


@needs_pocl
def test_readme_server_script(fleet: tuner.Client, workdir: Path) -> None:
    """Against a server: the job runs on its worker, the log fills as trials arrive, and
    the build takes the server's best record."""
    ns = run_script(readme_scripts()[1])
    result, module = ns["result"], ns["module"]
    assert result.ok and result.job.trials_done == 16
    assert [w.name for w in fleet.workers()] == ["api-test"]
    workload = ns["tasks"][0].workload
    check_log(workdir / "fleet.log", 16, workload)
    replay: list[tuner.Trial] = []  # following an ended job hands on all its trials
    assert fleet.follow(result.job.id, [replay.append]).status == "done"
    assert [t.record.to_line() for t in replay if t.record] == (
        workdir / "fleet.log").read_text().splitlines()
    served = fleet.best(TARGET, [workload])[0]
    assert served.record is not None and result.best[0] is not None
    # the server's best is the job's verified winner: one of the configs it searched
    assert tuner.Record.from_json(served.record).config in {
        t.record.config for t in replay if t.record}
    assert "this device 1, other device 0, default 0" in module.report()
    x = ns["module"].random_inputs()[0]  # the same seeded data the script ran on
    np.testing.assert_allclose(ns["y"], reference(x), rtol=1e-4, atol=1e-5)


@needs_pocl
def test_callbacks_see_every_trial_with_its_record(workdir: Path) -> None:
    """Each trial reaches on_trial once, in order, with the record the job stored; the
    hooks run start, updates, end; a plain function is an on_trial."""
    events: list[str] = []
    seen: list[tuner.Trial] = []

    class Spy(tuner.Callback):
        def on_start(self, job: tuner.JobView) -> None:
            events.append("start")

        def on_update(self, job: tuner.JobView) -> None:
            events.append("update")

        def on_end(self, job: tuner.JobView | None) -> None:
            events.append(f"end {job.status if job else None}")

    workload = tuner.extract_tasks("model.onnx", TARGET)[0].workload
    result = tuner.tune(workload, TARGET, n_trial=5, tuner="random", measure=FAST,
                        callbacks=[Spy(), seen.append], verify_top=0)
    assert events[0] == "start" and events[-1] == "end done" and "update" in events
    assert [t.number for t in seen] == [1, 2, 3, 4, 5]
    assert all(t.record is not None and t.record.workload == workload for t in seen)
    assert all(t.task == 0 and t.job_id == result.job.id for t in seen)
    ok = [t for t in seen if t.error_no == 0]
    assert ok and all(t.cost == pytest.approx(t.record.result.mean_cost) for t in ok
                      if t.record is not None)
    fastest = min(ok, key=lambda t: t.cost or 0.0)
    assert result.best[0] == fastest.record
    # the embedded database now serves the same record
    choice = choose_configs([workload], tuner.records.embedded(), tuner.Target.parse(TARGET),
                            DeviceLimits())[0]
    assert choice.record == fastest.record


def test_extract_tasks_are_what_tuner_tasks_prints(workdir: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    tasks = tuner.extract_tasks("model.onnx", "cuda -model=h200")
    assert [t.template for t in tasks] == ["conv2d_nchw.cuda", "conv2d_nchw_winograd.cuda"]
    assert all(t.layers == ["conv"] and t.flops > 0 for t in tasks)
    printed = CliRunner().invoke(app, ["tasks", "model.onnx", "--target", "cuda -model=h200"])
    assert printed.exit_code == 0, printed.output
    keys = [line.split(": ", 1)[1] for line in printed.stdout.splitlines()
            if re.match(r"^\d+: ", line)]
    assert keys == [t.workload.key for t in tasks]


def test_records_sources_and_apply_history_best(workdir: Path) -> None:
    """Each origin gives a source; apply_history_best nests and restores; the shipped
    pretuned logs serve a CUDA record offline; a missing database has no records."""
    from compiler.records import ChainSource, ServerSource
    from tuner.building import current_records

    pretuned = tuner.records.pretuned()
    assert len(pretuned) > 1000 and len(pretuned.paths) == 4
    cuda_log = next(p for p in pretuned.paths if p.name.startswith("cuda"))
    shipped = next(r for r in parse_log(cuda_log.read_text().splitlines(), str(cuda_log))
                   if r.workload.template == "conv2d_nchw.cuda" and r.result.error_no == 0)
    (choice,) = choose_configs([shipped.workload], pretuned, shipped.target, DeviceLimits())
    assert choice.source == THIS_DEVICE and choice.record is not None
    embedded = tuner.records.embedded()
    assert embedded.url.endswith("embedded.db")
    cuda = tuner.extract_tasks("model.onnx", "cuda -model=h200")
    assert embedded.candidates([t.workload for t in cuda], tuner.Target.parse("cuda")) == []
    assert not (workdir / "embedded.db").exists()  # reading never creates it
    server = tuner.records.server("http://127.0.0.1:1", "tok")
    assert isinstance(server, ServerSource) and server.token == "tok"
    chained = tuner.records.chain(embedded, pretuned)
    assert isinstance(chained, ChainSource) and chained.sources == (embedded, pretuned)
    with pytest.raises(ValueError, match="log file"):
        tuner.records.log()
    memory = MemorySource([])
    assert current_records() is None
    with tuner.apply_history_best(pretuned) as outer:
        assert current_records() is outer is pretuned
        with tuner.apply_history_best(memory):
            assert current_records() is memory
        assert current_records() is pretuned
    assert current_records() is None


def test_a_database_without_the_schema_is_a_records_error(workdir: Path) -> None:
    (workdir / "other.db").write_bytes(b"")
    source = tuner.records.database(f"sqlite:///{workdir / 'other.db'}")
    workload = tuner.extract_tasks("model.onnx", TARGET)[0].workload
    with pytest.raises(RecordsError):
        source.candidates([workload], tuner.Target.parse(TARGET))


DENSE = Workload(template="dense_small_batch.gpu", args=[
    ["TENSOR", [1, 8], "float32"], ["TENSOR", [4, 8], "float32"], None, "float32"])


def test_client_failures_are_one_line_errors() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with tuner.Client(url, "x") as client, pytest.raises(tuner.Unreachable,
                                                         match=f"cannot reach .* at {url}"):
        client.jobs()
    with pytest.raises(ValueError, match="http"):
        tuner.Client("localhost:8600")


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    """A server (no scheduler: ``FakeWorker.plan`` runs its passes) and no worker."""
    with live_server("sqlite", tmp_path) as server:
        yield server


class FakeWorker:
    """Plans, leases and reports through ``tuner.Client``'s typed API as a worker does:
    a trial costs ``cost(config index)``, the ``fail``-th reports (counted over all)
    fail, and ``reverse`` reports a lease's trials last first."""

    def __init__(self, srv: LiveServer, cost: Any = lambda index: 1e-3 / (index + 1),
                 fail: Any = lambda n: False) -> None:
        self.srv, self.cost, self.fail = srv, cost, fail
        self.client = tuner.Client(srv.url, srv.tokens["worker"])
        answer = self.client.api.register_worker(WorkerRegistration.model_validate(
            {"name": "fake", "target": TARGET}))
        self.id = answer.id
        self.client.api.use_token(answer.token)
        self.reported = 0
        # task id -> (config, result) of each trial reported, in report order
        self.leased: dict[int, list[tuple[dict[str, Any], MeasureResult]]] = {}

    def measure(self, n: int, reverse: bool = False) -> int:
        """Lease up to ``n`` trials and report each; how many there were."""
        self.srv._server.config.app.state.scheduler.run_pass()
        trials = self.client.api.lease(self.id, n, wait_s=0).trials
        results = []
        for trial in reversed(trials) if reverse else trials:
            self.reported += 1
            result = (MeasureResult.failure(MeasureErrorNo.COMPILE_DEVICE, "fake")
                      if self.fail(self.reported) else
                      MeasureResult(costs=(self.cost(trial.config["index"]),),
                                    error_no=MeasureErrorNo.NO_ERROR, all_cost=0.1))
            self.leased.setdefault(trial.task_id, []).append((trial.config, result))
            results.append(TrialResult(trial_id=trial.trial_id, result=result))
        if results:
            self.client.api.report_results(self.id, results)
        return len(trials)


def test_follow_hands_each_trial_its_own_record(live: LiveServer) -> None:
    """Two jobs tune one workload; the other job's failures and successes are stored
    between this one's: every trial reaches the callbacks with the record of its own
    trial (the server joins trial to record), never the other job's."""
    worker = FakeWorker(live, cost=lambda index: 1e-3, fail=lambda n: n % 3 == 0)
    with tuner.Client(live.url, live.tokens["client"]) as client:
        mine = client.submit([DENSE], TARGET, n_trial=4, tuner="random", verify_top=0)
        other = client.submit([DENSE], TARGET, n_trial=4, tuner="random", verify_top=0)
        while worker.measure(8, reverse=True):
            pass
        seen: list[tuner.Trial] = []
        job = client.follow(mine, [seen.append])
        task = job.tasks[0].id
        assert [t.number for t in seen] == [1, 2, 3, 4] and job.status.final
        assert [(t.record.config.to_json(), t.record.result.error_no)
                for t in seen if t.record] == [
            (config, result.error_no) for config, result in worker.leased[task]]
        assert [t.error_no for t in seen] == [r.error_no for _, r in worker.leased[task]]
        assert all(t.job_id == mine for t in seen)
        assert client.job(other).status.final


def test_follow_asks_for_a_tasks_trials_only_when_its_count_grew(live: LiveServer) -> None:
    """Every poll reads the job; a task's trial list is asked for only when the task
    measured more since the last poll (a model's job has tens of tasks, most of them
    idle at any one poll). Two tasks polled while idle, then measured: one page each."""
    worker = FakeWorker(live, cost=lambda index: 1e-3)
    wider = Workload(template=DENSE.template, args=[
        ["TENSOR", [1, 16], "float32"], ["TENSOR", [4, 16], "float32"], None, "float32"])
    with tuner.Client(live.url, live.tokens["client"]) as client:
        job_id = client.submit([DENSE, wider], TARGET, n_trial=2, tuner="random",
                               verify_top=0)
        asked: list[int] = []
        trials = client.trials

        def counting(job: int, task: int, after: int | None = None) -> Any:
            asked.append(task)
            return trials(job, task, after)

        client.trials = counting  # type: ignore[method-assign]
        polls = 0

        def check() -> None:  # between polls: idle twice, then every trial measured
            nonlocal polls
            polls += 1
            if polls == 3:
                while worker.measure(8):
                    pass
                live._server.config.app.state.scheduler.run_pass()  # ends the job

        seen: list[tuner.Trial] = []
        job = client.follow(job_id, [seen.append], check=check)
    assert job.status.final and polls >= 3
    assert sorted((t.task, t.number) for t in seen) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert sorted(asked) == sorted(task.id for task in job.tasks)


def test_tune_best_is_this_jobs_own(live: LiveServer) -> None:
    """TuneResult.best is the cheapest working trial of the job itself, not a cheaper
    record another job stored for the same workload and device; a tuner the server does
    not know is its 422, naming the field."""
    worker = FakeWorker(live, cost=lambda index: 1e-3 / (index + 1))
    with tuner.Client(live.url, live.tokens["client"]) as client:
        with pytest.raises(tuner.InvalidRequest, match="tuner") as refused:
            tuner.tune(DENSE, TARGET, tuner="nope", server=client)
        assert refused.value.detail.startswith("tuner: ")
        first = client.submit([DENSE], TARGET, n_trial=9, tuner="grid")
        while worker.measure(9):
            pass
        cheapest = min(client.records(TARGET, DENSE), key=lambda r: r.result.mean_cost)
        worker.cost = lambda index: 1.0 + index  # dearer than every stored record
        stop = threading.Event()

        def work() -> None:
            while not stop.is_set():
                if not worker.measure(2):
                    stop.wait(0.05)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        try:
            result = tuner.tune(DENSE, TARGET, n_trial=3, tuner="random", server=client,
                                measure=FAST)
        finally:
            stop.set()
            thread.join(10)
        assert result.ok and client.job(first).status == "done"
        best = result.best[0]
        assert best is not None and best.result.mean_cost >= 1.0
        assert best != cheapest
        mine = [config for config, _ in worker.leased[result.job.tasks[0].id]]
        assert best.config.to_json() == min(mine, key=lambda c: c["index"])


def test_database_has_the_clients_record_methods(live: LiveServer, tmp_path: Path) -> None:
    """tuner.Database and tuner.Client answer the same calls alike: import_log takes a
    path (a second import adds nothing), import_lines takes text, export, best and
    pretuned_log agree; a missing database is NoDatabase, and is not created."""
    log = next(p for p in tuner.records.pretuned().paths if p.name.startswith("opencl"))
    lines = [line for line in log.read_text().splitlines() if line.startswith("{")][:40]
    (tmp_path / "some.log").write_text("\n".join(lines) + "\n")
    missing = tmp_path / "missing.db"
    with pytest.raises(tuner.NoDatabase, match="no database"):
        tuner.Database(f"sqlite:///{missing}").export()
    assert not missing.exists()
    target = tuner.Target.parse(Record_target(lines[0]))
    with tuner.Client(live.url, live.tokens["client"]) as client, \
            tuner.Database(f"sqlite:///{tmp_path / 'db.sqlite'}", create=True) as database:
        for store in (client, database):
            first = store.import_log(tmp_path / "some.log")
            assert first.accepted + first.refused == len(lines) and first.accepted > 0
            again = store.import_lines("\n".join(lines))
            assert again.accepted == 0 and again.duplicates == first.accepted
        assert database.export(target) == client.export(target)
        assert database.pretuned_log(target) == client.pretuned_log(target)
        workloads = list({r.workload.key: r.workload
                          for r in database.records(target)}.values())
        assert [b.record for b in database.best(target, workloads)] == [
            b.record for b in client.best(target, workloads)]
        assert database.search(target) == client.search(target)


def Record_target(line: str) -> str:
    return str(json.loads(line)["input"][0])


@needs_pocl
def test_build_closes_the_device_it_opened(workdir: Path) -> None:
    """A device tuner.build opens is the module's to close; one passed in stays open."""
    from compiler.runtime import open_device

    with tuner.build("model.onnx", TARGET) as module:
        assert module.owns_device
        (y,) = module.run([np.ones((1, 4, 8, 8), np.float32)])
    assert not module.owns_device
    with open_device("opencl:0") as device:
        kept = tuner.build("model.onnx", TARGET, device=device)
        kept.close()
        np.testing.assert_allclose(kept.run([np.ones((1, 4, 8, 8), np.float32)])[0], y)


def test_cli_times_trials_as_tune_does() -> None:
    """`tuner tune`'s timing flags default to tuner.DEFAULT_MEASURE, what tune() uses."""
    import inspect

    from cli.tune import tune as command

    defaults = {name: p.default.default for name, p in inspect.signature(command).parameters.items()
                if name in ("number", "repeat", "min_repeat_ms", "timeout", "cpu_cache_flush")}
    assert defaults == {"number": tuner.DEFAULT_MEASURE.number,
                        "repeat": tuner.DEFAULT_MEASURE.repeat,
                        "min_repeat_ms": tuner.DEFAULT_MEASURE.min_repeat_ms,
                        "timeout": tuner.DEFAULT_MEASURE.timeout_s,
                        "cpu_cache_flush": tuner.DEFAULT_MEASURE.enable_cpu_cache_flush}
    assert inspect.signature(tuner.tune).parameters["measure"].default == tuner.DEFAULT_MEASURE
    assert tuner.DEFAULT_MEASURE.min_repeat_ms == 50.0


def test_tuner_loads_no_cli_and_bench_imports_no_cli() -> None:
    code = "import sys, json, tuner\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert [m for m in json.loads(out.splitlines()[-1]) if m.split(".")[0] == "cli"] == []
    for path in sorted((REPO_ROOT / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.module.split(".")[0] != "cli", path
                assert not any(a.name.startswith("_") for a in node.names), (path, node.module)
            elif isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "cli" for a in node.names), path


@needs_pocl
def test_a_dead_worker_or_ctrl_c_cancels_the_job(workdir: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded worker's loop dies: WorkerStopped, the job cancelled. Ctrl-C while
    following the job: TuneInterrupted saying the job was cancelled."""
    from workers.agent import WorkerAgent

    workload = tuner.extract_tasks("model.onnx", TARGET)[0].workload

    def dies(self: WorkerAgent) -> None:
        raise RuntimeError("boom")

    with monkeypatch.context() as patch:
        patch.setattr(WorkerAgent, "run", dies)
        with pytest.raises(tuner.WorkerStopped, match=r"stopped: boom; job (\d+) cancelled"):
            tuner.tune(workload, TARGET, n_trial=2, measure=FAST)

    class CtrlC(tuner.Callback):
        def on_update(self, job: tuner.JobView) -> None:
            raise KeyboardInterrupt

    with pytest.raises(tuner.TuneInterrupted) as stopped:
        tuner.tune(workload, TARGET, n_trial=1000, measure=FAST, callbacks=[CtrlC()])
    assert stopped.value.outcome == f"job {stopped.value.job_id} cancelled"
    with tuner.EmbeddedFleet(tuner.records.embedded().url, "opencl:0") as fleet, \
            tuner.Client(fleet.url, fleet.client_token) as client:
        assert [j.status for j in client.jobs()] == ["cancelled", "cancelled"]
