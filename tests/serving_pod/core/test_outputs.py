"""Requested-output handling on streamed (decoupled) responses, through tritonclient's gRPC stream.

Model ``dec_scores`` (tests/serving_pod/data/decoupled): response i has SCORES = roll([.1, .2, .3, .4], i)
(labels cat, dog, bird, fish) and INDEX = i. Each streamed response must get what a unary response
gets: only the requested outputs, ``class_count`` top-N strings, shared-memory writes (each response
overwrites the region, as Triton's stream does), and a region too small fails that response only.
HTTP has no streaming endpoint, so these cases are gRPC only.
"""

from __future__ import annotations

import queue
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from serving_pod.core.outputs import finish, plan_outputs
from serving_pod.core.types import InferResponse, RequestedOutput, Tensor
from serving_pod.shm import SharedMemoryManager

DATA = Path(__file__).resolve().parents[1] / "data" / "decoupled"
BASE = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
TOO_SMALL = (
    "shared memory size specified with the request for output 'SCORES' (8 bytes) should be at least "
    "16 bytes to hold the results"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from support.server import ServerThread, make_options

    repo = tmp_path_factory.mktemp("dec_outputs_repo")
    shutil.copytree(DATA / "dec_scores", repo / "dec_scores")
    thread = ServerThread(make_options([repo], allow_client_shm=True))
    handle = thread.start()
    assert not handle.engine.startup_failures, handle.engine.startup_failures
    yield handle
    thread.stop()


@pytest.fixture
def region(server):
    """``region(name, size)``: a registered system shm region; unregistered and destroyed after the test."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    made: list[tuple[str, Any]] = []

    def make(name: str, byte_size: int) -> Any:
        handle = shm.create_shared_memory_region(name, f"/ferry_{uuid.uuid4().hex[:12]}", byte_size)
        made.append((name, handle))
        client.register_system_shared_memory(name, handle._shm_key, byte_size)
        return handle

    yield make
    for name, handle in made:
        client.unregister_system_shared_memory(name)
        shm.destroy_shared_memory_region(handle)
    client.close()


class Stream:
    """A tritonclient gRPC stream; ``on_result`` (if set) runs on the callback thread before queueing."""

    def __init__(self, handle, on_result=None) -> None:
        self.client = grpcclient.InferenceServerClient(handle.grpc_url)
        self.items: queue.Queue = queue.Queue()

        def callback(result, error) -> None:
            if result is not None and on_result is not None:
                on_result(result)
            self.items.put(error or result)

        self.client.start_stream(callback=callback)

    def send(self, count: int, outputs: list, **kwargs) -> None:
        tensor = grpcclient.InferInput("COUNT", [1], "INT32")
        tensor.set_data_from_numpy(np.array([count], np.int32))
        self.client.async_stream_infer("dec_scores", [tensor], outputs=outputs, **kwargs)

    def take(self, count: int) -> list:
        return [self.items.get(timeout=20) for _ in range(count)]

    def assert_quiet(self) -> None:
        with pytest.raises(queue.Empty):
            self.items.get(timeout=0.3)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def _final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def test_class_count_on_every_streamed_response(server) -> None:
    stream = Stream(server)
    stream.send(3, [grpcclient.InferRequestedOutput("SCORES", class_count=2)], request_id="cls")
    results = stream.take(3)
    assert [[s.decode() for s in r.as_numpy("SCORES")] for r in results] == [
        ["0.400000:3:fish", "0.300000:2:bird"],
        ["0.400000:0:cat", "0.300000:3:fish"],
        ["0.400000:1:dog", "0.300000:0:cat"],
    ]
    assert [r.get_output("SCORES").datatype for r in results] == ["BYTES"] * 3
    assert [r.get_output("INDEX") for r in results] == [None] * 3  # only what was requested
    assert [r.get_response().id for r in results] == ["cls"] * 3
    stream.assert_quiet()
    stream.close()


def test_each_streamed_response_writes_the_region(server, region, tmp_path) -> None:
    handle = region("dec_out", 16)
    seen: list[tuple[int, list[float]]] = []

    def read_then_ack(result) -> None:
        # read before acknowledging: the model sends the next response (overwriting the region) only after
        index = int(result.as_numpy("INDEX")[0])
        seen.append((index, shm.get_contents_as_numpy(handle, np.float32, [4]).tolist()))
        (tmp_path / f"ack_{index}").touch()

    stream = Stream(server, on_result=read_then_ack)
    scores = grpcclient.InferRequestedOutput("SCORES")
    scores.set_shared_memory("dec_out", 16)
    stream.send(3, [scores, grpcclient.InferRequestedOutput("INDEX")], parameters={"gate": str(tmp_path)})
    results = stream.take(3)
    assert seen == [(i, np.roll(BASE, i).tolist()) for i in range(3)]
    for result in results:
        assert result.get_response().raw_output_contents[0] == b""  # the data went to the region only
        assert list(result.get_output("SCORES").shape) == [4]
    stream.close()


def test_region_too_small_fails_each_response_and_the_stream_goes_on(server, region) -> None:
    region("dec_small", 8)
    stream = Stream(server)
    scores = grpcclient.InferRequestedOutput("SCORES")
    scores.set_shared_memory("dec_small", 8)
    stream.send(2, [scores], request_id="small", enable_empty_final_response=True)
    first, second, last = stream.take(3)
    for error in (first, second):
        assert isinstance(error, InferenceServerException) and TOO_SMALL in str(error)
    assert _final(last) and last.as_numpy("SCORES") is None  # the request still completes
    # the final data response fails too, and its completion still reaches the client
    stream.send(1, [scores], parameters={"final_with_data": True}, enable_empty_final_response=True)
    error, last = stream.take(2)
    assert isinstance(error, InferenceServerException) and TOO_SMALL in str(error)
    assert _final(last)
    # same stream, fitting outputs: served as usual
    stream.send(2, [grpcclient.InferRequestedOutput("INDEX")])
    assert [int(r.as_numpy("INDEX")[0]) for r in stream.take(2)] == [0, 1]
    stream.close()
    other = Stream(server)  # and the server serves new streams
    other.send(1, [grpcclient.InferRequestedOutput("INDEX")])
    (only,) = other.take(1)
    assert int(only.as_numpy("INDEX")[0]) == 0
    other.close()


def test_unary_and_streamed_responses_share_one_finish() -> None:
    """``finish`` is the one step both paths run: filtering, then classification."""
    response = InferResponse("m", "1", [Tensor("SCORES", "FP32", BASE), Tensor("INDEX", "INT32", np.array([0], np.int32))])
    plan = plan_outputs([RequestedOutput("SCORES", {"classification": 1})], SharedMemoryManager(allow=False))

    class Model:
        max_batch_size = 0

    class Labels:
        def labels(self, model: Any, output: str) -> list[str]:
            return ["cat", "dog", "bird", "fish"]

    finish(response, plan, Model(), labels=Labels(), shm=SharedMemoryManager(allow=False))  # type: ignore[arg-type]
    assert [t.name for t in response.outputs] == ["SCORES"]
    assert response.outputs[0].data.tolist() == [b"0.400000:3:fish"]
