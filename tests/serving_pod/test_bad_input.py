"""Bad input never takes the server down: each case gets a clear error, and the next good request is served.

Raw HTTP bodies (httpx) and raw gRPC messages exercise what tritonclient would never send.
"""

from __future__ import annotations

import gzip
import json
import struct

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from support.server import test_model_config, write_model

LIMIT = 1 << 20  # --http-max-input-size for these tests
HUGE = 2**62  # two of them overflow numpy's index type


@pytest.fixture
def server(threaded_server, tmp_path):
    write_model(tmp_path, "fp32", test_model_config("fp32"))
    write_model(tmp_path, "text", test_model_config("text", "TYPE_STRING", "[ 2 ]"))
    write_model(tmp_path, "broken", 'name: "broken"\nbackend: "ferry_test"\nmax_batch_size: 4\n'
                'input [ { name: "INPUT0" data_type: TYPE_NOPE dims: [ 4 ] } ]\n')
    write_model(tmp_path, "fails_load", test_model_config(
        "fails_load", extra='parameters { key: "fail_load" value { string_value: "true" } }'))
    return threaded_server([tmp_path], http_max_input_size=LIMIT)


def _post(server, body: bytes, headers: dict | None = None, model: str = "fp32") -> httpx.Response:
    return httpx.post(f"http://{server.http_url}/v2/models/{model}/infer", content=body, headers=headers or {}, timeout=30)


def _assert_still_serving(server) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    response = _post(server, body.encode())
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1, 2, 3, 4]


def _binary_request(name: str, datatype: str, shape: list[int], raw: bytes, declared: int | None = None) -> tuple[bytes, dict]:
    header = json.dumps({"inputs": [{"name": name, "shape": shape, "datatype": datatype,
                                      "parameters": {"binary_data_size": len(raw) if declared is None else declared}}]}).encode()
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


ID = "[request id: <id_unknown>]"  # what Triton's core puts before its refusals (a request without an id)

