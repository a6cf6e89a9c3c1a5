"""DLPack in python models: BF16 and GPU tensors, as Triton's python backend takes and gives them.

Everywhere: BF16 through ``to_dlpack`` / ``from_dlpack`` (DLPack's bfloat16 type, which numpy cannot
import) served over HTTP and gRPC; each DLPack object a model cannot use, with its message, as a unit
and as a served model's failure (the server goes on); exported capsules free what they hold.

On a GPU (marker ``gpu``, torch with CUDA): a model returns torch CUDA tensors (as an object and as a bare
capsule, BF16 too, computed on a side stream) and Ferry copies them to host as the response leaves; the
tensors say they are on the GPU, refuse ``as_numpy`` with Triton's message and round-trip into torch.
In the server process and isolated in a child, over HTTP and gRPC.
"""

from __future__ import annotations

import ctypes
import gc
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from serving_pod.backends import pb_dlpack, pb_utils
from support.server import write_model

BF16_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            y = pb_utils.Tensor.from_dlpack("Y", x.to_dlpack())  # a bfloat16 capsule and back
            assert y.triton_dtype() == 14, y.triton_dtype()
            responses.append(pb_utils.InferenceResponse([y]))
        return responses
"""

#: each request names, in parameter "case", a DLPack object the backend cannot take
BAD_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class Elsewhere:
    def __dlpack__(self, stream=None):
        raise AssertionError("never asked")

    def __dlpack_device__(self):
        return (8, 0)  # kDLMetal


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            case = json.loads(request.parameters() or "{}").get("case")
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if case == "object":
                source = object()
            elif case == "device":
                source = Elsewhere()
            elif case == "consumed":
                source = x.__dlpack__()
                np.from_dlpack(type("C", (), {"__dlpack__": lambda self, stream=None, **_: source,
                                              "__dlpack_device__": lambda self: (1, 0)})())
            else:
                source = x
            y = pb_utils.Tensor.from_dlpack("Y", source)
            responses.append(pb_utils.InferenceResponse([y]))
        return responses
"""

GPU_MODEL = """
import numpy as np
import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = torch.device("cuda", int(args["model_instance_device_id"]))
        self.side = torch.cuda.Stream(device=self.device)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()).to(self.device)
            with torch.cuda.stream(self.side):  # work pending on a non-default stream when exported
                doubled = x * 2
                y = pb_utils.Tensor.from_dlpack("Y", doubled)
            z = pb_utils.Tensor.from_dlpack("Z", torch.utils.dlpack.to_dlpack(x + 1))
            b = pb_utils.Tensor.from_dlpack("B", (x * 3).to(torch.bfloat16))
            for tensor in (y, z, b):
                assert not tensor.is_cpu(), tensor
                assert tensor.__dlpack_device__() == (2, self.device.index), tensor.__dlpack_device__()
                try:
                    tensor.as_numpy()
                    raise AssertionError("as_numpy of a GPU tensor")
                except pb_utils.TritonModelException as exc:
                    assert str(exc) == "Tensor is stored in GPU and cannot be converted to NumPy.", exc
            back = torch.utils.dlpack.from_dlpack(y.to_dlpack())  # our capsule over the same memory
            assert back.is_cuda and torch.equal(back, doubled), back
            assert y.shape() == list(x.shape) and y.triton_dtype() == 11 and b.triton_dtype() == 14
            responses.append(pb_utils.InferenceResponse([y, z, b]))
        return responses
"""


def _config(name: str, inputs: str, outputs: str, isolated: bool = False, kind: str = "KIND_CPU") -> str:
    extra = 'parameters { key: "FERRY_ISOLATED" value { string_value: "true" } }\n' if isolated else ""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            f"input [ {inputs} ]\noutput [ {outputs} ]\n"
            f"instance_group [ {{ count: 1 kind: {kind} }} ]\n" + extra)


def _serve(repo: Path) -> Any:
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([repo]))
    handle = thread.start()
    assert not handle.engine.startup_failures, handle.engine.startup_failures
    return thread, handle


FP32_X = '{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo: Path = tmp_path_factory.mktemp("dlpack_repo")
    bf16 = '{ name: "X" data_type: TYPE_BF16 dims: [ -1 ] }'
    write_model(repo, "bf16", _config("bf16", bf16, bf16.replace('"X"', '"Y"')), {"1/model.py": BF16_MODEL})
    write_model(repo, "bad", _config("bad", FP32_X, FP32_X.replace('"X"', '"Y"')), {"1/model.py": BAD_MODEL})
    thread, handle = _serve(repo)
    yield handle
    thread.stop()


# --------------------------------------------------------------------------- everywhere


