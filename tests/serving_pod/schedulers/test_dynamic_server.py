"""The dynamic batcher through a real in-process server and tritonclient (HTTP and gRPC).

A slow ``ferry_test`` model (``execute_delay_ms``) keeps its one instance busy while concurrent
clients queue; ``batch_stats``, the execution count and the ``nv_*`` metrics must then show
Triton's batches. Request parameters ``priority`` / ``timeout`` travel through the real clients.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from support.server import ServerHandle, in_thread, test_model_config, write_model

SLOW_MS = 600


def slow_model(repository: Path, name: str, batching: str, max_batch: int = 4) -> None:
    extra = (
        f'parameters {{ key: "execute_delay_ms" value {{ string_value: "{SLOW_MS}" }} }}\n'
        f"dynamic_batching {{ {batching} }}\ninstance_group [ {{ count: 1 kind: KIND_CPU }} ]"
    )
    write_model(repository, name, test_model_config(name, max_batch_size=max_batch, extra=extra))


def infer(handle: ServerHandle, protocol: str, model: str, value: float, **kwargs: Any) -> Any:
    module = handle.module(protocol)
    client = handle.client(protocol)
    try:
        tensor = module.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
        return client.infer(model, [tensor], **kwargs).as_numpy("OUTPUT0")[0, 0]
    except Exception as exc:  # the caller asserts on the error text
        return exc
    finally:
        client.close()


async def wait_busy(handle: ServerHandle, model: str) -> None:
    scheduler = handle.engine.registry.get(model).scheduler
    deadline = time.monotonic() + 10
    while scheduler.pool.idle_count():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)


async def wait_pending(handle: ServerHandle, model: str, count: int) -> None:
    scheduler = handle.engine.registry.get(model).scheduler
    deadline = time.monotonic() + 10
    while scheduler.pending() < count:
        assert time.monotonic() < deadline, f"only {scheduler.pending()} requests queued"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_concurrent_clients_form_triton_batches(tmp_path: Path, server_factory, protocol: str) -> None:
    slow_model(tmp_path, "slow", "")
    handle = await server_factory([tmp_path])
    pool = ThreadPoolExecutor(max_workers=9)
    loop = asyncio.get_running_loop()
    first = loop.run_in_executor(pool, infer, handle, protocol, "slow", 0.0)
    await wait_busy(handle, "slow")
    rest = [loop.run_in_executor(pool, infer, handle, protocol, "slow", float(i)) for i in range(1, 9)]
    await wait_pending(handle, "slow", 8)
    assert not first.done(), "the first execution ended before the others queued"
    values = await asyncio.gather(first, *rest)
    pool.shutdown()
    assert values == [float(i) for i in range(9)]
    stats = (await in_thread(handle.client("http").get_inference_statistics, "slow"))["model_stats"][0]
    assert (stats["execution_count"], stats["inference_count"]) == (3, 9)
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {1: 1, 4: 2}
    assert stats["inference_stats"]["success"]["count"] == 9
    text = (await in_thread(lambda: urllib.request.urlopen(handle.metrics_url).read())).decode()
    assert 'nv_inference_exec_count{model="slow",version="1"} 3' in text
    assert 'nv_inference_count{model="slow",version="1"} 9' in text


async def test_queue_full_and_priority_over_http(tmp_path: Path, server_factory) -> None:
    slow_model(
        tmp_path, "prio",
        "priority_levels: 2 default_priority_level: 2 default_queue_policy { max_queue_size: 2 }",
        max_batch=1,
    )
    handle = await server_factory([tmp_path])
    # the first execution lasts until the refusal is in: with only SLOW_MS, a host busy enough to take that long
    # between the first request and the fifth let the queue drain and the fifth in (the first execution always
    # runs on the instance's thread, so waiting there holds no event loop)
    instance = handle.engine.registry.get("prio").pool.instances[0]
    gate, execute = threading.Event(), instance._execute

    def gated(requests: list) -> list:
        if not instance.executions:
            gate.wait(30)
        return execute(requests)

    instance._execute = gated
    pool = ThreadPoolExecutor(max_workers=5)
    loop = asyncio.get_running_loop()
    done: list[float] = []

    def tracked(value: float, **kwargs: Any) -> Any:
        result = infer(handle, "http", "prio", value, **kwargs)
        done.append(value)
        return result

    first = loop.run_in_executor(pool, tracked, 0.0)
    await wait_busy(handle, "prio")
    low = loop.run_in_executor(pool, tracked, 1.0)  # default level 2
    await wait_pending(handle, "prio", 1)
    high = loop.run_in_executor(pool, functools.partial(tracked, 2.0, priority=1))
    await wait_pending(handle, "prio", 2)
    low2 = loop.run_in_executor(pool, tracked, 3.0)
    await wait_pending(handle, "prio", 3)
    full = await loop.run_in_executor(pool, infer, handle, "http", "prio", 4.0)  # level 2 holds 2 already
    assert "Exceeds maximum queue size" in str(full)
    assert not first.done(), "the first execution ended before the refusal"
    gate.set()
    await asyncio.gather(first, low, high, low2)
    pool.shutdown()
    assert done == [0.0, 2.0, 1.0, 3.0]
    client = handle.client("grpc")
    stats = await in_thread(functools.partial(client.get_inference_statistics, "prio", as_json=True))
    # a queue-full refusal is charged to no statistic, as in Triton (gRPC's JSON leaves a zero count out)
    assert stats["model_stats"][0]["inference_stats"]["fail"].get("count", "0") == "0"


async def _behind_a_busy_instance(tmp_path: Path, server_factory, protocol: str, policy: str,
                                  second: Callable[[Any], Any]) -> Any:
    """Serve ``tmo`` (one slow instance, ``policy``), keep its instance busy with a request over ``protocol`` and
    run ``second(handle)`` in a thread meanwhile; its result, once the first request has answered."""
    slow_model(tmp_path, "tmo", policy, max_batch=1)
    handle = await server_factory([tmp_path])
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=2)
    first = loop.run_in_executor(pool, infer, handle, protocol, "tmo", 0.0)
    await wait_busy(handle, "tmo")
    result = await loop.run_in_executor(pool, second, handle)
    assert await first == 0.0
    pool.shutdown()
    return result


async def test_request_timeout_parameter_over_grpc(tmp_path: Path, server_factory) -> None:
    expired = await _behind_a_busy_instance(
        tmp_path, server_factory, "grpc",
        "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 60000000 "
        "allow_timeout_override: true }",
        lambda handle: infer(handle, "grpc", "tmo", 1.0, timeout=1000),
    )
    assert "Request timeout expired" in str(expired)


async def test_a_queue_timeout_is_answered_text_plain_over_http(tmp_path: Path, server_factory) -> None:
    """A request that timed out in the queue (REJECT): tritonserver 2.51 answers it from its response callback, which
    sets no content type, so over HTTP it is 503 ``text/plain`` with the ``{"error": ...}`` body (recorded live); Ferry
    typed it ``application/json`` as it types refusals found before queuing (a full queue: still JSON, as Triton)."""
    import httpx

    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]}

    def post(handle: Any) -> httpx.Response:
        url = f"http://127.0.0.1:{handle.server.http_port}/v2/models/tmo/infer"
        return httpx.post(url, json=body, timeout=30)

    expired = await _behind_a_busy_instance(
        tmp_path, server_factory, "http",
        "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 1000 }", post)
    answer = (expired.status_code, expired.headers["content-type"], expired.text)
    assert answer == (503, "text/plain", '{"error":"Request timeout expired"}')

