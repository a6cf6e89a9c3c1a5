"""PyTriton decorator semantics: stacking and splitting, grouping, padding, first values, async functions.

Decorators are called directly with request lists where they need no model config; the ones that
read the config (``pad_batch``, ``first_value``'s batching check, list outputs) run through a bound model.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serving_pod.core.errors import InternalError
from serving_pod.pyapi import (
    DecoratorError,
    DynamicBatcher,
    Engine,
    ModelConfig,
    Tensor,
    batch,
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
)


def requests_of(*rows: list[float], name: str = "x") -> list[dict[str, np.ndarray]]:
    return [{name: np.array(r, np.float32).reshape(len(r), 1)} for r in rows]


def test_batch_stacks_requests_and_splits_outputs_back() -> None:
    seen = []

    @batch
    def double(x):
        seen.append(x.copy())
        return {"y": x * 2}

    results = double(requests_of([1, 2], [3], [4, 5, 6]))
    assert [r["y"].ravel().tolist() for r in results] == [[2, 4], [6], [8, 10, 12]]
    assert seen[0].ravel().tolist() == [1, 2, 3, 4, 5, 6]


def test_batch_mismatched_output_rows_is_a_clear_error() -> None:
    @batch
    def drops_a_row(x):
        return {"y": x[:-1], "z": x}

    with pytest.raises(DecoratorError) as info:
        drops_a_row(requests_of([1, 2], [3]))
    message = str(info.value)
    assert "output batch sizes do not add up" in message
    assert "'y' has shape [2, 1]" in message and "expected 3 rows" in message and "[2, 1]" in message
    assert "'z'" not in message


def test_batch_refuses_requests_with_different_inputs() -> None:
    @batch
    def identity(**inputs):
        return inputs

    with pytest.raises(DecoratorError, match="different inputs: \\['x'\\] and \\['x', 'y'\\]"):
        identity([{"x": np.ones((1, 1))}, {"x": np.ones((1, 1)), "y": np.ones((1, 1))}])


def test_group_by_keys_then_batch_handles_mixed_input_sets() -> None:
    @group_by_keys
    @batch
    def total(x, y=None):
        return {"s": x + (y if y is not None else 0)}

    requests = [{"x": np.ones((1, 1))}, {"x": np.ones((1, 1)), "y": np.full((1, 1), 5.0)}, {"x": np.zeros((2, 1))}]
    results = total(requests)
    assert [r["s"].ravel().tolist() for r in results] == [[1.0], [6.0], [0.0, 0.0]]


def test_group_by_values_calls_once_per_value_and_keeps_row_order() -> None:
    calls = []

    @batch
    @group_by_values("t")
    def scale(x, t):
        calls.append((t[0, 0], x.ravel().tolist()))
        return {"y": x * t}

    requests = [
        {"x": np.array([[1.0]]), "t": np.array([[2.0]])},
        {"x": np.array([[2.0], [3.0]]), "t": np.array([[10.0], [2.0]])},
        {"x": np.array([[4.0]]), "t": np.array([[10.0]])},
    ]
    results = scale(requests)
    assert sorted(calls) == [(2.0, [1.0, 3.0]), (10.0, [2.0, 4.0])]
    assert [r["y"].ravel().tolist() for r in results] == [[2.0], [20.0, 6.0], [40.0]]


def test_group_by_values_groups_strings_and_checks_group_outputs() -> None:
    @batch
    @group_by_values("lang")
    def tag(text, lang):
        return {"out": np.array([lang[0] + b":" + t for t in text], dtype=object)}

    requests = [
        {"text": np.array([b"a", b"b"], dtype=object), "lang": np.array([b"en", b"de"], dtype=object)},
        {"text": np.array([b"c"], dtype=object), "lang": np.array([b"en"], dtype=object)},
    ]
    assert [r["out"].tolist() for r in tag(requests)] == [[b"en:a", b"de:b"], [b"en:c"]]

    @batch
    @group_by_values("t")
    def wrong_rows(x, t):
        return {"y": x[:1]}

    with pytest.raises(DecoratorError, match="output 'y' of a group of 2 rows has shape \\[1, 1\\]"):
        wrong_rows([{"x": np.ones((2, 1)), "t": np.ones((2, 1))}])
    with pytest.raises(DecoratorError, match="input\\(s\\) \\['temperature'\\] are not in the batch"):
        group_by_values("temperature")(lambda **k: k)(x=np.ones((1, 1)))


def test_first_value_squeezes_and_is_strict() -> None:
    got = []

    @batch
    @first_value("t")
    def use(x, t):
        got.append(t)
        return {"y": x}

    use([{"x": np.ones((2, 1)), "t": np.array([[0.5], [0.5]], np.float32)}])
    assert got == [0.5] and np.ndim(got[0]) == 0
    with pytest.raises(DecoratorError, match="rows of input 't' differ"):
        use([{"x": np.ones((2, 1)), "t": np.array([[0.5], [0.7]], np.float32)}])

    lenient = first_value("t", strict=False, squeeze_single_values=False)(lambda requests: requests)
    (request,) = lenient([{"t": np.array([[1.0], [2.0]])}])
    assert request["t"].tolist() == [1.0]


def test_sample_calls_once_per_request_and_fill_optionals_fills_missing() -> None:
    @fill_optionals(bias=np.array([100.0]))
    @sample
    def add(x, bias):
        return {"y": x + bias}

    results = add([{"x": np.array([[1.0]])}, {"x": np.array([[2.0]]), "bias": np.array([[1.0]])}])
    assert [r["y"].ravel().tolist() for r in results] == [[101.0], [3.0]]
    with pytest.raises(DecoratorError, match="must be a numpy array"):
        fill_optionals(bias=1.0)


def test_async_functions_through_the_decorators() -> None:
    @batch
    @group_by_values("t")
    async def scale(x, t):
        await asyncio.sleep(0)
        return {"y": x * t}

    assert scale._ferry_async is True
    coroutine = scale([{"x": np.array([[1.0], [2.0]]), "t": np.array([[3.0], [4.0]])}])
    (result,) = asyncio.run(coroutine)
    assert result["y"].ravel().tolist() == [3.0, 8.0]


FIXED = [Tensor("x", np.float32, (1,))]


def test_pad_batch_pads_to_preferred_size_and_trims_outputs() -> None:
    seen = []

    @batch
    @pad_batch
    def padded(x):
        seen.append(x.ravel().tolist())
        return {"y": x + 1}

    with Engine() as engine:
        engine.bind("padded", padded, FIXED, [Tensor("y", np.float32, (1,))],
                    ModelConfig(max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=(2, 4))))
        three = engine.infer("padded", {"x": np.array([[1.0], [2.0], [3.0]], np.float32)})
        five = engine.infer("padded", {"x": np.arange(5, dtype=np.float32).reshape(5, 1)})
    assert seen[0] == [1.0, 2.0, 3.0, 3.0]  # the last row repeated up to preferred size 4
    assert seen[1] == [0.0, 1.0, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0]  # above every preferred size: max_batch_size
    assert three["y"].ravel().tolist() == [2.0, 3.0, 4.0]
    assert five["y"].shape == (5, 1)


def test_decorators_that_need_the_config_fail_clearly_outside_or_on_wrong_models() -> None:
    with pytest.raises(DecoratorError, match="@pad_batch reads the model config"):
        pad_batch(lambda **k: k)(x=np.ones((1, 1)))

    @first_value("x")
    def no_batch(requests):
        return [{"y": r["x"]} for r in requests]

    with Engine() as engine:
        engine.bind("nobatch", no_batch, FIXED, [Tensor("y", np.float32, (1,))], ModelConfig(batching=False))
        with pytest.raises(InternalError, match="@first_value can only be used with models that batch"):
            engine.infer("nobatch", {"x": np.ones(1, np.float32)})


def test_list_outputs_follow_the_declared_output_order() -> None:
    @batch
    def two(x):
        return [x * 2, x * 3]

    with Engine() as engine:
        engine.bind("two", two, FIXED, [Tensor("b", np.float32, (1,)), Tensor("a", np.float32, (1,))])
        result = engine.infer("two", {"x": np.ones((1, 1), np.float32)})
    assert result["b"].item() == 2.0 and result["a"].item() == 3.0
    with pytest.raises(DecoratorError, match="returned 2 outputs as a list, the model declares 0"):
        two([{"x": np.ones((1, 1))}])
