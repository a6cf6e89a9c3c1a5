"""The HTTP surface answered as NVIDIA Triton 2.51 answers it: status, content type, encoding headers and body.

Each case below was sent to Triton 2.51 (CPU, python backend) and to Ferry serving the same python models; the
expected answers are Triton's. Ferry is checked against them always, and Triton itself where it can be had
(``support.triton``), so the table cannot drift from what Triton does. Differences left on purpose (a 400 where
Triton answers 500 for a malformed body, percent-decoded model names in the path, ...) are not in the table; they
have their own tests below, which say Triton's answer.

Triton's content types are route by route: its handlers for metadata, configuration, statistics and the
repository set ``application/json`` first, while health, model readiness, unknown routes and inference errors
found before the body is parsed keep libevhtp's default ``text/plain`` (with the same ``{"error": ...}`` body),
and so do errors of the model's execution (sent from Triton's response callback).
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np
import pytest
from support.python_models import ADD_SUB_CONFIG, ADD_SUB_MODEL, COUNT_CONFIG, COUNT_MODEL
from support.python_models import DATA as PYTHON_MODELS
from support.server import ServerThread, make_options, write_model

FAILS_CONFIG = ADD_SUB_CONFIG.replace('"add_sub"', '"fails"')

#: INPUT0's first element picks the failure: 1 an error response, 2 one with a code, else ``execute`` raises
FAILS_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            kind = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().flat[0])
            if kind == 1:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad thing")))
            elif kind == 2:
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("bad argument", pb_utils.TritonError.INVALID_ARG)))
            else:
                raise RuntimeError("boom")
        return out
'''

HALVES_CONFIG = """
name: "halves"
backend: "python"
max_batch_size: 0
input [ { name: "H" data_type: TYPE_FP16 dims: [ 2 ] }, { name: "B" data_type: TYPE_BF16 dims: [ 2 ] } ]
output [ { name: "H" data_type: TYPE_FP16 dims: [ 2 ] }, { name: "B" data_type: TYPE_BF16 dims: [ 2 ] },
         { name: "F" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""

#: its FP16 and BF16 inputs back (BF16 through DLPack: numpy has no bfloat16), and H as FP32
HALVES_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            h = pb_utils.get_input_tensor_by_name(request, "H")
            b = pb_utils.get_input_tensor_by_name(request, "B")
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("H", h.as_numpy()), pb_utils.Tensor.from_dlpack("B", b.to_dlpack()),
                pb_utils.Tensor("F", h.as_numpy().astype(np.float32))]))
        return out