HTTP_CASES = {
    # case: (body, headers, status, message fragment)
    "malformed JSON": (b'{"inputs": [', {}, 400, "failed to parse the request JSON buffer"),
    "JSON not an object": (b"[1, 2]", {}, 400, "expected a JSON object"),
    "no inputs": (b'{"id": "1"}', {}, 400, "must have an 'inputs' array"),
    "unknown datatype": (json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP128", "data": [1, 2, 3, 4]}]}).encode(),
                         {}, 400, "invalid datatype for input INPUT0"),  # Triton's words
    "element count mismatch": (json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3]}]}).encode(),
                               {}, 400, "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    "negative shape": (json.dumps({"inputs": [{"name": "INPUT0", "shape": [-1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}).encode(),
                       {}, 400, "non-negative integers"),
    # each of these five was a 500 (a ValueError or TypeError from numpy)
    "shape too large, JSON data": (json.dumps({"inputs": [{"name": "INPUT0", "shape": [HUGE, HUGE, 0], "datatype": "FP32", "data": []}]}).encode(),
                                   {}, 400, f"input 'INPUT0': shape [{HUGE}, {HUGE}, 0] has too many elements"),
    "shape too large, binary data": (*_binary_request("INPUT0", "FP32", [HUGE, HUGE, 0], b""), 400, "has too many elements"),
    "shape too large, shared memory": (json.dumps({"inputs": [{"name": "INPUT0", "shape": [HUGE, HUGE], "datatype": "FP32",
                                                               "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}]}).encode(),
                                       {}, 400, "has too many elements"),
    "shape of 65 dimensions": (json.dumps({"inputs": [{"name": "INPUT0", "shape": [1] * 65, "datatype": "FP32", "data": [1]}]}).encode(),
                               {}, 400, "has more than 64 dimensions"),
    "boolean in shape": (json.dumps({"inputs": [{"name": "INPUT0", "shape": [True, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}).encode(),
                         {}, 400, "non-negative integers"),
    # true was read as 1 ("expected 16 bytes ..., got 1")
    "boolean binary_data_size": (*_binary_request("INPUT0", "FP32", [1, 4], b"\0" * 16, declared=True), 400,
                                 "binary_data_size must be a non-negative integer"),
    # Triton 2.51's words for each datatype (its status is 500, recorded live); Ferry served a number as a [1] tensor
    "data a number, not an array": (json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32",
                                                            "data": 5}]}).encode(),
                                    {}, 400, "Unable to parse 'data': attempt to access JSON non-array as array"),
    "data a string, not an array": (json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "BYTES",
                                                            "data": "a"}]}).encode(),
                                    {}, 400, "Unable to parse 'data': attempt to access JSON non-array as array"),
    "wrong JSON value type": (json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": ["a", 2, 3, 4]}]}).encode(),
                              {}, 400, "data does not fit FP32"),
    # numpy read these as numbers (served, the float truncated); Triton 2.51 refuses them ("Unable to parse 'data'")
    "number as JSON string": (json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": ["1", 2, 3, 4]}]}).encode(),
                              {}, 400, "input 'INPUT0': data does not fit FP32: expected numbers, got '1'"),
    "JSON boolean as a number": (json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, True]}]}).encode(),
                                 {}, 400, "input 'INPUT0': data does not fit FP32: expected numbers, got True"),
    "BYTES element count": (*_binary_request("INPUT0", "BYTES", [1, 2], struct.pack("<I", 1) + b"a"), 400,
                            f"{ID} expected 2 string elements for inference input 'INPUT0' for model 'text', got 1"),
    "binary larger than body": (*_binary_request("INPUT0", "FP32", [1, 4], b"\0" * 8, declared=16), 400, "unexpected size for input 'INPUT0', expecting 8 additional bytes"),
    "binary size wrong for shape": (*_binary_request("INPUT0", "FP32", [1, 4], b"\0" * 12), 400,
                                    f"{ID} input byte size mismatch for input 'INPUT0' for model 'fp32'. Expected 16, got 12"),
    "trailing bytes": ((lambda b, h: (b + b"junk", h))(*_binary_request("INPUT0", "FP32", [1, 4], b"\0" * 16)) + (400, "unexpected additional input data for model")),
    "header length beyond body": (b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}, 400, "inference header size should be in range (0, 14), got: 999"),
    # tritonserver reads the length with atoi: 0, so the body is the raw input (``http.raw``), 14 bytes of 16
    "header length not a number": (b'{"inputs": []}', {"Inference-Header-Content-Length": "ten"}, 400,
                                   "input byte size mismatch for input 'raw_input' for model 'fp32'. Expected 16, got 14"),
    # orjson put every byte that is not UTF-8 at "line 1 column 1 (char 0)", "surrogates not allowed"; Triton 2.51
    # reads such a body up to its first NUL ("unexpected size for input 'INPUT0', expecting 16 additional bytes")
    "binary data without its header length": (_binary_request("INPUT0", "FP32", [1, 4], np.ones(4, np.float32).tobytes())[0], {},
                                              400, "failed to parse the request JSON buffer: the JSON document (109 bytes) is "
                                              "followed by 16 bytes that are not JSON; binary tensor data needs the "
                                              "'Inference-Header-Content-Length' header (the length of the JSON)"),
    "bytes that are not UTF-8 in the JSON": (b'{"id": "\xff", "inputs": []}', {}, 400,
                                             "failed to parse the request JSON buffer: invalid UTF-8 at byte 8"),
    "unsupported encoding": (b"xx", {"Content-Encoding": "br"}, 501, "Unsupported compression type"),
    "corrupt gzip": (b"not gzip at all", {"Content-Encoding": "gzip"}, 400, "failed to decompress"),
}


@pytest.mark.parametrize("case", list(HTTP_CASES))
def test_http_bad_bodies(server, case):
    body, headers, status, fragment = HTTP_CASES[case]
    response = _post(server, body, headers, model="text" if case.startswith("BYTES") else "fp32")
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]
    _assert_still_serving(server)


@pytest.mark.parametrize(("data", "fragment"), [
    ([1.5, 2, 3, 4], "input 'INPUT0': data does not fit INT32: expected integers, got 1.5"),  # was served as 1
    ([1, False, 3, 4], "input 'INPUT0': data does not fit INT32: expected integers, got False"),
    ([1, 2, 3, "4"], "input 'INPUT0': data does not fit INT32: expected integers, got '4'"),
])
def test_http_json_integers_take_only_integers(threaded_server, tmp_path, data, fragment):
    write_model(tmp_path, "int32", test_model_config("int32", "TYPE_INT32"))
    server = threaded_server([tmp_path])
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "INT32", "data": data}]}
    response = _post(server, json.dumps(body).encode(), model="int32")
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]


