"""Isolated python models (``FERRY_ISOLATED``) served by a running server, over HTTP and gRPC.

There the channel to each child reads on the server's event loop and small executions are awaited on
it (``execute_on_loop``); inputs over ``LOOP_SEND_LIMIT`` go through the instance's thread. Checked with
tritonclient: two instances (two processes) answering concurrent requests, a child that crashes
mid-request (that request gets an error naming the exit code, the next one a fresh child), inputs on
both sides of the limit, a decoupled model streaming from its child, BLS from the model's own threads and
coroutines (the child's threads read its pipe while ``execute`` runs), and an unload under load.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from serving_pod.backends.python_isolated import LOOP_SEND_LIMIT
from support.python_models import install_python_model

PROTOCOLS = ["http", "grpc"]

FANOUT_CONFIG = """name: "fanout"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
parameters { key: "FERRY_ISOLATED" value { string_value: "true" } }
"""
# BLS from threads of the model's own pool (execute waits on their futures, not on the server) and
# from coroutines (async_exec): while execute runs, those threads must read the child's pipe themselves.
FANOUT_MODEL = """
import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils


def _request(x):
    return pb_utils.InferenceRequest(model_name="scale_x2", requested_output_names=["Y"],
                                     inputs=[pb_utils.Tensor("X", x)])


def _y(response):
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        self.pool = ThreadPoolExecutor(3)

    async def _awaited(self, x):
        return _y(await _request(x).async_exec())

    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            threaded = list(self.pool.map(lambda v: _y(_request(v).exec()), [x, x + 1, x + 2]))
            awaited = await asyncio.gather(*(self._awaited(x + i) for i in range(3)))
            y = sum(threaded) + sum(awaited)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.astype(np.float32))]))
        return responses

    def finalize(self):
        self.pool.shutdown()
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from support.server import ServerThread, make_options

    repo: Path = tmp_path_factory.mktemp("isolated_repo")
    scale = install_python_model(repo, "py_scale", "scale_x2", isolated=True)
    config = scale / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 2 ]", "dims: [ -1 ]")
                      + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    install_python_model(repo, "py_crash", "crash")
    install_python_model(repo, "py_decoupled", "stream", isolated=True)
    fanout = repo / "fanout"
    (fanout / "1").mkdir(parents=True)
    (fanout / "config.pbtxt").write_text(FANOUT_CONFIG)
    (fanout / "1" / "model.py").write_text(FANOUT_MODEL)
    thread = ServerThread(make_options([repo]))
    handle = thread.start()
    assert not handle.engine.startup_failures, handle.engine.startup_failures
    yield handle
    thread.stop()


def _infer(server: Any, protocol: str, model: str, name: str, data: np.ndarray) -> Any:
    module = server.module(protocol)
    tensor = module.InferInput(name, list(data.shape), "FP32" if data.dtype == np.float32 else "INT32")
    tensor.set_data_from_numpy(data)
    return server.client(protocol).infer(model, [tensor])