'''

MODELS = ("add_sub", "counter", "fails", "halves", "py_bytes")


def _json(document: Any) -> bytes:
    return json.dumps(document).encode()


def _inputs(**extra: Any) -> bytes:
    return _json({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                             {"name": "INPUT1", "datatype": "INT32", "shape": [1, 4], "data": [1, 1, 1, 1]}],
                  **extra})


def _failing(kind: int) -> bytes:
    return _json({"inputs": [{"name": name, "datatype": "INT32", "shape": [1, 4], "data": [kind, 0, 0, 0]}
                             for name in ("INPUT0", "INPUT1")]})


def _binary(tail: int = 0) -> tuple[bytes, dict[str, str]]:
    """A binary add_sub request; ``tail`` bytes more (> 0) or fewer (< 0) than its inputs declare."""
    body, headers = _binary_sized(16)
    return (body + b"\0" * tail if tail >= 0 else body[:tail]), headers


def _binary_sized(first: int) -> tuple[bytes, dict[str, str]]:
    """A binary add_sub request whose INPUT0 declares and carries ``first`` bytes (16 fit its shape)."""
    header = _json({"inputs": [{"name": name, "datatype": "INT32", "shape": [1, 4],
                                "parameters": {"binary_data_size": size}}
                               for name, size in (("INPUT0", first), ("INPUT1", 16))]})
    data = np.arange(8, dtype=np.int32).tobytes()
    return header + data[:first] + data[16:], {"Inference-Header-Content-Length": str(len(header))}


def _binary_strings(name: str, shape: list[int], data: bytes) -> tuple[bytes, dict[str, str]]:
    """A binary request of one BYTES input with ``data`` as its (length-prefixed) elements."""
    header = _json({"inputs": [{"name": name, "datatype": "BYTES", "shape": shape,
                                "parameters": {"binary_data_size": len(data)}}]})
    return header + data, {"Inference-Header-Content-Length": str(len(header))}


def _halves(outputs: list[dict[str, Any]] | None = None, **extra: Any) -> tuple[bytes, dict[str, str]]:
    """A binary request of ``halves`` (H = [1.5, -2], B = [1.5, -2] in BF16) asking for ``outputs``."""
    header = _json({"inputs": [{"name": name, "datatype": datatype, "shape": [2], "parameters": {"binary_data_size": 4}}
                               for name, datatype in (("H", "FP16"), ("B", "BF16"))],
                    **({"outputs": outputs} if outputs is not None else {}), **extra})
    bf16 = np.array([1.5, -2], np.float32).view(np.uint16)[1::2].tobytes()  # the upper halves of the FP32s
    return header + np.array([1.5, -2], np.float16).tobytes() + bf16, {"Inference-Header-Content-Length": str(len(header))}


def _as_json(*names: str) -> list[dict[str, Any]]:
    return [{"name": name, "parameters": {"binary_data": False}} for name in names]


def _as_binary(*names: str) -> list[dict[str, Any]]:
    return [{"name": name, "parameters": {"binary_data": True}} for name in names]


#: tritonserver's answer to an FP16 or BF16 output asked for as JSON, which names no output: found while writing
#: the response (the model ran), so typed text/plain
HALF_AS_JSON = "sending {} data via JSON is not supported. Please use the binary data format for output"

_HEADER_LENGTH = _binary()[1]["Inference-Header-Content-Length"]
#: the generate route's answer to add_sub's INPUT0 as one number (its shape is [-1, 4])
GENERATE_SHAPE = "The schema can not convert input 'INPUT0' to tensor with proper shape"


class Case(NamedTuple):
    method: str
    path: str
    body: bytes = b""
    #: a mapping, or (name, value) pairs in the order sent where a header is sent twice
    headers: dict[str, str] | tuple[tuple[str, str], ...] = {}


class Answer(NamedTuple):
    status: int
    content_type: str | None
    #: the encoding headers: content-encoding of the answer, accept-encoding of a 501 for the request's
    encodings: tuple[str | None, str | None]
    body: bytes  # decoded from its content-encoding


def _error(message: str) -> bytes:
    return json.dumps({"error": message}, separators=(",", ":")).encode()


def _text(status: int, message: str) -> Answer:
    return Answer(status, "text/plain", (None, None), _error(message))


def _typed(status: int, message: str) -> Answer:
    return Answer(status, "application/json", (None, None), _error(message))


OUTPUTS = (b'{"name":"OUTPUT0","datatype":"INT32","shape":[1,4],"data":[2,3,4,5]},'
           b'{"name":"OUTPUT1","datatype":"INT32","shape":[1,4],"data":[0,1,2,3]}')
SUM = b'{"model_name":"add_sub","model_version":"1","outputs":[' + OUTPUTS + b"]}"
SUM0 = b'{"model_name":"add_sub","model_version":"1","outputs":[' + OUTPUTS.split(b"},")[0] + b"}]}"  # OUTPUT0 only
BINARY_SUM = (b'{"model_name":"add_sub","model_version":"1","outputs":['  # of ``_binary()``
              b'{"name":"OUTPUT0","datatype":"INT32","shape":[1,4],"data":[4,6,8,10]},'
              b'{"name":"OUTPUT1","datatype":"INT32","shape":[1,4],"data":[-4,-4,-4,-4]}]}')
#: an add_sub request whose binary body is read as raw (Inference-Header-Content-Length 0): add_sub has 2 inputs
RAW_REFUSED = ("[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got 2 "
               "inputs in 'add_sub' model configuration")
UNSUPPORTED_COMPRESSION = Answer(501, "text/plain", (None, "gzip, deflate"), b'{"error":"Unsupported compression type"}')
GENERATE_ENCODING = "Unsupported content-encoding, only 'identity' is supported."
INVALID_TYPE = "parameter '{}' has invalid type. It should be either 'int', 'bool', or 'string'."
INDEX = b"[" + b",".join(b'{"name":"%s","version":"1","state":"READY"}' % name.encode() for name in MODELS) + b"]"
BOM = b"\xef\xbb\xbf"
NOT_FOUND = _text(404, "Not Found")
NOT_ALLOWED_TEXT = _text(405, "Method Not Allowed")
NOT_ALLOWED_JSON = _typed(405, "Method Not Allowed")
EMPTY_TEXT = Answer(200, "text/plain", (None, None), b"")

CASES: dict[str, tuple[Case, Answer]] = {
    # a decoupled model on the plain inference route: Triton's words, found before the body is read
    "decoupled model infer": (Case("POST", "/v2/models/counter/infer", _json(
        {"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [2]}]})),
        _text(501, "HTTP end point doesn't support models with decoupled transaction policy")),
    # health and readiness: text/plain, even when empty
    "server live": (Case("GET", "/v2/health/live"), EMPTY_TEXT),
    "server ready": (Case("GET", "/v2/health/ready"), EMPTY_TEXT),
    "server live by POST": (Case("POST", "/v2/health/live"), NOT_ALLOWED_TEXT),
    "model ready": (Case("GET", "/v2/models/add_sub/ready"), EMPTY_TEXT),
    "model version ready": (Case("GET", "/v2/models/add_sub/versions/1/ready"), EMPTY_TEXT),
    "unknown model ready": (Case("GET", "/v2/models/nope/ready"), _text(400, "Model version not ready")),
    "unknown version ready": (Case("GET", "/v2/models/add_sub/versions/2/ready"),
                              _text(400, "Model version not ready")),
    "model ready by POST": (Case("POST", "/v2/models/add_sub/ready"), NOT_ALLOWED_TEXT),
    "model ready, version too large": (Case("GET", "/v2/models/add_sub/versions/99999999999999999999/ready"), _text(
        400, "failed to get model version from specified version string '99999999999999999999' (details: stol), "
             "version should be an integral value > 0")),
    # unknown routes: no handler, text/plain
    "unknown route": (Case("GET", "/v3/foo"), NOT_FOUND),
    "health with a trailing slash": (Case("GET", "/v2/health/live/"), NOT_FOUND),
    "metadata with a trailing slash": (Case("GET", "/v2/models/add_sub/"), NOT_FOUND),
    "version that is not a number": (Case("GET", "/v2/models/add_sub/versions/abc"), NOT_FOUND),
    "infer, version not a number": (Case("POST", "/v2/models/add_sub/versions/abc/infer", _inputs()), NOT_FOUND),
    "trace setting of a version": (Case("GET", "/v2/models/add_sub/versions/1/trace/setting"), NOT_FOUND),
    # an unknown model's trace setting: refused before the body is read (Ferry named the body's fault first)
    "trace setting of an unknown model, body not JSON": (Case("POST", "/v2/models/nope/trace/setting", b"{"),
                                                         _typed(400, "Request for unknown model : nope")),
    "trace setting of an unknown model, body not an object": (Case("POST", "/v2/models/nope/trace/setting", b"[]"),
                                                              _typed(400, "Request for unknown model : nope")),
    "trace setting of an unknown model, a rate that is a number": (Case(
        "POST", "/v2/models/nope/trace/setting", _json({"trace_rate": 5})),
        _typed(400, "Request for unknown model : nope")),
    "unknown model control action": (Case("POST", "/v2/repository/models/add_sub/bogus"), NOT_FOUND),
    # inference: text/plain for what Triton finds before parsing the body, application/json after
    "infer by GET": (Case("GET", "/v2/models/add_sub/infer"), NOT_ALLOWED_TEXT),
    "infer unknown model": (Case("POST", "/v2/models/nope/infer", _inputs()),
                            _text(404, "Request for unknown model: 'nope' is not found")),
    "infer unknown version": (Case("POST", "/v2/models/add_sub/versions/2/infer", _inputs()),
                              _text(404, "Request for unknown model: 'add_sub' version 2 is not found")),
    # the model is looked up before the body is read: its errors come first (Ferry parsed the body first)
    "infer unknown model, body not JSON": (Case("POST", "/v2/models/nope/infer", b"{not json"),
                                           _text(404, "Request for unknown model: 'nope' is not found")),
    "infer unknown version, no inputs": (Case("POST", "/v2/models/add_sub/versions/2/infer", _json({"id": "x"})),
                                         _text(404, "Request for unknown model: 'add_sub' version 2 is not found")),
    "infer unknown model, header length past the body": (Case("POST", "/v2/models/nope/infer", _binary()[0], {
        "Inference-Header-Content-Length": "300"}), _text(404, "Request for unknown model: 'nope' is not found")),
    "infer unknown model, unsupported content encoding": (
        Case("POST", "/v2/models/nope/infer", _inputs(), {"Content-Encoding": "br"}),
        _text(404, "Request for unknown model: 'nope' is not found")),
    "decoupled model infer, body not JSON": (Case("POST", "/v2/models/counter/infer", b"[1, 2"),
        _text(501, "HTTP end point doesn't support models with decoupled transaction policy")),
    "infer header length past the body": (Case("POST", "/v2/models/add_sub/infer", _binary()[0], {
        "Inference-Header-Content-Length": "300"}),
        _text(400, "inference header size should be in range (0, 240), got: 300")),
    "infer negative header length": (Case("POST", "/v2/models/add_sub/infer", _binary()[0], {
        "Inference-Header-Content-Length": "-1"}),
        _text(400, "inference header size should be in range (0, 240), got: -1")),
    "infer unsupported content encoding": (
        Case("POST", "/v2/models/add_sub/infer", _inputs(), {"Content-Encoding": "br"}),
        Answer(501, "text/plain", (None, "gzip, deflate"), b'{"error":"Unsupported compression type"}')),
    # an empty body in gzip or deflate: Triton's words before the body is parsed (Ferry: "truncated data")
    "infer empty gzip body": (Case("POST", "/v2/models/add_sub/infer", b"", {"Content-Encoding": "gzip"}),
                              _text(400, "nothing to be decompressed")),
    "infer empty deflate body": (Case("POST", "/v2/models/add_sub/infer", b"", {"Content-Encoding": "deflate"}),
                                 _text(400, "nothing to be decompressed")),
    "infer more binary data than declared": (Case("POST", "/v2/models/add_sub/infer", *_binary(2)),
                                             _typed(400, "unexpected additional input data for model 'add_sub'")),
    "infer less binary data than declared": (Case("POST", "/v2/models/add_sub/infer", *_binary(-4)), _typed(
        400, "unexpected size for input 'INPUT1', expecting 4 additional bytes for model 'add_sub'")),
    "infer with zero classes": (Case("POST", "/v2/models/add_sub/infer", _inputs(
        outputs=[{"name": "OUTPUT0", "parameters": {"classification": 0}}])), Answer(
        200, "application/json", (None, None), SUM0)),
    "infer with an id": (Case("POST", "/v2/models/add_sub/infer", _inputs(id="r1")), Answer(
        200, "application/json", (None, None), b'{"id":"r1",' + SUM[1:])),
    "infer input of another datatype": (Case("POST", "/v2/models/add_sub/infer", _json({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 4], "data": [1, 1, 1, 1]}]})), _typed(
        400, "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'FP32', but model 'add_sub' expects "
             "'INT32'")),
    # one UTF-8 byte order mark before a JSON body is skipped, as rapidjson skips it (Ferry refused it)
    "infer JSON after a byte order mark": (Case("POST", "/v2/models/add_sub/infer", BOM + _inputs()),
                                           Answer(200, "application/json", (None, None), SUM)),
    "infer binary header after a byte order mark": (Case("POST", "/v2/models/add_sub/infer", BOM + _binary()[0], {
        "Inference-Header-Content-Length": str(len(BOM) + int(_binary()[1]["Inference-Header-Content-Length"]))}),
        Answer(200, "application/json", (None, None), BINARY_SUM)),
    "repository index after a byte order mark": (Case("POST", "/v2/repository/index", BOM + _json({"ready": True})),
                                                 Answer(200, "application/json", (None, None), INDEX)),
    # FP16 and BF16 have no JSON form: refused by the front end before the model's datatype is compared
    "infer FP16 input as JSON": (Case("POST", "/v2/models/add_sub/infer", _json({"inputs": [
        {"name": "INPUT0", "datatype": "FP16", "shape": [1, 4], "data": [1.5, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 4], "data": [1, 1, 1, 1]}]})), _typed(
        400, "receiving FP16 data via JSON is not supported. Please use the binary data format for input INPUT0")),
    "infer BF16 input as JSON": (Case("POST", "/v2/models/add_sub/infer", _json({"inputs": [
        {"name": "INPUT0", "datatype": "BF16", "shape": [1, 4], "data": [1.5, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 4], "data": [1, 1, 1, 1]}]})), _typed(
        400, "receiving BF16 data via JSON is not supported. Please use the binary data format for input INPUT0")),
    # ... and FP16 or BF16 outputs asked for as JSON fail the response, whatever else it holds (Ferry wrote numbers)
    "infer FP16 output as JSON": (Case("POST", "/v2/models/halves/infer", *_halves(_as_json("H"))),
                                  _text(400, HALF_AS_JSON.format("FP16"))),
    "infer BF16 output as JSON": (Case("POST", "/v2/models/halves/infer", *_halves(_as_json("B"))),
                                  _text(400, HALF_AS_JSON.format("BF16"))),
    "infer FP16 output with no binary_data flag": (Case("POST", "/v2/models/halves/infer", *_halves([{"name": "H"}])),
                                                   _text(400, HALF_AS_JSON.format("FP16"))),
    "infer FP16 output as JSON beside FP32": (Case("POST", "/v2/models/halves/infer", *_halves(_as_json("F", "H"))),
                                              _text(400, HALF_AS_JSON.format("FP16"))),
    "infer BF16 output as JSON beside binary FP16": (Case("POST", "/v2/models/halves/infer", *_halves(
        _as_binary("H") + _as_json("B"))), _text(400, HALF_AS_JSON.format("BF16"))),
    "infer FP16 output as JSON, binary_data_output true": (Case("POST", "/v2/models/halves/infer", *_halves(
        _as_json("H"), parameters={"binary_data_output": True})), _text(400, HALF_AS_JSON.format("FP16"))),
    "infer half outputs, none listed": (Case("POST", "/v2/models/halves/infer", *_halves()),
                                        _text(400, HALF_AS_JSON.format("FP16"))),
    "infer half outputs, none listed, binary_data_output true": (Case("POST", "/v2/models/halves/infer", *_halves(
        parameters={"binary_data_output": True})), Answer(200, "application/octet-stream", (None, None), (
            b'{"model_name":"halves","model_version":"1","outputs":[{"name":"H","datatype":"FP16","shape":[2],'
            b'"parameters":{"binary_data_size":4}},{"name":"B","datatype":"BF16","shape":[2],"parameters":'
            b'{"binary_data_size":4}},{"name":"F","datatype":"FP32","shape":[2],"parameters":{"binary_data_size":8}}]}'
            b"\x00>\x00\xc0\xc0?\x00\xc0" + np.array([1.5, -2], np.float32).tobytes()))),
    "infer FP16 output binary, FP32 as JSON": (Case("POST", "/v2/models/halves/infer", *_halves(
        _as_binary("H") + _as_json("F"))), Answer(200, "application/octet-stream", (None, None), (
            b'{"model_name":"halves","model_version":"1","outputs":[{"name":"H","datatype":"FP16","shape":[2],'
            b'"parameters":{"binary_data_size":4}},{"name":"F","datatype":"FP32","shape":[2],"data":[1.5,-2.0]}]}'
            b"\x00>\x00\xc0"))),
    # a classification Triton cannot make is found as the response is written too: text/plain (Ferry: JSON)
    "infer classification of an FP16 output": (Case("POST", "/v2/models/halves/infer", *_halves(
        [{"name": "H", "parameters": {"classification": 1, "binary_data": False}}])),
        _text(400, "class result not available for output due to unsupported type 'FP16'")),
    # data that does not fit the shape: the core's words, after the model's other checks (``--http-workers``
    # ran the model on a placeholder instead: the worker's finding did not reach the server process)
    "infer binary data short of the shape": (Case("POST", "/v2/models/add_sub/infer", *_binary_sized(12)), _typed(
        400, "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected "
             "16, got 12")),
    "infer too few strings": (Case("POST", "/v2/models/py_bytes/infer", _json({"inputs": [
        {"name": "TEXT", "datatype": "BYTES", "shape": [3], "data": ["a", "b"]}]})), _typed(
        400, "[request id: <id_unknown>] expected 3 string elements for inference input 'TEXT' for model 'py_bytes', "
             "got 2")),
    # a BYTES element longer than the bytes left: Triton's python backend finds it as the model executes, so the
    # answer is typed as the model's errors are (the core's string count and length checks are application/json)
    "infer BYTES element longer than its data": (Case("POST", "/v2/models/py_bytes/infer", *_binary_strings(
        "TEXT", [1], struct.pack("<I", 10) + b"abc")), _text(
        400, "incomplete string data for inference input 'TEXT', expecting string of length 10 but only 3 bytes "
             "available")),
    # errors of the model's execution: text/plain, as the model worded them
    "infer, the model answers an error": (Case("POST", "/v2/models/fails/infer", _failing(1)),
                                          _text(500, "bad thing")),
    "infer, the model answers an error with a code": (Case("POST", "/v2/models/fails/infer", _failing(2)),
                                                      _text(400, "bad argument")),
    "infer, the model raises": (Case("POST", "/v2/models/fails/infer", _failing(3)), _text(
        500, "Failed to process the request(s) for model 'fails_0', message: RuntimeError: boom")),
    # request parameters: an int, bool, string or double; an object, array or null is refused, ``headers`` too
    "request parameter headers an object": (Case("POST", "/v2/models/add_sub/infer", _inputs(
        parameters={"headers": {"x-a": "b"}})), _typed(400, INVALID_TYPE.format("headers"))),
    "request parameter headers an array": (Case("POST", "/v2/models/add_sub/infer", _inputs(
        parameters={"headers": ["x-a"]})), _typed(400, INVALID_TYPE.format("headers"))),
    "request parameter headers null": (Case("POST", "/v2/models/add_sub/infer", _inputs(
        parameters={"headers": None})), _typed(400, INVALID_TYPE.format("headers"))),
    "request parameter headers a string": (Case("POST", "/v2/models/add_sub/infer", _inputs(
        parameters={"headers": "x-a"})), Answer(200, "application/json", (None, None), SUM)),
    "request parameter a nested object": (Case("POST", "/v2/models/add_sub/infer", _inputs(
        parameters={"p": {"q": {"r": 1}}})), _typed(400, INVALID_TYPE.format("p"))),
    "request parameter an array": (Case("POST", "/v2/models/add_sub/infer", _inputs(
        parameters={"p": [1, 2]})), _typed(400, INVALID_TYPE.format("p"))),
    "request parameter null": (Case("POST", "/v2/models/add_sub/infer", _inputs(parameters={"p": None})),
                               _typed(400, INVALID_TYPE.format("p"))),
    "request parameter a double": (Case("POST", "/v2/models/add_sub/infer", _inputs(parameters={"p": 1.5})),
                                   Answer(200, "application/json", (None, None), SUM)),
    "input and output parameters of any type": (Case("POST", "/v2/models/add_sub/infer", _json({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4],
         "parameters": {"headers": {"a": "b"}, "p": [1], "q": None}},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 4], "data": [1, 1, 1, 1]}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"headers": {"a": "b"}, "p": [1], "q": None}},
                    {"name": "OUTPUT1"}]})), Answer(200, "application/json", (None, None), SUM)),
    # an output listed twice: its first entry decides (Ferry took the last)
    "output listed twice, JSON first": (Case("POST", "/v2/models/add_sub/infer", _inputs(outputs=[
        {"name": "OUTPUT0", "parameters": {"binary_data": False}}, {"name": "OUTPUT0", "parameters": {
            "binary_data": True}}])), Answer(200, "application/json", (None, None), SUM0)),
    "output listed twice, binary first": (Case("POST", "/v2/models/add_sub/infer", _inputs(outputs=[
        {"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT0"}])), Answer(
        200, "application/octet-stream", (None, None), b'{"model_name":"add_sub","model_version":"1","outputs":['
        b'{"name":"OUTPUT0","datatype":"INT32","shape":[1,4],"parameters":{"binary_data_size":16}}]}'
        + np.array([2, 3, 4, 5], np.int32).tobytes())),
    "output listed twice, plain first": (Case("POST", "/v2/models/add_sub/infer", _inputs(outputs=[
        {"name": "OUTPUT0"}, {"name": "OUTPUT0", "parameters": {"classification": 1}}])), Answer(
        200, "application/json", (None, None), SUM0)),
    # response encoding: the accepted one of the highest q-value, the first among equals
    "gzip refused by its q-value": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {
        "Accept-Encoding": "gzip;q=0"}), Answer(200, "application/json", (None, None), SUM)),
    "deflate listed first": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {"Accept-Encoding": "deflate, gzip"}),
                             Answer(200, "application/json", ("deflate", None), SUM)),
    "identity preferred": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {
        "Accept-Encoding": "identity;q=0.5, gzip;q=0.2"}), Answer(200, "application/json", (None, None), SUM)),
    "gzip of the highest q-value": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {
        "Accept-Encoding": "deflate;q=0.5, gzip;q=0.9"}), Answer(200, "application/json", ("gzip", None), SUM)),
    # an upgrade request is the plain request it also is, body included (Ferry read no body: 400 "Raw request ...")
    "infer with curl --http2's h2c upgrade": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {
        "Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAARAAAAAAAIAAAAA"}),
        Answer(200, "application/json", (None, None), SUM)),
    "infer with a websocket upgrade": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {
        "Connection": "Upgrade", "Upgrade": "websocket"}), Answer(200, "application/json", (None, None), SUM)),
    "gzip request body": (Case("POST", "/v2/models/add_sub/infer", gzip.compress(_inputs()), {
        "Content-Encoding": "gzip"}), Answer(200, "application/json", (None, None), SUM)),
    # a header sent twice: its first value counts (evhtp_kv_find), the second is ignored (Ferry took the last)
    "infer header length twice, the JSON's first": (Case("POST", "/v2/models/add_sub/infer", _binary()[0], (
        ("Inference-Header-Content-Length", _HEADER_LENGTH), ("Inference-Header-Content-Length", "0"))),
        Answer(200, "application/json", (None, None), BINARY_SUM)),
    "infer header length twice, 0 first": (Case("POST", "/v2/models/add_sub/infer", _binary()[0], (
        ("Inference-Header-Content-Length", "0"), ("Inference-Header-Content-Length", _HEADER_LENGTH))),
        _typed(400, RAW_REFUSED)),
    "infer header length twice, one past the body second": (Case("POST", "/v2/models/add_sub/infer", _binary()[0], (
        ("Inference-Header-Content-Length", _HEADER_LENGTH), ("Inference-Header-Content-Length", "300"))),
        Answer(200, "application/json", (None, None), BINARY_SUM)),
    "infer empty header length": (Case("POST", "/v2/models/add_sub/infer", _binary()[0], {
        "Inference-Header-Content-Length": ""}), _typed(400, RAW_REFUSED)),  # atoi(""): 0, a raw request
    "content encoding twice, gzip first": (Case("POST", "/v2/models/add_sub/infer", gzip.compress(_inputs()), (
        ("Content-Encoding", "gzip"), ("Content-Encoding", "br"))), Answer(200, "application/json", (None, None), SUM)),
    "content encoding twice, br first": (Case("POST", "/v2/models/add_sub/infer", gzip.compress(_inputs()), (
        ("Content-Encoding", "br"), ("Content-Encoding", "gzip"))), UNSUPPORTED_COMPRESSION),
    "content encoding twice, empty first": (Case("POST", "/v2/models/add_sub/infer", gzip.compress(_inputs()), (
        ("Content-Encoding", ""), ("Content-Encoding", "gzip"))), UNSUPPORTED_COMPRESSION),
    "content encoding twice, empty second": (Case("POST", "/v2/models/add_sub/infer", gzip.compress(_inputs()), (
        ("Content-Encoding", "gzip"), ("Content-Encoding", ""))), Answer(200, "application/json", (None, None), SUM)),
    "accept encoding twice, gzip first": (Case("POST", "/v2/models/add_sub/infer", _inputs(), (
        ("Accept-Encoding", "gzip"), ("Accept-Encoding", "deflate"))), Answer(
        200, "application/json", ("gzip", None), SUM)),
    # encoding names matched exactly, as Triton matches them: GZIP, an empty value or Identity is another encoding
    "content encoding GZIP": (Case("POST", "/v2/models/add_sub/infer", gzip.compress(_inputs()), {
        "Content-Encoding": "GZIP"}), UNSUPPORTED_COMPRESSION),
    "content encoding empty": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {"Content-Encoding": ""}),
                               UNSUPPORTED_COMPRESSION),
    "content encoding Identity": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {
        "Content-Encoding": "Identity"}), UNSUPPORTED_COMPRESSION),
    "content encoding identity": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {
        "Content-Encoding": "identity"}), Answer(200, "application/json", (None, None), SUM)),
    "generate, content encoding empty": (Case("POST", "/v2/models/add_sub/generate", b'{"INPUT0": [1]}', {
        "Content-Encoding": ""}), _typed(400, GENERATE_ENCODING)),
    "generate, content encoding GZIP": (Case("POST", "/v2/models/add_sub/generate", b'{"INPUT0": [1]}', {
        "Content-Encoding": "GZIP"}), _typed(400, GENERATE_ENCODING)),
    "generate, content encoding identity": (Case("POST", "/v2/models/add_sub/generate", b'{"INPUT0": [1]}', {
        "Content-Encoding": "identity"}), _typed(400, GENERATE_SHAPE)),
    "generate, content encoding twice, identity first": (Case(
        "POST", "/v2/models/add_sub/generate", b'{"INPUT0": [1]}', (
            ("Content-Encoding", "identity"), ("Content-Encoding", "gzip"))), _typed(400, GENERATE_SHAPE)),
    # Accept-Encoding as Triton's CompressionTypeUsed reads it: exact names, ";q=" exactly, std::stod's weights
    "accept encoding GZIP": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {"Accept-Encoding": "GZIP"}),
                             Answer(200, "application/json", (None, None), SUM)),
    "accept encoding with a space before q": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {
        "Accept-Encoding": "gzip; q=0.5"}), Answer(200, "application/json", (None, None), SUM)),
    "accept encoding with a parameter after q": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {
        "Accept-Encoding": "gzip;q=0.5;level=1"}), Answer(200, "application/json", ("gzip", None), SUM)),
    "accept encoding, a weight that is no number": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {
        "Accept-Encoding": "gzip;q=abc, deflate;q=0.4"}), Answer(200, "application/json", ("deflate", None), SUM)),
    "accept encoding, a weight with a tail": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {
        "Accept-Encoding": "gzip;q=0.5x, deflate;q=0.4"}), Answer(200, "application/json", ("gzip", None), SUM)),
    "accept encoding, a tab before a name": (Case("POST", "/v2/models/add_sub/infer", _inputs(), {
        "Accept-Encoding": "deflate;q=0.5,\tgzip"}), Answer(200, "application/json", ("deflate", None), SUM)),
    # rapidjson's kParseNanAndInfFlag tokens: NaN, Inf and Infinity, each with an optional minus (Ferry took three)
    **{f"request parameter {token}": (Case("POST", "/v2/models/add_sub/infer", _inputs(parameters={"p": 0}).replace(
        b'"p": 0', b'"p": ' + token.encode())), Answer(200, "application/json", (None, None), SUM))
       for token in ("NaN", "-NaN", "Inf", "-Inf", "Infinity", "-Infinity")},
    "infer FP32 data -Inf": (Case("POST", "/v2/models/add_sub/infer", _json({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [0, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 4], "data": [1, 1, 1, 1]}]}).replace(b"[0,", b"[-Inf,")),
        _typed(400, "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'FP32', but model 'add_sub' "
                    "expects 'INT32'")),
    # input and output parameters that are not an object: no members to Triton, so ignored (Ferry refused them)
    "input parameters an array": (Case("POST", "/v2/models/add_sub/infer", _json({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4], "parameters": [1]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 4], "data": [1, 1, 1, 1], "parameters": "x"}]})),
        Answer(200, "application/json", (None, None), SUM)),
    "output parameters an array": (Case("POST", "/v2/models/add_sub/infer", _inputs(outputs=[
        {"name": "OUTPUT0", "parameters": [1]}])), Answer(200, "application/json", (None, None), SUM0)),
    # routes whose handler sets application/json first
    "server metadata by POST": (Case("POST", "/v2"), NOT_ALLOWED_JSON),
    "model metadata by POST": (Case("POST", "/v2/models/add_sub"), NOT_ALLOWED_JSON),
    "model config by POST": (Case("POST", "/v2/models/add_sub/config"), NOT_ALLOWED_JSON),
    "repository index by GET": (Case("GET", "/v2/repository/index"), NOT_ALLOWED_JSON),
    "unknown model metadata": (Case("GET", "/v2/models/nope"),
                               _typed(404, "Request for unknown model: 'nope' is not found")),
    "unloading an unknown model": (Case("POST", "/v2/repository/models/nope/unload"),
                                   Answer(200, "application/json", (None, None), b"")),
    # a repository named in the path: the index ignores it, model control refuses it
    "named repository index": (Case("POST", "/v2/repository/any/index", _json({"ready": True})), Answer(
        200, "application/json", (None, None), INDEX)),
    "named repository load": (Case("POST", "/v2/repository/any/models/add_sub/load"),
                              _typed(501, "'repository_name' specification is not supported")),
    "named repository unload": (Case("POST", "/v2/repository/any/models/add_sub/unload"),
                                _typed(501, "'repository_name' specification is not supported")),
    # shared memory registration (the servers allow client shared memory, as Triton 2.51 always does): a request
    # without a region name is refused before its body is read (Ferry named the body's fault or a missing 'key')
    "system shm register without a region, body not JSON": (Case("POST", "/v2/systemsharedmemory/register", b"{"),
        _typed(400, "'region name' is necessary to register system shared memory region")),
    "system shm register without a region, empty body": (Case("POST", "/v2/systemsharedmemory/register"),
        _typed(400, "'region name' is necessary to register system shared memory region")),
    "cuda shm register without a region, body not JSON": (Case("POST", "/v2/cudasharedmemory/register", b"{"),
        _typed(400, "'region name' is necessary to register cuda shared memory region")),
    # a CUDA handle: Triton's words when it is missing, not base64 or not the size of a cudaIpcMemHandle_t, all
    # before any CUDA call (Ferry: "CUDA shared memory register request has no 'raw_handle' {'b64': ...} field",
    # "... 'raw_handle' is not valid base64", and 501 for a 1-byte handle where no CUDA device is visible)
    "cuda shm register without a handle": (Case("POST", "/v2/cudasharedmemory/region/r/register", _json(
        {"device_id": 0, "byte_size": 16})), _typed(400, "Shared memory register request has no 'raw_handle' field")),
    "cuda shm register, handle not base64": (Case("POST", "/v2/cudasharedmemory/region/r/register", _json(
        {"raw_handle": {"b64": "!!"}, "device_id": 0, "byte_size": 16})),
        _typed(400, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")),
    "cuda shm register, handle of one byte": (Case("POST", "/v2/cudasharedmemory/region/r/register", _json(
        {"raw_handle": {"b64": "YQ=="}, "device_id": 0, "byte_size": 16})),
        _typed(400, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")),
    "cuda shm register, handle of 65 bytes": (Case("POST", "/v2/cudasharedmemory/region/r/register", _json(
        {"raw_handle": {"b64": base64.b64encode(bytes(65)).decode()}, "device_id": 0, "byte_size": 16})),
        _typed(400, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")),
}


def _binary_output_cases() -> dict[str, tuple[Case, Answer]]:
    """Every way of asking for binary outputs: the request's ``binary_data_output`` (true, false, absent) with both
    outputs listed (their ``binary_data`` true, false, absent beside another parameter, or no parameters at all),
    one listed with it and one without, none listed, or an empty list. Triton's rule: a listed output is binary
    when its own ``binary_data`` is true; ``binary_data_output`` counts only where no output is listed."""
    values = {"OUTPUT0": [2, 3, 4, 5], "OUTPUT1": [0, 1, 2, 3]}
    each = {"true": {"binary_data": True}, "false": {"binary_data": False}, "absent": {"other": 1}, "none": None}

    def answer(binary: dict[str, bool]) -> Answer:
        entries, chunks = [], []
        for name, is_binary in binary.items():
            entry = b'{"name":"%s","datatype":"INT32","shape":[1,4],' % name.encode()
            if is_binary:
                entries.append(entry + b'"parameters":{"binary_data_size":16}}')
                chunks.append(np.array(values[name], np.int32).tobytes())
            else:
                entries.append(entry + b'"data":' + _json(values[name]).replace(b" ", b"") + b"}")
        body = b'{"model_name":"add_sub","model_version":"1","outputs":[' + b",".join(entries) + b"]}"
        content_type = "application/octet-stream" if chunks else "application/json"
        return Answer(200, content_type, (None, None), body + b"".join(chunks))

    def case(request_level: str, **extra: Any) -> Case:
        parameters = {} if request_level == "absent" else {"parameters": {"binary_data_output": request_level == "true"}}
        return Case("POST", "/v2/models/add_sub/infer", _inputs(**parameters, **extra))

    cases = {}
    for request_level in ("true", "false", "absent"):
        prefix = f"binary_data_output {request_level}"
        for per_output, parameters in each.items():
            listed = [{"name": name, **({"parameters": parameters} if parameters else {})} for name in values]
            cases[f"{prefix}, outputs listed with binary_data {per_output}"] = (
                case(request_level, outputs=listed), answer({name: per_output == "true" for name in values}))
        cases[f"{prefix}, one output with binary_data true"] = (
            case(request_level, outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}]),
            answer({"OUTPUT0": True, "OUTPUT1": False}))
        for label, extra in (("no outputs listed", {}), ("an empty outputs list", {"outputs": []})):
            cases[f"{prefix}, {label}"] = (case(request_level, **extra),
                                          answer({name: request_level == "true" for name in values}))
    return cases


CASES.update(_binary_output_cases())


def _answer(port: int, case: Case) -> Answer:
    headers = list(case.headers.items() if isinstance(case.headers, dict) else case.headers)
    if not any(name.lower() == "accept-encoding" for name, _ in headers):  # httpx asks for gzip unless told
        headers.insert(0, ("Accept-Encoding", "identity"))
    response = httpx.request(case.method, f"http://127.0.0.1:{port}{case.path}", content=case.body,
                             headers=headers, timeout=30)
    headers = response.headers
    # Triton's python stub adds the traceback of a failed execute (with its copy's path); Ferry does not
    body = re.sub(rb'\\n\\nAt:\\n.*?(?="})', b"", response.content)
    return Answer(response.status_code, headers.get("content-type"),
                  (headers.get("content-encoding"), headers.get("accept-encoding")), body)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("http_parity")
    write_model(path, "add_sub", ADD_SUB_CONFIG, {"1/model.py": ADD_SUB_MODEL})
    write_model(path, "counter", COUNT_CONFIG, {"1/model.py": COUNT_MODEL})
    write_model(path, "fails", FAILS_CONFIG, {"1/model.py": FAILS_MODEL})
    write_model(path, "halves", HALVES_CONFIG, {"1/model.py": HALVES_MODEL})
    shutil.copytree(PYTHON_MODELS / "py_bytes", path / "py_bytes", ignore=shutil.ignore_patterns("__pycache__"))
    return path


@pytest.fixture(scope="module")
def ferry_port(repository: Path):
    thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=MODELS,
                                       allow_client_shm=True))  # as Triton 2.51, which has no switch
    handle = thread.start()
    yield handle.server.http_port
    thread.stop()


@pytest.mark.parametrize("name", list(CASES))
def test_ferry_answers_as_triton(ferry_port: int, name: str) -> None:
    case, expected = CASES[name]
    assert _answer(ferry_port, case) == expected


def test_http_workers_answer_as_triton(repository: Path) -> None:
    """``--http-workers``: the worker processes' inference path and the routes they forward give the same answers."""
    import signal
    import subprocess
    import sys

    from support.server import free_ports, wait_ready

    http, grpc, metrics = free_ports(3)
    process = subprocess.Popen(
        [sys.executable, "-m", "serving_pod", f"--model-repository={repository}", f"--http-port={http}",
         f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
         "--metrics-address=127.0.0.1", "--http-workers=2", "--model-control-mode=explicit", "--allow-client-shm=true",
         *(f"--load-model={model}" for model in MODELS)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(http, process)
        answers = {name: _answer(http, case) for name, (case, _) in CASES.items()}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    assert answers == {name: expected for name, (_, expected) in CASES.items()}


def _success_and_fail(port: int, model: str) -> tuple[int, int]:
    stats = httpx.get(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=30).json()["model_stats"][0]
    return stats["inference_stats"]["success"]["count"], stats["inference_stats"]["fail"]["count"]


def test_a_half_output_refused_as_json_ran_the_model(ferry_port: int) -> None:
    """The refusal comes from writing the response: the model ran and its request counts a success (recorded live:
    Triton 2.51's success count went up by one, its fail count stayed 0)."""
    success, fail = _success_and_fail(ferry_port, "halves")
    case, expected = CASES["infer BF16 output as JSON"]
    assert _answer(ferry_port, case) == expected
    assert _success_and_fail(ferry_port, "halves") == (success + 1, fail)


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_triton_answers_as_the_table_says(repository: Path) -> None:
    """Side by side: Triton 2.51 gives every answer of the table (skipped where it cannot be had)."""
    from support.triton import running_triton

    with running_triton(repository, MODELS) as (http, _, _):
        answers = {name: _answer(http, case) for name, (case, _) in CASES.items()}
    assert answers == {name: expected for name, (_, expected) in CASES.items()}


def test_tritonclient_reads_the_text_typed_errors(ferry_port: int) -> None:
    """tritonclient reads an error from the body, whatever its content type."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(f"127.0.0.1:{ferry_port}")
    assert client.is_server_live() and client.is_model_ready("add_sub") and not client.is_model_ready("nope")
    tensor = httpclient.InferInput("N", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException) as error:
        client.infer("counter", [tensor])
    assert error.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"
    assert error.value.status() == "501"
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        client.infer("nope", [tensor])
    client.close()


@pytest.mark.parametrize("parameters", [None, [1], "p"])
def test_request_parameters_not_an_object_refused_in_tritons_words(ferry_port: int, parameters: Any) -> None:
    """``"parameters": null`` (or any non-object) is refused with Triton's words; Triton's status is 500, Ferry's
    400, as for the other malformed bodies (module docstring)."""
    case = Case("POST", "/v2/models/add_sub/infer", _inputs(parameters=parameters))
    assert _answer(ferry_port, case) == _typed(
        400, "failed to get request params.: attempt to get members for non-object")


@pytest.mark.parametrize("token", ["+NaN", "+Inf", "nan", "inf", "INF", "Infin", "NaNa", "Infinityx", "1e400", "-1e400"])
def test_json_tokens_rapidjson_refuses_are_refused(ferry_port: int, token: str) -> None:
    """What rapidjson's ``kParseNanAndInfFlag`` does not read is not JSON, even in a body that also holds a token it
    reads (``NaN``: Ferry's second parser is used). Triton 2.51 answers 500 "failed to parse the request JSON buffer:
    Invalid value. at <offset>" (``Number too big to be stored in double`` for ``1e400``, recorded live); Ferry 400
    with its parser's words, as for the other malformed bodies (module docstring)."""
    body = _inputs(parameters={"p": 0, "q": 0}).replace(b'"p": 0', b'"p": ' + token.encode()).replace(
        b'"q": 0', b'"q": NaN')
    answer = _answer(ferry_port, Case("POST", "/v2/models/add_sub/infer", body))
    assert (answer.status, answer.content_type) == (400, "application/json")
    assert json.loads(answer.body)["error"].startswith("failed to parse the request JSON buffer: ")


def test_percent_encoded_model_names_are_decoded(threaded_server: Any, tmp_path: Path) -> None:
    """A model name in the path is percent-decoded, as tritonclient's HTTP client quotes it (``urllib.parse.quote``),
    so a model whose name has a space is reached by name. Left on purpose: Triton 2.51 never decodes the path
    (recorded live): ``/v2/models/a%20b/infer`` is 404 "Request for unknown model: 'a%20b' is not found" (so is
    tritonclient's request for 'a b'), ``add%5Fsub`` is an unknown model and ``a%5Fb`` the model named so."""
    import tritonclient.http as httpclient

    write_model(tmp_path, "a b", ADD_SUB_CONFIG.replace('"add_sub"', '"a b"'), {"1/model.py": ADD_SUB_MODEL})
    handle = threaded_server([tmp_path], model_control_mode="explicit")
    client = httpclient.InferenceServerClient(f"127.0.0.1:{handle.server.http_port}")
    client.load_model("a b")
    assert client.is_model_ready("a b") and client.get_model_metadata("a b")["name"] == "a b"
    inputs = []
    for name, values in (("INPUT0", [1, 2, 3, 4]), ("INPUT1", [1, 1, 1, 1])):
        tensor = httpclient.InferInput(name, [1, 4], "INT32")
        tensor.set_data_from_numpy(np.array([values], np.int32))
        inputs.append(tensor)
    assert client.infer("a b", inputs).as_numpy("OUTPUT0").tolist() == [[2, 3, 4, 5]]
    assert _answer(handle.server.http_port, Case("POST", "/v2/models/a%20b/infer", _inputs())).status == 200
    client.close()
