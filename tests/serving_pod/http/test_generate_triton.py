"""The generate extension side by side with NVIDIA Triton 2.51: the same bodies, the same answers.

Each case below was sent to Triton 2.51 (CPU, python backend) and to Ferry serving the same python models: a
non-decoupled echo with inputs and outputs of several datatypes, a batching one and a decoupled streaming one.
The expected answers (status, content type, body) are Triton's. Ferry is checked against them always, and Triton
itself where it can be had (``support.triton``), so the table cannot drift from what Triton does.

Ferry answers a few cases otherwise on purpose (``KEPT``, with what Triton answers and why):

- Triton answers 500 (``INTERNAL``) for bodies a client got wrong: an empty body, a document that is not an
  object, an ``"id"`` that is not a string, elements that do not suit the input's datatype, nested arrays whose
  elements do not fill the shape, a ``"parameters"`` that is not an object. Ferry answers 400 in clearer words
  (the empty body and the nested arrays in Triton's);
- Triton wraps an integer that does not fit an unsigned input (``[256]`` for UINT8 becomes 0): Ferry refuses it;
- Triton refuses FP16 and BF16 outputs (``sending FP16 data via JSON is not supported``): the generate schema has
  no way to ask for binary outputs, so such a model cannot answer at all. Ferry writes them as numbers (its
  ``/infer`` refuses them as JSON outputs in Triton's words, since a client can ask for binary data there);
- Triton writes NaN and infinities as ``NaN`` / ``Infinity`` and BYTES outputs as their raw bytes, neither of
  which is JSON: Ferry writes ``null`` and replaces bytes that are not UTF-8;
- ``sequence_id`` in a body (a side-by-side sweep, recorded live, not in the tables): Triton 2.51 never reads it as
  the correlation id, so a sequence model refuses every generate request ("... must specify a non-zero or
  non-empty correlation ID"); Ferry reads ``sequence_id``/``sequence_start``/``sequence_end`` as ``/infer`` does.

Nested arrays are read as Triton reads them: their elements in order, the shape from the outer array's length
(``[["hi"]]`` for a ``[1]`` input, ``[[1], [2]]`` for ``[-1]``); a key written twice in the body is read twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.server import ServerThread, make_options, write_model

ECHO_CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "ids" data_type: TYPE_INT64 dims: [ -1 ] optional: true },
        { name: "f32" data_type: TYPE_FP32 dims: [ -1 ] optional: true },
        { name: "flag" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
        { name: "h" data_type: TYPE_FP16 dims: [ -1 ] optional: true },
        { name: "u8" data_type: TYPE_UINT8 dims: [ -1 ] optional: true },
        { name: "grid" data_type: TYPE_INT32 dims: [ 2, -1 ] optional: true },
        { name: "words" data_type: TYPE_STRING dims: [ -1 ] optional: true } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "shapes" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "out_i64" data_type: TYPE_INT64 dims: [ -1 ] },
         { name: "out_f32" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "out_f16" data_type: TYPE_FP16 dims: [ -1 ] },
         { name: "out_bool" data_type: TYPE_BOOL dims: [ -1 ] },
         { name: "out_words" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "out_2d" data_type: TYPE_INT32 dims: [ -1, -1 ] } ]
"""

# text_output: the text and the request's parameters; shapes: every input's shape, dtype and elements;
# parameter "want" picks the other outputs ("all", "f16", "empty": none at all, "nan")
ECHO_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