def test_http_truncated_bytes_tensor(server):
    raw = struct.pack("<I", 3) + b"abc" + struct.pack("<I", 10) + b"short"
    body, headers = _binary_request("INPUT0", "BYTES", [1, 2], raw)
    response = _post(server, body, headers, model="text")
    assert response.status_code == 400
    # Triton's core takes an element longer than its data; its python backend refuses it, in these words
    assert response.json()["error"] == ("incomplete string data for inference input 'INPUT0', expecting string of "
                                        "length 10 but only 5 bytes available")
    _assert_still_serving(server)


def test_http_oversized_body_refused(server):
    response = _post(server, b"{" + b" " * (LIMIT + 10) + b"}")
    assert response.status_code == 400
    assert "exceeds the maximum allowed value of 1048576 bytes" in response.json()["error"]
    _assert_still_serving(server)


def test_http_decompression_bomb_refused(server):
    bomb = gzip.compress(b"{" + b" " * (LIMIT * 8) + b"}")
    assert len(bomb) < LIMIT // 8
    response = _post(server, bomb, {"Content-Encoding": "gzip"})
    assert response.status_code == 400
    assert "exceeds the maximum allowed value" in response.json()["error"]
    _assert_still_serving(server)


def _grpc_call(server, request: pb.ModelInferRequest) -> grpc.RpcError:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=30)
    return info.value


def _grpc_request(raw: list[bytes], datatype: str = "FP32", shape=(1, 4), model: str = "fp32", inputs: int = 1) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    for index in range(inputs):
        request.inputs.add(name=f"INPUT{index}", datatype=datatype, shape=list(shape))
    request.raw_input_contents.extend(raw)
    return request


GRPC_CASES = {
    "raw contents count mismatch": (_grpc_request([b"\0" * 16, b"\0" * 16]), "expected 1 raw_input_contents (one per input), got 2"),
    "raw size wrong for shape": (_grpc_request([b"\0" * 12]),
                                 f"{ID} input byte size mismatch for input 'INPUT0' for model 'fp32'. Expected 16, got 12"),
    "no data": (_grpc_request([]), "unable to find data for input tensor 'INPUT0' for model 'fp32' in request."),
    # Triton's core counts the truncated element as one, then finds too few
    "truncated BYTES": (_grpc_request([struct.pack("<I", 9) + b"abc"], "BYTES", (1, 2), "text"),
                        f"{ID} expected 2 string elements for inference input 'INPUT0' for model 'text', got 1"),
    "unknown datatype": (_grpc_request([b"\0" * 16], "FP128"),
                         f"{ID} inference input 'INPUT0' data-type is '<invalid>', but model 'fp32' expects 'FP32'"),
    "BYTES element count": (_grpc_request([struct.pack("<I", 1) + b"a"], "BYTES", (1, 2), "text"),
                            f"{ID} expected 2 string elements for inference input 'INPUT0' for model 'text', got 1"),
    # the same shapes as over HTTP (gRPC shapes are int64s, so no booleans)
    "shape too large": (_grpc_request([b""], shape=(HUGE, HUGE, 0)), f"input 'INPUT0': shape [{HUGE}, {HUGE}, 0] has too many elements"),
    "shape of 65 dimensions": (_grpc_request([b"\0" * 4], shape=(1,) * 65), "has more than 64 dimensions"),
}


