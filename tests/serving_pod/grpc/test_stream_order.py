"""The gRPC stream answers a model that is not decoupled in request order, as tritonserver 2.51 does.

Ferry runs a stream's requests at once. tritonserver writes each answer to a request for a model that is not
decoupled only after the answers to the requests before it (``StreamInferHandler``'s ordered states), even when a
later request finishes first or is refused at once; a decoupled model's responses go out as they come. ``nap`` (two
instances) sleeps the milliseconds its input says, so a slow first request finishes after a quick second one.
Checked on both gRPC front ends against ``EXPECTED``, recorded from Triton 2.51; the slow
``test_triton_answers_in_request_order`` checks a live Triton against the same answers (skipped with the installer's
reason where Triton cannot be had).
"""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from support.server import ServerThread, make_options, write_model

NAP = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()
            time.sleep(float(value[0]) / 1000.0)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
        return responses
'''

CONFIG = """name: "nap"
backend: "python"
max_batch_size: 0
input [ { name: "MS", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("stream_order")
    write_model(repo, "nap", CONFIG, files={"1/model.py": NAP})
    return repo


def _stream_answers(grpc_port: int) -> list[str]:
    """Four requests on one stream: slow (600 ms), quick, refused (wrong datatype), quick; the answers as they came."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for request_id, milliseconds, datatype in (("slow", 600, "INT32"), ("quick", 0, "INT32"),
                                                   ("refused", 0, "FP32"), ("last", 0, "INT32")):
            tensor = grpcclient.InferInput("MS", [1], datatype)
            tensor.set_data_from_numpy(np.array([milliseconds], np.int32 if datatype == "INT32" else np.float32))
            client.async_stream_infer("nap", [tensor], request_id=request_id)
        got = []
        for _ in range(4):
            result, error = answers.get(timeout=60)
            got.append(f"error {error.message()}" if error is not None else result.get_response().id)
        return got
    finally:
        client.stop_stream()
        client.close()


#: the answers in the order tritonserver 2.51 sends them (recorded from a live Triton; compared with one by the slow
#: ``test_triton_answers_in_request_order``)
EXPECTED = ["slow", "quick", "error [request id: refused] inference input 'MS' data-type is 'FP32', but model "
            "'nap' expects 'INT32'", "last"]


@pytest.mark.parametrize("grpc_server", ["native", "grpcio"])
def test_stream_answers_in_request_order(repository: Path, grpc_server: str) -> None:
    thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=("nap",),
                                       grpc_server=grpc_server))
    server = thread.start()
    try:
        assert _stream_answers(server.server.grpc_port) == EXPECTED
    finally:
        thread.stop()


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_triton_answers_in_request_order(repository: Path) -> None:
    from support.triton import running_triton

    with running_triton(repository, ["nap"]) as (_, grpc_port, _):
        assert _stream_answers(grpc_port) == EXPECTED
