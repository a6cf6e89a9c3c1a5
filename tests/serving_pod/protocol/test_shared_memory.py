"""System shared memory extension: tritonclient's shm utilities round-trip inputs and outputs over HTTP and gRPC.

Also: region status/unregister through both protocols, outputs too large for their region,
perf_analyzer ``--shared-memory system`` (skipped when perf_analyzer cannot be installed here), and the
answers once different from Triton 2.51's (found and compared in ``test_shared_memory_triton.py``).
"""

from __future__ import annotations

import base64
import threading
import time
import uuid

import httpx
import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from support.server import test_model_config, write_model

PROTOCOLS = ["http", "grpc"]
SLOW = 'parameters { key: "execute_delay_ms" value { string_value: "1000" } }'


@pytest.fixture
def server(threaded_server, tmp_path):
    write_model(tmp_path, "idt", test_model_config("idt"))
    write_model(tmp_path, "idt_int", test_model_config("idt_int", datatype="TYPE_INT32", dims="[ 16 ]"))
    write_model(tmp_path, "slow", test_model_config("slow", extra=SLOW))
    write_model(tmp_path, "idt_text",
                test_model_config("idt_text", datatype="TYPE_STRING", dims="[ -1 ]", max_batch_size=0))
    return threaded_server([tmp_path], allow_client_shm=True)


@pytest.fixture
def regions():
    """Create tritonclient shm regions with unique keys; destroyed after the test."""
    made = []

    def make(name: str, byte_size: int):
        handle = shm.create_shared_memory_region(name, f"/ferry_{uuid.uuid4().hex[:12]}", byte_size)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _key(handle) -> str:
    return handle._shm_key


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_and_outputs_round_trip_through_shared_memory(server, regions, protocol):
    client, module = server.client(protocol), server.module(protocol)
    data = np.arange(8, dtype=np.float32).reshape(2, 4) * 1.5
    in_region = regions("in0", data.nbytes)
    out_region = regions("out0", data.nbytes + 16)
    shm.set_shared_memory_region(in_region, [data])
    client.unregister_system_shared_memory()
    client.register_system_shared_memory("in0", _key(in_region), data.nbytes)
    client.register_system_shared_memory("out0", _key(out_region), data.nbytes + 16)

    infer_input = module.InferInput("INPUT0", [2, 4], "FP32")
    infer_input.set_shared_memory("in0", data.nbytes)
    output = module.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out0", data.nbytes, offset=16)
    result = client.infer("idt", [infer_input], outputs=[output])

    meta = result.get_output("OUTPUT0")
    shape = meta["shape"] if protocol == "http" else list(meta.shape)
    assert shape == [2, 4]
    got = shm.get_contents_as_numpy(out_region, np.float32, [2, 4], offset=16)
    np.testing.assert_array_equal(got, data)
    # the data went to shared memory only, not into the response
    if protocol == "http":
        assert set(meta) == {"name", "datatype", "shape"}
    else:
        assert result.get_response().raw_output_contents == [b""]

    status = client.get_system_shared_memory_status()
    names = sorted(r["name"] for r in status) if protocol == "http" else sorted(status.regions)
    assert names == ["in0", "out0"]
    client.unregister_system_shared_memory("in0")
    client.unregister_system_shared_memory()
    status = client.get_system_shared_memory_status()
    assert (status if protocol == "http" else list(status.regions)) == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_input_at_an_offset_and_mixed_with_regular_inputs(server, regions, protocol):
    client, module = server.client(protocol), server.module(protocol)
    data = np.arange(32, dtype=np.int32).reshape(2, 16)
    region = regions("both", 64 + data.nbytes)
    shm.set_shared_memory_region(region, [data], offset=64)
    client.register_system_shared_memory("both", _key(region), 64 + data.nbytes)
    try:
        infer_input = module.InferInput("INPUT0", [2, 16], "INT32")
        infer_input.set_shared_memory("both", data.nbytes, offset=64)
        result = client.infer("idt_int", [infer_input])  # output comes back in the response
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        client.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_output_larger_than_its_region_is_refused(server, regions, protocol):
    client, module = server.client(protocol), server.module(protocol)
    data = np.ones((2, 4), dtype=np.float32)
    small = regions("small", 8)
    client.register_system_shared_memory("small", _key(small), 8)
    try:
        infer_input = module.InferInput("INPUT0", [2, 4], "FP32")
        infer_input.set_data_from_numpy(data)
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("small", 8)
        with pytest.raises(InferenceServerException, match="should be at least 32 bytes"):
            client.infer("idt", [infer_input], outputs=[output])
    finally:
        client.unregister_system_shared_memory()


