"""Where a build's configs come from: TopHub logs through the fallback chain (this device,
other device by target key, default), validity against device limits, a real loopback
server with its pretuned-log and best-answer caches (download, 304, offline builds that
choose what online ones did, nothing at all), the ``--records`` helper and the build
report."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import CONV, RESNET50_CONV, TOPHUB_DIR, VGG16_CONV, nchwc_workload
from server_fixtures import free_port, live_server

from compiler.records import (
    DEFAULT,
    OTHER_DEVICE,
    THIS_DEVICE,
    ChainSource,
    Choice,
    LogCache,
    LogSource,
    MemorySource,
    RecordsServerError,
    RecordsUnavailableError,
    RecordsWarning,
    ServerSource,
    build_report,
    choose_configs,
    open_source,
    predict,
)
from compiler.records.choose import NOT_IN_SPACE, OVER_LIMITS
from compiler.templates import get_template
from schemas import (
    Config,
    DeviceLimits,
    MeasureErrorNo,
    MeasureResult,
    Record,
    Target,
    Workload,
)

pytestmark = pytest.mark.timeout(60)

POCL = Target.parse("opencl -model=pocl-cpu")
LIMITS = DeviceLimits()  # PoCL-like: 1024 work-items, 48 KiB local memory
TEMPLATE = get_template(CONV)

# Which log holds which layer (checked by the tests below, not assumed):
IN_OPENCL_LOG = RESNET50_CONV["resnet50.res3.3x3"]  # opencl -model=1080ti only
ONLY_IN_CUDA_LOG = RESNET50_CONV["resnet50.res3a.3x3s2"]  # cuda -model=tx2 only
IN_BOTH = RESNET50_CONV["resnet50.res2.1x1"]  # cuda 1080ti is cheaper than opencl 1080ti
IN_NO_LOG = VGG16_CONV["vgg16.conv5.3x3"]
NEVER_ASKED = RESNET50_CONV["resnet50.res5.3x3"]  # opencl -model=1080ti; asked offline only

# res3.3x3 (128 -> 128 channels, 28x28): 256 work-items a block, fits PoCL ...
FITS = {"tile_f": (8, 1, 16, 1), "tile_y": (7, 1, 4, 1), "tile_x": (7, 1, 4, 1),
        "tile_rc": (16, 8), "tile_ry": (1, 3), "tile_rx": (1, 3),
        "auto_unroll_max_step": 512, "unroll_explicit": 1}
# ... and 16 x 14 x 14 = 3136 work-items a block, which does not.
TOO_MANY_THREADS = {**FITS, "tile_f": (8, 1, 16, 1), "tile_y": (1, 1, 14, 2),
                    "tile_x": (2, 1, 14, 1)}


def log_path(name: str) -> Path:
    """A shipped TopHub log (package data: it is always there)."""
    path = TOPHUB_DIR / name
    assert path.is_file(), f"the shipped TopHub log is missing: {path}"
    return path


def made_up(workload: Workload, target: Target, knobs: dict[str, Any], cost: float,
            ok: bool = True) -> Record:
    """A record as a worker on ``target`` would have logged it."""
    config = TEMPLATE.space(workload).to_config(knobs)
    result = (MeasureResult(costs=(cost,), error_no=MeasureErrorNo.NO_ERROR, timestamp=1.0)
              if ok else MeasureResult.failure(MeasureErrorNo.RUNTIME_DEVICE, "crashed"))
    return Record(target=target, workload=workload, config=config, result=result)


def log_state(source: ServerSource) -> str | None:
    """How the source's last build got its pretuned log."""
    return source.last_fetch.state if source.last_fetch else None


def picks(choices: Sequence[Choice]) -> list[tuple[str, str | None, Config, str | None]]:
    """What a build takes from each choice, whatever file or URL the record came from."""
    return [(c.source, c.key, c.config, None if c.origin_target is None else str(c.origin_target))
            for c in choices]


def best_fails(request: Callable[..., httpx.Response]) -> Callable[..., httpx.Response]:
    """``httpx.Client.request``, but POST /records/best answers 503: a half-up server."""

    def patched(self: httpx.Client, method: str, url: Any, **kwargs: Any) -> httpx.Response:
        if method == "POST" and str(url).endswith("/records/best"):
            return httpx.Response(503, request=self.build_request(method, url))
        return request(self, method, url, **kwargs)

    return patched


@pytest.fixture(scope="module")
def tophub() -> LogSource:
    """cuda then opencl: AutoTVM keeps the first of equal costs, so file order matters."""
    return LogSource([log_path("cuda_v0.10.log"), log_path("opencl_v0.04.log")])


