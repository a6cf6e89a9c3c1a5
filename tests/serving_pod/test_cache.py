"""The response cache: keys, LRU by bytes, hits that skip execution in a real server, ensembles, refused configs."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
from support.server import (
    ServerHandle,
    ensemble_config,
    in_thread,
    test_model_config,
    write_model,
)

from serving_pod.cache import (
    SEGMENT_HEADER_BYTES,
    SEGMENT_TAIL_BYTES,
    ResponseCache,
    allocation_bytes,
    cache_capacity,
    entry_bytes,
    request_key,
)
from serving_pod.core.errors import ModelLoadError
from serving_pod.core.types import InferRequest, RequestedOutput, Tensor

CACHE = {"local": {"size": str(1 << 20)}}


def make_request(value: float = 1.0, *, model: str = "m", version: str = "1", shape=(1, 4), dtype=np.float32,
                 outputs: list[str] | None = None, parameters: dict | None = None) -> InferRequest:
    datatype = {np.float32: "FP32", np.int32: "INT32"}[dtype]
    return InferRequest(
        model, version, [Tensor("INPUT0", datatype, np.full(shape, value, dtype))],
        outputs=[RequestedOutput(name, dict(parameters or {})) for name in outputs] if outputs is not None else None,
    )


def test_key_covers_model_version_inputs_and_outputs() -> None:
    base = request_key(make_request())
    assert request_key(make_request()) == base
    for other in (
        make_request(2.0), make_request(model="n"), make_request(version="2"), make_request(shape=(2, 2)),
        make_request(dtype=np.int32), make_request(outputs=["OUTPUT0"]),
    ):
        assert request_key(other) != base


def test_key_has_output_names_not_their_parameters() -> None:
    """binary_data, classification and shared-memory placements are applied after the cache (``core.outputs``);
    listing every output of the config asks for what listing none does."""
    only = request_key(make_request(outputs=["OUTPUT0"]))
    for parameters in ({"binary_data": True}, {"binary_data": False}, {"classification": 2},
                       {"shared_memory_region": "r", "shared_memory_byte_size": 16}):
        assert request_key(make_request(outputs=["OUTPUT0"], parameters=parameters)) == only
    every = frozenset({"OUTPUT0", "OUTPUT1"})
    assert request_key(make_request(outputs=["OUTPUT1", "OUTPUT0"]), every) == request_key(make_request(), every)
    assert request_key(make_request(outputs=["OUTPUT0"]), every) != request_key(make_request(), every)


def test_key_ignores_input_order_and_handles_bytes() -> None:
    a = Tensor("A", "INT32", np.arange(3, dtype=np.int32))
    b = Tensor("B", "BYTES", np.array([b"x", b"yz"], dtype=object))
    c = Tensor("B", "BYTES", np.array([b"xy", b"z"], dtype=object))
    assert request_key(InferRequest("m", "1", [a, b])) == request_key(InferRequest("m", "1", [b, a]))
    assert request_key(InferRequest("m", "1", [a, b])) != request_key(InferRequest("m", "1", [a, c]))


def entry(value: int, nbytes: int = 400) -> list[Tensor]:
    return [Tensor("OUTPUT0", "UINT8", np.full(nbytes, value, np.uint8))]


def room_for(entries: int, size: int) -> int:
    """A cache size whose segment holds exactly ``entries`` blocks of ``size`` bytes."""
    return SEGMENT_HEADER_BYTES + entries * size + SEGMENT_TAIL_BYTES


def test_entries_are_counted_as_tritons_local_cache_counts_them() -> None:
    """The serialized response (count, then per output packed size, name, datatype, shape, buffer) in a block
    of its size plus 8, rounded up to 16 (measured on Triton 2.51: tests/serving_pod/test_cache_triton.py)."""
    assert entry_bytes(entry(1)) == 4 + 8 + 4 + 7 + 4 + 5 + 4 + 8 + 8 + 400
    assert [allocation_bytes(n) for n in (104, 105, 120, 121, 871, 872)] == [112, 128, 128, 144, 880, 880]
    text = Tensor("T", "BYTES", np.array(["ab", b"c"], dtype=object))
    assert entry_bytes([text]) == 4 + 8 + 4 + 1 + 4 + 5 + 4 + 8 + 8 + (4 + 2) + (4 + 1)
    cache = ResponseCache(1024)
    assert cache.utilization() == 128 / 1024  # the segment's header is in use from the start


def test_lru_by_bytes() -> None:
    size = allocation_bytes(entry_bytes(entry(1)))
    cache = ResponseCache(room_for(2, size))
    assert cache.insert(b"k_1", entry(1)) and cache.insert(b"k_2", entry(2))
    assert cache.lookup(b"k_1") is not None  # k_1 is now the most recently used
    assert cache.insert(b"k_3", entry(3))
    assert cache.lookup(b"k_2") is None and cache.lookup(b"k_1") is not None
    assert len(cache) == 2 and cache.used == SEGMENT_HEADER_BYTES + 2 * size
    assert not cache.insert(b"big", entry(4, nbytes=4 * size))  # larger than the whole cache
    assert len(cache) == 2 and cache.evictions == 1


def test_a_key_stored_again_keeps_its_place_in_the_lru_order() -> None:
    """Triton's local cache answers ALREADY_EXISTS to an insert of a key it holds (two identical requests in one
    batch both missed) and leaves the entry where it was: the next eviction still takes it first (recorded on
    Triton 2.51: tests/serving_pod/test_cache_triton.py)."""
    size = allocation_bytes(entry_bytes(entry(1)))
    cache = ResponseCache(room_for(2, size))
    assert cache.insert(b"k_1", entry(1)) and cache.insert(b"k_2", entry(2))
    assert not cache.insert(b"k_1", entry(1))
    assert cache.insert(b"k_3", entry(3))
    assert b"k_1" not in cache and b"k_2" in cache and cache.evictions == 1


def test_an_entry_the_segment_can_never_hold_evicts_nothing() -> None:
    """Triton evicts every entry before it finds out such an entry cannot fit; Ferry refuses it at once."""
    size = allocation_bytes(entry_bytes(entry(1)))
    cache = ResponseCache(room_for(2, size))
    assert cache.insert(b"k_1", entry(1)) and cache.insert(b"k_2", entry(2))
    too_big = entry(3, nbytes=cache.capacity - 100)
    assert entry_bytes(too_big) <= cache.capacity  # not larger than the cache's size...
    assert not cache.insert(b"k_3", too_big)  # ...but larger than its segment's room
    assert (len(cache), cache.evictions) == (2, 0)


def test_totals_as_tritons_local_cache_keeps_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's local cache: every lookup is a hit or a miss and timed; every insert is timed, also one that
    stores nothing; evictions count entries pushed out; utilization is the fraction of bytes in use."""
    clock = iter(range(0, 10**9, 1500))  # each reading of the clock is 1.5 us after the previous one
    monkeypatch.setattr("serving_pod.cache.time.monotonic_ns", lambda: next(clock))
    size = allocation_bytes(entry_bytes(entry(1)))
    cache = ResponseCache(room_for(2, size))
    assert (cache.hits, cache.misses, cache.lookups, cache.evictions) == (0, 0, 0, 0)
    assert cache.lookup(b"k_1") is None
    assert cache.insert(b"k_1", entry(1)) and cache.insert(b"k_2", entry(2))
    assert cache.utilization() == (cache.capacity - SEGMENT_TAIL_BYTES) / cache.capacity
    assert cache.lookup(b"k_1") is not None
    assert cache.insert(b"k_3", entry(3))  # pushes k_2 out
    assert not cache.insert(b"k_3", entry(3))  # already there (Triton's ALREADY_EXISTS): timed, nothing evicted
    assert not cache.insert(b"big", entry(4, nbytes=4 * size))  # larger than the whole cache: timed, a no-op
    assert cache.lookup(b"k_2") is None
    assert (cache.hits, cache.misses, cache.lookups, cache.evictions, len(cache)) == (1, 2, 3, 1, 2)
    assert (cache.lookup_ns, cache.insert_ns) == (3 * 1500, 5 * 1500)
    cache = ResponseCache(4 * size)
    cache.insert(b"k_1", entry(1))
    assert cache.utilization() == (SEGMENT_HEADER_BYTES + size) / (4 * size)


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
        ({"local": {"size": "191"}}, "invalid local cache size '191': the local cache needs at least 192 bytes"),
    ],
)
def test_bad_cache_config(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cache_capacity(config)
    assert cache_capacity({}) is None and cache_capacity({"local": {"size": "192"}}) == 192


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
    with pytest.raises(ModelLoadError, match="failed to poll from model repository: Response Cache does not currently "
                                             "support model dec with 'decoupled'"):
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
    legacy = build_parser().parse_args(["--response-cache-byte-size", "4096"])
    assert options_from_args(legacy).engine.cache_config == {"local": {"size": "4096"}}
    too_small = build_parser().parse_args(["--response-cache-byte-size", "100"])  # tritonserver: cannot start
    with pytest.raises(SystemExit):
        options_from_args(too_small)
    for bad in ("redis,host=x", "local", "local,size=big"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--cache-config", bad])


# --- ensembles (Triton's top-level ensemble caching) -----------------------------------------
def _cache(enable: bool = True) -> str:
    return f"response_cache {{ enable: {str(enable).lower()} }}"


def ensemble_repo(repository: Path, *, cache: bool = True) -> None:
    for name in ("step_a", "step_b"):
        write_model(repository, name, test_model_config(name))
    write_model(repository, "ens", ensemble_config("ens", ["step_a", "step_b"], extra=_cache(cache)))


def ensemble_infer(handle: ServerHandle, protocol: str, value: float, model: str = "ens", **kwargs):
    client, module = handle.client(protocol), handle.module(protocol)
    tensor = module.InferInput("IN", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
    return client.infer(model, [tensor], **kwargs).as_numpy("OUT").tolist()


def wire_stats(handle: ServerHandle, protocol: str, model: str) -> dict:
    """``model_stats[0]`` as tritonclient returns it over ``protocol`` (counts as ints)."""
    client = handle.client(protocol)
    if protocol == "http":
        stats = client.get_inference_statistics(model)
    else:
        stats = client.get_inference_statistics(model, as_json=True)
    entry = stats["model_stats"][0]
    inference = entry["inference_stats"]
    return {
        "execution_count": int(entry.get("execution_count", 0)),
        **{key: int(inference[key].get("count", 0)) for key in ("success", "cache_hit", "cache_miss")},
    }


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_ensemble_top_level_hits_skip_the_composing_models(tmp_path: Path, server_factory, protocol: str) -> None:
    ensemble_repo(tmp_path)
    handle = await server_factory([tmp_path], cache_config=CACHE)
    first = await in_thread(ensemble_infer, handle, protocol, 5.0)
    second = await in_thread(ensemble_infer, handle, protocol, 5.0)
    assert first == second == [[5.0] * 4]
    assert await in_thread(ensemble_infer, handle, protocol, 6.0) == [[6.0] * 4]  # other inputs: a miss
    stats = await in_thread(wire_stats, handle, protocol, "ens")
    assert (stats["cache_hit"], stats["cache_miss"], stats["success"]) == (1, 2, 3)
    for step in ("step_a", "step_b"):  # the hit ran no composing model
        step_stats = await in_thread(wire_stats, handle, protocol, step)
        assert (step_stats["execution_count"], step_stats["cache_hit"], step_stats["success"]) == (2, 0, 2)
    text = (await in_thread(lambda: urllib.request.urlopen(handle.metrics_url).read())).decode()
    assert 'nv_cache_num_hits_per_model{model="ens",version="1"} 1' in text
    assert 'nv_cache_num_misses_per_model{model="ens",version="1"} 2' in text


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_a_failed_ensemble_request_is_no_cache_miss(tmp_path: Path, server_factory, protocol: str) -> None:
    """Triton's ensemble counts a miss when it stores its answer, so a request a step failed adds none (a plain
    model counts its failed requests as misses: test_cache_triton.py records both on Triton 2.51)."""
    fail = 'parameters { key: "fail_on_value" value { string_value: "13" } }'
    write_model(tmp_path, "step_a", test_model_config("step_a", extra=fail))
    write_model(tmp_path, "step_b", test_model_config("step_b"))
    write_model(tmp_path, "ens", ensemble_config("ens", ["step_a", "step_b"], extra=_cache()))
    handle = await server_factory([tmp_path], cache_config=CACHE)
    for _ in range(2):
        with pytest.raises(Exception, match="failed on value"):
            await in_thread(ensemble_infer, handle, protocol, 13.0)
    assert await in_thread(ensemble_infer, handle, protocol, 5.0) == [[5.0] * 4]
    stats = await in_thread(wire_stats, handle, protocol, "ens")
    assert (stats["cache_hit"], stats["cache_miss"], stats["success"]) == (0, 1, 1)
    text = (await in_thread(lambda: urllib.request.urlopen(handle.metrics_url).read())).decode()
    assert 'nv_cache_num_misses_per_model{model="ens",version="1"} 1' in text


async def test_ensemble_without_cache_enabled_always_runs_its_steps(tmp_path: Path, server_factory) -> None:
    ensemble_repo(tmp_path, cache=False)
    handle = await server_factory([tmp_path], cache_config=CACHE)
    for _ in range(2):
        await in_thread(ensemble_infer, handle, "http", 5.0)
    assert (await in_thread(wire_stats, handle, "http", "ens"))["cache_hit"] == 0
    assert (await in_thread(wire_stats, handle, "http", "step_a"))["execution_count"] == 2


async def test_ensemble_cache_key_is_the_ensembles_own(tmp_path: Path, server_factory) -> None:
    """A composing model with its own cache keeps a separate entry: the ensemble's hit is the ensemble's."""
    write_model(tmp_path, "step_a", test_model_config("step_a", extra="response_cache { enable: true }"))
    write_model(tmp_path, "step_b", test_model_config("step_b"))
    write_model(tmp_path, "ens", ensemble_config("ens", ["step_a", "step_b"], extra=_cache()))
    handle = await server_factory([tmp_path], cache_config=CACHE)
    engine = handle.engine
    data = np.full((1, 4), 2.0, np.float32)
    for _ in range(2):
        await engine.infer(InferRequest("ens", "", [Tensor("IN", "FP32", data)]))
    ens, step_a = engine.registry.get("ens").stats, engine.registry.get("step_a").stats
    assert (ens.cache_hit.count, ens.cache_miss.count) == (1, 1)
    assert (step_a.cache_hit.count, step_a.cache_miss.count, step_a.execution_count) == (0, 1, 1)
    # the composing model asked directly as the ensemble's step asks it: its own entry, a hit for it
    await engine.infer(InferRequest("step_a", "", [Tensor("INPUT0", "FP32", data)], [RequestedOutput("OUTPUT0")]))
    assert (step_a.cache_hit.count, ens.cache_hit.count) == (1, 1)


async def test_ensemble_with_a_sequence_step_is_not_cached(tmp_path: Path, server_factory, caplog) -> None:
    sequence = test_model_config("seq_step", extra="sequence_batching { }")
    write_model(tmp_path, "seq_step", sequence)
    write_model(tmp_path, "inner", ensemble_config("inner", ["seq_step"], extra=_cache(False)))
    # the sequence step is one level down
    write_model(tmp_path, "ens", ensemble_config("ens", ["inner"], ports=("IN", "OUT"), extra=_cache()))
    with caplog.at_level("WARNING", logger="ferry.cache"):
        handle = await server_factory([tmp_path], cache_config=CACHE)
    assert handle.engine.model_ready("ens")
    assert "Response Cache is not used for ensemble 'ens': composing model 'seq_step' uses the sequence" in caplog.text
    for _ in range(2):
        await in_thread(lambda: ensemble_infer(
            handle, "grpc", 1.0, "ens", sequence_id=7, sequence_start=True, sequence_end=True
        ))
    stats = await in_thread(wire_stats, handle, "grpc", "ens")
    assert (stats["cache_hit"], stats["cache_miss"], stats["success"]) == (0, 0, 2)
    assert (await in_thread(wire_stats, handle, "grpc", "seq_step"))["execution_count"] == 2


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        ("dec_ens", ensemble_config("dec_ens", ["step_a"],
                                    extra=_cache() + "\nmodel_transaction_policy { decoupled: true }"),
         "failed to load 'dec_ens', failed to poll from model repository: Response Cache does not currently "
         "support model dec_ens with 'decoupled' transaction policy. Please disable the response cache."),
        ("seq_cached", test_model_config("seq_cached", extra="sequence_batching { }\nresponse_cache { enable: true }"),
         "failed to load 'seq_cached', failed to poll from model repository: Response Cache does not currently "
         "support model seq_cached with sequence batching scheduler. Please disable the response cache."),
    ],
)
async def test_decoupled_ensembles_and_sequence_models_cannot_enable_the_cache(
    tmp_path: Path, server_factory, name: str, config: str, message: str
) -> None:
    write_model(tmp_path, "step_a", test_model_config("step_a"))
    write_model(tmp_path, name, config)
    handle = await server_factory([tmp_path], cache_config=CACHE, model_control_mode="explicit")
    with pytest.raises(ModelLoadError) as error:
        await handle.engine.load_model(name)
    assert str(error.value) == message
    assert not handle.engine.model_ready(name)