def test_duplicate_region_name_is_already_exists(server, regions):
    client = server.client("grpc")
    region = regions("dup", 64)
    client.register_system_shared_memory("dup", _key(region), 64)
    try:
        with pytest.raises(InferenceServerException, match="already in manager") as info:
            client.register_system_shared_memory("dup", _key(region), 64)
        assert info.value.status() == "StatusCode.ALREADY_EXISTS"
    finally:
        client.unregister_system_shared_memory()


def test_cuda_shared_memory_without_a_gpu_is_unsupported_but_status_works(server):
    from serving_pod.core.errors import UnsupportedError
    from serving_pod.cuda_shm import _runtime

    try:
        _runtime()
    except UnsupportedError:
        pass  # no cuda-python, or no CUDA device visible to it
    else:
        pytest.skip("a CUDA device is visible here: test_cuda_shared_memory.py covers this host")
    for protocol in PROTOCOLS:
        client = server.client(protocol)
        with pytest.raises(InferenceServerException, match="CUDA shared memory is not supported"):
            # a well-formed handle (base64 of a 64-byte cudaIpcMemHandle_t): one of another size is refused first
            client.register_cuda_shared_memory("gpu0", base64.b64encode(bytes(64)), 0, 64)
        client.unregister_cuda_shared_memory()  # perf_analyzer does this at start
        status = client.get_cuda_shared_memory_status()
        assert (status if protocol == "http" else list(status.regions)) == []


@pytest.mark.perf_analyzer
@pytest.mark.timeout(240)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_perf_analyzer_shared_memory_system(server, protocol):
    from support.perf_analyzer import check_shared_memory_run

    check_shared_memory_run(server, protocol, "system")


# --- differences from Triton 2.51 found by test_shared_memory_triton.py, fixed in Ferry ----------------------

def _grpc_stub(server):
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))


def _grpc_infer_request(params: dict, *, outputs=(), raw: bytes | None = None):
    """``idt_int`` request whose INPUT0 has ``params`` ({key: (kind, value)}); ``outputs`` are (name, params)."""
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name="idt_int")
    tensor = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    for key, (kind, value) in params.items():
        setattr(tensor.parameters[key], kind, value)
    for name, out_params in outputs:
        out = request.outputs.add(name=name)
        for key, (kind, value) in out_params.items():
            setattr(out.parameters[key], kind, value)
    if raw is not None:
        request.raw_input_contents.append(raw)
    return request


def test_duplicate_region_name_is_400_over_http_and_already_exists_over_grpc(server, regions):
    region = regions("dup", 64)
    http, grpc_client = server.client("http"), server.client("grpc")
    http.register_system_shared_memory("dup", _key(region), 64)
    try:
        with pytest.raises(InferenceServerException, match="shared memory region 'dup' already in manager") as info:
            http.register_system_shared_memory("dup", _key(region), 64)
        assert info.value.status() == "400"  # Triton's; was 409
        with pytest.raises(InferenceServerException, match="already in manager") as info:
            grpc_client.register_system_shared_memory("dup", _key(region), 64)
        assert info.value.status() == "StatusCode.ALREADY_EXISTS"
    finally:
        http.unregister_system_shared_memory()


