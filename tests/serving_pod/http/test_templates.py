"""Request templates (``serving_pod.http.templates``): a repeated binary header is parsed once, with the same result.

Covered: a request built from a template equals the one the full parse gives, for fixed-size and BYTES inputs,
with and without requested outputs and parameters; each built request has parameters of its own; which headers
never become templates; bodies that disagree with their template get the full parse's error (what each bad body
gets is in ``test_a_body_that_disagrees_with_its_template_gets_the_full_parse_error``); the table's bound; and a
served model answering repeated binary requests from tritonclient with the right outputs for each body.
"""

from __future__ import annotations

import struct

import httpx
import numpy as np
import orjson
import pytest

from serving_pod.core.datatypes import DataDefect
from serving_pod.core.errors import InvalidArgumentError
from serving_pod.http import templates
from serving_pod.http.codec import decode_infer_request
from support.infer import assert_same_request, infer_simple_repeatedly
from support.server import DEFAULT_MODELS


@pytest.fixture(autouse=True)
def _empty_table():
    templates.clear()
    yield
    templates.clear()


def _body(header: dict, *tensors: bytes) -> tuple[bytes, int]:
    head = orjson.dumps(header)
    return head + b"".join(tensors), len(head)


def _binary_input(name: str, datatype: str, shape: list[int], size: int) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}}


