"""Triton's raw binary request (``http.raw``), answered as tritonserver 2.51 answers it.

Each case was sent to Triton 2.51 (CPU, python backend) and to Ferry serving the same python models; the expected
answers are Triton's. Ferry is checked against them always (in process, and through ``--http-workers=2``, whose
processes ask the server process for the model's configuration), and Triton itself where it can be had
(``support.triton``). What Triton showed: ``Inference-Header-Content-Length`` read with ``atoi`` (``abc``, ``""``,
``0x10`` and ``4294967296`` are 0), and a 0 (or no header with an empty body) makes the whole body the model's one
input; a batching model gets a batch of 1; every output comes back as binary data; the errors are the core's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import httpx
import numpy as np
import pytest

from serving_pod.http.raw import header_length
from support.server import ServerThread, make_options, write_model

ECHO_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            tensor = request.inputs()[0]
            array = tensor.as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", array),
                pb_utils.Tensor("SHAPE", np.array(array.shape, np.int64)),
                pb_utils.Tensor("NAME", np.array([tensor.name().encode()], np.object_)),
                pb_utils.Tensor("PARAMS", np.array([request.parameters().encode()], np.object_)),
            ]))
        return out
'''


def _echo_config(name: str, data_type: str, dims: str, max_batch_size: int = 0) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: {data_type} dims: {dims} }} ]
output [ {{ name: "OUT" data_type: {data_type} dims: [ -1 ] }}, {{ name: "SHAPE" data_type: TYPE_INT64 dims: [ -1 ] }},
         {{ name: "NAME" data_type: TYPE_STRING dims: [ 1 ] }}, {{ name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""


ECHOES = {
    "fixed": ("TYPE_FP32", "[ 4 ]", 0),
    "variable": ("TYPE_INT32", "[ -1 ]", 0),
    "batching": ("TYPE_INT32", "[ 2 ]", 8),
    "two_variable": ("TYPE_INT32", "[ -1, -1 ]", 0),
    "text": ("TYPE_STRING", "[ 1 ]", 0),
    "text_batching": ("TYPE_STRING", "[ 1 ]", 4),
    "two_texts": ("TYPE_STRING", "[ 2 ]", 0),
}

TWO_INPUTS_CONFIG = """
name: "two_inputs"
backend: "python"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_INT32 dims: [ 2 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "C" data_type: TYPE_INT32 dims: [ 2 ] } ]
"""

TWO_INPUTS_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("C", pb_utils.get_input_tensor_by_name(r, "A").as_numpy())])
                for r in requests]
'''

MODELS = (*ECHOES, "two_inputs")
FORWARD = "--http-header-forward-pattern=^x-"


class Case(NamedTuple):
    model: str
    body: bytes
    headers: dict[str, str] = {}


class Answer(NamedTuple):
    status: int
    content_type: str | None
    header_length: str | None  # the answer's Inference-Header-Content-Length
    encoding: str | None
    body: bytes


def _outputs(model: str, array: np.ndarray, datatype: str, raw: bytes, params: bytes = b"{}") -> Answer:
    """The answer of the echo model to a raw request: its four outputs, all binary, in Triton's JSON."""
    shape = np.array(array.shape, np.int64).tobytes()
    name = len(b"IN").to_bytes(4, "little") + b"IN"
    parameters = len(params).to_bytes(4, "little") + params
    outputs = [("OUT", datatype, list(array.shape), raw), ("SHAPE", "INT64", [array.ndim], shape),
               ("NAME", "BYTES", [1], name), ("PARAMS", "BYTES", [1], parameters)]
    header = json.dumps({"model_name": model, "model_version": "1", "outputs": [
        {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(r)}} for n, d, s, r in outputs]},
        separators=(",", ":")).encode()
    return Answer(200, "application/octet-stream", str(len(header)), None, header + b"".join(r for *_, r in outputs))


def _error(message: str, content_type: str = "application/json", status: int = 400) -> Answer:
    return Answer(status, content_type, None, None, json.dumps({"error": message}, separators=(",", ":")).encode())


def _mismatch(model: str, expected: int, got: int) -> Answer:
    return _error(f"[request id: <id_unknown>] input byte size mismatch for input 'raw_input' for model '{model}'. "
                  f"Expected {expected}, got {got}")


