"""Python BLS end to end through tritonclient: ``exec``, ``async_exec``, decoupled ``exec(decoupled=True)``,
sequence requests with correlation id and flags, and BLS errors.

``bls_router`` (tests/serving_pod/data/decoupled) calls the ONNX ``add_sub`` and ``onnx_acc`` models
(built by ``support.models``) and the decoupled ``dec_counter`` through the engine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from support.models import make_add_sub_model, make_state_model

DATA = Path(__file__).resolve().parent / "data" / "decoupled"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from support.server import ServerThread, make_options

    repo = tmp_path_factory.mktemp("bls_repo")
    for name in ("bls_router", "dec_counter", "params_echo"):
        shutil.copytree(DATA / name, repo / name)
    make_add_sub_model(repo / "add_sub", "TYPE_FP32", dims=(4,), max_batch=8)
    make_state_model(repo / "onnx_acc")
    thread = ServerThread(make_options([repo]))
    handle = thread.start()
    assert not handle.engine.startup_failures, handle.engine.startup_failures
    yield handle
    thread.stop()


def _call(handle, protocol: str, mode: str, x: list[float]):
    module, client = handle.module(protocol), handle.client(protocol)
    tensor = module.InferInput("X", [4], "FP32")
    tensor.set_data_from_numpy(np.array(x, np.float32))
    try:
        return client.infer("bls_router", [tensor], parameters={"mode": mode}).as_numpy("Y")
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_bls_to_onnx(server, protocol: str, mode: str) -> None:
    np.testing.assert_array_equal(_call(server, protocol, mode, [1, 2, 3, 4.5]), [2, 4, 6, 9])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_streams_from_a_decoupled_model(server, protocol: str) -> None:
    np.testing.assert_array_equal(_call(server, protocol, "stream", [4, 0, 0, 0]), [0, 1, 2, 3])
    assert _call(server, protocol, "stream", [0, 0, 0, 0]).size == 0  # zero responses, then final


def test_bls_sequence_uses_correlation_id_and_flags(server) -> None:
    np.testing.assert_array_equal(_call(server, "grpc", "sequence", [5, 6, 7, 0]), [5, 11, 18])
    np.testing.assert_array_equal(_call(server, "grpc", "sequence", [1, 1, 1, 0]), [1, 2, 3])  # restarted


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_custom_parameters_named_like_reserved_ones_reach_the_called_model(server, protocol: str) -> None:
    """As in Triton, a BLS call's ``parameters`` are all custom: ``timeout`` or ``sequence_id`` among them is
    neither checked as nor taken for the request's timeout or correlation id (the arguments are)."""
    module, client = server.module(protocol), server.client(protocol)
    tensor = module.InferInput("X", [4], "FP32")
    tensor.set_data_from_numpy(np.zeros(4, np.float32))
    try:
        result = client.infer("bls_router", [tensor], parameters={"mode": "params"})
    finally:
        client.close()
    response = result.get_response()
    params = response["parameters"] if protocol == "http" else {
        k: v.string_param for k, v in response.parameters.items()}
    parameters, correlation_id, timeout = json.loads(params["echo"])
    assert json.loads(parameters) == {"timeout": "soon", "sequence_id": "not-a-sequence", "priority": "high",
                                      "note": 1}
    assert (correlation_id, timeout) == ("77", "5000000")


def test_bls_error_reaches_the_client(server) -> None:
    with pytest.raises(InferenceServerException) as error:
        _call(server, "http", "missing", [1, 2, 3, 4])
    assert ("BLS failed: Model no_such_model - Error when running inference: Failed for execute the inference "
            "request. Model 'no_such_model' is not ready.") in str(error.value)  # Triton 2.51's words


def test_bls_calls_are_charged_to_the_called_models(server) -> None:
    def successes(name: str) -> int:
        return server.engine.statistics(name)[0]["inference_stats"]["success"]["count"]

    before = successes("add_sub"), successes("bls_router")
    for _ in range(3):
        _call(server, "grpc", "sync", [1, 1, 1, 1])
    assert (successes("add_sub") - before[0], successes("bls_router") - before[1]) == (3, 3)


@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_a_bls_request_is_validated_once(server, monkeypatch, mode: str) -> None:
    """The engine admits a BLS request as any other; a refusal it marks is worded for BLS without a second check."""
    called = server.engine.registry.get("add_sub" if mode == "sync" else "dec_counter")
    checked = []
    validate = called.validate
    monkeypatch.setattr(called, "validate", lambda request: (checked.append(request.model_name), validate(request))[1])
    _call(server, "grpc", mode, [2, 0, 0, 0])
    assert checked == [called.name]
