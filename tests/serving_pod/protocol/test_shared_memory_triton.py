"""System shared memory side by side with NVIDIA Triton 2.51: the same requests, the same answers.

``double_py`` (default models) serves both; every case goes out as raw HTTP JSON and raw gRPC messages (so
that wrong parameter types and kinds can be sent) and the outcome, the status and message or the response,
must be the same. Skipped with the installer's reason where Triton cannot be had. Not compared, because
Ferry answers on purpose otherwise (see ``test_shared_memory.py`` and ``security/test_shm_security.py``):
JSON parameters of the wrong type, an output region too small and a key that does not exist (Triton:
500 / INTERNAL, Ferry: 400 / INVALID_ARGUMENT); one key under two names (Triton refuses with INTERNAL
"Invalid shared memory region", Ferry maps each name on its own, every access bounds-checked). A byte size of 0 at
offset 0 (a zero-element input) Triton refuses ("Invalid offset + byte size", its offset + size - 1 wraps below
zero); Ferry reads the empty tensor. Bytes that do not fit the shape get the core's words in both, as binary data.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm

from support.server import DEFAULT_MODELS

DATA = np.arange(16, dtype=np.float32)


def _cases(http, grpc_call, key: str, out_key: str) -> dict[str, Any]:
    """name -> outcome; the regions 'in' (DATA, ``key``) and 'out' (``out_key``), 64 bytes each, are registered
    after the registrations past the end (Triton refuses one key under two names)."""
    from tritonclient.grpc import service_pb2 as pb

    def infer_http(inputs, outputs=None):
        body = {"inputs": inputs, **({"outputs": outputs} if outputs else {})}
        return http("POST", "/v2/models/double_py/infer", body)

    def infer_grpc(params, outputs=(), raw=None):
        request = pb.ModelInferRequest(model_name="double_py")
        tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
        targets = [(tensor.parameters, params)]
        targets += [(request.outputs.add(name=name).parameters, items) for name, items in outputs]
        for where, items in targets:
            for name, (kind, value) in items.items():
                setattr(where[name], kind, value)
        if raw is not None:
            request.raw_input_contents.append(raw)
        return grpc_call("ModelInfer", request)

    def tensor(params, **extra):
        return {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": params, **extra}

    in_shm = {"shared_memory_region": "in", "shared_memory_byte_size": 64}
    in_grpc = {"shared_memory_region": ("string_param", "in"), "shared_memory_byte_size": ("int64_param", 64)}
    out_grpc = {"shared_memory_region": ("string_param", "out"), "shared_memory_byte_size": ("int64_param", 64)}
    register = pb.SystemSharedMemoryRegisterRequest
    return {
        "http register past the end": http("POST", "/v2/systemsharedmemory/region/x/register",
                                           {"key": key, "offset": 32, "byte_size": 64}),
        "grpc register past the end": grpc_call("SystemSharedMemoryRegister",
                                                register(name="x", key=key, offset=60, byte_size=8)),
        "register in": http("POST", "/v2/systemsharedmemory/region/in/register", {"key": key, "byte_size": 64}),
        "register out": grpc_call("SystemSharedMemoryRegister", register(name="out", key=out_key, byte_size=64)),
        "http same name twice": http("POST", "/v2/systemsharedmemory/region/in/register", {"key": key, "byte_size": 8}),
        "grpc same name twice": grpc_call("SystemSharedMemoryRegister", register(name="in", key=key, byte_size=8)),
        "http status unknown": http("GET", "/v2/systemsharedmemory/region/x/status"),
        "grpc status unknown": grpc_call("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name="x")),
        "http unregister unknown": http("POST", "/v2/systemsharedmemory/region/x/unregister"),
        "http input and output in shm": infer_http([tensor(in_shm)], [{"name": "OUTPUT0", "parameters": {
            "shared_memory_region": "out", "shared_memory_byte_size": 64}}]),
        "grpc input and output in shm": infer_grpc(in_grpc, [("OUTPUT0", out_grpc)]),
        "http size larger": infer_http([tensor({**in_shm, "shared_memory_byte_size": 68})]),
        "grpc offset past": infer_grpc({**in_grpc, "shared_memory_offset": ("int64_param", 8)}),
        "grpc negative offset": infer_grpc({**in_grpc, "shared_memory_offset": ("int64_param", -1)}),
        "grpc negative size": infer_grpc({**in_grpc, "shared_memory_byte_size": ("int64_param", -64)}),
        "grpc output at a negative offset": infer_grpc(in_grpc, [
            ("OUTPUT0", {**out_grpc, "shared_memory_offset": ("int64_param", -4)})]),
        "http unknown region": infer_http([tensor({**in_shm, "shared_memory_region": "x"})]),
        "http data and region": infer_http([tensor(in_shm, data=DATA.tolist())]),
        "http region named ''": infer_http([tensor({**in_shm, "shared_memory_region": ""})]),
        "grpc region named ''": infer_grpc({**in_grpc, "shared_memory_region": ("string_param", "")}),
        "grpc output region named ''": infer_grpc(in_grpc, [
            ("OUTPUT0", {**out_grpc, "shared_memory_region": ("string_param", "")})]),
        "http offset without region": infer_http([tensor({"shared_memory_offset": 0})]),
        "http binary size and region": infer_http([tensor({**in_shm, "binary_data_size": 64})]),
        "grpc uint64 size": infer_grpc({**in_grpc, "shared_memory_byte_size": ("uint64_param", 64)}),
        "grpc string region kind": infer_grpc({**in_grpc, "shared_memory_region": ("int64_param", 3)}),
        "grpc offset without region": infer_grpc({"shared_memory_offset": ("int64_param", 0)}, raw=DATA.tobytes()),
        "http binary_data output in shm": infer_http([tensor(in_shm)], [{"name": "OUTPUT0", "parameters": {
            "shared_memory_region": "out", "shared_memory_byte_size": 64, "binary_data": True}}]),
        "grpc binary_data output in shm": infer_grpc(in_grpc, [
            ("OUTPUT0", {**out_grpc, "binary_data": ("bool_param", True)})]),
        "http size short of the shape": infer_http([tensor({**in_shm, "shared_memory_byte_size": 32})]),
        "grpc size short of the shape, 48": infer_grpc({**in_grpc, "shared_memory_byte_size": ("int64_param", 48)}),
        "http unregister all": http("POST", "/v2/systemsharedmemory/unregister"),
        "http output to unregistered": infer_http([tensor({}, data=DATA.tolist())], [{"name": "OUTPUT0", "parameters": {
            "shared_memory_region": "out", "shared_memory_byte_size": 64}}]),
    }


def _run(http_port: int, grpc_port: int, key: str, out_key: str) -> dict[str, Any]:
    import grpc
    import httpx
    from tritonclient.grpc import service_pb2_grpc

    def http(method, path, body=None):
        response = httpx.request(method, f"http://127.0.0.1:{http_port}{path}", json=body, timeout=30)
        return response.status_code, response.json() if response.content else None

    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    def grpc_call(method, request):
        try:
            return "OK", str(getattr(stub, method)(request, timeout=30))
        except grpc.RpcError as error:
            return str(error.code()), error.details()

    try:
        return _cases(http, grpc_call, key, out_key)
    finally:
        channel.close()


@pytest.mark.slow  # a live Triton
def test_system_shared_memory_answers_match_triton(tmp_path: Path) -> None:
    from support.server import ServerThread, make_options
    from support.triton import running_triton, triton_or_skip

    triton_or_skip()
    shutil.copytree(DEFAULT_MODELS / "double_py", tmp_path / "double_py")
    handle = shm.create_shared_memory_region("diff", f"/ferry_{uuid.uuid4().hex[:12]}", 64)
    out = shm.create_shared_memory_region("diff_out", f"/ferry_{uuid.uuid4().hex[:12]}", 64)
    try:
        shm.set_shared_memory_region(handle, [DATA])
        key, out_key = handle._shm_key, out._shm_key
        with running_triton(tmp_path, ["double_py"]) as (http, grpc_port, _):
            triton = _run(http, grpc_port, key, out_key)
        thread = ServerThread(make_options([tmp_path], allow_client_shm=True))
        ferry_server = thread.start()
        try:
            ferry = _run(ferry_server.server.http_port, ferry_server.server.grpc_port, key, out_key)
        finally:
            thread.stop()
    finally:
        shm.destroy_shared_memory_region(handle)
        shm.destroy_shared_memory_region(out)
    assert triton["grpc input and output in shm"][0] == "OK"  # what makes the comparison worth it
    for case, theirs in triton.items():
        assert ferry[case] == theirs, case
