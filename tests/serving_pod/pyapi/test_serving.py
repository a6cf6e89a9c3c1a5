"""A bound function served over HTTP and gRPC: tritonclient answers, dynamic batching shows in the statistics,
function errors become request errors; ``ModelClient`` on both protocols."""

from __future__ import annotations

import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from serving_pod.pyapi import DynamicBatcher, ModelClient, ModelClientError, ModelConfig, Server, Tensor, batch
from serving_pod.pyapi.client import parse_url

PROTOCOLS = ["http", "grpc"]
BATCH_SIZES: list[int] = []


@batch
def slow_double(x):
    BATCH_SIZES.append(len(x))
    time.sleep(0.02)  # slow enough that concurrent requests queue up behind one execution
    return {"y": x * 2}


@batch
def fragile(x):
    if np.any(x < 0):
        raise RuntimeError("cannot handle negatives")
    return {"y": x}


def scale_in_place(requests):
    for request in requests:
        request["x"] *= 2  # its own arrays (docs/python-api.md)
    return [{"y": request["x"]} for request in requests]


@pytest.fixture(scope="module")
def server():
    with Server(http_port=0, grpc_port=0, metrics_port=0) as started:
        started.bind(
            "slow_double", slow_double, [Tensor("x", np.float32, (-1,))], [Tensor("y", np.float32, (-1,))],
            ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=100_000)),
        )
        started.bind("fragile", fragile, [Tensor("x", np.float32, (2,))], [Tensor("y", np.float32, (2,))])
        started.bind("scale_in_place", scale_in_place, [Tensor("x", np.float32, (2,))],
                     [Tensor("y", np.float32, (2,))])
        yield started


def url(server: Server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def counts(server: Server, model: str) -> tuple[int, int]:
    stats = server.statistics(model)[0]
    return stats["inference_count"], stats["execution_count"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tritonclient_infers_a_bound_function(server: Server, protocol: str) -> None:
    if protocol == "http":
        import tritonclient.http as module

        client = module.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    else:
        import tritonclient.grpc as module

        client = module.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        metadata = client.get_model_metadata("slow_double")
        inputs = metadata["inputs"] if protocol == "http" else [{"shape": list(i.shape)} for i in metadata.inputs]
        assert inputs[0]["shape"] == [-1, -1]
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        item = module.InferInput("x", [2, 3], "FP32")
        item.set_data_from_numpy(x)
        result = client.infer("slow_double", [item])
        assert result.as_numpy("y").tolist() == (x * 2).tolist()
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_concurrent_requests_share_executions(server: Server, protocol: str) -> None:
    requests, before_inferences, before_executions = 8, *counts(server, "slow_double")
    barrier = threading.Barrier(requests, timeout=10)

    def one(index: int) -> np.ndarray:
        with ModelClient(url(server, protocol), "slow_double") as client:
            client.model_config  # connect before the race starts
            barrier.wait()
            return client.infer_sample(np.full(3, index, np.float32))["y"]

    BATCH_SIZES.clear()
    with ThreadPoolExecutor(requests) as pool:
        results = list(pool.map(one, range(requests)))
    assert [r.tolist() for r in results] == [[2.0 * i] * 3 for i in range(requests)]
    inferences, executions = counts(server, "slow_double")
    assert inferences - before_inferences == requests
    assert executions - before_executions < requests / 2, f"batches seen: {BATCH_SIZES}"
    assert max(BATCH_SIZES) > 1 and sum(BATCH_SIZES) == requests
    with urllib.request.urlopen(server.metrics_url) as response:
        assert f'nv_inference_exec_count{{model="slow_double",version="1"}} {executions}' in response.read().decode()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_function_errors_are_request_errors(server: Server, protocol: str) -> None:
    with ModelClient(url(server, protocol), "fragile") as client:
        with pytest.raises(ModelClientError, match="model 'fragile': RuntimeError: cannot handle negatives") as info:
            client.infer_batch(x=-np.ones((1, 2), np.float32))
        assert str(info.value.status) in ("500", "StatusCode.INTERNAL")
        assert client.infer_batch(x=np.ones((1, 2), np.float32))["y"].tolist() == [[1.0, 1.0]]
        with pytest.raises(ModelClientError, match="unexpected shape for input 'x' for model 'fragile'"):
            client.infer_batch(x=np.ones((1, 3), np.float32))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_client_inputs_and_errors(server: Server, protocol: str) -> None:
    with ModelClient(url(server, protocol), "fragile") as client:
        assert client.infer_sample(np.array([1.0, 2.0], np.float32))["y"].tolist() == [1.0, 2.0]
        with pytest.raises(ValueError, match="either positionally .* or by name, not both"):
            client.infer_batch(np.ones((1, 2)), x=np.ones((1, 2)))
        with pytest.raises(ValueError, match="takes 1 inputs \\['x'\\], got 2"):
            client.infer_batch(np.ones((1, 2)), np.ones((1, 2)))
    with ModelClient(url(server, protocol), "missing") as client:
        with pytest.raises(ModelClientError, match="missing"):
            client.infer_batch(x=np.ones((1, 2), np.float32))
        with pytest.raises(TimeoutError, match="model 'missing' not ready"):
            client.wait_for_model(0.1)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_function_may_write_into_its_inputs(server: Server, protocol: str) -> None:
    """Without the copy, numpy refuses: "output array is read-only" (the request body's bytes)."""
    with ModelClient(url(server, protocol), "scale_in_place") as client:
        result = client.infer_batch(x=np.array([[1.5, -2.0], [3.0, 4.0]], np.float32))
    assert result["y"].tolist() == [[3.0, -4.0], [6.0, 8.0]]


def test_parse_url() -> None:
    assert parse_url("grpc://localhost:9001") == ("grpc", "localhost:9001")
    assert parse_url("localhost:9000") == ("http", "localhost:9000")
    assert parse_url("http://example") == ("http", "example:8000")
    with pytest.raises(ValueError, match="unsupported URL scheme 'ftp'"):
        parse_url("ftp://host:1")
    with pytest.raises(ValueError, match="invalid server URL"):
        parse_url("http://host:1/v2")


def test_a_function_calling_this_server_through_a_client_stays_on_its_thread(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """``relay`` asks ``fragile`` through a ``ModelClient`` of this same server: on the event loop thread that call
    would wait for an answer only that thread can give (the server would hang until the client's timeout). Its
    source names the client, so ``auto`` never moves it there, however quick it is on its thread; a function that
    names none may move."""
    from serving_pod.schedulers import instances

    monkeypatch.setattr(instances, "INLINE_ENTER_NS", 5_000_000)
    address = server.http_url

    @batch
    def relay(x):
        with ModelClient(address, "fragile", timeout_s=5.0) as client:
            return {"y": client.infer_batch(x=x)["y"] * 3}

    spec = [Tensor("x", np.float32, (2,))], [Tensor("y", np.float32, (2,))]
    server.bind("relay", relay, *spec)
    server.bind("plain", fragile, *spec)
    pools = {name: server._aio.core.registry.get(name).pool for name in ("relay", "plain")}
    assert (pools["relay"].instances[0].inline_safe, pools["plain"].instances[0].inline_safe) == (False, True)
    with ModelClient(server.grpc_url, "relay") as client:
        for value in range(2 * instances.INLINE_WINDOW):
            x = np.full((1, 2), value, np.float32)
            assert client.infer_batch(x=x)["y"].tolist() == [[3.0 * value] * 2]
    assert not pools["relay"]._modes[0].inline
    assert counts(server, "relay") == (2 * instances.INLINE_WINDOW, 2 * instances.INLINE_WINDOW)