@pytest.mark.parametrize("field, value, named", [
    ("data", list(range(16)), "set 'data' 'shared_memory_region'"),
    ("binary_data_size", 64, "set 'binary_data_size' 'shared_memory_region'"),
    ("shared_memory_region", None, "no field is set"),  # only shared_memory_offset / _byte_size: no region
])
def test_http_input_with_not_exactly_one_data_source_is_refused(server, regions, field, value, named):
    import httpx

    region = regions("in", 64)
    shm.set_shared_memory_region(region, [np.arange(16, dtype=np.int32) + 100])
    client = server.client("http")
    client.register_system_shared_memory("in", _key(region), 64)
    try:
        tensor = {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16],
                  "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 64}}
        if field == "data":
            tensor["data"] = value  # the region's bytes used to win silently
        elif value is None:
            del tensor["parameters"][field]
        else:
            tensor["parameters"][field] = value
        response = httpx.post(f"http://{server.http_url}/v2/models/idt_int/infer", json={"inputs": [tensor]})
        assert response.status_code == 400
        assert response.json()["error"] == (
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            f"'shared_memory_region' in 'parameters'. But {named}"
        )
        infer_input = httpclient_input(server, "http", "in")
        np.testing.assert_array_equal(client.infer("idt_int", [infer_input]).as_numpy("OUTPUT0")[0],
                                      np.arange(16, dtype=np.int32) + 100)
    finally:
        client.unregister_system_shared_memory()


def httpclient_input(server, protocol: str, region: str):
    infer_input = server.module(protocol).InferInput("INPUT0", [1, 16], "INT32")
    infer_input.set_shared_memory(region, 64)
    return infer_input


@pytest.mark.parametrize("key, kind, value, expected", [
    ("shared_memory_byte_size", "uint64_param", 64, "int64_param"),  # was accepted
    ("shared_memory_byte_size", "string_param", "64", "int64_param"),
    ("shared_memory_offset", "bool_param", False, "int64_param"),
    ("shared_memory_offset", "double_param", 0.0, "int64_param"),
    ("shared_memory_region", "int64_param", 1, "string_param"),
])
def test_grpc_shared_memory_parameter_of_the_wrong_kind_is_refused(server, regions, key, kind, value, expected):
    import grpc

    region = regions("in", 64)
    client = server.client("grpc")
    client.register_system_shared_memory("in", _key(region), 64)
    try:
        params = {"shared_memory_region": ("string_param", "in"), "shared_memory_byte_size": ("int64_param", 64)}
        params[key] = (kind, value)
        for request in (_grpc_infer_request(params),
                        _grpc_infer_request({}, outputs=[("OUTPUT0", params)], raw=bytes(64))):
            with pytest.raises(grpc.RpcError) as info:
                _grpc_stub(server).ModelInfer(request)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            tensor = "INPUT0" if request.inputs[0].parameters else "OUTPUT0"
            assert info.value.details() == (
                f"invalid value type for '{key}' parameter for tensor '{tensor}', expected {expected}."
            )
        client.infer("idt_int", [httpclient_input(server, "grpc", "in")])  # still serves
    finally:
        client.unregister_system_shared_memory()


@pytest.mark.parametrize("key", ["shared_memory_offset", "shared_memory_byte_size"])
def test_grpc_offset_or_size_without_a_region_is_refused(server, key):
    import grpc

    # the input has its data in raw_input_contents: the stray parameter used to be ignored
    request = _grpc_infer_request({key: ("int64_param", 0)}, raw=np.arange(16, dtype=np.int32).tobytes())
    with pytest.raises(grpc.RpcError) as info:
        _grpc_stub(server).ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        f"'{key}' can not be specified without 'shared_memory_region' parameter for tensor 'INPUT0'"
    )


def test_grpc_output_in_shared_memory_ignores_binary_data(server, regions):
    # binary_data is an HTTP parameter: Triton's gRPC ignores it, its HTTP refuses it beside a region
    out_region = regions("out", 64)
    client = server.client("grpc")
    client.register_system_shared_memory("out", _key(out_region), 64)
    try:
        data = np.arange(16, dtype=np.int32) * 3
        out_params = {"shared_memory_region": ("string_param", "out"), "shared_memory_byte_size": ("int64_param", 64),
                      "binary_data": ("bool_param", True)}
        response = _grpc_stub(server).ModelInfer(
            _grpc_infer_request({}, outputs=[("OUTPUT0", out_params)], raw=data.tobytes()))
        assert list(response.raw_output_contents) == [b""]
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_region, np.int32, [16]), data)
        import httpx

        body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": data.tolist()}],
                "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "out",
                                                               "shared_memory_byte_size": 64, "binary_data": True}}]}
        response = httpx.post(f"http://{server.http_url}/v2/models/idt_int/infer", json=body)
        assert response.status_code == 400
        assert "can't set both 'shared_memory_region' and 'binary_data'" in response.json()["error"]
    finally:
        client.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("side", ["input", "output"])
