"""Instance groups give that many concurrent executions (requests spread over all instances but passive ones);
grpc.health.v1 follows readiness; the inline fast path keeps results and statistics identical to threaded execution."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from support.server import test_model_config, write_model


def _config(name: str, count: int, delay_ms: int, mode: str = "auto") -> str:
    return test_model_config(
        name,
        max_batch_size=0,
        extra=f"""
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value {{ string_value: "{delay_ms}" }} }}
parameters {{ key: "ferry_execution_mode" value {{ string_value: "{mode}" }} }}
""",
    )


def _fire(server, model: str, clients: int) -> float:
    import tritonclient.http as httpclient

    errors: list[BaseException] = []

    def one() -> None:
        try:
            client = httpclient.InferenceServerClient(server.http_url)
            tensor = httpclient.InferInput("INPUT0", [4], "FP32")
            tensor.set_data_from_numpy(np.ones(4, np.float32))
            client.infer(model, [tensor])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return time.monotonic() - start


def _instance_names_used(server, model: str) -> list[list[int]]:
    instances = [i for i in _backend_instances(server) if i.context.model_name == model]
    return [len(i.executions) for i in instances]


def _backend_instances(server):
    from serving_pod.backends.registry import _cache

    return [instance for (name, _), backend in _cache.items() if name == "ferry_test" for instance in backend.instances]


def test_instance_count_gives_concurrent_executions(threaded_server, tmp_path):
    write_model(tmp_path, "one", _config("one", 1, 300))
    write_model(tmp_path, "three", _config("three", 3, 300))
    server = threaded_server([tmp_path])
    _fire(server, "three", 3)
    _fire(server, "one", 3)
    # every one of the three instances executed exactly one of the three concurrent requests
    assert sorted(_instance_names_used(server, "three")[-3:]) == [1, 1, 1]
    assert _instance_names_used(server, "one")[-1] == 3
    stats = server.client("http").get_inference_statistics("one")["model_stats"][0]["inference_stats"]
    # with one instance, two of the three requests waited for the instance: queue time shows it
    assert stats["queue"]["ns"] >= 2 * 250_000_000 * 0.9
    three = server.client("http").get_inference_statistics("three")["model_stats"][0]["inference_stats"]
    assert three["queue"]["ns"] < stats["queue"]["ns"]


PASSIVE_AND_ACTIVE = "instance_group [ { count: 1 kind: KIND_CPU passive: true }, { count: 1 kind: KIND_CPU } ]"


@pytest.mark.parametrize("scheduling", ["", "dynamic_batching { }", "sequence_batching { }", "rate_limit"])
def test_passive_instances_are_loaded_but_never_scheduled(threaded_server, tmp_path, scheduling):
    """Triton 2.51 loads a ``passive: true`` group's instances but schedules only the others: two concurrent
    requests to one passive and one active instance ran one after the other (recorded live: answered after 1.1 s
    and 2.1 s for 1 s executions, with and without the dynamic batcher and the rate limiter). Ferry ran them on
    both instances at once."""
    batching = "" if scheduling == "rate_limit" else scheduling
    config = test_model_config("p", max_batch_size=0, extra=f"""{PASSIVE_AND_ACTIVE}
{batching}
parameters {{ key: "execute_delay_ms" value {{ string_value: "300" }} }}""")
    write_model(tmp_path, "p", config)
    server = threaded_server([tmp_path], rate_limit="execution_count" if scheduling == "rate_limit" else "off")
    if scheduling.startswith("sequence"):
        elapsed = _fire_sequences(server, "p", 2)
    else:
        elapsed = _fire(server, "p", 2)
    assert _instance_names_used(server, "p")[-2:] == [0, 2]  # the passive instance comes first (group order)
    assert elapsed >= 0.55


def _fire_sequences(server, model: str, sequences: int) -> float:
    """``sequences`` one-request sequences at once (ids 1..), over HTTP; the seconds they took."""
    import tritonclient.http as httpclient

    def one(sequence_id: int) -> None:
        tensor = httpclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_data_from_numpy(np.ones(4, np.float32))
        httpclient.InferenceServerClient(server.http_url).infer(
            model, [tensor], sequence_id=sequence_id, sequence_start=True, sequence_end=True)

    threads = [threading.Thread(target=one, args=(i + 1,)) for i in range(sequences)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return time.monotonic() - start


def test_a_model_whose_every_instance_is_passive_still_serves(threaded_server, tmp_path):
    """Ferry's choice: Triton 2.51 crashes (SIGSEGV) on the first request to such a model (recorded live)."""
    config = test_model_config("allp", max_batch_size=0,
                               extra="instance_group [ { count: 1 kind: KIND_CPU passive: true } ]")
    write_model(tmp_path, "allp", config)
    server = threaded_server([tmp_path])
    _fire(server, "allp", 1)
    assert _instance_names_used(server, "allp")[-1:] == [1]


@pytest.mark.parametrize("mode", ["thread", "inline", "auto"])
def test_execution_modes_give_identical_results_and_statistics(threaded_server, tmp_path, mode):
    write_model(tmp_path, "m", _config("m", 1, 0, mode))
    server = threaded_server([tmp_path])
    client = server.client("grpc")
    module = server.module("grpc")
    for value in range(100):
        tensor = module.InferInput("INPUT0", [4], "FP32")
        data = np.full(4, value, np.float32)
        tensor.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("m", [tensor]).as_numpy("OUTPUT0"), data)
    stats = client.get_inference_statistics("m", as_json=True)["model_stats"][0]
    assert int(stats["execution_count"]) == 100
    assert int(stats["inference_stats"]["success"]["count"]) == 100
    assert int(stats["inference_stats"]["compute_infer"]["count"]) == 100


def test_invalid_execution_mode_fails_the_load(threaded_server, tmp_path):
    write_model(tmp_path, "m", _config("m", 1, 0, "sometimes"))
    server = threaded_server([tmp_path])
    index = {row["name"]: row for row in server.client("http").get_model_repository_index()}
    assert index["m"]["state"] == "UNAVAILABLE"
    assert "ferry_execution_mode must be auto, thread or inline, got 'sometimes'" in index["m"]["reason"]


def test_grpc_health_follows_readiness(threaded_server, tmp_path):
    write_model(tmp_path, "good", test_model_config("good"))
    server = threaded_server([tmp_path])
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
        write_model(tmp_path, "broken", 'name: "broken"\nbackend: "nope"')
        server.call(server.engine.registry.poll())  # its version is UNAVAILABLE: not ready
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.NOT_SERVING