def _bytes_elements(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


HEADER = {
    "inputs": [_binary_input("A", "INT32", [1, 4], 16), _binary_input("S", "BYTES", [2], 11),
               _binary_input("E", "FP32", [0, 3], 0)],
    "outputs": [{"name": "Y", "parameters": {"binary_data": True}}, {"name": "Z"}],
    "parameters": {"priority": 2, "custom": "x"},
}


def test_a_repeated_header_is_built_from_its_template_with_the_same_result() -> None:
    first, length = _body(HEADER, np.arange(4, dtype="<i4").tobytes(), _bytes_elements(b"ab", b"c"))
    parsed = decode_infer_request(first, length, "m", "2")
    assert templates.lookup(first[:length]) is not None
    second, _ = _body(HEADER, np.arange(10, 14, dtype="<i4").tobytes(), _bytes_elements(b"xy", b"z"))
    built = decode_infer_request(second, length, "m", "2")
    assert built.inputs[0].data.tolist() == [[10, 11, 12, 13]] and built.inputs[1].data.tolist() == [b"xy", b"z"]
    assert built.inputs[2].data.shape == (0, 3)
    templates.clear()
    assert_same_request(built, decode_infer_request(second, length, "m", "2"))  # what the full parse makes of the same body
    # parameters belong to each request: the front end adds forwarded headers to them
    templates.learn(second[:length], parsed)
    built.parameters["x-forwarded"] = "1"
    again = decode_infer_request(second, length, "m", "2")
    assert again.parameters == {"priority": 2, "custom": "x"} and again.parameters is not built.parameters


def test_perf_analyzers_header_with_its_empty_id_is_a_template() -> None:
    header = (b'{"id":"","inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"parameters":'
              b'{"binary_data_size":64}}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}')
    body = header + np.arange(16, dtype="<f4").tobytes()
    full = decode_infer_request(body, len(header), "double_py", "")
    assert templates.lookup(header) is not None
    built = decode_infer_request(body, len(header), "double_py", "")
    assert_same_request(built, full)
    assert built.id == ""


def test_without_outputs_or_parameters_too() -> None:
    header = {"inputs": [_binary_input("A", "FP32", [2], 8)]}
    body, length = _body(header, np.array([1.5, 2.5], "<f4").tobytes())
    full = decode_infer_request(body, length, "m", "")
    built = decode_infer_request(body, length, "m", "")
    assert templates.lookup(body[:length]) is not None
    assert_same_request(built, full)
    assert built.outputs is None and built.parameters == {}


@pytest.mark.parametrize("header", [
    {"id": "7", "inputs": [_binary_input("A", "FP32", [2], 8)]},  # a numbered request: every header unique
    {"inputs": [_binary_input("A", "FP32", [2], 8), {"name": "B", "datatype": "FP32", "shape": [1], "data": [1]}]},
    {"inputs": [{"name": "A", "datatype": "FP32", "shape": [2],
                 "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8}}]},
    {"inputs": [_binary_input("A", "FP32", [2], 8)],
     "outputs": [{"name": "Y", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8}}]},
    {"inputs": [_binary_input("A", "FP32", [2], 8)], "parameters": {"note": "x" * templates.MAX_HEADER_BYTES}},
])
def test_headers_that_never_become_templates(header) -> None:
    binary = b"" if "shared_memory_region" in str(header["inputs"]) else np.zeros(2, "<f4").tobytes()
    body, length = _body(header, binary)
    decode_infer_request(body, length, "m", "")
    assert templates.lookup(body[:length]) is None


def test_a_json_only_request_is_never_a_template() -> None:
    body = orjson.dumps({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
    decode_infer_request(body, None, "m", "")
    decode_infer_request(body, len(body), "m", "")  # a header length with all tensors in JSON
    assert templates.lookup(body) is None


@pytest.mark.parametrize(("binary", "message"), [
    (np.zeros(3, "<f4").tobytes(), "unexpected additional input data for model 'm'"),
    (np.zeros(1, "<f4").tobytes(), "unexpected size for input 'A', expecting 4 additional bytes for model 'm'"),
    (b"", "unexpected size for input 'A', expecting 8 additional bytes for model 'm'"),
])
def test_a_body_that_disagrees_with_its_template_gets_the_full_parse_error(binary, message) -> None:
    header = {"inputs": [_binary_input("A", "FP32", [2], 8)]}
    good, length = _body(header, np.zeros(2, "<f4").tobytes())
    decode_infer_request(good, length, "m", "")
    assert templates.lookup(good[:length]) is not None
    with pytest.raises(InvalidArgumentError, match=message):
        decode_infer_request(good[:length] + binary, length, "m", "")


def test_bytes_elements_are_checked_for_every_body() -> None:
    header = {"inputs": [_binary_input("S", "BYTES", [1], 6)]}
    good, length = _body(header, _bytes_elements(b"ok"))
    decode_infer_request(good, length, "m", "")
    bad = good[:length] + struct.pack("<I", 5) + b"ok"  # an element claiming 5 bytes where 2 follow
    defect = DataDefect("string_data", 5, 2)  # refused by the model's checks (``core.validation``)
    assert decode_infer_request(bad, length, "m", "").inputs[0].defect == defect
    templates.clear()
    assert decode_infer_request(bad, length, "m", "").inputs[0].defect == defect  # the full parse says the same


def test_the_table_is_bounded() -> None:
    for index in range(templates.MAX_TEMPLATES + 3):
        body, length = _body({"inputs": [_binary_input(f"I{index}", "FP32", [1], 4)]}, b"\0" * 4)
        decode_infer_request(body, length, "m", "")
    assert 0 < len(templates._templates) <= templates.MAX_TEMPLATES


def test_repeated_binary_requests_get_the_answer_for_their_own_data(threaded_server) -> None:
    server = threaded_server([DEFAULT_MODELS], model_control_mode="explicit", load_models=("simple",))
    infer_simple_repeatedly(server, "http")
    # a body one byte short after the good ones: the full parse's 400, and the server goes on
    head = orjson.dumps({"inputs": [_binary_input("INPUT0", "INT32", [1, 16], 64),
                                    _binary_input("INPUT1", "INT32", [1, 16], 64)]})
    url = f"http://{server.http_url}/v2/models/simple/infer"
    for body, status in ((head + b"\0" * 128, 200), (head + b"\0" * 127, 400), (head + b"\1" * 128, 200)):
        answer = httpx.post(url, content=body, headers={"Inference-Header-Content-Length": str(len(head))}, timeout=30)
        assert answer.status_code == status, answer.text
    assert "unexpected size for input 'INPUT1', expecting 1 additional bytes for model 'simple'" == httpx.post(
        url, content=head + b"\0" * 127, headers={"Inference-Header-Content-Length": str(len(head))}, timeout=30,
    ).json()["error"]
