"""The ``tuner`` command: space, codegen, measure (TopHub config and --index), devices."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.main import app
from compiler.records.pretuned import TOPHUB_DIR
from compiler.runtime.device import Device, is_cpu
from compiler.templates import get_template
from schemas import Config, MeasureErrorNo, Record, Workload
from schemas.record import COLD_INFO, read_lines

runner = CliRunner()
TOPHUB = TOPHUB_DIR
CUDA_LOG = TOPHUB / "cuda_v0.10.log"

# ResNet-50 stage 2, 3x3 conv: 64 -> 64 channels on 56x56, stride 1, pad 1.
RESNET_3X3: list[Any] = [
    ["TENSOR", [1, 64, 56, 56], "float32"], ["TENSOR", [64, 64, 3, 3], "float32"],
    [1, 1], [1, 1, 1, 1], [1, 1], "float32",
]
RESNET_3X3_SPACE = 90316800


def _opencl_targets() -> list[str]:
    try:
        from compiler.runtime.opencl import list_opencl_devices

        return [str(d.target) for d in list_opencl_devices()]
    except Exception:
        return []


OPENCL_TARGETS = _opencl_targets()
HAS_POCL = "opencl -model=pocl-cpu" in OPENCL_TARGETS
needs_opencl = pytest.mark.skipif(not OPENCL_TARGETS, reason="no OpenCL device here")


@lru_cache(maxsize=None)
def count_splits(extent: int, parts: int) -> int:
    """Ordered ways to write ``extent`` as a product of ``parts`` positive factors (brute force)."""
    if parts == 1:
        return 1
    return sum(count_splits(extent // f, parts - 1)
               for f in range(1, extent + 1) if extent % f == 0)


def invoke(argv: list[str]) -> Any:
    result = runner.invoke(app, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    return result


# --- space -------------------------------------------------------------------------------


def test_space_of_resnet_3x3() -> None:
    """Size, knobs and FLOPs of the ResNet-50 3x3 conv, checked by counting splits here."""
    result = invoke(["space", "conv2d_nchw.cuda", "--workload", json.dumps(RESNET_3X3)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["template"] == "conv2d_nchw.cuda"
    assert out["size"] == RESNET_3X3_SPACE
    assert out["flops"] == 2 * 64 * 56 * 56 * 64 * 3 * 3

    knobs = {k["name"]: k for k in out["knobs"]}
    assert [k["name"] for k in out["knobs"]] == [
        "tile_f", "tile_y", "tile_x", "tile_rc", "tile_ry", "tile_rx",
        "auto_unroll_max_step", "unroll_explicit"]
    expected_splits = {"tile_f": (64, 4), "tile_y": (56, 4), "tile_x": (56, 4),
                       "tile_rc": (64, 2), "tile_ry": (3, 2), "tile_rx": (3, 2)}
    for name, (extent, parts) in expected_splits.items():
        assert knobs[name]["kind"] == "sp"
        assert (knobs[name]["extent"], knobs[name]["num_outputs"]) == (extent, parts)
        assert knobs[name]["size"] == count_splits(extent, parts), name
    assert knobs["auto_unroll_max_step"]["candidates"] == [0, 512, 1500]
    assert knobs["unroll_explicit"]["candidates"] == [0, 1]
    # 84 * 80 * 80 * 7 * 2 * 2 * 3 * 2, counted independently of the library.
    independent = math.prod(count_splits(e, p) for e, p in expected_splits.values()) * 3 * 2
    assert independent == RESNET_3X3_SPACE
    assert math.prod(k["size"] for k in out["knobs"]) == out["size"]

    default = Config.model_validate(out["default"])
    workload = Workload(template="conv2d_nchw.cuda", args=RESNET_3X3)
    assert 0 <= default.index < out["size"]
    assert get_template("conv2d_nchw.cuda").space(workload).get(default.index) == default


def test_space_of_dense() -> None:
    args = [["TENSOR", [1, 2048], "float32"], ["TENSOR", [1000, 2048], "float32"], None,
            "float32"]
    result = invoke(["space", "dense_small_batch.gpu", "--workload", json.dumps(args)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["size"] == count_splits(2048, 2) == 12
    assert out["flops"] == 2 * 2048 * 1000


# --- codegen -----------------------------------------------------------------------------


def _split_prelude(text: str) -> tuple[list[str], list[str]]:
    """(the dialect prelude: up to the #endif of its TUNER_PRELUDE guard; the kernel)."""
    lines = text.splitlines()
    assert "#ifndef TUNER_PRELUDE" in lines
    depth, end = 0, None
    for i in range(lines.index("#ifndef TUNER_PRELUDE"), len(lines)):
        word = lines[i].split()[0] if lines[i].strip() else ""
        depth += word in ("#if", "#ifdef", "#ifndef")
        depth -= word == "#endif"
        if depth == 0:  # the guard's own #endif (the prelude nests #if blocks inside)
            end = i + 1
            break
    assert end is not None, "the prelude guard is never closed"
    return lines[:end], [line for line in lines[end:] if line.strip()]


@pytest.mark.parametrize(
    ("template", "args", "index"),
    [
        ("conv2d_nchw.cuda", RESNET_3X3, 12345678),
        ("dense_small_batch.gpu", [["TENSOR", [4, 512], "float32"],
                                   ["TENSOR", [256, 512], "float32"], None, "float32"], 5),
        ("dense_large_batch.gpu", [["TENSOR", [64, 512], "float32"],
                                   ["TENSOR", [256, 512], "float32"], None, "float32"], 77),
    ],
)
def test_codegen_dialects_differ_in_prelude_only(template: str, args: list[Any],
                                                 index: int) -> None:
    sources = {}
    for dialect in ("cuda", "opencl"):
        result = invoke(["codegen", template, "--workload", json.dumps(args),
                         "--index", str(index), "--dialect", dialect])
        assert result.exit_code == 0, result.output
        sources[dialect] = _split_prelude(result.stdout)
    (cuda_head, cuda_body), (ocl_head, ocl_body) = sources["cuda"], sources["opencl"]
    assert cuda_body == ocl_body
    assert any(line.startswith("KERNEL void ") for line in cuda_body)
    assert cuda_head != ocl_head
    assert any("__syncthreads" in line for line in cuda_head)
    assert any("barrier(CLK_LOCAL_MEM_FENCE)" in line for line in ocl_head)
    body = "\n".join(cuda_body)
    for dialect_word in ("__syncthreads", "threadIdx", "blockIdx", "get_local_id",
                         "get_group_id", "__global", "__local", "__shared__"):
        assert dialect_word not in body, dialect_word


# --- measure -----------------------------------------------------------------------------


def _small_tophub_conv() -> Record:
    """The smallest-FLOP square conv2d_nchw.cuda record of TopHub's cuda log."""
    template = get_template("conv2d_nchw.cuda")
    records = [r for _, r in read_lines(CUDA_LOG.read_text().splitlines())
               if isinstance(r, Record) and r.workload.template == "conv2d_nchw.cuda"
               and r.workload.args[0][1][2] == r.workload.args[0][1][3]]
    return min(records, key=lambda r: template.flops(r.workload))


@needs_opencl
@pytest.mark.skipif(not CUDA_LOG.exists(), reason=f"{CUDA_LOG} is absent")
def test_measure_tophub_config() -> None:
    """A TopHub config object as --config: one record line, error_no 0, same config."""
    tophub = _small_tophub_conv()
    result = invoke(["measure", "conv2d_nchw.cuda",
                     "--workload", json.dumps(tophub.workload.args_json()),
                     "--config", json.dumps(tophub.config.to_json()),
                     "--number", "2", "--repeat", "3"])
    assert result.exit_code == 0, result.output
    lines = [x for x in result.stdout.splitlines() if x.strip()]
    assert len(lines) == 1, lines
    record = Record.from_line(lines[0])
    assert record.result.error_no == MeasureErrorNo.NO_ERROR, record.result.error_msg
    assert record.workload == tophub.workload
    assert record.config == tophub.config
    assert record.target.kind == "opencl"
    assert str(record.target) in OPENCL_TARGETS
    assert len(record.result.costs) == 1  # 3 repeats, fastest and slowest dropped
    assert all(0 < c < 1 for c in record.result.costs)
    assert "GFLOP/s" in result.output


@needs_opencl
def test_measure_by_index() -> None:
    """--index N measures the space's N-th config and records it under that index."""
    args = [["TENSOR", [1, 256], "float32"], ["TENSOR", [16, 256], "float32"], None,
            "float32"]
    template = get_template("dense_small_batch.gpu")
    space = template.space(Workload(template=template.name, args=args))
    index = 4
    assert space.values_at(index) == {"tile_k": (16, 16)}
    result = invoke(["measure", "dense_small_batch.gpu", "--workload", json.dumps(args),
                     "--index", str(index), "--number", "1", "--repeat", "1"])
    assert result.exit_code == 0, result.output
    record = Record.from_line(result.stdout.strip().splitlines()[0])
    assert record.result.error_no == MeasureErrorNo.NO_ERROR, record.result.error_msg
    assert record.config == space.get(index)
    assert record.config.index == index
    assert record.config.knob("tile_k") == (-1, 16)


def test_measure_with_cold_weights_says_so_in_the_record(device: Device) -> None:
    """--cpu-cache-flush on a CPU device: the record's info says ``cpu_cache_flush``, so a
    build ranks it with the cold records when it is imported; without it, nothing."""
    args = [["TENSOR", [1, 256], "float32"], ["TENSOR", [16, 256], "float32"], None,
            "float32"]
    said = {}
    for flags in (["--cpu-cache-flush"], []):
        result = invoke(["measure", "dense_small_batch.gpu", "--workload", json.dumps(args),
                         "--index", "4", "--number", "1", "--repeat", "1", *flags])
        assert result.exit_code == 0, result.output
        record = Record.from_line(result.stdout.strip().splitlines()[0])
        said[bool(flags)] = (record.info or {}).get(COLD_INFO)
    assert said == {True: True if is_cpu(device.info) else None, False: None}


# --- devices -----------------------------------------------------------------------------


def test_devices_json() -> None:
    result = invoke(["devices", "--json"])
    assert result.exit_code == 0, result.output
    devices = json.loads(result.stdout)
    assert isinstance(devices, list)
    assert len({d["spec"] for d in devices}) == len(devices)
    for d in devices:
        assert {"spec", "name", "platform", "target", "limits"} <= d.keys()
        assert d["limits"]["max_threads_per_block"] > 0
    assert [d["target"] for d in devices if d["spec"].startswith("opencl")] == OPENCL_TARGETS
    if not HAS_POCL:
        pytest.skip("PoCL is not installed: nothing more to check")
    assert any(d["target"] == "opencl -model=pocl-cpu" for d in devices)


@needs_opencl
def test_devices_table() -> None:
    result = invoke(["devices"])
    assert result.exit_code == 0, result.output
    assert "opencl:0" in result.output


def test_serve_refuses_several_processes_on_sqlite(tmp_path: Path) -> None:
    """SQLite has one writer: `--workers 2` on it is refused before anything listens."""
    result = runner.invoke(app, ["serve", "--workers", "2", "--database-url",
                                 f"sqlite:///{tmp_path / 'x.db'}"])
    assert result.exit_code == 2
    assert "--workers" in result.output and "PostgreSQL" in result.output


# --- tokens --------------------------------------------------------------------------------


def test_token_list_and_revoke(tmp_path: Path) -> None:
    """`token list` shows id, name, role, worker, created (never a token); `token revoke`
    takes an id or a name, and says so in one line (exit 1) when nothing matched."""
    from server_fixtures import migrate

    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate(url)
    created = invoke(["token", "create", "--role", "client", "--name", "ci",
                      "--database-url", url])
    assert created.exit_code == 0, created.output
    secret = created.stdout.splitlines()[-1]
    invoke(["token", "create", "--role", "worker", "--name", "gpus", "--database-url", url])
    listed = invoke(["token", "list", "--database-url", url])
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["id", "name", "role", "worker", "created"]
    assert [r.split()[:4] for r in rows] == [["1", "ci", "client", "-"],
                                             ["2", "gpus", "worker", "-"]]
    assert secret not in listed.stdout
    gone = invoke(["token", "revoke", "gpus", "--database-url", url])
    assert (gone.exit_code, gone.stdout.strip()) == (0, "revoked token 2 (gpus, worker)")
    gone = invoke(["token", "revoke", "1", "--database-url", url])
    assert gone.exit_code == 0, gone.output
    assert invoke(["token", "list", "--database-url", url]).stdout.strip() == "no tokens"
    missing = invoke(["token", "revoke", "gpus", "--database-url", url])
    assert missing.exit_code == 1
    assert missing.stderr.startswith("error: no token has the id or name 'gpus'")


def test_embedded_runs_reuse_one_token_pair(tmp_path: Path) -> None:
    """The embedded client and worker tokens live beside the SQLite file (mode 0600) and
    are reused while the database has them; a revoked one is replaced."""
    from server_fixtures import migrate

    from tuner.embedded import embedded_tokens, tokens_file
    from tuner_server.db.session import make_engine, session_factory
    from tuner_server.services.tokens import list_tokens, lookup, revoke

    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate(url)
    engine = make_engine(url)
    try:
        sessions = session_factory(engine)
        first = embedded_tokens(sessions, url)
        assert embedded_tokens(sessions, url) == first
        path = tokens_file(url)
        assert path == tmp_path / "tuner.db.tokens.json"
        assert path.stat().st_mode & 0o777 == 0o600
        assert json.loads(path.read_text()) == first
        with sessions.begin() as session:
            assert [(t.role, t.worker_id) for t in list_tokens(session)] == [
                ("client", None), ("worker", None)]
            info = lookup(session, first["worker"])
            assert info is not None
            revoke(session, str(info.id))
        again = embedded_tokens(sessions, url)
        assert again["client"] == first["client"] and again["worker"] != first["worker"]
        with sessions() as session:
            assert len(list_tokens(session)) == 2
    finally:
        engine.dispose()