# --------------------------------------------------------------------------------------
# The fallback chain over the TopHub logs


def test_opencl_1080ti_record_serves_pocl_via_key_opencl(tophub: LogSource) -> None:
    (choice,) = choose_configs([IN_OPENCL_LOG], tophub, POCL, LIMITS)
    assert choice.source == OTHER_DEVICE and choice.key == "opencl"
    assert str(choice.origin_target) == "opencl -model=1080ti"
    assert choice.origin is not None and choice.origin.endswith("opencl_v0.04.log")
    assert choice.cost is None  # another device's time is not this device's
    assert not TEMPLATE.check_limits(IN_OPENCL_LOG, choice.config, LIMITS)


def test_cuda_only_record_serves_pocl_via_key_gpu(tophub: LogSource) -> None:
    (choice,) = choose_configs([ONLY_IN_CUDA_LOG], tophub, POCL, LIMITS)
    assert choice.source == OTHER_DEVICE and choice.key == "gpu"
    assert str(choice.origin_target) == "cuda -model=tx2"
    assert choice.origin is not None and choice.origin.endswith("cuda_v0.10.log")


def test_key_order_beats_cost(tophub: LogSource) -> None:
    """res2.1x1: cuda 1080ti measured faster, but key "opencl" comes before "gpu"."""
    cuda = choose_configs([IN_BOTH], tophub, Target.parse("cuda -model=1080ti"), LIMITS)[0]
    (choice,) = choose_configs([IN_BOTH], tophub, POCL, LIMITS)
    assert choice.source == OTHER_DEVICE and choice.key == "opencl"
    assert str(choice.origin_target) == "opencl -model=1080ti"
    assert cuda.source == THIS_DEVICE and cuda.record is not None and choice.record is not None
    assert cuda.record.result.mean_cost < choice.record.result.mean_cost


def test_this_device_wins_even_when_slower(tophub: LogSource) -> None:
    mine = made_up(IN_OPENCL_LOG, POCL, FITS, cost=1e-3)  # 20x the 1080ti's time
    source = ChainSource([tophub, MemorySource([mine], origin="embedded database")])
    (choice,) = choose_configs([IN_OPENCL_LOG], source, POCL, LIMITS)
    assert choice.source == THIS_DEVICE and choice.key is None
    assert choice.record == mine and choice.origin == "embedded database"
    assert choice.cost == pytest.approx(1e-3)


def test_the_default_follows_the_devices_vector_lanes() -> None:
    """With no record, a CPU template's default is sized for the device's lanes: what
    an untuned build on an AVX-512 CPU runs is its wider default, not the AVX2 one."""
    workload = nchwc_workload(1, 64, 56, 64, 3, 1, 1)
    template = get_template(workload.template)
    wide = DeviceLimits(simd_lanes=16)
    (choice,) = choose_configs([workload], None, POCL, wide)
    assert choice.source == DEFAULT
    assert choice.config == template.default_config(workload, wide)
    assert choice.config != template.default_config(workload)
    (narrow,) = choose_configs([workload], None, POCL, DeviceLimits(simd_lanes=8))
    assert narrow.config == template.default_config(workload)


def test_failed_measurements_are_never_candidates(tophub: LogSource) -> None:
    failed = made_up(IN_OPENCL_LOG, POCL, FITS, cost=0.0, ok=False)
    (choice,) = choose_configs([IN_OPENCL_LOG], ChainSource([tophub, MemorySource([failed])]),
                               POCL, LIMITS)
    assert choice.source == OTHER_DEVICE and not choice.rejected


def test_no_record_anywhere_gives_the_default_config(tophub: LogSource) -> None:
    (choice,) = choose_configs([IN_NO_LOG], tophub, POCL, LIMITS)
    assert choice.source == DEFAULT
    assert choice.config == TEMPLATE.default_config(IN_NO_LOG)
    assert choice.record is None and choice.origin is None and choice.origin_target is None
    (no_source,) = choose_configs([IN_NO_LOG], None, POCL, LIMITS)
    assert no_source.config == choice.config


