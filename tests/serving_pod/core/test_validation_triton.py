"""Requests the model refuses (``core.validation``), refused as NVIDIA Triton 2.51's core refuses them.

Each case is sent over HTTP (binary tensor data, or JSON ``data``) and over gRPC (``raw_input_contents``, or typed
``contents``); both protocols go through the engine's validation, so the answer is the same words (HTTP 400, gRPC
INVALID_ARGUMENT). ``CASES`` holds Triton's answers as recorded from it: Ferry is held to them always, Triton
itself where it can be had (``support.triton``; else that test is skipped), so the record cannot drift.

Triton makes its checks after the repeated-input one in its input map's order (``validation.triton_order``): for
two inputs the reverse of the request's, so of two whose batch sizes differ it names the one sent first. ``abcd_b``'s
inputs ``a`` and ``d`` share a bucket, which shows the hash order apart from the reverse one.

``FERRY_ONLY`` holds what Ferry refuses in its own words on purpose, because Triton takes junk or words it worse:
a required input missing beside an optional one (Triton runs the model, which is given None for it: add_sub's
``None.as_numpy()`` fails with a 500 / INTERNAL ``AttributeError``; the generate extension's bodies the same), a
batch of 0 (Triton runs ``[0,16]`` with 64 bytes), more inputs than the model has (Triton writes "missing required
input(s) ]"). A negative dimension is refused by Ferry's front ends (Triton: a 500 "Unable to parse 'shape'" over
HTTP; over gRPC "All input dimensions should be specified" for -1, else a shape or byte-size refusal that echoes the
negative dimension or a size computed from it).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from serving_pod.core.validation import BATCH_NOTE, triton_order
from support.python_models import DATA as PYTHON_MODELS
from support.server import DEFAULT_MODELS, ServerThread, make_options
from support.triton import running_triton

MODELS = ("add_sub_py", "double_py", "py_bytes", "add_sub_b", "opt_py", "abcd_b")
ABCD_CONFIG = """
name: "abcd_b"
backend: "python"
max_batch_size: 8
input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "b" data_type: TYPE_FP32 dims: [ 1 ] },
        { name: "c" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "d" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
ABCD_MODEL = """
class TritonPythonModel:
    def execute(self, requests):
        raise NotImplementedError("only refused requests are sent")
"""
F4 = np.arange(4, dtype=np.float32).tobytes()
ID = "[request id: <id_unknown>] "


def _repository(root: Path) -> Path:
    for name in ("add_sub_py", "double_py"):
        shutil.copytree(DEFAULT_MODELS / name, root / name)
    shutil.copytree(PYTHON_MODELS / "py_bytes", root / "py_bytes", ignore=shutil.ignore_patterns("__pycache__"))
    for name, edit in (("add_sub_b", lambda text: text.replace("max_batch_size: 0", "max_batch_size: 8")),
                       ("opt_py", lambda text: text.replace('dims: [ 4 ] }\n]', 'dims: [ 4 ] optional: true }\n]', 1))):
        shutil.copytree(DEFAULT_MODELS / "add_sub_py", root / name)
        config = root / name / "config.pbtxt"
        config.write_text(edit(config.read_text().replace('"add_sub_py"', f'"{name}"')))
    assert "optional: true" in (root / "opt_py" / "config.pbtxt").read_text()
    (root / "abcd_b" / "1").mkdir(parents=True)
    (root / "abcd_b" / "config.pbtxt").write_text(ABCD_CONFIG)
    (root / "abcd_b" / "1" / "model.py").write_text(ABCD_MODEL)
    return root


def _strings(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


class Case:
    """A request: ``inputs`` of (name, datatype, shape, data): bytes (binary / raw), or a list (JSON ``data`` /
    typed ``contents``)."""

    def __init__(self, model: str, *inputs: tuple[str, str, list[int], Any], id: str = "",
                 outputs: tuple[str, ...] = ()) -> None:
        self.model, self.inputs, self.id, self.outputs = model, inputs, id, outputs

    def http(self, port: int) -> tuple[int, str]:
        header: dict[str, Any] = {"inputs": []}
        if self.id:
            header["id"] = self.id
        if self.outputs:
            header["outputs"] = [{"name": name} for name in self.outputs]
        chunks = []
        for name, datatype, shape, data in self.inputs:
            entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
            if isinstance(data, bytes):
                entry["parameters"] = {"binary_data_size": len(data)}
                chunks.append(data)
            else:
                entry["data"] = data
            header["inputs"].append(entry)
        head = json.dumps(header).encode()
        headers = {"Inference-Header-Content-Length": str(len(head))} if chunks else {}
        response = httpx.post(f"http://127.0.0.1:{port}/v2/models/{self.model}/infer", content=head + b"".join(chunks),
                              headers=headers, timeout=60)
        return response.status_code, response.json().get("error", "")

    def grpc(self, stub: Any) -> tuple[str, str]:
        message = pb.ModelInferRequest(model_name=self.model, id=self.id)
        for name, datatype, shape, data in self.inputs:
            tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
            if isinstance(data, bytes):
                message.raw_input_contents.append(data)
            elif datatype == "BYTES":
                tensor.contents.bytes_contents.extend(item.encode() for item in data)
            else:
                tensor.contents.fp32_contents.extend(data)
        for name in self.outputs:
            message.outputs.add(name=name)
        try:
            stub.ModelInfer(message, timeout=60)
            return "OK", ""
        except grpc.RpcError as error:
            return error.code().name, error.details()


def _pair(*inputs: tuple[str, str, list[int], Any], **kwargs: Any) -> Case:
    return Case("add_sub_py", *inputs, **kwargs)


INPUT1 = ("INPUT1", "FP32", [4], F4)
SHAPE = "unexpected shape for input 'INPUT0' for model "
COUNT = "expected 2 inputs but got {} inputs for model 'add_sub_py'. Got input(s) {}, but missing required input(s) {}. " \
        "Please provide all required input(s)."

#: case -> (request, Triton 2.51's words, the same over both protocols)
CASES: dict[str, tuple[Case, str]] = {
    "byte size": (_pair(("INPUT0", "FP32", [4], F4[:12]), INPUT1),
                  f"{ID}input byte size mismatch for input 'INPUT0' for model 'add_sub_py'. Expected 16, got 12"),
    "byte size, the request's id": (
        _pair(("INPUT0", "FP32", [4], F4[:12]), INPUT1, id="abc"),
        "[request id: abc] input byte size mismatch for input 'INPUT0' for model 'add_sub_py'. Expected 16, got 12"),
    "datatype before byte size": (_pair(("INPUT0", "INT32", [4], F4[:12]), INPUT1),
                                  f"{ID}inference input 'INPUT0' data-type is 'INT32', but model 'add_sub_py' expects 'FP32'"),
    "an unknown datatype": (_pair(("INPUT0", "FOO", [4], F4[:12]), INPUT1),
                            f"{ID}inference input 'INPUT0' data-type is '<invalid>', but model 'add_sub_py' expects 'FP32'"),
    "shape before byte size": (_pair(("INPUT0", "FP32", [5], F4), INPUT1), f"{ID}{SHAPE}'add_sub_py'. Expected [4], got [5]. "),
    "a repeated input": (_pair(("INPUT0", "FP32", [4], F4), ("INPUT0", "FP32", [4], F4), id="d1"),
                         "[request id: d1] input 'INPUT0' already exists in request"),
    "a missing input": (_pair(("INPUT0", "FP32", [4], F4[:12])), ID + COUNT.format(1, "['INPUT0']", "['INPUT1']")),
    "no inputs": (_pair(), ID + COUNT.format(0, "[]", "['INPUT0','INPUT1']")),
    "missing inputs before an unknown one": (_pair(("X", "FP32", [4], F4)),
                                             ID + COUNT.format(1, "['X']", "['INPUT0','INPUT1']")),
    "an unknown input": (_pair(("INPUT0", "FP32", [4], F4[:12]), ("X", "FP32", [4], F4)),
                         "unexpected inference input 'X' for model 'add_sub_py'"),
    "an unknown output before the inputs": (_pair(("INPUT0", "FP32", [4], F4), outputs=("NOPE",)),
                                            "unexpected inference output 'NOPE' for model 'add_sub_py'"),
    "an optional input": (Case("opt_py"), f"{ID}expected number of inputs between 1 and 2 but got 0 inputs for model "
                                          "'opt_py'. Got input(s) [], but missing required input(s) ['INPUT0']. "
                                          "Please provide all required input(s)."),
    "a batching model's shape": (Case("double_py", ("INPUT0", "FP32", [16], F4 * 4)),
                                 f"{ID}{SHAPE}'double_py'. Expected [-1,16], got [16]. {BATCH_NOTE}"),
    "a batching model's byte size": (
        Case("double_py", ("INPUT0", "FP32", [2, 16], F4 * 4)),
        f"{ID}input byte size mismatch for input 'INPUT0' for model 'double_py'. Expected 128, got 64"),
    "no batch dimension": (Case("double_py", ("INPUT0", "FP32", [], F4[:4])),
                           f"{ID}input 'INPUT0' has no shape but model requires batch dimension for 'double_py'"),
    "batch size before byte size": (Case("double_py", ("INPUT0", "FP32", [65, 16], F4)),
                                    f"{ID}inference request batch-size must be <= 64 for 'double_py'"),
    "batch size before datatype": (Case("add_sub_b", ("INPUT0", "INT32", [9, 4], F4 * 9), ("INPUT1", "FP32", [9, 4], F4 * 9)),
                                   f"{ID}inference request batch-size must be <= 8 for 'add_sub_b'"),
    "a repeated input before batch sizes": (Case("add_sub_b", ("INPUT0", "FP32", [2, 4], F4 * 2), ("INPUT1", "FP32", [2, 4], F4 * 2),
                                     ("INPUT1", "FP32", [1, 4], F4)),
                                f"{ID}input 'INPUT1' already exists in request"),
    "batch sizes that differ": (Case("add_sub_b", ("INPUT0", "FP32", [1, 4], F4), ("INPUT1", "FP32", [2, 4], F4 * 2)),
                                f"{ID}input 'INPUT0' batch size does not match other inputs for 'add_sub_b'"),
    "batch sizes that differ, sent the other way": (
        Case("add_sub_b", ("INPUT1", "FP32", [2, 4], F4 * 2), ("INPUT0", "FP32", [1, 4], F4)),
        f"{ID}input 'INPUT1' batch size does not match other inputs for 'add_sub_b'"),
    "batch sizes that differ, before the batch size": (
        Case("add_sub_b", ("INPUT0", "FP32", [9, 4], F4 * 9), ("INPUT1", "FP32", [1, 4], F4)),
        f"{ID}input 'INPUT0' batch size does not match other inputs for 'add_sub_b'"),
    "batch sizes that differ, in hash order": (
        Case("abcd_b", *((name, "FP32", [size, 1], F4[:4] * size) for name, size in zip("abcd", (2, 1, 1, 2)))),
        f"{ID}input 'd' batch size does not match other inputs for 'abcd_b'"),
    "a shape, then a datatype": (_pair(("INPUT0", "FP32", [5], F4), ("INPUT1", "INT32", [4], F4)),
                                 (f"{ID}inference input 'INPUT1' data-type is 'INT32', but model 'add_sub_py' "
                                  "expects 'FP32'")),
    "two byte sizes": (_pair(("INPUT0", "FP32", [4], F4[:8]), ("INPUT1", "FP32", [4], F4 * 2)),
                       f"{ID}input byte size mismatch for input 'INPUT1' for model 'add_sub_py'. Expected 16, got 32"),
    "datatypes, in hash order": (Case("abcd_b", *((name, "INT32", [1, 1], F4[:4]) for name in "abcd")),
                                 f"{ID}inference input 'c' data-type is 'INT32', but model 'abcd_b' expects 'FP32'"),
    "a missing input, the others in hash order": (
        Case("abcd_b", *((name, "FP32", [1, 1], F4[:4]) for name in "abd")),
        (f"{ID}expected 4 inputs but got 3 inputs for model 'abcd_b'. Got input(s) ['b','d','a'], but missing "
         "required input(s) ['c']. Please provide all required input(s).")),
    "too few strings": (Case("py_bytes", ("TEXT", "BYTES", [3], _strings(b"a", b"b"))),
                        f"{ID}expected 3 string elements for inference input 'TEXT' for model 'py_bytes', got 2"),
    "too many strings": (Case("py_bytes", ("TEXT", "BYTES", [1], _strings(b"a", b"b", b"c"))),
                         f"{ID}unexpected number of string elements 2 for inference input 'TEXT' for model 'py_bytes', "
                         "expecting 1"),
    "a string length cut short": (
        Case("py_bytes", ("TEXT", "BYTES", [2], _strings(b"a") + b"\1\0")),
        f"{ID}incomplete string length indicator for inference input 'TEXT' for model 'py_bytes', expecting 4 bytes "
        "but only 2 bytes available. Please make sure the string length indicator is in one buffer."),
    "a string longer than its data": (
        Case("py_bytes", ("TEXT", "BYTES", [1], struct.pack("<I", 10) + b"abc")),
        "incomplete string data for inference input 'TEXT', expecting string of length 10 but only 3 bytes available"),
    "a string longer than its data, too few": (
        Case("py_bytes", ("TEXT", "BYTES", [2], struct.pack("<I", 10) + b"abc")),
        f"{ID}expected 2 string elements for inference input 'TEXT' for model 'py_bytes', got 1"),
    "too few strings as data": (Case("py_bytes", ("TEXT", "BYTES", [3], ["a", "b"])),
                                f"{ID}expected 3 string elements for inference input 'TEXT' for model 'py_bytes', got 2"),
    "too many strings as data": (Case("py_bytes", ("TEXT", "BYTES", [3], ["a", "b", "c", "d"])),
                                 f"{ID}unexpected number of string elements 4 for inference input 'TEXT' for model "
                                 "'py_bytes', expecting 3"),
    "datatype of strings": (Case("py_bytes", ("TEXT", "FP32", [3], F4[:8])),
                            f"{ID}inference input 'TEXT' data-type is 'FP32', but model 'py_bytes' expects 'BYTES'"),
}

#: HTTP JSON ``data`` / gRPC typed ``contents`` of the wrong length: Triton's HTTP front end refuses it before the
#: model is asked (with a 500: Ferry's is a 400), its gRPC front end leaves it to the core's byte-size check
CONTENTS = (_pair(("INPUT0", "FP32", [4], [1.0, 2.0, 3.0]), ("INPUT1", "FP32", [4], [1.0, 2.0, 3.0, 4.0])),
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
            f"{ID}input byte size mismatch for input 'INPUT0' for model 'add_sub_py'. Expected 16, got 12")

FERRY_ONLY: dict[str, tuple[Case, str]] = {
    "a required input missing beside an optional one": (
        Case("opt_py", ("INPUT1", "FP32", [4], F4)),
        f"{ID}expected number of inputs between 1 and 2 but got 1 inputs for model 'opt_py'. Got input(s) ['INPUT1'], "
        "but missing required input(s) ['INPUT0']. Please provide all required input(s)."),
    "a batch of 0": (Case("double_py", ("INPUT0", "FP32", [0, 16], F4 * 4)),
                     f"{ID}inference request batch-size must be >= 1 for 'double_py'"),
    "more inputs than the model has": (_pair(("INPUT0", "FP32", [4], F4), INPUT1, ("X", "FP32", [4], F4)),
                                       ID + COUNT.format(3, "['X','INPUT1','INPUT0']", "[]")),
}


def _answers(http: int, grpc_port: int, cases: dict[str, tuple[Case, str]]) -> dict[str, Any]:
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return {name: (case.http(http), case.grpc(stub)) for name, (case, _) in cases.items()}


def _expected(cases: dict[str, tuple[Case, str]]) -> dict[str, Any]:
    return {name: ((400, words), ("INVALID_ARGUMENT", words)) for name, (_, words) in cases.items()}


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    return _repository(tmp_path_factory.mktemp("validation_differential"))


@pytest.fixture(scope="module")
def ferry(repository: Path):
    thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=MODELS))
    server = thread.start()
    try:
        yield server.server.http_port, server.server.grpc_port
    finally:
        thread.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_ferry_refuses_as_triton(ferry: tuple[int, int], case: str) -> None:
    assert _answers(*ferry, {case: CASES[case]}) == _expected({case: CASES[case]})


