"""``--grpc-header-forward-pattern``: the order in which forwarded metadata reaches a model's request parameters.

Recorded from tritonserver 2.51 (``--grpc-header-forward-pattern=my-.*``, unary and streaming): a python model's
``request.parameters()`` lists the request's own parameters, then the forwarded metadata ordered by name
(``{"p":3,"my-bin-bin":...,"my-empty-bin":...,"my-h":...,"my-utf-bin":...}`` for metadata sent as my-h, other,
my-bin-bin, my-utf-bin, my-empty-bin): grpc++ keeps client metadata in a sorted multimap. Ferry kept arrival order.
"""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from support.python_models import PARAMS_CONFIG, PARAMS_MODEL
from support.server import ServerThread, make_options, write_model

#: sent in this order; the model sees the request's own parameter, then the forwarded ones by name
HEADERS = {"my-zeta": "z", "other": "x", "my-bin-bin": b"\x01", "my-alpha": "a", "my-mid": "m"}
SEEN = ["custom", "my-alpha", "my-bin-bin", "my-mid", "my-zeta"]


@pytest.fixture(scope="module")
def grpc_url(tmp_path_factory: pytest.TempPathFactory):
    repository = tmp_path_factory.mktemp("forward_order")
    write_model(repository, "params", PARAMS_CONFIG, {"1/model.py": PARAMS_MODEL})
    thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=("params",),
                                       grpc_header_forward="my-.*"))
    handle = thread.start()
    try:
        yield handle.grpc_url
    finally:
        thread.stop()


def _input() -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    return [tensor]


def test_unary_metadata_reaches_the_model_ordered_by_name(grpc_url: str) -> None:
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        result = client.infer("params", _input(), headers=HEADERS, parameters={"custom": "v"})
    finally:
        client.close()
    assert list(json.loads(result.as_numpy("PARAMS")[0])) == SEEN


def test_stream_metadata_reaches_each_request_ordered_by_name(grpc_url: str) -> None:
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=HEADERS)
    try:
        client.async_stream_infer("params", _input(), parameters={"custom": "v"})
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()
    assert error is None
    assert list(json.loads(result.as_numpy("PARAMS")[0])) == SEEN
