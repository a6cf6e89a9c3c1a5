"""Ensembles answered as tritonserver 2.51 answers them, over HTTP and gRPC, and side by side with it.

Each case was a difference found by running the same requests against Triton 2.51: a ``decoupled: true`` ensemble
over non-decoupled steps (Triton serves and runs it as not decoupled), the sequence parameters every ensemble
response carries, the ``in ensemble '...'`` prefix of a failing step's error, and no ``max_inflight_requests``
(a field newer than Triton 2.51's model_config.proto) in the served config. Composing model: ``add_sub_py``.
Side by side: Triton's answers to the same cases are recorded in ``EXPECTED``; Ferry runs against them by default,
a live Triton in the slow ``test_nvidia_tritons_answers_as_recorded``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from support.server import DEFAULT_MODELS, copy_models, write_model

PROTOCOLS = ["http", "grpc"]


def _ensemble(name: str, dims: str = "[ 4 ]", extra: str = "") -> str:
    tensors = lambda *names: ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: {dims} }}' for n in names)  # noqa: E731
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {tensors("IN0", "IN1")} ]
output [ {tensors("SUM", "DIFF")} ]
{extra}
ensemble_scheduling {{ step [ {{ model_name: "add_sub_py" model_version: -1
  input_map {{ key: "INPUT0" value: "IN0" }} input_map {{ key: "INPUT1" value: "IN1" }}
  output_map {{ key: "OUTPUT0" value: "SUM" }} output_map {{ key: "OUTPUT1" value: "DIFF" }} }} ] }}
"""


MODELS = ("add_sub_py", "e_plain", "e_declared_decoupled", "e_any_shape")


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repository = copy_models(tmp_path_factory.mktemp("ensemble_parity"), DEFAULT_MODELS, "add_sub_py")
    write_model(repository, "e_plain", _ensemble("e_plain"))
    write_model(repository, "e_declared_decoupled", _ensemble(
        "e_declared_decoupled", extra="model_transaction_policy { decoupled: true }"))
    write_model(repository, "e_any_shape", _ensemble("e_any_shape", dims="[ -1 ]"))  # add_sub_py wants [4]
    return repository


@pytest.fixture(scope="module")
def server(repository):
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=MODELS))
    handle = thread.start()
    yield handle
    thread.stop()


def _inputs(module, length: int = 4):
    tensors = []
    for name, value in (("IN0", 3.0), ("IN1", 1.0)):
        tensor = module.InferInput(name, [length], "FP32")
        tensor.set_data_from_numpy(np.full(length, value, np.float32))
        tensors.append(tensor)
    return tensors


