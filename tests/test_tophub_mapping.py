"""TopHub's tuned conv2d records are configs of our space, mean the same point, and run.

Acceptance: every ``conv2d_nchw.cuda`` record in cuda_v0.10.log with float32 NCHW data
and dilation 1 maps to a valid config of our space (the test counts them and lists any
that do not, with the reason); a sample of them measured on PoCL gives correct results.

A record carries its config twice: as ``entity`` (knob values) and as ``index`` (AutoTVM's
mixed-radix position in the space). We decode the entity; when our enumeration of the
space reproduces the record's index, our space is AutoTVM's, knob for knob.
"""

from __future__ import annotations

import json
from functools import lru_cache

import pytest
from conftest import CONV, TOPHUB_DIR, MeasurePool, describe_failures

from compiler.runtime.measure import MeasureRequest
from compiler.templates import ConfigError, get_template
from compiler.templates.ops import Conv2dOp
from schemas import MeasureOptions, Record
from schemas.record import read_lines

CUDA_LOG = TOPHUB_DIR / "cuda_v0.10.log"
TEMPLATE = get_template(CONV)


@lru_cache(maxsize=1)
def conv_records() -> tuple[tuple[int, Record], ...]:
    """(line number, record) for each conv2d_nchw.cuda record with float32 NCHW data and
    dilation 1 (the log holds no other conv2d_nchw.cuda records, but the rule is stated)."""
    out = []
    with CUDA_LOG.open() as f:
        for line_no, rec in read_lines(f):
            if isinstance(rec, Exception) or rec.workload.template != CONV:
                continue
            data, dilation = rec.workload.args[0], rec.workload.args[4]
            if data[2] == "float32" and tuple(dilation) in ((1, 1), 1):
                out.append((line_no, rec))
    return tuple(out)


def _op(rec: Record) -> Conv2dOp:
    return TEMPLATE.parse(rec.workload)


def _index_matches(rec: Record) -> bool:
    return TEMPLATE.space(rec.workload).index_of(TEMPLATE.decode(rec.workload, rec.config)) \
        == rec.config.index


def test_every_record_maps_to_a_config_of_our_space() -> None:
    """decode() accepts each record's entity: exact splits, known knobs, valid choices."""
    records = conv_records()
    failures = []
    for line_no, rec in records:
        try:
            TEMPLATE.decode(rec.workload, rec.config)
        except ConfigError as err:
            failures.append(f"line {line_no} {json.dumps(rec.workload.args_json())}: {err}")
    print(f"\n{len(records) - len(failures)} of {len(records)} conv2d_nchw.cuda records map")
    # The README of the stored log counts 600 conv2d_nchw.cuda records, all float32, dilation 1.
    assert len(records) >= 600
    assert not failures, f"{len(failures)} records do not map:\n" + "\n".join(failures)


def test_record_index_agrees_with_our_enumeration() -> None:
    """Square kernels (no tile_ry/tile_rx naming question): our index of the decoded
    entity equals the record's index for >= 95% of records, i.e. the split enumeration
    order and knob order are AutoTVM's. The rest are listed (TopHub holds records whose
    index and entity disagree, e.g. line 336: index says tile_f [4, 2, 16, 1])."""
    square = [(n, r) for n, r in conv_records() if _op(r).kh == _op(r).kw]
    mismatched = [n for n, r in square if not _index_matches(r)]
    matched = len(square) - len(mismatched)
    total = sum(_index_matches(r) for _, r in conv_records())
    print(f"\nindex matches: {matched}/{len(square)} square-kernel records, "
          f"{total}/{len(conv_records())} in all; lines that differ: {mismatched}")
    assert square
    assert matched >= 0.95 * len(square), f"only {matched}/{len(square)} match: {mismatched}"


def test_older_logs_name_the_kernel_height_split_tile_rx() -> None:
    """Records listing tile_rx before tile_ry (older AutoTVM) mean tile_rx = split of the
    kernel height: with kh != kw only that reading is valid, and with kh == kw but
    different splits only that reading reproduces the record's index. decode() reads
    them so; a wrong reading runs a transposed reduction tiling, not the tuned one."""
    cases = []
    for line_no, rec in conv_records():
        names = [e.name for e in rec.config.entity]
        if names.index("tile_rx") < names.index("tile_ry") and \
                rec.config.knob("tile_rx") != rec.config.knob("tile_ry"):
            cases.append((line_no, rec))
    square = [n for n, r in cases if _op(r).kh == _op(r).kw]
    assert len(cases) >= 40 and len(square) >= 10, (len(cases), len(square))
    wrong = []
    for line_no, rec in cases:
        knobs = TEMPLATE.decode(rec.workload, rec.config)
        ry, rx = rec.config.knob("tile_rx"), rec.config.knob("tile_ry")  # as the log means
        if (list(knobs["tile_ry"])[1:], list(knobs["tile_rx"])[1:]) != (list(ry)[1:], list(rx)[1:]) \
                or not _index_matches(rec):
            wrong.append(f"line {line_no}: decoded tile_ry {knobs['tile_ry']} tile_rx "
                         f"{knobs['tile_rx']}, log tile_rx {list(ry)} tile_ry {list(rx)}")
    assert not wrong, "\n".join(wrong)


def _sample(max_flops: int = 250_000_000) -> list[tuple[int, Record]]:
    """The cheapest record of each (kernel shape, stride) under ``max_flops``, plus the
    cheapest with a register tile over 64 (the random sweep stops at 64)."""
    from compiler.templates.conv2d_nchw import _Tiles

    by_kind: dict[tuple[int, int, int], tuple[int, int, Record]] = {}
    big_tile: tuple[int, int, Record] | None = None
    for line_no, rec in conv_records():
        op = _op(rec)
        if op.flops > max_flops:
            continue
        key = (op.kh, op.kw, op.stride[0])
        if key not in by_kind or op.flops < by_kind[key][0]:
            by_kind[key] = (op.flops, line_no, rec)
        acc = _Tiles(op, TEMPLATE.decode(rec.workload, rec.config)).acc_size
        if acc > 64 and (big_tile is None or op.flops < big_tile[0]):
            big_tile = (op.flops, line_no, rec)
    picked = sorted(by_kind.values(), key=lambda x: x[1])
    if big_tile is not None and big_tile[1] not in {p[1] for p in picked}:
        picked.append(big_tile)
    return [(line_no, rec) for _, line_no, rec in picked]


@pytest.mark.slow
def test_sample_of_records_is_correct_on_pocl(measure_pool: MeasurePool) -> None:
    """TopHub's own configs (1x1 to 7x7, 1x7/7x1/3x1/1x3, a 1x512, strides 1 and 2, tuned
    on four GPU models) built and run on PoCL give numpy's answer (error_no 0)."""
    sample = _sample()
    kinds = {(_op(r).kh, _op(r).kw, _op(r).stride[0]) for _, r in sample}
    assert len(sample) >= 8 and len(kinds) >= 8, sorted(kinds)
    options = MeasureOptions(number=1, repeat=1, timeout_s=120)
    results = measure_pool.map([MeasureRequest(CONV, r.workload, r.config, options)
                                for _, r in sample])
    failed = [(req, res) for req, res in results if not res.ok]
    lines = [n for (n, _), (_, res) in zip(sample, results) if not res.ok]
    assert not failed, (f"{len(failed)} of {len(sample)} TopHub records (lines {lines}) "
                        f"failed on PoCL:\n{describe_failures(failed)}")