NAMES = ("text_input", "ids", "f32", "flag", "h", "u8", "grid", "words")


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            params = json.loads(request.parameters())
            shapes = {}
            for name in NAMES:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    array = tensor.as_numpy()
                    shapes[name] = [list(array.shape), str(array.dtype),
                                    [x.decode() if isinstance(x, bytes) else x.item() for x in array.flatten()]]
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().flatten()[0].decode()
            if text == "fail":
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("the model refused 'fail'")))
                continue
            want = params.get("want", "all")
            tensors = [
                pb_utils.Tensor("text_output", np.array([(text + "|" + json.dumps(params, sort_keys=True)).encode()],
                                                        dtype=np.object_)),
                pb_utils.Tensor("shapes", np.array([json.dumps(shapes, sort_keys=True).encode()], dtype=np.object_))]
            if want == "all":
                tensors += [pb_utils.Tensor("out_i64", np.array([2**40, -3], np.int64)),
                            pb_utils.Tensor("out_f32", np.array([0.1, 1.5], np.float32)),
                            pb_utils.Tensor("out_bool", np.array([True], np.bool_)),
                            pb_utils.Tensor("out_words", np.array([b"a", "\\u00e9".encode(), b'q"x'], np.object_)),
                            pb_utils.Tensor("out_2d", np.array([[1, 2], [3, 4]], np.int32))]
            elif want == "f16":
                tensors.append(pb_utils.Tensor("out_f16", np.array([1.5], np.float16)))
            elif want == "empty":
                tensors = []
            elif want == "nan":
                tensors = [pb_utils.Tensor("out_f32", np.array([float("nan"), float("inf")], np.float32))]
            out.append(pb_utils.InferenceResponse(tensors))
        return out
'''

BATCHED_CONFIG = """
name: "batched"
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "shapes" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

BATCHED_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            shape = json.dumps(list(x.shape)).encode()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("shapes", np.array([[shape]] * x.shape[0], dtype=np.object_))]))
        return out
'''

OPTIONAL_CONFIG = """
name: "optional"
backend: "python"
max_batch_size: 0
input [ { name: "opt" data_type: TYPE_INT32 dims: [ 1 ] optional: true } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

OPTIONAL_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            opt = pb_utils.get_input_tensor_by_name(request, "opt")
            reply = json.dumps([None if opt is None else opt.as_numpy().tolist(), json.loads(request.parameters())])
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([reply.encode()], dtype=np.object_))]))
        return out
'''

STREAM_CONFIG = """
name: "stream"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "delay" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# N responses (``delay`` seconds before each, stopping once the request is cancelled), then the final flag alone,
# or (parameter final="with_last") a last response that carries it; parameter "log": a file that gets one line per
# request, {"id", "sent", "cancelled"}, once it is done
STREAM_MODEL = '''
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            delay = pb_utils.get_input_tensor_by_name(request, "delay")
            delay = float(delay.as_numpy()[0]) if delay is not None else 0.0
            params = json.loads(request.parameters())
            sender = request.get_response_sender()
            sent, cancelled = 0, False
            for i in range(count):
                time.sleep(delay)
                if request.is_cancelled():
                    cancelled = True
                    break
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("I", np.array([i], np.int32)),
                    pb_utils.Tensor("text_output", np.array([("t%d" % i).encode()], dtype=np.object_))]))
                sent += 1
            if params.get("final") == "with_last":
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([99], np.int32))]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if "log" in params:
                with open(params["log"], "a") as log:
                    log.write(json.dumps({"id": request.request_id(), "sent": sent, "cancelled": cancelled}) + "\\n")
        return None
'''

MODELS = ["echo", "batched", "optional", "stream"]
JSON_TYPE, EVENTS_TYPE = "application/json", "text/event-stream; charset=utf-8"
ONE_RESPONSE = ('{"error":"generate expects model to produce exactly 1 response, use generate stream for model that '
                'generates various number of responses"}')
ALL_OUTPUTS = {"out_2d": [1, 2, 3, 4], "out_bool": True, "out_f32": [0.10000000149011612, 1.5],
               "out_i64": [1099511627776, -3], "out_words": ["a", "\u00e9", 'q"x']}


def _echo(shapes: dict[str, Any], text: str = "hi", params: dict[str, Any] | None = None, *,
          outputs: dict[str, Any] = ALL_OUTPUTS, request_id: str = "") -> str:
    """The echo model's answer, as the JSON text of its response (keys in byte order)."""
    fields = {"model_name": "echo", "model_version": "1", "shapes": json.dumps(shapes, sort_keys=True),
              "text_output": text + "|" + json.dumps(params or {}, sort_keys=True), **outputs}
    if request_id:
        fields["id"] = request_id
    return json.dumps(dict(sorted(fields.items())), separators=(",", ":"), ensure_ascii=False)