def _channels(server: Any, model: str) -> list[Any]:
    return [instance._channel for instance in server.engine.registry.get(model).pool.instances]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_two_instance_processes_answer_concurrent_requests(server, protocol: str) -> None:
    assert all(channel.on_loop for channel in _channels(server, "scale_x2"))
    inputs = [np.array([i, -i], np.float32) for i in range(40)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda x: _infer(server, protocol, "scale_x2", "X", x).as_numpy("Y"), inputs))
    for x, y in zip(inputs, results):
        np.testing.assert_array_equal(y, x * 2)
    instances = server.engine.registry.get("scale_x2").pool.instances
    assert all(instance._child.requests == {} for instance in instances)  # every request settled


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_on_both_sides_of_the_loop_send_limit(server, protocol: str) -> None:
    for count in (LOOP_SEND_LIMIT // 4 - 16, LOOP_SEND_LIMIT // 4 + 16, 2_000_000):  # small; thread; 8 MB
        x = np.linspace(-1, 1, count, dtype=np.float32)
        np.testing.assert_array_equal(_infer(server, protocol, "scale_x2", "X", x).as_numpy("Y"), x * 2)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_crashing_child_fails_its_request_and_the_next_gets_a_fresh_one(server, protocol: str) -> None:
    ok = np.array([0], np.int32)
    first = int(_infer(server, protocol, "crash", "INPUT0", ok).as_numpy("PID")[0])
    with pytest.raises(InferenceServerException, match="stopped unexpectedly: exit code 3"):
        _infer(server, protocol, "crash", "INPUT0", np.array([1], np.int32))
    after = _infer(server, protocol, "crash", "INPUT0", ok)
    assert after.as_numpy("OUTPUT0").tolist() == [0]
    assert int(after.as_numpy("PID")[0]) != first
    assert all(channel.on_loop for channel in _channels(server, "crash"))  # the restarted one reads on the loop


def test_a_decoupled_model_streams_from_its_child(server) -> None:
    import queue

    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    items: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: items.put(error or result))
    try:
        for count in (3, 2):
            tensor = grpcclient.InferInput("COUNT", [1], "INT32")
            tensor.set_data_from_numpy(np.array([count], np.int32))
            client.async_stream_infer("stream", [tensor], request_id=f"n{count}")
        got = [items.get(timeout=30) for _ in range(5)]
        assert not [g for g in got if isinstance(g, Exception)], got
        by_id: dict[str, list[int]] = {}
        for result in got:
            by_id.setdefault(result.get_response().id, []).append(int(result.as_numpy("INDEX")[0]))
        assert by_id == {"n3": [0, 1, 2], "n2": [0, 1]}
        tensor = grpcclient.InferInput("COUNT", [1], "INT32")
        tensor.set_data_from_numpy(np.array([-1], np.int32))
        client.async_stream_infer("stream", [tensor])
        error = items.get(timeout=30)
        assert isinstance(error, InferenceServerException) and "negative count" in str(error)
    finally:
        client.stop_stream()
        client.close()


def test_unloading_under_load_answers_every_accepted_request(threaded_server, tmp_path: Path, caplog) -> None:
    """Requests in flight when the unload starts all complete; the children exit; nothing is logged as failed."""
    import logging
    import threading

    scale = install_python_model(tmp_path, "py_scale", "busy", isolated=True)
    config = scale / "config.pbtxt"
    config.write_text(config.read_text() + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    server = threaded_server([tmp_path], model_control_mode="explicit", load_models=("busy",))
    children = [i._child.process for i in server.engine.registry.get("busy").pool.instances]
    client = server.client("http")
    outcomes: list[Any] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                y = _infer(server, "http", "busy", "X", np.array([1, 2], np.float32)).as_numpy("Y")
                outcomes.append(y.tolist())
            except InferenceServerException as exc:
                outcomes.append(str(exc))

    caplog.set_level(logging.WARNING)
    with ThreadPoolExecutor(4) as pool:
        for _ in range(4):
            pool.submit(load)
        while len(outcomes) < 40:
            threading.Event().wait(0.01)
        client.unload_model("busy")
        stop.set()
    answered = [o for o in outcomes if isinstance(o, list)]
    refused = [o for o in outcomes if isinstance(o, str)]
    assert answered and all(o == [2.0, 4.0] for o in answered)
    # after the unload began, new requests are refused in Triton's words; none fails half-way
    assert all("Request for unknown model: 'busy' has no available versions" in o or "'busy' is unloading" in o
               for o in refused), refused
    assert all(child.wait(timeout=30) is not None for child in children)
    assert not [r for r in caplog.records if "Exception in callback" in r.getMessage() or r.levelno >= logging.ERROR]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_from_the_models_own_threads_and_coroutines(server, protocol: str) -> None:
    x = np.array([1, -2, 0.5], np.float32)
    with ThreadPoolExecutor(3) as pool:  # several at once, so calls cross in the pipes
        results = list(pool.map(lambda v: _infer(server, protocol, "fanout", "X", v).as_numpy("Y"), [x, x * 2, x * 3]))
    for factor, y in zip((1, 2, 3), results):
        np.testing.assert_allclose(y, 12 * x * factor + 12)