FOUR = np.arange(4, dtype=np.float32)
THREE = np.arange(3, dtype=np.int32)
PAIR = np.arange(2, dtype=np.int32)
RAW = {"Inference-Header-Content-Length": "0"}

CASES: dict[str, tuple[Case, Answer]] = {
    # what makes a request raw: a length atoi reads as 0, or no length and an empty body
    "header 0": (Case("fixed", FOUR.tobytes(), RAW), _outputs("fixed", FOUR, "FP32", FOUR.tobytes())),
    "header not a number": (Case("fixed", FOUR.tobytes(), {"Inference-Header-Content-Length": "abc"}),
                            _outputs("fixed", FOUR, "FP32", FOUR.tobytes())),
    "header empty": (Case("fixed", FOUR.tobytes(), {"Inference-Header-Content-Length": ""}),
                     _outputs("fixed", FOUR, "FP32", FOUR.tobytes())),
    "header hexadecimal": (Case("fixed", FOUR.tobytes(), {"Inference-Header-Content-Length": "0x10"}),
                           _outputs("fixed", FOUR, "FP32", FOUR.tobytes())),
    "header 2**32": (Case("fixed", FOUR.tobytes(), {"Inference-Header-Content-Length": "4294967296"}),
                     _outputs("fixed", FOUR, "FP32", FOUR.tobytes())),
    "header past a long": (Case("fixed", FOUR.tobytes(), {"Inference-Header-Content-Length": "99999999999999999999"}),
                           _error("inference header size should be in range (0, 16), got: 99999999999999999999",
                                  "text/plain")),
    "empty body, no header": (Case("variable", b""), _outputs("variable", THREE[:0], "INT32", b"")),
    "empty body, fixed dims": (Case("fixed", b""), _mismatch("fixed", 16, 0)),
    # the shape: the configured dims, one -1 filled in from the size, a batch of 1 in front
    "fixed dims, too many bytes": (Case("fixed", FOUR.tobytes() + b"\0" * 4, RAW), _mismatch("fixed", 16, 20)),
    "variable dims": (Case("variable", THREE.tobytes(), RAW), _outputs("variable", THREE, "INT32", THREE.tobytes())),
    "variable dims, a partial element": (Case("variable", b"\1\0\0\0\2", RAW), _mismatch("variable", 4, 5)),
    "batching model": (Case("batching", PAIR.tobytes(), RAW),
                       _outputs("batching", PAIR.reshape(1, 2), "INT32", PAIR.tobytes())),
    "batching model, two rows": (Case("batching", np.arange(4, dtype=np.int32).tobytes(), RAW),
                                 _mismatch("batching", 8, 16)),
    "two variable dims": (Case("two_variable", THREE.tobytes(), RAW), _error(
        "[request id: <id_unknown>] The shape of the raw input 'IN' can not be deduced because there are more than "
        "one variable-sized dimension")),
    # BYTES: the body is the one element
    "bytes": (Case("text", b"hello", RAW), _outputs("text", np.empty(1), "BYTES", b"\5\0\0\0hello")),
    "bytes, empty": (Case("text", b"", RAW), _outputs("text", np.empty(1), "BYTES", b"\0\0\0\0")),
    "bytes, batching model": (Case("text_batching", b"hi", RAW),
                              _outputs("text_batching", np.empty((1, 1)), "BYTES", b"\2\0\0\0hi")),
    "bytes, two elements": (Case("two_texts", b"hi", RAW), _error(
        "[request id: <id_unknown>] For BYTE datatype raw input 'IN', the model must have input shape [1]")),
    # refusals found before the input is deduced
    "two inputs": (Case("two_inputs", THREE.tobytes(), RAW), _error(
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in "
        "'two_inputs' model configuration")),
    "unknown model": (Case("nope", b"xx", RAW), _error("Request for unknown model: 'nope' is not found", "text/plain",
                                                       404)),
    "unknown version": (Case("fixed/versions/2", b"xx", RAW), _error(
        "Request for unknown model: 'fixed' version 2 is not found", "text/plain", 404)),
    # the rest of the request as any other: forwarded headers, compression both ways
    "forwarded header": (Case("fixed", FOUR.tobytes(), {**RAW, "x-trace": "t1"}),
                         _outputs("fixed", FOUR, "FP32", FOUR.tobytes(), b'{"x-trace":"t1"}')),
}


