"""grpc.codec's serialized response (``encode_serialized``): the bytes protobuf itself would write; and requests
numpy cannot hold.

Covered: fixed-size, BYTES, several and no outputs, versions and shapes that change, tensor bytes long
enough for a multi-byte length; the whole-message fallback for responses with parameters (their own or an
output's) or an id; the bound on the kept prefixes; shapes too large for numpy (empty or in shared memory)
and typed contents out of their datatype's range, each an INVALID_ARG; raw_input_contents entries paired, in
order, with the inputs outside shared memory (as Triton pairs them), one left over or missing refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from serving_pod.core.errors import InvalidArgumentError
from serving_pod.grpc import codec
from serving_pod.core.types import InferResponse, Tensor


def _words(*items: bytes) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return array


@pytest.mark.parametrize("response", [
    InferResponse("double_py", "1", [Tensor("OUTPUT0", "FP32", np.arange(16, dtype=np.float32).reshape(1, 16))]),
    InferResponse("m", "3", [Tensor("A", "INT64", np.arange(6).reshape(2, 3)), Tensor("B", "BYTES", _words(b"x", b""))]),
    InferResponse("m", "3", [Tensor("A", "INT64", np.arange(3).reshape(1, 3))]),  # the same model, another shape
    InferResponse("big", "1", [Tensor("Y", "UINT8", np.ones(70000, np.uint8))]),  # a 3-byte length
    InferResponse("m", "", []),
    InferResponse("m", "1", [Tensor("Y", "FP32", np.zeros(2, np.float32))], parameters={"sequence_end": True}),
    InferResponse("m", "1", [Tensor("Y", "FP32", np.zeros(2, np.float32), {"shape": "x"})]),
    InferResponse("m", "1", [Tensor("Y", "FP32", np.zeros(2, np.float32))], id="req-7"),
], ids=["fp32", "two outputs", "other shape", "long tensor", "no outputs", "parameters", "output parameters", "id"])
def test_serialized_responses_are_what_protobuf_writes(response: InferResponse) -> None:
    for _ in range(2):  # made, then from the kept prefix
        data = codec.encode_serialized(response)
        assert data == codec.encode_infer_response(response).SerializeToString()
        assert pb.ModelInferResponse.FromString(data) == codec.encode_infer_response(response)


def test_the_kept_prefixes_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(codec, "_RESPONSE_PREFIXES", {})
    for index in range(codec._RESPONSE_PREFIXES_MAX + 3):
        codec.encode_serialized(InferResponse(f"m{index}", "1", [Tensor("Y", "FP32", np.zeros(1, np.float32))]))
    assert 0 < len(codec._RESPONSE_PREFIXES) <= codec._RESPONSE_PREFIXES_MAX


HUGE = 2**62


@pytest.mark.parametrize(("datatype", "shape", "data"), [
    ("FP32", [HUGE, HUGE, 0], "raw"),  # no elements, yet beyond numpy's index type
    ("INT32", [0, HUGE, HUGE], "contents"),
    ("BYTES", [HUGE, HUGE, 0], "raw"),
    ("FP32", [HUGE, HUGE], "shared memory"),  # the placeholder the region is read into
])
def test_shapes_numpy_cannot_hold_are_invalid(datatype: str, shape: list[int], data: str) -> None:
    message = pb.ModelInferRequest(model_name="m")
    item = message.inputs.add(name="X", datatype=datatype, shape=shape)
    if data == "raw":
        message.raw_input_contents.append(b"")
    elif data == "contents":
        item.contents.SetInParent()
    else:
        item.parameters["shared_memory_region"].string_param = "r"
        item.parameters["shared_memory_byte_size"].int64_param = 64  # required beside a region
    with pytest.raises(InvalidArgumentError) as raised:  # was a ValueError: UNKNOWN "Unexpected <class ...>"
        codec.decode_infer_request(message)
    assert raised.value.message == f"input 'X': shape {shape} has too many elements"


@pytest.mark.parametrize(("datatype", "field", "value"), [
    ("INT8", "int_contents", 128), ("INT16", "int_contents", -40000), ("UINT8", "uint_contents", 256),
    ("UINT16", "uint_contents", 70000),
])
def test_contents_out_of_their_datatypes_range_are_invalid(datatype: str, field: str, value: int) -> None:
    message = pb.ModelInferRequest(model_name="m")
    getattr(message.inputs.add(name="X", datatype=datatype, shape=[2]).contents, field).extend([1, value])
    with pytest.raises(InvalidArgumentError) as raised:  # was an OverflowError
        codec.decode_infer_request(message)
    assert raised.value.message == f"input 'X': a value of its contents is out of range for {datatype}"


def _paired(raw: int) -> pb.ModelInferRequest:
    """Inputs A (raw), B (in shared memory), C (raw) and ``raw`` raw_input_contents entries of 4 bytes each."""
    message = pb.ModelInferRequest(model_name="m")
    for name in "ABC":
        message.inputs.add(name=name, datatype="INT32", shape=[1])
    message.inputs[1].parameters["shared_memory_region"].string_param = "r"
    message.inputs[1].parameters["shared_memory_byte_size"].int64_param = 4
    message.raw_input_contents.extend(np.array([index + 1], "<i4").tobytes() for index in range(raw))
    return message


def test_raw_entries_go_in_order_to_the_inputs_outside_shared_memory() -> None:
    request = codec.decode_infer_request(_paired(2))  # was refused: 2 entries for 3 inputs
    assert [t.data.tolist() for t in request.inputs] == [[1], [0], [2]]  # B: the placeholder the region fills
    assert request.inputs[1].parameters["shared_memory_region"] == "r"
    with pytest.raises(InvalidArgumentError) as raised:
        codec.decode_infer_request(_paired(3))
    assert raised.value.message == "expected 2 raw_input_contents (one per input not in shared memory), got 3"
    with pytest.raises(InvalidArgumentError) as raised:
        codec.decode_infer_request(_paired(1))
    assert raised.value.message == "unable to find data for input tensor 'C' for model 'm' in request."
