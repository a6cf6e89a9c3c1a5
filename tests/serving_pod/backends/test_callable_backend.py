"""Backend "ferry_callable": bound functions' errors become request errors, outputs are checked, instances spread."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from serving_pod.backends.callable import CALLABLES, Request
from serving_pod.core.errors import InternalError, InvalidArgumentError, ModelLoadError, ServerError
from serving_pod.pyapi import DynamicBatcher, Engine, ModelConfig, Tensor, batch
from support.server import write_model

X = [Tensor("x", np.float32, (2,))]
Y = [Tensor("y", np.float32, (2,))]
ONE = {"x": np.ones((1, 2), np.float32)}


@pytest.fixture
def engine():
    with Engine() as started:
        yield started


def test_function_errors_fail_the_request_and_the_model_keeps_serving(engine: Engine) -> None:
    @batch
    def picky(x):
        if np.any(x < 0):
            raise ValueError("negative input")
        return {"y": x}

    engine.bind("picky", picky, X, Y)
    with pytest.raises(InternalError, match="model 'picky': ValueError: negative input"):
        engine.infer("picky", {"x": -np.ones((1, 2), np.float32)})
    assert engine.infer("picky", ONE)["y"].tolist() == [[1.0, 1.0]]
    stats = engine.statistics("picky")[0]["inference_stats"]
    assert stats["fail"]["count"] == 1 and stats["success"]["count"] == 1


def test_server_errors_pass_through_and_exceptions_as_results_fail_one_request(engine: Engine) -> None:
    def per_request(requests: list[Request]):
        assert all(isinstance(r, Request) for r in requests)
        if requests[0].parameters.get("refuse"):
            raise InvalidArgumentError("refused by the model")
        return [ValueError("odd one out") if r["x"][0, 0] == 7 else {"y": r["x"]} for r in requests]

    engine.bind("per_request", per_request, X, Y)
    with pytest.raises(InvalidArgumentError, match="^refused by the model$"):
        engine.infer("per_request", ONE, parameters={"refuse": True})
    with pytest.raises(InternalError, match="ValueError: odd one out"):
        engine.infer("per_request", {"x": np.full((1, 2), 7, np.float32)})


@pytest.mark.parametrize(
    "returned, message",
    [
        ({"y": np.ones((1, 3), np.float32)}, r"output 'y' has shape \[1, 3\], expected \[1, 2\]"),
        ({"y": np.ones((2, 2), np.float32)}, r"output 'y' has shape \[2, 2\], expected \[1, 2\] \(dim 0 is the request's batch size\)"),
        ({"y": np.ones((1, 2)), "z": np.ones((1, 2))}, r"returned output\(s\) \['z'\] that the model does not declare"),
        ({}, r"did not return output\(s\) \['y'\]"),
        ({"y": np.array([["a", "b"]])}, "numpy dtype <U1, which does not convert to the declared FP32"),
        ("text", "a result must be a dict of output name -> array"),
    ],
)
def test_bad_outputs_are_clear_request_errors(engine: Engine, returned, message) -> None:
    engine.bind("bad", lambda requests: [returned for _ in requests], X, Y)
    with pytest.raises(InternalError, match=message):
        engine.infer("bad", ONE)


def test_wrong_result_count_and_float64_outputs(engine: Engine) -> None:
    engine.bind("none", lambda requests: None, X, Y)
    with pytest.raises(InternalError, match="must return a list with one result per request, got NoneType"):
        engine.infer("none", ONE)
    engine.bind("f64", lambda requests: [{"y": r["x"].astype(np.float64) * 2} for r in requests], X, Y)
    result = engine.infer("f64", ONE)["y"]
    assert result.dtype == np.float32 and result.tolist() == [[2.0, 2.0]]


def test_instances_run_concurrently_on_their_own_threads(engine: Engine) -> None:
    threads: set[str] = set()
    barrier = threading.Barrier(2, timeout=10)

    def meet(requests):
        threads.add(threading.current_thread().name)
        barrier.wait()  # both instances must be inside at once, or this times out
        return [{"y": r["x"]} for r in requests]

    engine.bind("pair", meet, X, Y, ModelConfig(batching=False, instances=2))  # one request per execution
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: engine.infer("pair", {"x": np.ones(2, np.float32)}), range(2)))
    assert len(results) == 2 and len(threads) == 2


def test_a_list_of_functions_is_one_instance_each(engine: Engine) -> None:
    def first(requests):
        return [{"y": r["x"] * 0} for r in requests]

    engine.bind("listed", [first, first], X, Y, ModelConfig(batcher=DynamicBatcher()))
    assert engine.model_config("listed")["instance_group"][0]["count"] == 2
    with pytest.raises(ValueError, match="2 functions given but ModelConfig\\(instances=3\\)"):
        engine.bind("listed3", [first, first], X, Y, ModelConfig(instances=3))


def test_a_repository_model_naming_the_backend_cannot_load(tmp_path: Path) -> None:
    write_model(tmp_path, "orphan", """
name: "orphan"
backend: "ferry_callable"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "ferry_callable_key" value { string_value: "nobody" } }
""")
    with Engine(tmp_path, load_models=()) as engine:
        with pytest.raises(ModelLoadError, match="no function is registered under key 'nobody'"):
            engine.load("orphan")


def test_unbind_and_stop_release_the_table_entries() -> None:
    before = set(CALLABLES)
    with Engine() as engine:
        engine.bind("a", lambda requests: [{"y": r["x"]} for r in requests], X, Y)
        engine.bind("b", lambda requests: [{"y": r["x"]} for r in requests], X, Y)
        assert len(set(CALLABLES) - before) == 2
        engine.unbind("a")
        assert len(set(CALLABLES) - before) == 1
        with pytest.raises(ServerError, match="'a'"):
            engine.infer("a", ONE)
    assert set(CALLABLES) == before


def test_stream_errors_end_the_stream_with_a_clear_error(engine: Engine) -> None:
    def fails_midway(requests):
        yield [{"v": np.array([1], np.int32)} for _ in requests]
        raise RuntimeError("generation failed")

    def bad_output(requests):
        yield [{"v": np.array([1.5])} for _ in requests]
        raise AssertionError("not reached: the only stream already ended")

    decoupled = ModelConfig(batching=False, decoupled=True)
    spec = ([Tensor("n", np.int32, (1,))], [Tensor("v", np.int32, (1,))])
    engine.bind("midway", fails_midway, *spec, decoupled)
    engine.bind("bad_output", bad_output, *spec, decoupled)
    stream = engine.stream("midway", {"n": np.array([1], np.int32)})
    assert next(stream)["v"].tolist() == [1]
    with pytest.raises(InternalError, match="model 'midway': RuntimeError: generation failed"):
        next(stream)
    with pytest.raises(InternalError, match="output 'v' has numpy dtype float64, which does not convert to the declared INT32"):
        list(engine.stream("bad_output", {"n": np.array([1], np.int32)}))