HI = {"text_input": [[1], "object", ["hi"]]}


def _i(position: int, request_id: str = "", text: bool = True) -> str:
    ident = f',"id":"{request_id}"' if request_id else ""
    tail = f',"text_output":"t{position}"' if text else ""
    return f'{{"I":{position}{ident},"model_name":"stream","model_version":"1"{tail}}}'


def _body(value: Any) -> bytes:
    return value if isinstance(value, bytes) else json.dumps(value).encode()


class Case:
    """A request (route under ``/v2/models/``, body) and Triton's answer: status, content type, body."""

    def __init__(self, route: str, body: Any, status: int, content_type: str, answer: str) -> None:
        self.route, self.body = route, _body(body)
        self.answer = (status, content_type, answer)


def _error(status: int, message: str) -> tuple[int, str, str]:
    return status, JSON_TYPE, json.dumps({"error": message}, separators=(",", ":"))


CASES: list[Case] = [
    # -- scalars, lists, strings, booleans, the shape filled from the model's dims
    Case("echo/generate", {"text_input": "hi"}, 200, JSON_TYPE, _echo(HI)),
    Case("echo/generate", {"text_input": ["hi"], "ids": 5, "flag": True}, 200, JSON_TYPE, _echo(
        {**HI, "ids": [[1], "int64", [5]], "flag": [[1], "bool", [True]]})),
    Case("echo/generate", {"text_input": "hi", "ids": [1, 2, 3], "f32": [1, 2.5], "u8": [255, 0]}, 200, JSON_TYPE,
         _echo({**HI, "ids": [[3], "int64", [1, 2, 3]], "f32": [[2], "float32", [1.0, 2.5]],
                "u8": [[2], "uint8", [255, 0]]})),
    Case("echo/generate", {"text_input": "hi", "ids": [], "words": "solo", "grid": [1, 2, 3, 4]}, 200, JSON_TYPE,
         _echo({**HI, "ids": [[0], "int64", []], "words": [[1], "object", ["solo"]],
                "grid": [[2, 2], "int32", [1, 2, 3, 4]]})),
    Case("echo/generate", {"text_input": "hi", "grid": [1, 2, 3]}, *_error(
        400, "The schema can not convert input 'grid' to tensor with proper shape")),
    Case("batched/generate", {"x": [1, 2]}, 200, JSON_TYPE,
         '{"model_name":"batched","model_version":"1","shapes":["[2, 1]","[2, 1]"]}'),
    Case("batched/generate", {"x": 7}, 200, JSON_TYPE, '{"model_name":"batched","model_version":"1","shapes":"[1, 1]"}'),
    # -- nested arrays: their elements in order, the shape from the outer array
    Case("echo/generate", {"text_input": [["hi"]], "ids": [[1], [2]], "words": [["x"], ["y"]]}, 200, JSON_TYPE, _echo(
        {**HI, "ids": [[2], "int64", [1, 2]], "words": [[2], "object", ["x", "y"]]})),
    Case("echo/generate", {"text_input": "hi", "words": [["x", "y"]]}, *_error(
        400, "[request id: <id_unknown>] unexpected number of string elements 2 for inference input 'words' for "
             "model 'echo', expecting 1")),
    # -- keys that name parameters: the rest at the top level, and "parameters"' keys
    Case("echo/generate", {"id": "r1", "text_input": "hi", "temperature": 0.5, "k": 3, "s": True,
                           "parameters": {"p": "x", "ids": [4]}}, 200, JSON_TYPE,
         _echo({**HI, "ids": [[1], "int64", [4]]}, params={"id": "r1", "k": 3, "p": "x", "s": True,
                                                             "temperature": 0.5}, request_id="r1")),
    Case("echo/generate", {"text_input": "hi", "big": 2**63, "neg": -5, "parameters": {}}, 200, JSON_TYPE,
         _echo(HI, params={"big": 9.223372036854776e+18, "neg": -5})),  # past int64: a double
    Case("echo/generate", {"text_input": "hi", "x": [1]}, *_error(
        400, "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'.")),
    Case("echo/generate", {"text_input": "hi", "parameters": {"x": None}}, *_error(
        400, "Converting keyword: 'parameters': parameter 'x' has invalid type. It should be either 'int', 'bool', "
             "or 'string'.")),
    Case("echo/generate", {"text_input": "hi", "parameters": {"parameters": {"a": 1}}}, *_error(
        400, "Converting keyword: 'parameters': parameter 'parameters' has invalid type. It should be either 'int', "
             "'bool', or 'string'.")),
    # -- an input given twice, FP16 inputs
    Case("echo/generate", {"id": "r9", "text_input": "a", "parameters": {"text_input": "b"}}, *_error(
        400, "Converting keyword: 'parameters': [request id: r9] input 'text_input' already exists in request")),
    Case("echo/generate", {"id": "r9", "parameters": {"text_input": "b"}, "text_input": "a"}, *_error(
        400, "[request id: r9] input 'text_input' already exists in request")),
    Case("optional/generate", b'{"opt": 1, "opt": 2}', *_error(
        400, "[request id: <id_unknown>] input 'opt' already exists in request")),
    Case("optional/generate", b'{"parameters": {"opt": 1, "opt": 2}}', *_error(
        400, "Converting keyword: 'parameters': [request id: <id_unknown>] input 'opt' already exists in request")),
    # one UTF-8 byte order mark before the body is skipped, as rapidjson skips it (Ferry refused it)
    Case("batched/generate", b'\xef\xbb\xbf{"x": 7}', 200, JSON_TYPE,
         '{"model_name":"batched","model_version":"1","shapes":"[1, 1]"}'),
    Case("stream/generate_stream", b'\xef\xbb\xbf{"N": 0}', 200, EVENTS_TYPE, ""),
    # a key written twice is read twice, by its name: its first value each time
    Case("optional/generate", b'{"parameters": {"a": 1}, "parameters": {"b": 2}}', 200, JSON_TYPE,
         '{"model_name":"optional","model_version":"1","text_output":"[null, {\\"a\\": 1}]"}'),
    Case("optional/generate", b'{"a": 1, "opt": 3, "a": 2, "parameters": {"b": 1, "b": 2}}', 200, JSON_TYPE,
         '{"model_name":"optional","model_version":"1","text_output":"[[3], {\\"a\\": 1, \\"b\\": 1}]"}'),
    Case("optional/generate", {}, 200, JSON_TYPE,
         '{"model_name":"optional","model_version":"1","text_output":"[null, {}]"}'),
    Case("echo/generate", {"text_input": "hi", "h": [1.0]}, *_error(
        400, "receiving FP16 data via JSON is not supported. Please use the binary data format for input h")),
    Case("echo/generate", {"text_input": "hi", "parameters": {"h": [1.0]}}, *_error(
        400, "Converting keyword: 'parameters': receiving FP16 data via JSON is not supported. Please use the binary "
             "data format for input h")),
    # -- a response with no output, model errors, several responses
    Case("echo/generate", {"text_input": "hi", "parameters": {"want": "empty"}}, 200, JSON_TYPE,
         '{"model_name":"echo","model_version":"1"}'),
    Case("echo/generate_stream", {"text_input": "hi", "id": "e", "parameters": {"want": "empty"}}, 200, EVENTS_TYPE,
         'data: {"id":"e","model_name":"echo","model_version":"1"}\n\n'),
    Case("echo/generate", {"text_input": "fail"}, 400, JSON_TYPE, '{"error":"the model refused \'fail\'"}'),
    Case("echo/generate_stream", {"text_input": "fail"}, 400, EVENTS_TYPE,
         'data: {"error":"the model refused \'fail\'"}\n\n'),
    Case("echo/versions/1/generate_stream", {"text_input": "hi", "id": "s1"}, 200, EVENTS_TYPE,
         f"data: {_echo(HI, params={'id': 's1'}, request_id='s1')}\n\n"),
    Case("stream/generate_stream", {"N": 3, "id": "abc"}, 200, EVENTS_TYPE,
         "".join(f"data: {_i(i, 'abc')}\n\n" for i in range(3))),
    Case("stream/generate_stream", {"N": 0}, 200, EVENTS_TYPE, ""),
    Case("stream/generate_stream", {"N": 1, "parameters": {"final": "with_last"}}, 200, EVENTS_TYPE,
         f"data: {_i(0)}\n\ndata: {_i(99, text=False)}\n\n"),
    Case("stream/generate", {"N": 1}, 200, JSON_TYPE, _i(0)),
    Case("stream/generate", {"N": 0, "parameters": {"final": "with_last"}}, 200, JSON_TYPE, _i(99, text=False)),
    Case("stream/generate", {"N": 0}, 200, JSON_TYPE, ONE_RESPONSE),
    Case("stream/generate", {"N": 2}, 200, JSON_TYPE, ONE_RESPONSE),
    Case("stream/versions/2/generate_stream", {"N": 1}, *_error(
        404, "Request for unknown model: 'stream' version 2 is not found")),
]

