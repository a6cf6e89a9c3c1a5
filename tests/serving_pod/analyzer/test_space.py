"""The configuration space: points, normalization, neighbours, and configs built from points."""

from __future__ import annotations

import pytest

from serving_pod.analyzer.errors import InputError
from serving_pod.analyzer.space import (ConfigPoint, SearchSpace, apply_point, config_from_dict, config_dict,
                                        neighbours, parse_choices, parse_int_list, point_of, read_base_config,
                                        with_value)
from support.server import DEFAULT_MODELS


def space(**overrides) -> SearchSpace:
    values = dict(instance_counts=(1, 2), max_batch_sizes=(8, 64), dynamic_batching=(True, False),
                  delays_us=(0, 500), preferred=("none", "max"), concurrencies=(1, 2, 4))
    values.update(overrides)
    return SearchSpace(**values)


@pytest.mark.parametrize(("text", "expected"), [
    ("1,2,4", (1, 2, 4)), ("4,1,4", (1, 4)), ("1..8", (1, 2, 4, 8)), ("1..6", (1, 2, 4, 6)), ("3..3", (3,)),
])
def test_int_lists(text: str, expected: tuple[int, ...]) -> None:
    assert parse_int_list(text, "--concurrency", minimum=1) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("0", "must be >= 1"), ("8..2", "start 8 is above end 2"), ("a,b", "not an integer"), ("", "list is empty"),
    ("-1..4", "must be >= 1"),
])
def test_bad_int_lists(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_int_list(text, "--concurrency", minimum=1)


def test_choices_are_checked() -> None:
    assert parse_choices("max,none,max", "x", ("none", "max")) == ("max", "none")
    with pytest.raises(InputError, match="use a comma-separated list of none, max"):
        parse_choices("sometimes", "x", ("none", "max"))


def test_points_normalize_and_name_themselves() -> None:
    point = ConfigPoint(2, 64, False, 500, (64,)).normalized()
    assert point == ConfigPoint(2, 64, False)
    assert point.key == "i2-b64-nodb"
    batched = ConfigPoint(1, 32, True, 100, (64, 16, 32)).normalized()
    assert batched.preferred_batch_sizes == (16, 32)  # sizes above max_batch_size are dropped
    assert batched.key == "i1-b32-db100-p16.32"
    assert ConfigPoint.from_dict(batched.as_dict()) == batched


def test_preferred_sizes_follow_the_max_batch_size() -> None:
    point = ConfigPoint(1, 64, True, 0, (64,))
    assert with_value(point, "max_batch_size", 8).preferred_batch_sizes == (8,)
    assert with_value(point, "preferred", "half").preferred_batch_sizes == (32, 64)


def test_neighbours_change_one_dimension_only() -> None:
    s = space()
    point = ConfigPoint(1, 64, True, 0)
    assert [p.instance_count for p in neighbours(s, point, "instance_count")] == [2]
    assert list(neighbours(s, point, "dynamic_batching")) == [ConfigPoint(1, 64, False)]
    assert list(neighbours(s, ConfigPoint(1, 64, False), "max_queue_delay_us")) == []  # no batcher, no delay
    on = list(neighbours(space(delays_us=(300, 900), preferred=("max",)), ConfigPoint(1, 64, False),
                         "dynamic_batching"))
    assert on == [ConfigPoint(1, 64, True, 300, (64,))]  # switched on at the space's first values


def test_grid_is_deduplicated() -> None:
    grid = space().grid()
    assert len(grid) == len(set(grid))
    # per (instances, max batch): 1 without batching + 2 delays x 2 preferred with it
    assert len(grid) == 2 * 2 * (1 + 2 * 2)


def test_model_without_batching_keeps_max_batch_size_zero() -> None:
    restricted = space().for_model(ConfigPoint(1, 0, False))
    assert {p.max_batch_size for p in restricted.grid()} == {0}
    assert {p.dynamic_batching for p in restricted.grid()} == {False}


def test_apply_point_keeps_everything_else() -> None:
    base = read_base_config(DEFAULT_MODELS / "mlp_onnx", "mlp_onnx")
    assert point_of(base) == ConfigPoint(1, 64, True, 200)
    assert apply_point(base, point_of(base)) == base
    changed = apply_point(base, ConfigPoint(3, 16, True, 1000, (16,)))
    assert point_of(changed) == ConfigPoint(3, 16, True, 1000, (16,))
    assert list(changed.input) == list(base.input) and changed.platform == base.platform
    off = apply_point(base, ConfigPoint(1, 64, False))
    assert not off.HasField("dynamic_batching")
    assert config_from_dict(config_dict(changed)) == changed


def test_bad_config_is_an_input_error(tmp_path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text("max_batch_size: [")
    with pytest.raises(InputError, match="failed to parse config.pbtxt of model 'broken'"):
        read_base_config(tmp_path / "broken", "broken")