def test_config_over_the_limits_is_skipped_for_the_next() -> None:
    fast_but_too_big = made_up(IN_OPENCL_LOG, POCL, TOO_MANY_THREADS, cost=1e-6)
    slower = made_up(IN_OPENCL_LOG, POCL, FITS, cost=2e-6)
    assert TEMPLATE.check_limits(IN_OPENCL_LOG, fast_but_too_big.config, LIMITS)
    (choice,) = choose_configs([IN_OPENCL_LOG],
                               MemorySource([fast_but_too_big, slower], origin="test"),
                               POCL, LIMITS)
    assert choice.source == THIS_DEVICE and choice.record == slower
    assert choice.rejected_counts == {OVER_LIMITS: 1}
    assert "3136 threads per block > 1024" in choice.rejected[0].detail
    # A device that allows 4096 work-items takes the faster one.
    big = DeviceLimits(max_threads_per_block=4096, max_thread_x=4096, max_thread_y=4096)
    (roomy,) = choose_configs([IN_OPENCL_LOG],
                              MemorySource([fast_but_too_big, slower], origin="test"), POCL, big)
    assert roomy.record == fast_but_too_big and not roomy.rejected


def test_record_outside_the_space_is_skipped() -> None:
    """rocm_v0.05.log's gfx900 record for res2.1x1 uses auto_unroll_max_step 128, not one
    of conv2d_nchw.cuda's values: a real record this space cannot run."""
    rocm = LogSource([log_path("rocm_v0.05.log"), log_path("cuda_v0.10.log")])
    (choice,) = choose_configs([IN_BOTH], rocm, Target.parse("rocm -model=gfx900"), LIMITS)
    assert choice.rejected_counts == {NOT_IN_SPACE: 1}
    assert "auto_unroll_max_step" in choice.rejected[0].detail
    assert str(choice.rejected[0].target) == "rocm -model=gfx900"
    assert choice.source == OTHER_DEVICE and choice.key == "gpu"
    assert str(choice.origin_target) == "cuda -model=1080ti"  # cheapest gpu record


def test_repeated_workloads_share_one_decision(tophub: LogSource) -> None:
    choices = choose_configs([IN_BOTH, IN_NO_LOG, IN_BOTH], tophub, POCL, LIMITS)
    assert [c.source for c in choices] == [OTHER_DEVICE, DEFAULT, OTHER_DEVICE]
    assert choices[0] is choices[2]


def test_bad_log_lines_are_skipped_with_a_warning(tmp_path: Path) -> None:
    good = made_up(IN_OPENCL_LOG, POCL, FITS, cost=1e-3)
    path = tmp_path / "mine.log"
    path.write_text(f"# my records\n{good.to_line()}\n{{not json\n\n")
    with pytest.warns(RecordsWarning, match=r"mine.log: skipped 1 unreadable line\(s\): line 3"):
        source = LogSource(path)
    assert len(source) == 1
    with pytest.raises(FileNotFoundError, match="missing.log"):
        LogSource(tmp_path / "missing.log")


# --------------------------------------------------------------------------------------
# The server, its pretuned log and the local cache