#: where Ferry answers otherwise on purpose (module docstring): route, body -> (Triton's answer, Ferry's)
KEPT: list[tuple[str, Any, tuple[int, str, str], tuple[int, str, str]]] = [
    ("echo/generate", b"", _error(500, "failed to parse the request JSON buffer: The document is empty. at 0"),
     _error(400, "failed to parse the request JSON buffer: The document is empty.")),
    ("echo/generate", b"[1]", _error(500, "attempt to get members for non-object"),
     _error(400, "generate request must be a JSON object")),
    ("echo/generate", {"text_input": "hi", "id": 7}, _error(
        500, "Unable to parse 'id': attempt to access JSON non-string as string"),
     _error(400, "'id' field must be a string")),
    ("echo/generate", {"text_input": "hi", "ids": [1.5]}, _error(
        500, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
     _error(400, "input 'ids': data does not fit INT64: expected integers, got 1.5")),
    ("echo/generate", {"text_input": 5}, _error(
        500, "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
     _error(400, "input 'text_input': BYTES elements must be JSON strings")),
    ("echo/generate", {"text_input": "hi", "ids": [[1, 2]]}, _error(
        500, "Unable to parse 'data': Shape does not match true shape of 'data' field"),
     _error(400, "Unable to parse 'data': Shape does not match true shape of 'data' field")),
    ("echo/generate", {"text_input": "hi", "parameters": []}, _error(
        500, "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as object"),
     _error(400, "Expected JSON object for keyword: 'parameters'")),
    ("echo/generate", {"text_input": "hi", "u8": [256]}, (200, JSON_TYPE, _echo({**HI, "u8": [[1], "uint8", [0]]})),
     _error(400, "input 'u8': data does not fit UINT8: Python integer 256 out of bounds for uint8")),
    ("echo/generate_stream", {"text_input": "hi", "parameters": {"want": "f16"}}, (400, EVENTS_TYPE, (
        'data: {"error":"sending FP16 data via JSON is not supported. Please use the binary data format for '
        'output"}\n\n')),
     (200, EVENTS_TYPE, f"data: {_echo(HI, params={'want': 'f16'}, outputs={'out_f16': 1.5})}\n\n")),
    ("echo/generate", {"text_input": "hi", "parameters": {"want": "nan"}}, (
        200, JSON_TYPE, '{"model_name":"echo","model_version":"1","out_f32":[NaN,Infinity]}'),
     (200, JSON_TYPE, '{"model_name":"echo","model_version":"1","out_f32":[null,null]}')),
]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("generate_triton")
    write_model(path, "echo", ECHO_CONFIG, files={"1/model.py": ECHO_MODEL})
    write_model(path, "batched", BATCHED_CONFIG, files={"1/model.py": BATCHED_MODEL})
    write_model(path, "optional", OPTIONAL_CONFIG, files={"1/model.py": OPTIONAL_MODEL})
    write_model(path, "stream", STREAM_CONFIG, files={"1/model.py": STREAM_MODEL})
    return path


@pytest.fixture(scope="module")
def ferry_url(repository: Path) -> Iterator[str]:
    thread = ServerThread(make_options([repository]))
    server = thread.start()
    try:
        yield f"http://{server.http_url}"
    finally:
        thread.stop()


def _answers(url: str, requests: list[tuple[str, bytes]]) -> list[tuple[int, str, str]]:
    got = []
    with httpx.Client(timeout=60) as client:
        for route, body in requests:
            answer = client.post(f"{url}/v2/models/{route}", content=body)
            got.append((answer.status_code, answer.headers["content-type"], answer.text))
    return got


def _kept_requests() -> list[tuple[str, bytes]]:
    return [(route, _body(body)) for route, body, _, _ in KEPT]


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.route}:{case.body[:60]!r}")
def test_ferry_answers_generate_as_triton(ferry_url: str, case: Case) -> None:
    assert _answers(ferry_url, [(case.route, case.body)]) == [case.answer]


@pytest.mark.parametrize(("route", "body", "ferry"), [(route, body, ferry) for route, body, _, ferry in KEPT],
                         ids=lambda value: str(value)[:60])
def test_ferry_answers_otherwise_on_purpose(ferry_url: str, route: str, body: Any, ferry: tuple) -> None:
    assert _answers(ferry_url, [(route, _body(body))]) == [ferry]


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_triton_answers_generate_as_the_tables_say(repository: Path) -> None:
    from support.triton import running_triton

    with running_triton(repository, MODELS) as (http, _, _):
        url = f"http://127.0.0.1:{http}"
        got = _answers(url, [(case.route, case.body) for case in CASES])
        kept = _answers(url, _kept_requests())
    for case, answer in zip(CASES, got):
        assert answer == case.answer, (case.route, case.body)
    assert kept == [triton for _, _, triton, _ in KEPT]


def _cut_stream(url: str, log: Path) -> tuple[tuple[int, str, bytes], dict[str, Any]]:
    """Read the first event of a long stream, hang up, and wait for the model's line about the request."""
    body = json.dumps({"N": 20, "delay": 0.2, "id": "cut", "parameters": {"log": str(log)}})
    with httpx.Client(timeout=60) as client, \
            client.stream("POST", f"{url}/v2/models/stream/generate_stream", content=body) as answer:
        first = (answer.status_code, answer.headers["content-type"], next(answer.iter_raw()))
    deadline = time.monotonic() + 60
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    # the model is idle once it answers the next request: Triton's python stub, killed with its server in the
    # middle of one, is left behind
    assert httpx.post(f"{url}/v2/models/stream/generate", content=b'{"N": 1}', timeout=60).status_code == 200
    return first, json.loads(log.read_text().splitlines()[0])


# the live NVIDIA Triton case runs with -m slow; Ferry's case runs by default against the same expected answers
@pytest.mark.parametrize("server", ["ferry", pytest.param("triton", marks=pytest.mark.slow)])
def test_a_client_gone_mid_stream_cancels_the_request(repository: Path, tmp_path: Path, server: str,
                                                      request: pytest.FixtureRequest) -> None:
    """The model sees its request cancelled once the client hangs up, and stops (``request.is_cancelled()``)."""
    log = tmp_path / f"{server}.log"
    if server == "ferry":
        first, line = _cut_stream(request.getfixturevalue("ferry_url"), log)
    else:
        from support.triton import running_triton

        with running_triton(repository, ["stream"]) as (http, _, _):
            first, line = _cut_stream(f"http://127.0.0.1:{http}", log)
    assert first == (200, EVENTS_TYPE, f"data: {_i(0, 'cut')}\n\n".encode())
    assert line["id"] == "cut" and line["cancelled"] is True and 1 <= line["sent"] < 20