def _gzip_case() -> tuple[Case, Answer]:
    import gzip

    return (Case("fixed", gzip.compress(FOUR.tobytes()), {**RAW, "Content-Encoding": "gzip"}),
            _outputs("fixed", FOUR, "FP32", FOUR.tobytes()))


CASES["gzip body"] = _gzip_case()


def _answer(port: int, case: Case) -> Answer:
    response = httpx.post(f"http://127.0.0.1:{port}/v2/models/{case.model}/infer", content=case.body,
                          headers={"Accept-Encoding": "identity", **case.headers}, timeout=30)
    headers = response.headers
    return Answer(response.status_code, headers.get("content-type"), headers.get("inference-header-content-length"),
                  headers.get("content-encoding"), response.content)


def _answers(port: int) -> dict[str, Answer]:
    return {name: _answer(port, case) for name, (case, _) in CASES.items()}


EXPECTED = {name: answer for name, (_, answer) in CASES.items()}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("raw_binary")
    for name, (data_type, dims, max_batch_size) in ECHOES.items():
        write_model(path, name, _echo_config(name, data_type, dims, max_batch_size), {"1/model.py": ECHO_MODEL})
    write_model(path, "two_inputs", TWO_INPUTS_CONFIG, {"1/model.py": TWO_INPUTS_MODEL})
    return path


@pytest.fixture(scope="module")
def ferry_port(repository: Path):
    thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=MODELS,
                                       http_header_forward="^x-"))
    handle = thread.start()
    yield handle.server.http_port
    thread.stop()


@pytest.mark.parametrize("name", list(CASES))
def test_ferry_answers_raw_requests_as_triton(ferry_port: int, name: str) -> None:
    case, expected = CASES[name]
    assert _answer(ferry_port, case) == expected


def test_raw_answer_is_compressed_as_any_other(ferry_port: int) -> None:
    case, expected = CASES["header 0"]
    response = httpx.post(f"http://127.0.0.1:{ferry_port}/v2/models/fixed/infer", content=case.body,
                          headers={**case.headers, "Accept-Encoding": "gzip"}, timeout=30)
    assert response.headers["content-encoding"] == "gzip"
    assert response.content == expected.body  # httpx decompressed it


def test_http_workers_answer_raw_requests_as_triton(repository: Path) -> None:
    """``--http-workers=2``: a worker asks the server process for the model's configuration, and answers the same."""
    import signal
    import subprocess
    import sys

    from support.server import free_ports, wait_ready

    http, grpc, metrics = free_ports(3)
    process = subprocess.Popen(
        [sys.executable, "-m", "serving_pod", f"--model-repository={repository}", f"--http-port={http}",
         f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
         "--metrics-address=127.0.0.1", "--http-workers=2", "--model-control-mode=explicit", FORWARD,
         *(f"--load-model={model}" for model in MODELS)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(http, process)
        answers = [_answers(http) for _ in range(3)]  # new connections each time: spread over the processes
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    assert all(answer == EXPECTED for answer in answers)


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_triton_answers_raw_requests_as_the_table_says(repository: Path) -> None:
    """Side by side: Triton 2.51 gives every answer of the table (skipped where it cannot be had)."""
    from support.triton import running_triton

    with running_triton(repository, MODELS, FORWARD) as (http, _, _):
        assert _answers(http) == EXPECTED


@pytest.mark.parametrize(("text", "length"), [
    (b"0", 0), (b"abc", 0), (b"", 0), (b"0x10", 0), (b"  12", 12), (b"+2", 2), (b"2abc", 2), (b"-1", -1),
    (b"4294967296", 0), (b"4294967297", 1), (b"2147483648", -2**31), (b"99999999999999999999", -1),
    (b"-99999999999999999999", 0),
])
def test_header_length_is_read_as_atoi(text: bytes, length: int) -> None:
    assert header_length(text) == length
