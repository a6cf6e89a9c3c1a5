"""The response cache: keys, LRU by bytes, and hits that skip execution in a real server."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest

from serving_pod.cache import ENTRY_OVERHEAD, ResponseCache, cache_capacity, request_key
from serving_pod.core.errors import ModelLoadError
from serving_pod.core.types import InferRequest, RequestedOutput, Tensor
from support.server import ServerHandle, in_thread, test_model_config, write_model

CACHE = {"local": {"size": str(1 << 20)}}


def make_request(value: float = 1.0, *, model: str = "m", version: str = "1", shape=(1, 4), dtype=np.float32,
                 outputs: list[str] | None = None) -> InferRequest:
    datatype = {np.float32: "FP32", np.int32: "INT32"}[dtype]
    return InferRequest(
        model, version, [Tensor("INPUT0", datatype, np.full(shape, value, dtype))],
        outputs=[RequestedOutput(name) for name in outputs] if outputs is not None else None,
    )


def test_key_covers_model_version_inputs_and_outputs() -> None:
    base = request_key(make_request())
    assert request_key(make_request()) == base
    for other in (
        make_request(2.0), make_request(model="n"), make_request(version="2"), make_request(shape=(2, 2)),
        make_request(dtype=np.int32), make_request(outputs=["OUTPUT0"]),
    ):
        assert request_key(other) != base


def test_key_ignores_input_order_and_handles_bytes() -> None:
    a = Tensor("A", "INT32", np.arange(3, dtype=np.int32))
    b = Tensor("B", "BYTES", np.array([b"x", b"yz"], dtype=object))
    c = Tensor("B", "BYTES", np.array([b"xy", b"z"], dtype=object))
    assert request_key(InferRequest("m", "1", [a, b])) == request_key(InferRequest("m", "1", [b, a]))
    assert request_key(InferRequest("m", "1", [a, b])) != request_key(InferRequest("m", "1", [a, c]))


def entry(value: int, nbytes: int = 400) -> list[Tensor]:
    return [Tensor("OUTPUT0", "UINT8", np.full(nbytes, value, np.uint8))]


def test_lru_by_bytes() -> None:
    size = ENTRY_OVERHEAD + 3 + 400
    cache = ResponseCache(2 * size)
    assert cache.insert(b"k_1", entry(1)) and cache.insert(b"k_2", entry(2))
    assert cache.lookup(b"k_1") is not None  # k_1 is now the most recently used
    assert cache.insert(b"k_3", entry(3))
    assert cache.lookup(b"k_2") is None and cache.lookup(b"k_1") is not None
    assert len(cache) == 2 and cache.used == 2 * size
    assert not cache.insert(b"big", entry(4, nbytes=4 * size))  # larger than the whole cache
    assert len(cache) == 2


def test_cached_tensors_are_private_read_only_copies() -> None:
    batch = np.arange(8, dtype=np.float32).reshape(2, 4)
    cache = ResponseCache(1 << 16)
    cache.insert(b"k", [Tensor("OUTPUT0", "FP32", batch[:1])])  # a view into a batch output
    batch[:] = -1
    (stored,) = cache.lookup(b"k")
    assert stored.data.tolist() == [[0, 1, 2, 3]] and stored.data.base is None
    assert not stored.data.flags.writeable


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"redis": {"host": "x"}}, "unsupported cache 'redis'"),
        ({"local": {"size": "lots"}}, "invalid local cache size"),
        ({"local": {"size": "1", "ttl": "3"}}, "unknown setting 'ttl'"),
    ],
)
def test_bad_cache_config(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cache_capacity(config)
    assert cache_capacity({}) is None and cache_capacity({"local": {"size": "10"}}) == 10


# --- through a server ------------------------------------------------------------------------
def cached_model(repository: Path, name: str, *, enable: bool = True, extra: str = "") -> None:
    cache = f"response_cache {{ enable: {str(enable).lower()} }}"
    params = 'parameters { key: "fail_on_value" value { string_value: "13" } }'
    write_model(repository, name, test_model_config(name, extra=f"{cache}\n{params}\n{extra}"))


def infer(handle: ServerHandle, model: str, value: float):
    import tritonclient.http as httpclient

    client = handle.client("http")
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
    try:
        return client.infer(model, [tensor]).as_numpy("OUTPUT0")
    except Exception as exc:
        return exc


async def stats_of(handle: ServerHandle, model: str) -> dict:
    return (await in_thread(handle.client("http").get_inference_statistics, model))["model_stats"][0]


async def test_hits_skip_execution(tmp_path: Path, server_factory) -> None:
    cached_model(tmp_path, "cached")
    handle = await server_factory([tmp_path], cache_config=CACHE)
    first = await in_thread(infer, handle, "cached", 5.0)
    second = await in_thread(infer, handle, "cached", 5.0)
    assert first.tolist() == second.tolist() == [[5.0] * 4]
    other = await in_thread(infer, handle, "cached", 6.0)
    assert other.tolist() == [[6.0] * 4]
    stats = await stats_of(handle, "cached")
    inference = stats["inference_stats"]
    assert (inference["cache_hit"]["count"], inference["cache_miss"]["count"]) == (1, 2)
    assert stats["execution_count"] == 2 and inference["success"]["count"] == 3
    assert inference["compute_infer"]["count"] == 2  # hits have no compute
    instance = handle.engine.registry.get("cached").pool.instances[0]
    assert len(instance.executions) == 2
    text = (await in_thread(lambda: urllib.request.urlopen(handle.metrics_url).read())).decode()
    assert 'nv_cache_num_hits_per_model{model="cached",version="1"} 1' in text
    assert 'nv_cache_num_misses_per_model{model="cached",version="1"} 2' in text


async def test_failures_are_not_cached(tmp_path: Path, server_factory) -> None:
    cached_model(tmp_path, "cached")
    handle = await server_factory([tmp_path], cache_config=CACHE)
    for _ in range(2):
        error = await in_thread(infer, handle, "cached", 13.0)
        assert "failed on value" in str(error)
    stats = await stats_of(handle, "cached")
    assert stats["execution_count"] == 2 and stats["inference_stats"]["cache_hit"]["count"] == 0


@pytest.mark.parametrize(("server_cache", "enable"), [(False, True), (True, False)])
async def test_cache_needs_both_server_and_model(tmp_path: Path, server_factory, server_cache: bool, enable: bool) -> None:
    cached_model(tmp_path, "m", enable=enable)
    handle = await server_factory([tmp_path], cache_config=CACHE if server_cache else {})
    for _ in range(2):
        await in_thread(infer, handle, "m", 1.0)
    stats = await stats_of(handle, "m")
    assert stats["execution_count"] == 2 and stats["inference_stats"]["cache_hit"]["count"] == 0


async def test_decoupled_models_cannot_enable_the_cache(tmp_path: Path, server_factory) -> None:
    cached_model(tmp_path, "dec", extra="model_transaction_policy { decoupled: true }")
    handle = await server_factory([tmp_path], cache_config=CACHE, model_control_mode="explicit")
    with pytest.raises(ModelLoadError, match="Response Cache does not currently support model 'dec'"):
        await handle.engine.load_model("dec")


async def test_requested_outputs_are_part_of_the_answer(tmp_path: Path, server_factory) -> None:
    config = test_model_config("two", extra="response_cache { enable: true }").replace(
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]',
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]',
    )
    write_model(tmp_path, "two", config)
    handle = await server_factory([tmp_path], cache_config=CACHE)
    engine = handle.engine
    only = await engine.infer(make_request(model="two", version="", outputs=["OUTPUT1"]))
    again = await engine.infer(make_request(model="two", version="", outputs=["OUTPUT1"]))
    full = await engine.infer(make_request(model="two", version=""))
    assert [t.name for t in only.outputs] == [t.name for t in again.outputs] == ["OUTPUT1"]
    assert sorted(t.name for t in full.outputs) == ["OUTPUT0", "OUTPUT1"]
    stats = engine.registry.get("two").stats
    assert (stats.cache_hit.count, stats.cache_miss.count) == (1, 2)


def test_cache_flags() -> None:
    from serving_pod.cli import build_parser, options_from_args

    args = build_parser().parse_args(["--cache-config", "local,size=4096"])
    assert options_from_args(args).engine.cache_config == {"local": {"size": "4096"}}
    legacy = build_parser().parse_args(["--response-cache-byte-size", "100"])
    assert options_from_args(legacy).engine.cache_config == {"local": {"size": "100"}}
    for bad in ("redis,host=x", "local", "local,size=big"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--cache-config", bad])