@pytest.mark.parametrize("case", list(GRPC_CASES))
def test_grpc_bad_messages(server, case):
    request, fragment = GRPC_CASES[case]
    error = _grpc_call(server, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in error.details()
    _assert_still_serving(server)


# reserved request parameters of the wrong type, refused for every model (Triton's front ends do the same):
# case -> (parameters as JSON values, the same as gRPC InferParameters, message fragment)
RESERVED_CASES = {
    "timeout a string": ({"timeout": "5"}, {"timeout": pb.InferParameter(string_param="5")},
                         "Unable to parse 'timeout': expected an unsigned 64-bit integer, got '5'"),
    "timeout negative": ({"timeout": -5}, {"timeout": pb.InferParameter(int64_param=-5)},
                         "Unable to parse 'timeout': expected an unsigned 64-bit integer, got -5"),
    "priority a boolean": ({"priority": True}, {"priority": pb.InferParameter(bool_param=True)},
                           "Unable to parse 'priority': expected an unsigned 64-bit integer, got True"),
    "priority a float": ({"priority": 1.5}, {"priority": pb.InferParameter(double_param=1.5)},
                         "Unable to parse 'priority': expected an unsigned 64-bit integer, got 1.5"),
    "sequence_start an integer": ({"sequence_start": 1}, {"sequence_start": pb.InferParameter(int64_param=1)},
                                  "Unable to parse 'sequence_start': expected true or false, got 1"),
    "sequence_end a string": ({"sequence_end": "yes"}, {"sequence_end": pb.InferParameter(string_param="yes")},
                              "Unable to parse 'sequence_end': expected true or false, got 'yes'"),
    "sequence_id a boolean": ({"sequence_id": False}, {"sequence_id": pb.InferParameter(bool_param=False)},
                              "Unable to parse 'sequence_id': expected an unsigned 64-bit integer or a string, got False"),
    "unknown triton_ key": ({"triton_secret": 1}, {"triton_secret": pb.InferParameter(int64_param=1)},
                            "parameter keys starting with 'triton_' are reserved for Triton usage"),
}
GOOD_INPUT = {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
#: the cases Triton's gRPC front end refuses by the parameter's kind, in its words (``SetInferenceRequestMetadata``)
GRPC_RESERVED_WORDS = {
    "timeout a string": "invalid value type for 'timeout' parameter, expected int64_param.",
    "priority a boolean": "invalid value type for 'priority' parameter, expected int64_param or uint64_param.",
    "priority a float": "invalid value type for 'priority' parameter, expected int64_param or uint64_param.",
    "sequence_start an integer": "invalid value type for 'sequence_start' parameter, expected bool_param.",
    "sequence_end a string": "invalid value type for 'sequence_end' parameter, expected bool_param.",
    "sequence_id a boolean": "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.",
}

#: the cases Triton's gRPC front end serves (an int64 timeout goes to a uint64 as it is: -5 is 2**64 - 5;
#: recorded in ``grpc/test_triton_differential.py``)
GRPC_SERVED = ("timeout negative",)


def _fp32_stats(server) -> dict:
    return server.client("http").get_inference_statistics("fp32")["model_stats"][0]["inference_stats"]


@pytest.mark.parametrize("case", list(RESERVED_CASES))
def test_http_reserved_parameter_of_the_wrong_type(server, case):
    parameters, _, fragment = RESERVED_CASES[case]
    before = _fp32_stats(server)
    response = _post(server, json.dumps({"inputs": [GOOD_INPUT], "parameters": parameters}).encode())
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]
    assert _fp32_stats(server)["fail"] == before["fail"]  # refused before the model: its statistics are untouched
    _assert_still_serving(server)


@pytest.mark.parametrize("case", [case for case in RESERVED_CASES if case not in GRPC_SERVED])
def test_grpc_reserved_parameter_of_the_wrong_type(server, case):
    _, parameters, fragment = RESERVED_CASES[case]
    fragment = GRPC_RESERVED_WORDS.get(case, fragment)
    request = _grpc_request([np.arange(4, dtype=np.float32).tobytes()])
    for key, value in parameters.items():
        request.parameters[key].CopyFrom(value)
    error = _grpc_call(server, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in error.details()
    _assert_still_serving(server)


@pytest.mark.parametrize(("body", "fragment"), [
    ({"inputs": [GOOD_INPUT], "parameters": {"binary_data_output": "yes"}},
     "Unable to parse 'binary_data_output': expected true or false, got 'yes'"),
    ({"inputs": [GOOD_INPUT], "parameters": {"triton_enable_empty_final_response": True}},
     "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified"),
    ({"inputs": [GOOD_INPUT], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": 1}}]},
     "output 'OUTPUT0': Unable to parse 'binary_data': expected true or false, got 1"),
    ({"inputs": [GOOD_INPUT], "id": 7}, "Unable to parse 'id': expected a string, got 7"),
    # each was served: Triton 2.51 refuses them (a 400 with these words; the two below are its 500s)
    ({"inputs": [GOOD_INPUT], "parameters": {"custom": [1, 2]}},
     "parameter 'custom' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"inputs": [GOOD_INPUT], "parameters": {"custom": None}}, "parameter 'custom' has invalid type"),
    ({"inputs": [GOOD_INPUT], "outputs": [{"name": "OUTPUT0", "parameters": {"classification": None}}]},
     "output 'OUTPUT0': 'classification' must be a positive integer, got None"),
])
def test_http_only_parameters_of_the_wrong_type(server, body, fragment):
    response = _post(server, json.dumps(body).encode())
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]
    _assert_still_serving(server)


def test_reserved_parameters_of_the_right_type_are_served(server):
    """The same keys with Triton's types pass on a model that reads none of them (HTTP and gRPC)."""
    parameters = {"timeout": 0, "priority": 0, "sequence_start": False, "sequence_end": False, "binary_data_output": False}
    response = _post(server, json.dumps({"inputs": [GOOD_INPUT], "parameters": parameters, "id": "r1"}).encode())
    assert response.status_code == 200, response.text
    assert response.json()["id"] == "r1"
    request = _grpc_request([np.arange(4, dtype=np.float32).tobytes()])
    request.parameters["timeout"].int64_param = 0
    request.parameters["priority"].uint64_param = 1
    request.parameters["triton_enable_empty_final_response"].bool_param = False
    with grpc.insecure_channel(server.grpc_url) as channel:
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == [0, 1, 2, 3]


def test_grpc_typed_contents_accepted(server):
    request = pb.ModelInferRequest(model_name="fp32")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.5])
    with grpc.insecure_channel(server.grpc_url) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [1.0, 2.0, 3.0, 4.5]


def test_models_that_fail_to_load_leave_the_others_serving(server):
    index = {row["name"]: row for row in server.client("http").get_model_repository_index()}
    assert index["fp32"]["state"] == "READY"
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "TYPE_NOPE" in index["broken"]["reason"]
    assert index["fails_load"]["state"] == "UNAVAILABLE"
    assert "ferry_test asked to fail loading" in index["fails_load"]["reason"]
    client = server.client("http")
    assert client.is_server_live()
    assert not client.is_server_ready()  # strict readiness: not every model is ready
    assert not client.is_model_ready("broken")
    _assert_still_serving(server)


# a model with no READY version, as tritonserver 2.51 answers (all three were 503 "... is not ready"):
# version -> (HTTP status, gRPC code, message)
NOT_READY_CASES = {
    "": (404, grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'fails_load' has no available versions"),
    "1": (503, grpc.StatusCode.UNAVAILABLE, "Request for unknown model: 'fails_load' version 1 is not at ready state"),
    "2": (404, grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'fails_load' version 2 is not found"),
}


@pytest.mark.parametrize("version", list(NOT_READY_CASES))
def test_infer_to_a_model_that_failed_to_load(server, version):
    status, code, message = NOT_READY_CASES[version]
    path = f"fails_load/versions/{version}" if version else "fails_load"
    response = _post(server, json.dumps({"inputs": [GOOD_INPUT]}).encode(), model=path)
    assert (response.status_code, response.json()) == (status, {"error": message})
    request = _grpc_request([np.arange(4, dtype=np.float32).tobytes()], model="fails_load")
    request.model_version = version
    error = _grpc_call(server, request)
    assert (error.code(), error.details()) == (code, message)
    _assert_still_serving(server)


# routes and methods tritonserver does not serve: its {"error": ...} body (tritonclient reads 'error'), never
# FastAPI's {"detail": ...}, and no 307 redirect for a trailing slash. case -> (method, path, status, error)
ROUTE_CASES = {
    "unknown route": ("GET", "/v2/nope", 404, "Not Found"),
    "trailing slash": ("GET", "/v2/models/fp32/", 404, "Not Found"),  # was a 307 to /v2/models/fp32
    "server metadata with a slash": ("GET", "/v2/", 404, "Not Found"),
    "POST on live": ("POST", "/v2/health/live", 405, "Method Not Allowed"),
    "DELETE on metadata": ("DELETE", "/v2/models/fp32", 405, "Method Not Allowed"),
    "GET on load": ("GET", "/v2/repository/models/fp32/load", 405, "Method Not Allowed"),
    "GET on infer": ("GET", "/v2/models/fp32/infer", 405, "Method Not Allowed"),  # was 404
    "GET on versioned infer": ("GET", "/v2/models/fp32/versions/1/infer", 405, "Method Not Allowed"),
    "model name with a slash": ("POST", "/v2/repository/models/..%2Fx/load", 404, "Not Found"),
    # tritonserver's routes take [0-9]+ versions only (these were 400 "failed to parse model version")
    "version not a number": ("GET", "/v2/models/fp32/versions/abc", 404, "Not Found"),
    "negative version": ("GET", "/v2/models/fp32/versions/-1/config", 404, "Not Found"),
    # infer too (these were 400 "failed to get model version from specified version string")
    "infer version not a number": ("POST", "/v2/models/fp32/versions/abc/infer", 404, "Not Found"),
    "infer negative version": ("POST", "/v2/models/fp32/versions/-1/infer", 404, "Not Found"),
    "infer version with a suffix": ("POST", "/v2/models/fp32/versions/1x/infer", 404, "Not Found"),  # was served
    "infer version of an unknown model": ("POST", "/v2/models/absent/versions/abc/infer", 404, "Not Found"),
    # and the generate extension's routes (these were 400 "failed to get model version ...")
    "generate version not a number": ("POST", "/v2/models/fp32/versions/abc/generate", 404, "Not Found"),
    "generate_stream negative version": ("POST", "/v2/models/fp32/versions/-1/generate_stream", 404, "Not Found"),
    "not ready": ("GET", "/v2/models/absent/ready", 400, "Model version not ready"),  # was an empty body
}


@pytest.mark.parametrize("case", list(ROUTE_CASES))
def test_http_unknown_routes_and_methods(server, case):
    method, path, status, error = ROUTE_CASES[case]
    response = httpx.request(method, f"http://{server.http_url}{path}", timeout=30)
    assert response.status_code == status, response.text
    assert response.json() == {"error": error}
    _assert_still_serving(server)


@pytest.mark.parametrize("kind", ["system", "cuda"])
def test_http_shared_memory_register_without_a_region(threaded_server, tmp_path, kind):
    """Triton's 400 for a register request without a region name (the route was unknown: 404 {"detail": ...})."""
    server = threaded_server([tmp_path], allow_client_shm=True)
    body = {"key": "/x", "byte_size": 8} if kind == "system" else {"raw_handle": {"b64": "AAAA"}, "device_id": 0,
                                                                    "byte_size": 8}
    response = httpx.post(f"http://{server.http_url}/v2/{kind}sharedmemory/register", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json() == {"error": f"'region name' is necessary to register {kind} shared memory region"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_the_model_cannot_run_fails_alone_in_its_batch(threaded_server, tmp_path, protocol):
    """Dynamic batching puts a request whose strings simple_string's ONNX ``Cast`` cannot read ("abc") in one
    batch with three good ones (preferred_batch_size 4; the statistics show the one execution): the bad request
    gets 500 / INTERNAL naming the model, the three good ones their sums. All four failed with that error (so
    does Triton's onnxruntime backend: a failed run fails every request of its batch)."""
    import shutil
    import threading

    from tritonclient.utils import InferenceServerException

    from support.server import DEFAULT_MODELS

    model = tmp_path / "strings"
    shutil.copytree(DEFAULT_MODELS / "simple_string", model)
    config = (model / "config.pbtxt").read_text().replace('name: "simple_string"', 'name: "strings"')
    (model / "config.pbtxt").write_text(
        config + "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 10000000 }\n")
    server = threaded_server([tmp_path])
    module = server.module(protocol)
    results: dict[str, object] = {}

    def send(value: bytes) -> None:
        inputs = []
        for name, data in (("INPUT0", value), ("INPUT1", b"1")):
            tensor = module.InferInput(name, [1, 16], "BYTES")
            tensor.set_data_from_numpy(np.array([[data] * 16], dtype=object))
            inputs.append(tensor)
        try:
            results[value.decode()] = server.client(protocol).infer("strings", inputs).as_numpy("OUTPUT0").tolist()
        except InferenceServerException as exc:
            results[value.decode()] = (str(exc.status()), exc.message())

    threads = [threading.Thread(target=send, args=(value,)) for value in (b"1", b"abc", b"2", b"3")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    stats = server.client("http").get_inference_statistics("strings")["model_stats"][0]
    assert stats["execution_count"] == 1 and stats["inference_stats"]["fail"]["count"] == 1  # one batch of four
    assert stats["inference_count"] == 3  # the good ones (it was 0)
    status, message = results.pop("abc")
    assert status == {"http": "500", "grpc": "StatusCode.INTERNAL"}[protocol]
    assert message.startswith("onnxruntime failed to run model 'strings'") and "Cast" in message
    assert results == {value: [[str(int(value) + 1).encode()] * 16] for value in ("1", "2", "3")}