def _bf16(values: np.ndarray) -> np.ndarray:
    """What tritonclient takes for BF16: ml_dtypes.bfloat16 from 2.58 on, FP32 (truncated) before."""
    try:
        import ml_dtypes
    except ImportError:
        return values
    return values.astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bf16_round_trips_through_dlpack(server: Any, protocol: str) -> None:
    module = server.module(protocol)
    values = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)  # exact in BF16
    tensor = module.InferInput("X", [4], "BF16")
    tensor.set_data_from_numpy(_bf16(values))
    result = server.client(protocol).infer("bf16", [tensor])
    output = result.get_output("Y")
    assert (output.datatype if protocol == "grpc" else output["datatype"]) == "BF16"
    np.testing.assert_array_equal(result.as_numpy("Y").astype(np.float32), values)


def test_a_bf16_capsule_says_bfloat16_and_comes_back_as_bf16() -> None:
    bits = np.array([0x3F80, 0xC020, 0x4049], np.uint16)  # 1.0, -2.5, 3.140625
    capsule = pb_utils.Tensor._wrap("b", bits, "BF16").to_dlpack()
    view = pb_dlpack.read_capsule(capsule)
    assert (view.code, view.bits, view.lanes, view.shape, view.device_type) == (4, 16, 1, (3,), 1)
    back = pb_utils.Tensor.from_dlpack("c", capsule)
    assert back._datatype == "BF16" and back.triton_dtype() == 14 and back.is_cpu()
    np.testing.assert_array_equal(back.as_numpy(), bits)


def test_exported_capsules_release_what_they_hold() -> None:
    before = len(pb_dlpack._exported)
    capsules = [pb_utils.Tensor._wrap("b", np.zeros(4, np.uint16), "BF16").to_dlpack() for _ in range(50)]
    assert len(pb_dlpack._exported) == before + 50
    read = pb_utils.Tensor.from_dlpack("r", capsules[0])  # a host copy: the capsule is not kept
    del capsules
    gc.collect()
    assert len(pb_dlpack._exported) == before and read.as_numpy().tolist() == [0, 0, 0, 0]
    # a consumer (torch.from_dlpack) renames the capsule, then calls the deleter once it is done
    capsule = pb_utils.Tensor._wrap("g", np.zeros(2, np.uint16), "BF16").to_dlpack()
    managed = pb_dlpack._Managed.from_address(pb_dlpack._api.PyCapsule_GetPointer(capsule, b"dltensor"))
    set_name = ctypes.pythonapi.PyCapsule_SetName
    set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
    assert set_name(capsule, b"used_dltensor") == 0
    assert len(pb_dlpack._exported) == before + 1
    managed.deleter(ctypes.pointer(managed))
    assert len(pb_dlpack._exported) == before
    del capsule  # its destructor leaves a consumed capsule alone
    gc.collect()
    assert len(pb_dlpack._exported) == before


def test_dlpack_objects_a_model_cannot_use_each_get_a_message() -> None:
    cases = [
        (object(), "Provided tensor is not supported. Tensor must be a DLPack capsule         or have "  # sic
         "`__dlpack__`"),
        (type("M", (), {"__dlpack__": lambda self, stream=None: None, "__dlpack_device__": lambda self: (8, 0)})(),
         "DLDevice type 8 is not support by Python backend."),
        (pb_dlpack.export(0, (2,), "FP32", 13, 0, None), "DLDevice type 13 is not support by Python backend."),
        (pb_dlpack.export(0, (2,), "BF16", 1, 0, None), "DLPack tensor of shape [2] has no data pointer"),
        (pb_dlpack.export(0, (3, 2), "FP32", 1, 0, None), "DLPack tensor of shape [3, 2] has no data pointer"),
    ]
    for source, message in cases:
        with pytest.raises(pb_utils.TritonModelException, match=re.escape(message)):
            pb_utils.Tensor.from_dlpack("Y", source)
    empty = pb_utils.Tensor.from_dlpack("e", pb_dlpack.export(0, (0, 4), "FP32", 1, 0, None))  # nothing to read
    assert empty.as_numpy().shape == (0, 4)
    with pytest.raises(pb_utils.TritonModelException, match="Tensor name cannot be an empty string"):
        pb_utils.Tensor.from_dlpack("", np.zeros(2))
    with pytest.raises(pb_utils.TritonModelException, match="Tensor 'o': cannot export the object to DLPack"):
        pb_utils.Tensor.from_dlpack("o", np.array([b"a"], dtype=object))  # numpy refuses: object dtype
    with pytest.raises(pb_utils.TritonModelException, match="DLPack does not have support for string tensors"):
        pb_utils.Tensor("s", np.array([b"a"], dtype=object)).to_dlpack()
    memory = np.zeros(2, np.float32)
    lanes = pb_dlpack.export(memory.ctypes.data, (2,), "FP32", 1, 0, memory)
    pb_dlpack._Managed.from_address(pb_dlpack._api.PyCapsule_GetPointer(lanes, b"dltensor")).dl_tensor.dtype.lanes = 4
    with pytest.raises(pb_utils.TritonModelException, match=r"DLPack data type \(code 2, 32 bits, 4 lanes\)"):
        pb_utils.Tensor.from_dlpack("Y", lanes)


