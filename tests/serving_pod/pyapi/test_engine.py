"""The in-process API: repository models and bound functions through ``Engine`` / ``AsyncEngine``, no network."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from serving_pod.core.errors import InvalidArgumentError, NotFoundError, UnavailableError
from serving_pod.pyapi import AsyncEngine, DynamicBatcher, Engine, ModelConfig, Tensor, batch
from support.server import copy_models, DEFAULT_MODELS, test_model_config, write_model

X = [Tensor("x", np.float32, (-1,))]
Y = [Tensor("y", np.float32, (-1,))]


@batch
def double(x):
    return {"y": x * 2}


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    write_model(tmp_path, "identity", test_model_config("identity"))
    return copy_models(tmp_path, DEFAULT_MODELS, "simple")


def test_repository_models_load_infer_unload_and_report(repository: Path) -> None:
    with Engine(repository) as engine:
        assert {row["name"]: row["state"] for row in engine.models()} == {"identity": "READY", "simple": "READY"}
        ints = np.arange(16, dtype=np.int32).reshape(1, 16)
        result = engine.infer("simple", {"INPUT0": ints, "INPUT1": np.ones_like(ints)}, outputs=["OUTPUT1"])
        assert list(result) == ["OUTPUT1"] and result["OUTPUT1"].tolist() == (ints - 1).tolist()
        assert engine.model_metadata("identity")["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}]
        assert engine.model_config("simple")["max_batch_size"] == 8
        engine.unload("identity")
        assert not engine.is_ready("identity") and engine.is_ready("simple")
        with pytest.raises(NotFoundError, match="'identity' has no available versions"):
            engine.infer("identity", {"INPUT0": np.ones((1, 4), np.float32)})
        engine.load("identity")
        assert engine.infer("identity", {"INPUT0": np.ones((1, 4), np.float32)})["OUTPUT0"].sum() == 4
        stats = engine.statistics("simple")[0]
        assert stats["inference_count"] == 1 and stats["execution_count"] == 1
        assert 'nv_inference_count{model="simple",version="1"} 1' in engine.metrics()


def test_request_errors_use_the_servers_messages(repository: Path) -> None:
    with Engine(repository) as engine:
        with pytest.raises(NotFoundError, match="Request for unknown model: 'missing' is not found"):
            engine.infer("missing", {"x": np.ones(1)})
        with pytest.raises(InvalidArgumentError, match="data-type is 'FP64', but model 'identity' expects 'FP32'"):
            engine.infer("identity", {"INPUT0": np.ones((1, 4))})
        with pytest.raises(TypeError, match="inputs must be a dict"):
            engine.infer("identity", [np.ones((1, 4), np.float32)])  # type: ignore[arg-type]


def test_load_models_and_control_mode_options(repository: Path) -> None:
    with Engine(repository, load_models=("simple",)) as engine:
        assert engine.is_ready("simple") and not engine.is_ready("identity")
    with Engine(repository, model_control_mode="none") as engine:
        assert engine.is_ready("identity")
        with pytest.raises(UnavailableError, match="explicit model load / unload is not allowed if polling is enabled"):
            engine.unload("identity")
        engine.bind("double", double, X, Y)  # binding needs no explicit mode
        assert engine.infer("double", {"x": np.ones((1, 2), np.float32)})["y"].tolist() == [[2.0, 2.0]]
    with pytest.raises(ValueError, match="model_control_mode must be"):
        Engine(repository, model_control_mode="sometimes")
    with pytest.raises(ValueError, match="unknown engine option\\(s\\) \\['colour'\\]"):
        Engine(colour="blue")


def test_bind_refuses_bad_declarations_with_clear_errors(repository: Path) -> None:
    with pytest.raises(ValueError, match="shape must be a non-empty sequence of sizes >= 1 or -1"):
        Tensor("x", np.float32, (0,))
    with pytest.raises(ValueError, match="unsupported tensor dtype complex64"):
        Tensor("x", np.complex64, (1,))
    with pytest.raises(ValueError, match="preferred_batch_size \\[16\\] exceeds max_batch_size 8"):
        ModelConfig(max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=(4, 16)))
    with pytest.raises(ValueError, match="instances must be >= 1"):
        ModelConfig(instances=0)
    with Engine(repository) as engine:
        with pytest.raises(ValueError, match="invalid model name 'a/b'"):
            engine.bind("a/b", double, X, Y)
        with pytest.raises(ValueError, match="declare at least one of its outputs"):
            engine.bind("empty", double, X, [])
        with pytest.raises(ValueError, match="inputs \\['x'\\] are declared more than once"):
            engine.bind("twice", double, X + X, Y)
        with pytest.raises(ValueError, match="infer_func must be callable, got int"):
            engine.bind("number", 3, X, Y)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'simple' is already loaded from the model repository"):
            engine.bind("simple", double, X, Y)
        engine.bind("double", double, X, Y)
        with pytest.raises(ValueError, match="model 'double' is already bound; unbind it first"):
            engine.bind("double", double, X, Y)
        with pytest.raises(ValueError, match="no function is bound as model 'nothing'"):
            engine.unbind("nothing")
    with Engine(repository, model_control_mode="poll") as engine:
        with pytest.raises(ValueError, match="would unload bound models"):
            engine.bind("double", double, X, Y)


def test_calls_before_start_fail_clearly() -> None:
    engine = Engine()
    with pytest.raises(RuntimeError, match="the engine is not started"):
        engine.infer("x", {})
    with pytest.raises(RuntimeError, match="not started"):
        list(engine.stream("x", {}))


def test_stream_iterates_decoupled_responses_and_stops_early() -> None:
    def countdown(requests):
        (request,) = requests
        for value in range(int(request["n"][0]), 0, -1):
            yield [{"v": np.array([value], np.int32)}]

    config = ModelConfig(batching=False, decoupled=True)
    with Engine() as engine:
        engine.bind("countdown", countdown, [Tensor("n", np.int32, (1,))], [Tensor("v", np.int32, (1,))], config)
        values = [r["v"].item() for r in engine.stream("countdown", {"n": np.array([4], np.int32)})]
        assert values == [4, 3, 2, 1]
        for response in engine.stream("countdown", {"n": np.array([1000], np.int32)}):
            break  # leaving early cancels the request and must not hang
        assert response["v"].item() == 1000
        with pytest.raises(Exception, match="decoupled"):
            engine.infer("countdown", {"n": np.array([1], np.int32)})
        # a plain model streams its single response
        engine.bind("double", double, X, Y)
        (only,) = engine.stream("double", {"x": np.ones((1, 1), np.float32)})
        assert only["y"].item() == 2.0


async def test_async_engine_runs_on_the_callers_loop() -> None:
    @batch
    async def triple(x):
        await asyncio.sleep(0.001)
        return {"y": x * 3}

    async with AsyncEngine() as engine:
        await engine.bind("triple", triple, X, Y, ModelConfig(batcher=DynamicBatcher(max_queue_delay_microseconds=50_000)))
        results = await asyncio.gather(*(engine.infer("triple", {"x": np.full((1, 1), i, np.float32)}) for i in range(4)))
        assert [r["y"].item() for r in results] == [0.0, 3.0, 6.0, 9.0]
        stats = engine.statistics("triple")[0]
        assert stats["inference_count"] == 4 and stats["execution_count"] == 1  # one batch: max_batch_size 4
        responses = [r async for r in engine.stream("triple", {"x": np.ones((2, 1), np.float32)})]
        assert len(responses) == 1 and responses[0]["y"].ravel().tolist() == [3.0, 3.0]


async def test_sync_engine_is_awaitable_from_another_loop() -> None:
    with Engine() as engine:
        engine.bind("double", double, X, Y)
        results = await asyncio.gather(*(engine.infer_async("double", {"x": np.full((1, 1), i, np.float32)}) for i in range(3)))
    assert [r["y"].item() for r in results] == [0.0, 2.0, 4.0]


def test_a_function_that_calls_the_engine_stays_on_its_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """``quadruple`` calls the same ``Engine`` synchronously: quick on its thread once its wait on the call is left
    out, but on the loop thread that call could not wait. In ``auto`` it runs on its thread from its first call
    (the wait is counted), so every request is answered; told ``inline``, the call fails with a clear error."""
    from serving_pod.schedulers import instances

    monkeypatch.setattr(instances, "INLINE_ENTER_NS", 5_000_000)  # its thread CPU may pass 500 us on a busy host
    with Engine() as engine:
        def quadruple(requests):
            return [{"y": engine.infer("double", {"x": request["x"]})["y"] * 2} for request in requests]

        engine.bind("double", double, X, Y)
        for mode in ("auto", "inline"):
            engine.bind(f"quadruple_{mode}", quadruple, X, Y,
                        ModelConfig(parameters={"ferry_execution_mode": mode}))
        pool = engine._aio.core.registry.get("quadruple_auto").pool
        requests = 4 * instances.INLINE_WINDOW
        for value in range(requests):
            x = np.full((1, 2), value, np.float32)
            assert engine.infer("quadruple_auto", {"x": x})["y"].tolist() == [[4.0 * value] * 2]
            assert not pool._modes[0].inline
        assert engine.statistics("quadruple_auto")[0]["inference_count"] == requests
        with pytest.raises(Exception, match="a blocking engine call was made from the engine's own event loop thread"):
            engine.infer("quadruple_inline", {"x": np.ones((1, 2), np.float32)})
        assert engine.infer("double", {"x": np.ones((1, 2), np.float32)})["y"].tolist() == [[2.0, 2.0]]


def test_a_function_whose_first_engine_call_is_refused_inline_goes_back_to_its_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``maybe`` calls the engine for negative inputs only, the first of them after ``auto`` moved it to the loop:
    that call is refused (its request fails with the clear error), and the function runs on its thread from then
    on, its calls answered."""
    from serving_pod.schedulers import instances

    monkeypatch.setattr(instances, "INLINE_ENTER_NS", 5_000_000)
    with Engine() as engine:
        def maybe(requests):
            return [{"y": engine.infer("double", {"x": -request["x"]})["y"] if request["x"][0, 0] < 0
                     else request["x"] * 2} for request in requests]

        engine.bind("double", double, X, Y)
        engine.bind("maybe", maybe, X, Y)
        pool = engine._aio.core.registry.get("maybe").pool
        sent = 0
        while not pool._modes[0].inline and sent < 8 * instances.INLINE_WINDOW:
            assert engine.infer("maybe", {"x": np.ones((1, 2), np.float32)})["y"].tolist() == [[2.0, 2.0]]
            sent += 1
        assert pool._modes[0].inline
        with pytest.raises(Exception, match="a blocking engine call was made from the engine's own event loop thread"):
            engine.infer("maybe", {"x": -np.ones((1, 2), np.float32)})
        assert not pool._modes[0].inline
        for _ in range(instances.INLINE_WINDOW + 2):
            assert engine.infer("maybe", {"x": -np.ones((1, 2), np.float32)})["y"].tolist() == [[2.0, 2.0]]
        assert not pool._modes[0].inline
