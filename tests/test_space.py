"""Config spaces encode points exactly as AutoTVM does, so TopHub indices mean the same here.

AutoTVM enumerates a split by depth-first search over the divisors with the innermost
factor varying slowest, numbers configs mixed-radix with the first knob least
significant, and writes the outermost factor as -1 (implied by the others).
"""

from __future__ import annotations

import random

import pytest
from conftest import CONV, DENSE_LARGE, DENSE_SMALL, RESNET50_CONV, dense_workload

from compiler.templates import ConfigError, get_template
from compiler.templates.space import ConfigSpace, OtherKnob, SplitKnob
from schemas import Config


def test_split_enumeration_order_is_autotvms() -> None:
    """8 into 3 factors, in the order AutoTVM's SplitSpace._generate_space appends them."""
    assert SplitKnob("t", 8, 3).values == (
        (8, 1, 1), (4, 2, 1), (2, 4, 1), (1, 8, 1),
        (4, 1, 2), (2, 2, 2), (1, 4, 2),
        (2, 1, 4), (1, 2, 4),
        (1, 1, 8),
    )
    # 12 = 2^2 * 3: ordered triples of exact factors, no tails (AutoTVM's "factors" policy).
    assert len(SplitKnob("t", 12, 3)) == 18
    assert all(a * b * c == 12 for a, b, c in SplitKnob("t", 12, 3).values)


def test_index_is_mixed_radix_with_the_first_knob_least_significant() -> None:
    space = ConfigSpace([SplitKnob("a", 4, 2), OtherKnob("b", (0, 512, 1500)),
                         SplitKnob("c", 6, 2)])
    assert len(space) == 3 * 3 * 4
    assert space.values_at(0) == {"a": (4, 1), "b": 0, "c": (6, 1)}
    assert space.values_at(1) == {"a": (2, 2), "b": 0, "c": (6, 1)}
    assert space.values_at(3) == {"a": (4, 1), "b": 512, "c": (6, 1)}
    assert space.values_at(9) == {"a": (4, 1), "b": 0, "c": (3, 2)}
    assert space.values_at(35) == {"a": (1, 4), "b": 1500, "c": (1, 6)}
    with pytest.raises(ConfigError, match="outside the space"):
        space.values_at(36)


def test_index_and_entity_round_trip() -> None:
    """get(i) carries index i, its entity decodes back to the same point, and every
    index of a small space is a distinct entity; on ResNet-50's 3x3 conv space (90M
    configs) a random sample does the same."""
    dense = get_template(DENSE_SMALL)
    wl = dense_workload(DENSE_SMALL, 1, 2048, 1000)
    space = dense.space(wl)
    entities = set()
    for i in range(len(space)):
        config = space.get(i)
        assert config.index == i
        assert space.decode(config) == space.values_at(i)
        entities.add(config.entity)
    assert len(entities) == len(space)

    conv = get_template(CONV)
    cw = RESNET50_CONV["resnet50.res3.3x3"]
    cspace = conv.space(cw)
    rng = random.Random(7)
    for i in [0, len(cspace) - 1, *(rng.randrange(len(cspace)) for _ in range(200))]:
        config = cspace.get(i)
        # through JSON, as a log line would carry it
        again = Config.model_validate(config.to_json())
        assert cspace.index_of(conv.decode(cw, again)) == i


def test_a_hand_computed_index() -> None:
    """tile_k over 2048 = 2^11 lists inner factors 1, 2, 4, ...: [-1, 64] is number 6."""
    dense = get_template(DENSE_SMALL)
    wl = dense_workload(DENSE_SMALL, 1, 2048, 1000)
    config = Config(index=0, entity=[["tile_k", "sp", [-1, 64]]])
    assert dense.space(wl).normalize(config).index == 6
    assert dense.decode(wl, config) == {"tile_k": (32, 64)}


def test_minus_one_is_inferred_and_explicit_outer_factors_are_checked() -> None:
    knob = SplitKnob("t", 16, 3)
    assert knob.decode([-1, 2, 4]) == (2, 2, 4)
    assert knob.decode([2, 2, 4]) == (2, 2, 4)  # TopHub writes the outer factor out
    assert knob.encode((2, 2, 4)) == [-1, 2, 4]
    with pytest.raises(ConfigError, match="not the extent 16"):
        knob.decode([3, 2, 4])
    with pytest.raises(ConfigError, match="do not divide the extent 16"):
        knob.decode([-1, 3, 1])
    with pytest.raises(ConfigError, match="expected a split of 3 factors"):
        knob.decode([-1, 16])

    # A whole config in TopHub's explicit form normalises to the -1 form, same index.
    conv = get_template(CONV)
    cw = RESNET50_CONV["resnet50.res3.3x3"]
    space = conv.space(cw)
    config = space.get(123456)
    explicit = Config(index=config.index, entity=[
        [e.name, e.kind, [space.values_at(config.index)[e.name][0], *e.value[1:]]]
        if e.kind == "sp" else [e.name, e.kind, e.value] for e in config.entity])
    assert explicit != config
    assert space.normalize(explicit) == config


def test_dense_large_batch_prunes_like_autotvm() -> None:
    """Power-of-two vthread/thread tiles of 64 or 128 outputs, k outer > 2; when a knob
    would be empty (a batch of 32, or 1000 outputs, has no such tile) AutoTVM drops the
    pruning of every knob."""
    tmpl = get_template(DENSE_LARGE)
    pruned = tmpl.space(dense_workload(DENSE_LARGE, 64, 4096, 4096))
    for knob in pruned.knobs[:2]:
        assert all(v[1] in (2, 4, 8, 16, 32, 64) and v[2] in (8, 16, 32, 64)
                   and v[1] * v[2] * v[3] in (64, 128) for v in knob.values), knob.name
    assert all(v[0] > 2 for v in pruned.knobs[2].values)
    with pytest.raises(ConfigError, match="pruned"):
        pruned.knobs[0].decode([-1, 1, 32, 1])

    assert len(pruned) == 6336
    for batch, out_dim in ((32, 4096), (64, 1000)):
        fallback = tmpl.space(dense_workload(DENSE_LARGE, batch, 4096, out_dim))
        assert [len(k) for k in fallback.knobs] == [
            len(SplitKnob("x", batch, 4)), len(SplitKnob("y", out_dim, 4)),
            len(SplitKnob("k", 4096, 3))]


@pytest.mark.parametrize("extent", [1, 7, 12, 64, 224, 360, 512, 1000])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_a_split_checks_and_counts_its_values_without_enumerating_them(extent: int,
                                                                       parts: int) -> None:
    """A records/best lookup checks one config of each of thousands of workloads: a
    split knob counts its values and decodes a config arithmetically, enumerating
    (and pruning) them only when asked for them, with the same answers."""
    knob = SplitKnob("t", extent, parts)
    assert knob.decode([-1, *([1] * (parts - 1))]) == (extent, *([1] * (parts - 1)))
    count = len(knob)
    assert "values" not in knob.__dict__  # neither decode nor len enumerated
    assert count == len(knob.values) == len(set(knob.values))
    assert all(knob.decode([-1, *v[1:]]) == v for v in knob.values)

    inner_small = SplitKnob("t", extent, parts, keep=lambda v: max(v[1:], default=1) <= 4)
    kept = set(inner_small.values)
    assert len(inner_small) == len(kept) == sum(1 for v in knob.values if v in kept)
    for value in knob.values:
        if value in kept:
            assert inner_small.decode([-1, *value[1:]]) == value
        else:
            with pytest.raises(ConfigError, match="pruned"):
                inner_small.decode([-1, *value[1:]])