def test_a_cuda_capsule_without_a_gpu_gets_tritons_message() -> None:
    try:
        pb_dlpack.cuda_runtime()
    except pb_dlpack.DLPackError:
        pass
    else:
        pytest.skip("a CUDA device is visible here; the GPU tests cover this host")
    capsule = pb_dlpack.export(0x1000, (2,), "FP32", pb_dlpack.K_DL_CUDA, 0, None)
    with pytest.raises(pb_utils.TritonModelException,
                       match="DLPack capsule passed pointer to memory allocated on GPU device, when GPU is not available"):
        pb_utils.Tensor.from_dlpack("Y", capsule)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_served_model_failing_on_dlpack_answers_the_message_and_the_server_goes_on(server: Any, protocol: str) -> None:
    module, client = server.module(protocol), server.client(protocol)
    x = np.array([1.0, 2.0], np.float32)

    def infer(case: str) -> Any:
        tensor = module.InferInput("X", [2], "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer("bad", [tensor], parameters={"case": case})

    for case, message in (("object", "Provided tensor is not supported"),
                          ("device", "DLDevice type 8 is not support by Python backend"),
                          ("consumed", "the capsule is not an unconsumed DLPack tensor")):
        with pytest.raises(InferenceServerException, match=message):
            infer(case)
    np.testing.assert_array_equal(infer("numpy").as_numpy("Y"), x)


# --------------------------------------------------------------------------- on a GPU


def _torch_cuda() -> Any:
    torch = pytest.importorskip("torch", reason="torch is not installed (the GPU tests make CUDA tensors with it)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    try:
        pb_dlpack.cuda_runtime()
    except pb_dlpack.DLPackError as exc:
        pytest.skip(str(exc))
    return torch


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory):
    _torch_cuda()
    repo: Path = tmp_path_factory.mktemp("dlpack_gpu_repo")
    outputs = ", ".join(f'{{ name: "{n}" data_type: {t} dims: [ -1 ] }}'
                        for n, t in (("Y", "TYPE_FP32"), ("Z", "TYPE_FP32"), ("B", "TYPE_BF16")))
    for name, isolated in (("gpu", False), ("gpu_isolated", True)):
        write_model(repo, name, _config(name, FP32_X, outputs, isolated, kind="KIND_GPU"), {"1/model.py": GPU_MODEL})
    thread, handle = _serve(repo)
    yield handle
    thread.stop()


@pytest.mark.gpu
def test_a_torch_cuda_tensor_is_a_gpu_tensor_copied_to_host_once() -> None:
    torch = _torch_cuda()
    source = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    tensor = pb_utils.Tensor.from_dlpack("t", source)
    assert not tensor.is_cpu() and tensor.shape() == [2, 3] and tensor.triton_dtype() == 11
    assert "gpu=0" in repr(tensor)
    np.testing.assert_array_equal(tensor._host(), source.cpu().numpy())
    assert tensor.is_cpu()  # now a host tensor
    strided = torch.zeros(4, 4, device="cuda").t()
    with pytest.raises(pb_utils.TritonModelException, match="DLPack tensor is not contiguous"):
        pb_utils.Tensor.from_dlpack("s", strided)
    pinned = torch.arange(4, dtype=torch.int32).pin_memory()
    np.testing.assert_array_equal(pb_utils.Tensor.from_dlpack("p", pinned).as_numpy(), np.arange(4, dtype=np.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["gpu", "gpu_isolated"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_returning_cuda_tensors_is_answered_from_host_copies(gpu_server: Any, protocol: str, model: str) -> None:
    module = gpu_server.module(protocol)
    x = np.linspace(-4, 4, 4096, dtype=np.float32)
    tensor = module.InferInput("X", [x.size], "FP32")
    tensor.set_data_from_numpy(x)
    client = gpu_server.client(protocol)
    for _ in range(3):
        result = client.infer(model, [tensor])
        np.testing.assert_array_equal(result.as_numpy("Y"), x * 2)
        np.testing.assert_array_equal(result.as_numpy("Z"), x + 1)
        expected_bf16 = (x * 3).view(np.uint32) >> 16  # torch rounds to nearest even; compare within one ulp
        got = result.as_numpy("B").astype(np.float32).view(np.uint32) >> 16
        assert np.max(np.abs(got.astype(np.int64) - expected_bf16.astype(np.int64))) <= 1