def _response_parameters(result, protocol: str) -> dict:
    if protocol == "http":
        return result.get_response().get("parameters", {})
    from google.protobuf import json_format

    return {key: json_format.MessageToDict(value) for key, value in result.get_response().parameters.items()}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_declared_decoupled_ensemble_over_plain_steps_is_served_as_not_decoupled(server, protocol: str) -> None:
    client, module = server.client(protocol), server.module(protocol)
    result = client.infer("e_declared_decoupled", _inputs(module))
    np.testing.assert_array_equal(result.as_numpy("SUM"), np.full(4, 4, np.float32))
    if protocol == "http":
        assert client.get_model_config("e_declared_decoupled")["model_transaction_policy"] == {"decoupled": False}
    else:
        config = client.get_model_config("e_declared_decoupled").config
        assert config.HasField("model_transaction_policy") and not config.model_transaction_policy.decoupled
    client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ensemble_response_carries_the_sequence_parameters(server, protocol: str) -> None:
    client, module = server.client(protocol), server.module(protocol)
    plain = client.infer("e_plain", _inputs(module))
    asked = client.infer("e_plain", _inputs(module), sequence_id=42, sequence_start=True, sequence_end=True)
    named = client.infer("e_plain", _inputs(module), sequence_id="abc")
    if protocol == "http":
        expected = [{"sequence_id": 0, "sequence_start": False, "sequence_end": False},
                    {"sequence_id": 42, "sequence_start": True, "sequence_end": True},
                    {"sequence_id": "abc", "sequence_start": False, "sequence_end": False}]
    else:
        expected = [{"sequence_id": {"int64Param": "0"}, "sequence_start": {"boolParam": False}, "sequence_end": {"boolParam": False}},
                    {"sequence_id": {"int64Param": "42"}, "sequence_start": {"boolParam": True}, "sequence_end": {"boolParam": True}},
                    {"sequence_id": {"stringParam": "abc"}, "sequence_start": {"boolParam": False}, "sequence_end": {"boolParam": False}}]
    assert [_response_parameters(r, protocol) for r in (plain, asked, named)] == expected
    # a plain model's response has none (Triton's neither)
    single = [module.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in single:
        tensor.set_data_from_numpy(np.ones(4, np.float32))
    assert _response_parameters(client.infer("add_sub_py", single), protocol) == {}
    client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_failing_step_error_names_the_ensemble(server, protocol: str) -> None:
    client, module = server.client(protocol), server.module(protocol)
    with pytest.raises(InferenceServerException) as error:
        client.infer("e_any_shape", _inputs(module, length=3))
    assert error.value.message().startswith(
        "in ensemble 'e_any_shape', [request id: <id_unknown>] unexpected shape for input 'INPUT")
    assert "for model 'add_sub_py'. Expected [4], got [3]" in error.value.message()
    assert error.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    client.close()


def test_served_ensemble_config_has_no_field_newer_than_tritons(server) -> None:
    client = server.client("http")
    scheduling = client.get_model_config("e_plain")["ensemble_scheduling"]
    assert sorted(scheduling) == ["step"]
    client.close()


# ---- side by side with tritonserver 2.51 (recorded answers; the live Triton runs with -m slow) --------------------------------

def _answers(http_port: int, grpc_port: int) -> dict[str, object]:
    """The cases above as raw answers, with what differs by design masked (Triton's ``[request id: ...]``
    prefix and trailing '. ', the order of outputs and which of two bad inputs is named)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    answers: dict[str, object] = {}
    for protocol, module, url in (("http", httpclient, f"127.0.0.1:{http_port}"),
                                  ("grpc", grpcclient, f"127.0.0.1:{grpc_port}")):
        client = module.InferenceServerClient(url)
        result = client.infer("e_declared_decoupled", _inputs(module))
        answers[f"{protocol} decoupled"] = (result.as_numpy("SUM").tolist(), _response_parameters(result, protocol))
        result = client.infer("e_plain", _inputs(module), sequence_id=7, sequence_start=True)
        answers[f"{protocol} sequence"] = _response_parameters(result, protocol)
        try:
            client.infer("e_any_shape", _inputs(module, length=3))
        except InferenceServerException as error:
            message = re.sub(r"\[request id: [^]]*\] ", "", error.message()).rstrip(". ")
            answers[f"{protocol} step error"] = (error.status(), re.sub(r"INPUT[01]", "INPUT?", message))
        config = client.get_model_config("e_declared_decoupled")
        if protocol == "http":
            answers["http config"] = (config["model_transaction_policy"], sorted(config["ensemble_scheduling"]))
        client.close()
    return answers


#: tritonserver 2.51's answers to ``_answers`` (recorded from a live Triton; the slow
#: ``test_nvidia_tritons_answers_as_recorded`` compares a live one with them)
EXPECTED: dict[str, object] = {
    "http decoupled": ([4.0, 4.0, 4.0, 4.0], {"sequence_id": 0, "sequence_start": False, "sequence_end": False}),
    "http sequence": {"sequence_id": 7, "sequence_start": True, "sequence_end": False},
    "http step error": ("400", "in ensemble 'e_any_shape', unexpected shape for input 'INPUT?' for model "
                               "'add_sub_py'. Expected [4], got [3]"),
    "http config": ({"decoupled": False}, ["step"]),
    "grpc decoupled": ([4.0, 4.0, 4.0, 4.0], {"sequence_id": {"int64Param": "0"}, "sequence_start": {"boolParam": False},
                                              "sequence_end": {"boolParam": False}}),
    "grpc sequence": {"sequence_id": {"int64Param": "7"}, "sequence_start": {"boolParam": True},
                      "sequence_end": {"boolParam": False}},
    "grpc step error": ("StatusCode.INVALID_ARGUMENT", "in ensemble 'e_any_shape', unexpected shape for input "
                                                       "'INPUT?' for model 'add_sub_py'. Expected [4], got [3]"),
}


def test_answers_match_nvidia_tritons(server) -> None:
    assert _answers(server.server.http_port, server.server.grpc_port) == EXPECTED


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_tritons_answers_as_recorded(repository) -> None:
    from support.triton import running_triton

    with running_triton(repository, list(MODELS)) as (http, grpc_port, _):
        assert _answers(http, grpc_port) == EXPECTED
