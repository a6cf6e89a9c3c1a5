"""One parity suite: every protocol case runs over HTTP and over gRPC with tritonclient and must agree.

Covers health, server and model metadata, config, inference of every datatype (binary and JSON tensors over
HTTP, raw contents over gRPC), BYTES, compression, statistics, and the error code + message of each failure.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from support.server import ServerThread, make_options, test_model_config, write_model

PROTOCOLS = ["http", "grpc"]

#: wire datatype -> (config type, numpy sample)
DATATYPES = {
    "BOOL": ("TYPE_BOOL", np.array([[True, False, True, False]])),
    "UINT8": ("TYPE_UINT8", np.array([[0, 1, 200, 255]], dtype=np.uint8)),
    "UINT16": ("TYPE_UINT16", np.array([[0, 1, 2000, 65535]], dtype=np.uint16)),
    "UINT32": ("TYPE_UINT32", np.array([[0, 1, 2**31, 2**32 - 1]], dtype=np.uint32)),
    "UINT64": ("TYPE_UINT64", np.array([[0, 1, 2**40, 2**63 + 5]], dtype=np.uint64)),
    "INT8": ("TYPE_INT8", np.array([[-128, -1, 0, 127]], dtype=np.int8)),
    "INT16": ("TYPE_INT16", np.array([[-32768, -1, 0, 32767]], dtype=np.int16)),
    "INT32": ("TYPE_INT32", np.array([[-(2**31), -1, 0, 2**31 - 1]], dtype=np.int32)),
    "INT64": ("TYPE_INT64", np.array([[-(2**63), -1, 0, 2**63 - 1]], dtype=np.int64)),
    "FP16": ("TYPE_FP16", np.array([[-1.5, 0.0, 0.25, 65504.0]], dtype=np.float16)),
    "FP32": ("TYPE_FP32", np.array([[-1.5, 0.0, 3.25, 1e30]], dtype=np.float32)),
    "FP64": ("TYPE_FP64", np.array([[-1.5, 0.0, 3.25, 1e300]], dtype=np.float64)),
    "BYTES": ("TYPE_STRING", np.array([[b"a", b"", "\u00e9t\u00e9".encode(), b"\x00\x01 bin"]], dtype=np.object_)),
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("parity")
    for datatype, (config_type, _) in DATATYPES.items():
        write_model(tmp_path, f"id_{datatype.lower()}", test_model_config(f"id_{datatype.lower()}", config_type))
    for protocol in PROTOCOLS:
        write_model(tmp_path, f"stats_{protocol}", test_model_config(f"stats_{protocol}"))
    write_model(tmp_path, "nobatch", test_model_config("nobatch", "TYPE_INT32", "[ 2, 3 ]", max_batch_size=0))
    write_model(
        tmp_path,
        "failing",
        test_model_config("failing", extra='parameters { key: "fail_on_value" value { string_value: "13" } }'),
    )
    return tmp_path


@pytest.fixture(scope="module")
def server(repository):
    thread = ServerThread(make_options([repository]))
    yield thread.start()
    thread.stop()


def _infer(handle, protocol: str, model: str, arrays: dict[str, np.ndarray], *, binary: bool = True, **kwargs):
    client = handle.client(protocol)
    module = handle.module(protocol)
    inputs = []
    for name, array in arrays.items():
        datatype = np_to_triton_dtype(array.dtype)
        tensor = module.InferInput(name, list(array.shape), datatype)
        if protocol == "http":
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    outputs = None
    if protocol == "http" and not binary:
        outputs = [module.InferRequestedOutput("OUTPUT0", binary_data=False)]
    return client.infer(model, inputs, outputs=outputs, **kwargs)


def _error(function, *args, **kwargs) -> tuple[str, str]:
    """(status, message) of the InferenceServerException raised by ``function``, normalized across protocols."""
    with pytest.raises(InferenceServerException) as info:
        function(*args, **kwargs)
    status = str(info.value.status())
    codes = {"StatusCode.INVALID_ARGUMENT": "400", "StatusCode.NOT_FOUND": "404",
             "StatusCode.UNAVAILABLE": "503", "StatusCode.INTERNAL": "500", "StatusCode.UNIMPLEMENTED": "501"}
    return codes.get(status, status), info.value.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_health_and_server_metadata(server, protocol):
    client = server.client(protocol)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("id_fp32")
    assert not client.is_model_ready("absent")
    meta = client.get_server_metadata()
    if protocol == "grpc":
        meta = {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}
    assert meta["name"] == "triton"
    assert "statistics" in meta["extensions"] and "binary_tensor_data" in meta["extensions"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_metadata_and_config(server, protocol):
    client = server.client(protocol)
    kwargs = {"as_json": True} if protocol == "grpc" else {}
    meta = client.get_model_metadata("id_int32", **kwargs)
    assert meta["name"] == "id_int32" and meta["versions"] == ["1"]
    assert meta["platform"] == "ferry_test"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": ["-1", "4"] if protocol == "grpc" else [-1, 4]}]
    nobatch = client.get_model_metadata("nobatch", **kwargs)
    assert [int(d) for d in nobatch["inputs"][0]["shape"]] == [2, 3]
    config = client.get_model_config("id_int32", **kwargs)
    config = config["config"] if protocol == "grpc" else config
    assert config["name"] == "id_int32"
    assert int(config["max_batch_size"]) == 8
    assert config["input"][0]["data_type"] == "TYPE_INT32"


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_infer_every_datatype(server, protocol, datatype):
    array = DATATYPES[datatype][1]
    result = _infer(server, protocol, f"id_{datatype.lower()}", {"INPUT0": array})
    out = result.as_numpy("OUTPUT0")
    assert out.shape == array.shape
    if datatype == "BYTES":
        assert [bytes(x) for x in out.flat] == [bytes(x) for x in array.flat]
    else:
        assert out.dtype == array.dtype
        np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d not in ("FP16",)])
def test_http_json_tensors_both_ways(server, datatype):
    array = DATATYPES[datatype][1]
    if datatype == "BYTES":
        array = np.array([["a", "", "\u00e9t\u00e9", "xyz"]], dtype=np.object_)
    result = _infer(server, "http", f"id_{datatype.lower()}", {"INPUT0": array}, binary=False)
    out = result.as_numpy("OUTPUT0")
    if datatype == "BYTES":
        assert [x.decode() if isinstance(x, bytes) else x for x in out.flat] == list(array.flat)
    else:
        np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
@pytest.mark.parametrize("binary_input", [True, False])
def test_http_json_outputs_keep_nan_and_infinities(server, datatype, binary_input):
    """Non-finite floats in a JSON output are written as Triton 2.51 writes them (recorded live from a python model:
    ``"data":[NaN,Infinity,-Infinity,1e300]``), tokens tritonclient reads back as those values; Ferry wrote
    ``null``, which tritonclient read as NaN, the infinities included. tritonclient writes such JSON inputs with
    the same tokens, which Triton reads (recorded live) and Ferry refused as not JSON (400)."""
    array = np.array([[np.nan, np.inf, -np.inf, 1.5]], dtype=DATATYPES[datatype][1].dtype)
    client, module = server.client("http"), server.module("http")
    tensor = module.InferInput("INPUT0", list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary_input)
    outputs = [module.InferRequestedOutput("OUTPUT0", binary_data=False)]
    result = client.infer(f"id_{datatype.lower()}", [tensor], outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)
    body = httpx.post(f"http://{server.http_url}/v2/models/id_{datatype.lower()}/infer", timeout=30, json={
        "inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    assert b"null" not in body.content and body.json()["outputs"][0]["data"] == [1, 2, 3, 4]  # finite: plain JSON


def test_http_json_refuses_fp16(server):
    array = DATATYPES["FP16"][1]
    status, message = _error(_infer, server, "http", "id_fp16", {"INPUT0": array}, binary=False)
    assert status == "400" and "FP16" in message and "binary" in message


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_and_responses(server, protocol, algorithm):
    array = np.arange(32, dtype=np.float32).reshape(8, 4)
    if protocol == "http":
        kwargs = {"request_compression_algorithm": algorithm, "response_compression_algorithm": algorithm}
    else:
        kwargs = {"compression_algorithm": algorithm}
    result = _infer(server, protocol, "id_fp32", {"INPUT0": array}, **kwargs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_aio_clients(server, protocol):
    array = np.arange(8, dtype=np.int32).reshape(2, 4)

    async def body():
        if protocol == "http":
            import tritonclient.http.aio as aioclient

            client = aioclient.InferenceServerClient(server.http_url)
        else:
            import tritonclient.grpc.aio as aioclient

            client = aioclient.InferenceServerClient(server.grpc_url)
        try:
            assert await client.is_server_ready()
            tensor = aioclient.InferInput("INPUT0", [2, 4], "INT32")
            tensor.set_data_from_numpy(array)
            result = await client.infer("id_int32", [tensor])
            return result.as_numpy("OUTPUT0")
        finally:
            await client.close()

    np.testing.assert_array_equal(asyncio.run(body()), array)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_statistics_invariants(server, protocol):
    array = np.ones((3, 4), dtype=np.float32)
    for _ in range(3):
        _infer(server, protocol, f"stats_{protocol}", {"INPUT0": array})
    client = server.client(protocol)
    kwargs = {"as_json": True} if protocol == "grpc" else {}
    stats = client.get_inference_statistics(f"stats_{protocol}", **kwargs)
    (entry,) = stats["model_stats"]
    inference = entry["inference_stats"]
    assert entry["name"] == f"stats_{protocol}" and entry["version"] == "1"
    assert int(entry["inference_count"]) == 9 and int(entry["execution_count"]) == 3
    assert int(inference["success"]["count"]) == 3 == int(inference["queue"]["count"])
    counts = {int(inference[k]["count"]) for k in ("compute_input", "compute_infer", "compute_output")}
    assert counts == {3}
    assert int(inference["success"]["ns"]) >= int(inference["compute_infer"]["ns"]) > 0
    (batch,) = entry["batch_stats"]
    assert int(batch["batch_size"]) == 3 and int(batch["compute_infer"]["count"]) == 3


# ---- errors: identical status and message over both protocols -------------------------------------------------

ERROR_CASES = {
    "unknown model": (lambda h, p: _infer(h, p, "absent", {"INPUT0": np.ones((1, 4), np.float32)}),
                      "404", "Request for unknown model: 'absent' is not found"),
    "unknown version": (lambda h, p: _infer(h, p, "id_fp32", {"INPUT0": np.ones((1, 4), np.float32)}, model_version="7"),
                        "404", "'id_fp32' version 7 is not found"),
    "wrong shape": (lambda h, p: _infer(h, p, "id_fp32", {"INPUT0": np.ones((1, 5), np.float32)}),
                    "400", "unexpected shape for input 'INPUT0' for model 'id_fp32'. Expected [-1,4], got [1,5]"),
    "wrong datatype": (lambda h, p: _infer(h, p, "id_fp32", {"INPUT0": np.ones((1, 4), np.int32)}),
                       "400", "inference input 'INPUT0' data-type is 'INT32', but model 'id_fp32' expects 'FP32'"),
    "extra input": (lambda h, p: _infer(h, p, "id_fp32", {"INPUT0": np.ones((1, 4), np.float32), "EXTRA": np.ones((1, 4), np.float32)}),
                    "400", "[request id: <id_unknown>] expected 1 inputs but got 2 inputs for model 'id_fp32'"),
    "missing input": (lambda h, p: _infer(h, p, "id_fp32", {"OTHER": np.ones((1, 4), np.float32)}),
                      "400", "unexpected inference input 'OTHER'"),
    "batch too large": (lambda h, p: _infer(h, p, "id_fp32", {"INPUT0": np.ones((9, 4), np.float32)}),
                        "400", "batch-size must be <= 8 for 'id_fp32'"),
    "execute raises": (lambda h, p: _infer(h, p, "failing", {"INPUT0": np.full((1, 4), 13, np.float32)}),
                       "500", "ferry_test model failed on value 13.0"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_identical_over_both_protocols(server, case):
    call, status, fragment = ERROR_CASES[case]
    results = {}
    for protocol in PROTOCOLS:
        results[protocol] = _error(call, server, protocol)
        assert results[protocol][0] == status, (protocol, results[protocol])
        assert fragment in results[protocol][1], (protocol, results[protocol])
    assert results["http"] == results["grpc"]
    # the server keeps serving after every bad request
    ok = _infer(server, "grpc", "id_fp32", {"INPUT0": np.ones((1, 4), np.float32)})
    assert ok.as_numpy("OUTPUT0").shape == (1, 4)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_metadata_errors(server, protocol):
    client = server.client(protocol)
    status, message = _error(client.get_model_metadata, "absent")
    assert status == "404" and "Request for unknown model: 'absent' is not found" in message
    status, message = _error(client.get_model_config, "absent")
    assert status == "404"


# ---- version strings and statistics: tritonserver 2.51's answers, checked side by side ----------------------------

STOL = "version should be an integral value > 0"
#: version string -> (HTTP (status, message), gRPC (status, message)); None = served. Triton's HTTP routes match
#: versions as [0-9]+ (anything else is an unknown route); its gRPC front end reads them with std::stol.
VERSION_CASES = {
    "abc": (("404", "Not Found"),
            ("400", f"failed to get model version from specified version string 'abc' (details: stol), {STOL}")),
    "-1": (("404", "Not Found"), ("400", f"invalid model version specified '-1' , {STOL}")),
    # was 404 "version 99999999999999999999 is not found"
    "99999999999999999999": (("400", "failed to get model version from specified version string "
                                     f"'99999999999999999999' (details: stol), {STOL}"),) * 2,
    "01": (None, None),  # was 404: the version is 1
    "007": (("404", "Request for unknown model: 'id_fp32' version 7 is not found"),) * 2,
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("version", list(VERSION_CASES))
def test_model_version_strings(server, protocol, version):
    expected = VERSION_CASES[version][PROTOCOLS.index(protocol)]
    client = server.client(protocol)
    for call in (client.get_model_metadata, client.get_model_config):
        if expected is None:
            call("id_fp32", version)
        else:
            assert _error(call, "id_fp32", version) == expected
    # infer answers as the other routes (HTTP infer said 400 "failed to get model version" for 'abc' and '-1')
    inputs = {"INPUT0": np.ones((1, 4), np.float32)}
    if expected is None:
        assert _infer(server, protocol, "id_fp32", inputs, model_version=version).as_numpy("OUTPUT0").shape == (1, 4)
    else:
        assert _error(_infer, server, protocol, "id_fp32", inputs, model_version=version) == expected
    if expected is None or expected[1].startswith("Request for unknown model"):
        assert client.is_model_ready("id_fp32", version) == (expected is None)
    elif protocol == "grpc":  # a version gRPC cannot parse is refused, not "not ready" (was ready=false)
        assert _error(client.is_model_ready, "id_fp32", version) == expected
    else:
        assert not client.is_model_ready("id_fp32", version)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_statistics_errors(server, protocol):
    """Triton's 400s (they were 404 'Request for unknown model'); a version without a model is ignored (was 400)."""
    client = server.client(protocol)
    assert _error(client.get_inference_statistics, "absent") == ("400", "requested model 'absent' is not available")
    assert _error(client.get_inference_statistics, "id_fp32", "7") == (
        "400", "requested model version is not available for model 'id_fp32'")
    kwargs = {"as_json": True} if protocol == "grpc" else {}
    stats = client.get_inference_statistics("", "1", **kwargs)["model_stats"]
    assert {entry["name"] for entry in stats} >= {"id_fp32", "nobatch"}