def test_a_region_named_empty_is_not_found(server, protocol, side):
    """An input or output placed in the region '' gets Triton 2.51's answer for any region not registered (404 /
    NOT_FOUND "Unable to find shared memory region: ''", recorded live over both protocols); Ferry refused the
    name itself with 400 / INVALID_ARGUMENT."""
    module = server.module(protocol)
    infer_input = module.InferInput("INPUT0", [1, 16], "INT32")
    outputs = None
    if side == "input":
        infer_input.set_shared_memory("", 64)
    else:
        infer_input.set_data_from_numpy(np.zeros((1, 16), np.int32))
        outputs = [module.InferRequestedOutput("OUTPUT0")]
        outputs[0].set_shared_memory("", 64)
    with pytest.raises(InferenceServerException) as info:
        server.client(protocol).infer("idt_int", [infer_input], outputs=outputs)
    assert (str(info.value.status()), info.value.message()) == (
        {"http": "404", "grpc": "StatusCode.NOT_FOUND"}[protocol], "Unable to find shared memory region: ''")


@pytest.mark.parametrize("offset, size, words", [
    (-1, 64, "Invalid offset for shared memory region: 'in'"),
    (0, -64, "Invalid offset + byte size for shared memory region: 'in'"),
])
def test_grpc_negative_offset_or_size_lies_outside_the_region(server, regions, offset, size, words):
    """A negative int64 shared_memory_offset or _byte_size is read as the size_t it stands for (-1: 2**64 - 1), so
    the region's bounds refuse it with INVALID_ARGUMENT in Triton 2.51's words (recorded live), for an input and
    an output alike; Ferry refused 'a non-negative integer' in words of its own."""
    import grpc

    region = regions("in", 64)
    client = server.client("grpc")
    client.register_system_shared_memory("in", _key(region), 64)
    try:
        params = {"shared_memory_region": ("string_param", "in"), "shared_memory_byte_size": ("int64_param", size),
                  "shared_memory_offset": ("int64_param", offset)}
        for request in (_grpc_infer_request(params),
                        _grpc_infer_request({}, outputs=[("OUTPUT0", params)], raw=bytes(64))):
            with pytest.raises(grpc.RpcError) as info:
                _grpc_stub(server).ModelInfer(request)
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, words)
        client.infer("idt_int", [httpclient_input(server, "grpc", "in")])  # still serves
    finally:
        client.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_output_in_shared_memory_with_classification_is_refused(server, regions, protocol):
    """An output placed in a registered region and asking for classification gets 400 / INVALID_ARGUMENT "output
    can't set both 'shared_memory_region' and 'classification'" (Triton 2.51's words; HTTP capitalizes "Output";
    tritonclient refuses the pair itself, so the messages are sent raw). Over HTTP Ferry served it: the class
    strings went into the region and the answer was 200."""
    import grpc
    import httpx

    region = regions("out", 64)
    shm.set_shared_memory_region(region, [np.full(16, 7, np.int32)])
    client = server.client(protocol)
    client.register_system_shared_memory("out", _key(region), 64)
    placed = {"shared_memory_region": "out", "shared_memory_byte_size": 64}
    try:
        if protocol == "http":
            body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}],
                    "outputs": [{"name": "OUTPUT0", "parameters": {**placed, "classification": 2}}]}
            response = httpx.post(f"http://{server.http_url}/v2/models/idt_int/infer", json=body)
            refusal = (response.status_code, response.json()["error"])
        else:
            kinds = {"shared_memory_region": "string_param", "shared_memory_byte_size": "int64_param"}
            params = {key: (kinds[key], value) for key, value in placed.items()}
            request = _grpc_infer_request({}, outputs=[("OUTPUT0", {**params, "classification": ("int64_param", 2)})],
                                          raw=np.arange(16, dtype=np.int32).tobytes())
            with pytest.raises(grpc.RpcError) as info:
                _grpc_stub(server).ModelInfer(request)
            refusal = (info.value.code(), info.value.details())
        assert refusal == ({"http": 400, "grpc": grpc.StatusCode.INVALID_ARGUMENT}[protocol],
                           {"http": "O", "grpc": "o"}[protocol]
                           + "utput can't set both 'shared_memory_region' and 'classification'")
        np.testing.assert_array_equal(shm.get_contents_as_numpy(region, np.int32, [16]), np.full(16, 7, np.int32))
        module = server.module(protocol)  # the same request without classification is served into the region
        infer_input = module.InferInput("INPUT0", [1, 16], "INT32")
        infer_input.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("out", 64)
        client.infer("idt_int", [infer_input], outputs=[output])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(region, np.int32, [16]), np.arange(16, dtype=np.int32))
    finally:
        client.unregister_system_shared_memory()