def test_server_source_cache_revalidation_and_offline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache_dir = tmp_path / "cache"
    mine = made_up(IN_OPENCL_LOG, POCL, FITS, cost=1e-3)
    wanted = [IN_OPENCL_LOG, ONLY_IN_CUDA_LOG, IN_BOTH, IN_NO_LOG]
    with live_server("sqlite", tmp_path) as server:
        with server.client() as admin:
            body = "".join(log_path(n).read_text() for n in ("cuda_v0.10.log",
                                                               "opencl_v0.04.log"))
            body += mine.to_line() + "\n"
            imported = admin.post("/api/v1/records/import", content=body,
                                  headers={"content-type": "text/plain"})
            assert imported.status_code == 200 and not imported.json()["errors"]
        source = ServerSource(server.url, token=server.tokens["client"], cache_dir=cache_dir)

        # First build: the log is downloaded and cached with its ETag.
        first = choose_configs(wanted, source, POCL, LIMITS)
        assert [(c.source, c.key) for c in first] == [
            (THIS_DEVICE, None), (OTHER_DEVICE, "gpu"), (OTHER_DEVICE, "opencl"),
            (DEFAULT, None)]
        assert first[0].record == mine
        assert str(first[1].origin_target) == "cuda -model=tx2"
        assert first[1].origin == f"{server.url}/api/v1/records/best"
        fetch = source.last_fetch
        assert fetch is not None and fetch.state == "downloaded" and fetch.records == 1
        assert fetch.path.parent == cache_dir and fetch.path.read_text() == mine.to_line() + "\n"
        with server.client("client") as client:
            etag = client.get(f"/api/v1/logs/{POCL}").headers["ETag"]
        assert fetch.path.with_suffix(".etag").read_text() == etag

        # Second build: If-None-Match -> 304, the cached copy is reused.
        second = choose_configs(wanted, source, POCL, LIMITS)
        assert second == first
        assert log_state(source) == "not modified"

        # New records for this device change the ETag: downloaded again.
        faster = made_up(IN_OPENCL_LOG, POCL, FITS, cost=5e-4)
        with server.client() as admin:
            admin.post("/api/v1/records/import", content=faster.to_line(),
                       headers={"content-type": "text/plain"}).raise_for_status()
        third = choose_configs(wanted, source, POCL, LIMITS)
        assert log_state(source) == "downloaded"
        assert third[0].record == faster
        assert fetch.path.with_suffix(".etag").read_text() != etag

        # Another device's better record, asked about alone: its fresh answer replaces the
        # cached one, the other workloads keep theirs.
        gtx = Record(target=Target.parse("opencl -model=1080ti"), workload=ONLY_IN_CUDA_LOG,
                     config=first[1].config,
                     result=MeasureResult(costs=(1e-3,), error_no=MeasureErrorNo.NO_ERROR,
                                          timestamp=2.0))
        with server.client() as admin:
            admin.post("/api/v1/records/import", content=gtx.to_line(),
                       headers={"content-type": "text/plain"}).raise_for_status()
        (fourth,) = choose_configs([ONLY_IN_CUDA_LOG], source, POCL, LIMITS)
        assert fourth.key == "opencl" and fourth.record == gtx
        online = [third[0], fourth, *third[2:]]
        assert [c.source for c in online] == [THIS_DEVICE, OTHER_DEVICE, OTHER_DEVICE, DEFAULT]

        # The log answers but /records/best fails: the cached answers stand in.
        with monkeypatch.context() as patch:
            patch.setattr(httpx.Client, "request", best_fails(httpx.Client.request))
            with pytest.warns(RecordsWarning, match=r"records/best: HTTP 503; 4 workload\(s\) "
                              r"from cached server answers, oldest \d+ s old"):
                half_up = choose_configs(wanted, source, POCL, LIMITS)
        assert log_state(source) == "not modified" and picks(half_up) == picks(online)

        # Online, the workload asked only later gets another device's record.
        elsewhere = ServerSource(server.url, token=server.tokens["client"],
                                 cache_dir=tmp_path / "elsewhere")
        (never_asked_online,) = choose_configs([NEVER_ASKED], elsewhere, POCL, LIMITS)
        assert never_asked_online.source == OTHER_DEVICE

        # A bad token is the user's error, not an outage: no silent fallback.
        with pytest.raises(RecordsServerError, match="401"):
            choose_configs(wanted, ServerSource(server.url, token="wrong", cache_dir=cache_dir),
                           POCL, LIMITS)
        server.stop()

    # Server gone: the cached log and answers are used as is, with a warning that says
    # how old they are; every workload asked online is chosen as online, other devices'
    # records included.
    two_hours_ago = time.time() - 2 * 3600 - 60
    os.utime(fetch.path, (two_hours_ago, two_hours_ago))
    with pytest.warns(RecordsWarning, match=r"cannot be reached .* last confirmed 2 h 1 min ago"
                      r".*; 4 workload\(s\) from cached server answers") as caught:
        offline = choose_configs([*wanted, NEVER_ASKED], source, POCL, LIMITS)
    assert log_state(source) == "offline"
    assert picks(offline[:4]) == picks(online)
    assert offline[0].record == faster
    answers = source.cache.answers_path_for(server.url, POCL)
    assert answers.parent == cache_dir
    assert offline[1].origin is not None and offline[1].origin.startswith(f"{answers} (cached, ")
    # A workload never asked online has no cached answer: the default, and the warning
    # names it.
    assert offline[4].source == DEFAULT
    assert source.last_fetch is not None and source.last_fetch.cached_answers == 4
    assert source.last_fetch.never_cached == (NEVER_ASKED,)
    (message,) = [str(w.message) for w in caught if issubclass(w.category, RecordsWarning)]
    assert message.endswith(f"; 1 never cached, so no other device's record for: "
                            f"{NEVER_ASKED.key}")

    # No server and no cache: a clear error, not an empty build.
    nowhere = ServerSource(f"http://127.0.0.1:{free_port()}", cache_dir=tmp_path / "empty",
                           timeout=2)
    with pytest.raises(RecordsUnavailableError,
                       match=r"cannot be reached .* no cached pretuned log"):
        choose_configs(wanted, nowhere, POCL, LIMITS)


