"""Which request parameters a python model's ``request.parameters()`` shows, as in Triton 2.51 (HTTP and gRPC).

Seen on Triton 2.51: the parameters the server consumes (``binary_data_output`` over HTTP, ``priority``,
``timeout``, ``sequence_*``) are hidden; custom ones and forwarded headers are shown; and a request-level
``binary_data_size`` (meaningful on an input only) is nobody's, so the model sees it, over HTTP and gRPC alike
(Ferry hid it). Over gRPC ``binary_data_output`` and ``priority`` as parameters are refused before the model.
The tables (``HTTP_CASES``, ``GRPC_CASES``) were recorded from a live Triton 2.51: Ferry runs against them by default,
a live Triton (``test_triton_shows_the_parameters_the_table_says``) under ``-m slow``.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from support.python_models import PARAMS_CONFIG, PARAMS_MODEL
from support.server import ServerThread, make_options, write_model

HTTP_CASES = {  # request parameters -> what the model sees (the x-foo header is forwarded every time)
    "binary_data_output": ({"binary_data_output": False}, {"x-foo": "bar"}),
    "priority and timeout": ({"priority": 1, "timeout": 100000}, {"x-foo": "bar"}),
    "sequence": ({"sequence_id": 7, "sequence_start": True, "sequence_end": True}, {"x-foo": "bar"}),
    "request-level binary_data_size": ({"binary_data_size": 4}, {"binary_data_size": 4, "x-foo": "bar"}),
    "custom": ({"custom": "v", "n": 3, "b": True}, {"custom": "v", "n": 3, "b": True, "x-foo": "bar"}),
}
GRPC_CASES = {  # infer() keyword arguments -> what the model sees
    "priority and timeout": ({"priority": 1, "timeout": 100000}, {}),
    "request-level binary_data_size": ({"parameters": {"binary_data_size": 4}}, {"binary_data_size": 4}),
    "forwarded header": ({"headers": {"x-foo": "bar", "other": "no"}}, {"x-foo": "bar"}),
    "forwarded binary metadata": ({"headers": {"x-text-bin": "h\u00e9llo".encode(), "x-empty-bin": b""}},
                                  {"x-empty-bin": "", "x-text-bin": "h\u00e9llo"}),  # as its text (Ferry dropped it)
    "custom": ({"parameters": {"custom": "v"}}, {"custom": "v"}),
}


def _http_seen(port: int, parameters: dict) -> dict:
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1], "data": [1]}], "parameters": parameters}
    response = httpx.post(f"http://127.0.0.1:{port}/v2/models/params/infer", json=body,
                          headers={"x-foo": "bar", "other": "no"}, timeout=30)
    assert response.status_code == 200, response.text
    return json.loads(response.json()["outputs"][0]["data"][0])


def _grpc_seen(port: int, kwargs: dict) -> dict:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = grpcclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    try:
        return json.loads(client.infer("params", [tensor], **kwargs).as_numpy("PARAMS")[0])
    finally:
        client.close()


def _all_seen(http: int, grpc: int) -> tuple[dict, dict]:
    return ({name: _http_seen(http, parameters) for name, (parameters, _) in HTTP_CASES.items()},
            {name: _grpc_seen(grpc, kwargs) for name, (kwargs, _) in GRPC_CASES.items()})


EXPECTED = ({name: seen for name, (_, seen) in HTTP_CASES.items()},
            {name: seen for name, (_, seen) in GRPC_CASES.items()})


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("request_parameters")
    write_model(path, "params", PARAMS_CONFIG, {"1/model.py": PARAMS_MODEL})
    return path


def test_ferry_shows_the_parameters_triton_shows(repository: Path) -> None:
    thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=("params",),
                                       http_header_forward="^x-", grpc_header_forward="^x-"))
    handle = thread.start()
    try:
        seen = _all_seen(handle.server.http_port, handle.server.grpc_port)
    finally:
        thread.stop()
    assert seen == EXPECTED


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_triton_shows_the_parameters_the_table_says(repository: Path) -> None:
    from support.triton import running_triton

    with running_triton(repository, ("params",), "--http-header-forward-pattern=^x-",
                        "--grpc-header-forward-pattern=^x-") as (http, grpc, _):
        assert _all_seen(http, grpc) == EXPECTED