@pytest.mark.parametrize("classification", [0, "x"])
def test_http_output_in_shared_memory_with_any_classification_is_refused(server, classification):
    """Over HTTP Triton 2.51 refuses the pair whatever the count (0, which alone means no classification, or one
    of the wrong type) and before it looks the region up: 400 "Output can't set both 'shared_memory_region' and
    'classification'" for a region never registered (recorded live; Ferry answered 404 or its own words)."""
    import httpx

    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "nope", "shared_memory_byte_size": 64,
                                                           "classification": classification}}]}
    response = httpx.post(f"http://{server.http_url}/v2/models/idt_int/infer", json=body)
    assert (response.status_code, response.json()) == (
        400, {"error": "Output can't set both 'shared_memory_region' and 'classification'"})


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("size", "words"), [
    (16, "input byte size mismatch for input 'INPUT0' for model 'idt'. Expected 32, got 16"),
    (48, "input byte size mismatch for input 'INPUT0' for model 'idt'. Expected 32, got 48"),
])
def test_input_bytes_that_do_not_fit_the_shape_are_refused_in_tritons_words(server, regions, protocol, size, words):
    """tritonserver 2.51 refuses a region's bytes that do not fit the input's shape as it refuses binary data: its
    core's words, after the model's other checks (recorded live by a side-by-side sweep). Ferry answered
    "input 'INPUT0': expected 32 bytes of FP32 data for shape [2, 4], got 16"."""
    client, module = server.client(protocol), server.module(protocol)
    region = regions("in0", 64)
    shm.set_shared_memory_region(region, [np.arange(16, dtype=np.float32)])
    client.register_system_shared_memory("in0", _key(region), 64)
    try:
        infer_input = module.InferInput("INPUT0", [2, 4], "FP32")
        infer_input.set_shared_memory("in0", size)
        with pytest.raises(InferenceServerException) as raised:
            client.infer("idt", [infer_input])
        assert raised.value.message() == f"[request id: <id_unknown>] {words}"
        assert raised.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    finally:
        client.unregister_system_shared_memory()


def test_bytes_input_that_is_malformed_is_refused_in_tritons_words(server, regions):
    """Malformed BYTES data in a region: the words tritonserver 2.51 gives (recorded live), as for binary data."""
    client = server.client("http")
    region = regions("text", 32)
    strings = b"".join(len(item).to_bytes(4, "little") + item for item in (b"ab", b"", b"xyz")) + b"\0" * 3
    shm.set_shared_memory_region(region, [np.frombuffer(strings, dtype=np.uint8)])
    client.register_system_shared_memory("text", _key(region), 32)
    cases = {  # (shape, byte size) -> Triton's words
        (3, 15): "incomplete string data for inference input 'INPUT0', expecting string of length 3 but only 1 bytes "
                 "available",
        (2, 17): "[request id: <id_unknown>] unexpected number of string elements 3 for inference input 'INPUT0' for "
                 "model 'idt_text', expecting 2",
        (3, 20): "[request id: <id_unknown>] incomplete string length indicator for inference input 'INPUT0' for model "
                 "'idt_text', expecting 4 bytes but only 3 bytes available. Please make sure the string length "
                 "indicator is in one buffer.",
    }
    answers = {}
    for (count, size), _ in cases.items():
        body = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [count], "parameters": {
            "shared_memory_region": "text", "shared_memory_byte_size": size}}]}
        response = httpx.post(f"http://{server.http_url}/v2/models/idt_text/infer", json=body, timeout=30)
        answers[(count, size)] = (response.status_code, response.json()["error"])
    client.unregister_system_shared_memory()
    assert answers == {case: (400, words) for case, words in cases.items()}