def test_unreadable_cached_answers_count_as_none(tmp_path: Path) -> None:
    """It is only a cache: a mangled file warns, and the next online build rewrites it."""
    cache = LogCache(tmp_path)
    path = cache.answers_path_for("http://x", POCL)
    path.write_text("{not json")
    with pytest.warns(RecordsWarning, match=r"unreadable cached server answers .*; ignored"):
        assert cache.load_answers("http://x", POCL) == {}
    mine = made_up(IN_OPENCL_LOG, POCL, FITS, cost=1e-3)
    with pytest.warns(RecordsWarning, match="unreadable"):
        cache.save_answers("http://x", POCL, {IN_OPENCL_LOG.key: mine, IN_NO_LOG.key: None})
    loaded = cache.load_answers("http://x", POCL)
    assert {k: a.record for k, a in loaded.items()} == {IN_OPENCL_LOG.key: mine,
                                                         IN_NO_LOG.key: None}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_default_cache_dir_follows_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert ServerSource("http://x").cache.directory == tmp_path / "tuner" / "logs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home_cache = tmp_path / "home" / ".cache" / "tuner" / "logs"
    assert ServerSource("http://x").cache.directory == home_cache


# --------------------------------------------------------------------------------------
# --records and the report


def test_open_source_reads_urls_files_and_lists(tmp_path: Path) -> None:
    cuda, opencl = log_path("cuda_v0.10.log"), log_path("opencl_v0.04.log")
    server = open_source("http://127.0.0.1:8000/", token="t", cache_dir=tmp_path)
    assert isinstance(server, ServerSource) and server.url == "http://127.0.0.1:8000"
    assert server.token == "t" and server.cache.directory == tmp_path
    assert isinstance(open_source(str(cuda)), LogSource)
    chain = open_source(f"{cuda}, https://tuner.example:8443")
    assert isinstance(chain, ChainSource)
    assert [type(s) for s in chain.sources] == [LogSource, ServerSource]
    listed = open_source([cuda, opencl, MemorySource([])])
    assert isinstance(listed, ChainSource)
    assert [type(s) for s in listed.sources] == [LogSource, LogSource, MemorySource]
    with pytest.raises(ValueError, match="neither an http"):
        open_source(str(tmp_path / "nope.log"))
    with pytest.raises(ValueError, match="no source"):
        open_source(" , ")


def test_report_names_every_task_its_source_and_the_counts(tophub: LogSource) -> None:
    mine = made_up(IN_OPENCL_LOG, POCL, FITS, cost=1e-3)
    too_big = made_up(IN_OPENCL_LOG, POCL, TOO_MANY_THREADS, cost=1e-6)
    source = ChainSource([tophub, MemorySource([too_big, mine], origin="embedded database")])
    wanted = [IN_OPENCL_LOG, ONLY_IN_CUDA_LOG, IN_BOTH, IN_NO_LOG]
    choices = choose_configs(wanted, source, POCL, LIMITS)
    text = build_report(choices, None, POCL)
    assert "Build report for opencl -model=pocl-cpu" in text
    for workload in wanted:
        shapes = TEMPLATE.input_shapes(workload)
        assert "x".join(map(str, shapes[0])) + ", " + "x".join(map(str, shapes[1])) in text
    skipped = ("task 1: skipped a record for opencl -model=pocl-cpu from embedded database: "
               "over device limits (3136 threads per block > 1024)")
    for phrase in ("this device", "other device (opencl)", "other device (gpu)", "default",
                   "cuda -model=tx2", "opencl -model=1080ti", "1.00 ms", "measured",
                   "estimated", skipped,
                   "4 tasks: this device 1, other device 2, default 1",
                   "the median of this device's 1 measured task(s)"):
        assert phrase in text, f"{phrase!r} missing from:\n{text}"

    # A task standing for two layers of the same shape takes twice the time.
    twice = [2.0 * TEMPLATE.flops(IN_OPENCL_LOG)] + [float(TEMPLATE.flops(w)) for w in wanted[1:]]
    assert predict(choices, twice).rows[0].seconds == pytest.approx(2e-3)
    assert "2.00 ms" in build_report(choices, twice, POCL)
    with pytest.raises(ValueError, match="4 choices but 1 FLOP counts"):
        predict(choices, twice[:1])

    # Nothing measured here: shares of FLOPs, and the report says so.
    text = build_report(choose_configs(wanted, tophub, POCL, LIMITS), None, POCL)
    assert "FLOPs share" in text and "0 tasks" not in text
    assert "4 tasks: this device 0, other device 3, default 1" in text
    total = sum(TEMPLATE.flops(w) for w in wanted)
    share = TEMPLATE.flops(IN_NO_LOG) / total
    assert f"{share:.1%}" in text


def test_no_warning_when_everything_is_fresh(tophub: LogSource) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choose_configs([IN_OPENCL_LOG], tophub, POCL, LIMITS)