@pytest.mark.parametrize("case", list(FERRY_ONLY))
def test_ferry_refuses_in_its_own_words(ferry: tuple[int, int], case: str) -> None:
    assert _answers(*ferry, {case: FERRY_ONLY[case]}) == _expected({case: FERRY_ONLY[case]})


#: names inserted in this order -> a libstdc++ ``std::unordered_map<std::string, ...>``'s iteration order, as a
#: small g++ program printed it (20 names: past the first rehash at 14)
ORDERS = [
    ([f"IN_{i}" for i in range(20)],
     ["IN_19", "IN_18", "IN_17", "IN_14", "IN_0", "IN_16", "IN_10", "IN_2", "IN_15", "IN_6", "IN_4", "IN_3", "IN_11",
      "IN_13", "IN_5", "IN_1", "IN_7", "IN_12", "IN_8", "IN_9"]),
    (list("abcdef"), ["f", "e", "c", "b", "d", "a"]),
    (["INPUT0", "INPUT1", "X"], ["X", "INPUT1", "INPUT0"]),
]


@pytest.mark.parametrize(("names", "order"), ORDERS)
def test_triton_order_is_libstdcxx_map_order(names: list[str], order: list[str]) -> None:
    assert triton_order(names) == order


def test_wrong_length_contents(ferry: tuple[int, int]) -> None:
    case, http_words, grpc_words = CONTENTS
    assert _answers(*ferry, {"contents": (case, "")})["contents"] == ((400, http_words), ("INVALID_ARGUMENT", grpc_words))


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_triton_refuses_as_recorded(repository: Path) -> None:
    with running_triton(repository, MODELS) as (http, grpc_port, _):
        answers = _answers(http, grpc_port, CASES)
        case, http_words, grpc_words = CONTENTS
        contents = _answers(http, grpc_port, {"contents": (case, "")})["contents"]
    assert {name: answer for name, answer in answers.items() if answer != _expected(CASES)[name]} == {}
    assert contents == ((500, http_words), ("INVALID_ARGUMENT", grpc_words))