def _in_flight(server, protocol, regions):
    """A request of the slow model reading region 'in0' and writing 'out0', started in a thread once both are
    registered; returns the thread and its outcome (set when it ends), after the engine holds both regions."""
    client, module = server.client(protocol), server.module(protocol)
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    source, target = regions("in0", 32), regions("out0", 32)
    shm.set_shared_memory_region(source, [data])
    client.register_system_shared_memory("in0", _key(source), 32)
    client.register_system_shared_memory("out0", _key(target), 32)
    infer_input = module.InferInput("INPUT0", [2, 4], "FP32")
    infer_input.set_shared_memory("in0", 32)
    output = module.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out0", 32)
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = server.client(protocol).infer("slow", [infer_input], outputs=[output])
        except InferenceServerException as error:
            outcome["error"] = error.message()

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while not (server.engine.shm.in_use("in0") and server.engine.shm.in_use("out0")):
        assert "error" not in outcome and time.monotonic() < deadline, outcome
        time.sleep(0.01)
    return thread, outcome, target, data


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", ["in0", "out0", ""])
def test_a_region_in_use_is_not_unregistered(server, regions, protocol, name):
    """tritonserver 2.51 (recorded live): unregistering a region an admitted request reads or writes is refused
    (500 / INTERNAL, "Cannot unregister shared memory region 'in0', it is currently in use."); unregistering every
    region drops the idle ones and names the busy ones in its map's order. The request then ends as if nothing had
    happened, and the regions stay registered. Ferry unregistered them: the request failed with 404 / NOT_FOUND
    "Unable to find shared memory region: 'out0'" and its output was lost."""
    client = server.client(protocol)
    idle = regions("idle", 8)
    client.register_system_shared_memory("idle", _key(idle), 8)
    thread, outcome, target, data = _in_flight(server, protocol, regions)
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.unregister_system_shared_memory(name)
        names = sorted(r["name"] for r in client.get_system_shared_memory_status()) if protocol == "http" else \
            sorted(client.get_system_shared_memory_status().regions)
    finally:
        thread.join()
    words = (f"Cannot unregister shared memory region '{name}', it is currently in use." if name else
             "Failed to unregister the following system shared memory regions: in0 ,out0 ,")
    assert (raised.value.status(), raised.value.message()) == (
        "500" if protocol == "http" else "StatusCode.INTERNAL", words)
    assert names == (["idle", "in0", "out0"] if name else ["in0", "out0"])
    assert "result" in outcome, outcome
    np.testing.assert_array_equal(shm.get_contents_as_numpy(target, np.float32, [2, 4]), data)
    assert not server.engine.shm.in_use("in0") and not server.engine.shm.in_use("out0")
    client.unregister_system_shared_memory()  # released with the request's answer
    assert len(client.get_system_shared_memory_status()) == 0 if protocol == "http" else \
        not client.get_system_shared_memory_status().regions


def test_status_lists_regions_by_name(server, regions):
    """tritonserver 2.51 lists the regions in its map's order, by name (recorded live); Ferry listed them in the
    order they were registered."""
    client = server.client("http")
    for name in ("b", "c", "a"):
        client.register_system_shared_memory(name, _key(regions(name, 8)), 8)
    try:
        assert [r["name"] for r in client.get_system_shared_memory_status()] == ["a", "b", "c"]
    finally:
        client.unregister_system_shared_memory()
