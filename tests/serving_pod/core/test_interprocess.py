"""core.interprocess: requests and results survive a pickled round trip in their compact form."""

from __future__ import annotations

import pickle

import numpy as np

from serving_pod.core.datatypes import DataDefect
from serving_pod.core.errors import InvalidArgumentError
from serving_pod.core.interprocess import (
    request_from_wire, request_to_wire, results_from_wire, results_to_wire,
)
from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput, Tensor


def _crossed(value):
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def test_a_request_keeps_its_tensors_outputs_parameters_and_flags() -> None:
    fp32 = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # not contiguous
    words = np.array([[b"a", b"\x00bc"]], dtype=np.object_)
    half = np.ones((1, 2), dtype=np.float16)
    request = InferRequest(
        "m", "2", [Tensor("A", "FP32", fp32), Tensor("B", "BYTES", words, {"p": 1}), Tensor("C", "FP16", half)],
        [RequestedOutput("Y", {"binary_data": True, "classification": 2})], "id-7", {"priority": 3},
        arrival_ns=1234, responder=lambda *a: None, cancelled=object(), custom_reserved={"timeout": "soon"},
    )
    back = request_from_wire(_crossed(request_to_wire(request)))
    assert (back.model_name, back.model_version, back.id, back.parameters, back.arrival_ns) == (
        "m", "2", "id-7", {"priority": 3}, 1234)
    assert back.custom_reserved == {"timeout": "soon"}  # a BLS caller's, for the isolated model's parameters()
    assert [(t.name, t.datatype, t.parameters) for t in back.inputs] == [
        ("A", "FP32", {}), ("B", "BYTES", {"p": 1}), ("C", "FP16", {})]
    assert np.array_equal(back.inputs[0].data, fp32) and back.inputs[0].data.dtype == np.float32
    assert back.inputs[0].data.flags.writeable  # a model may write into its inputs, as under Triton
    assert back.inputs[1].data.tolist() == [[b"a", b"\x00bc"]]
    assert back.inputs[2].data.dtype == np.float16 and back.inputs[2].data.shape == (1, 2)
    assert [(o.name, o.parameters) for o in back.outputs] == [("Y", {"binary_data": True, "classification": 2})]
    # the far side gets True where the request had a responder / cancel flag, to replace with its own
    assert back.responder is True and back.cancelled is True


def test_a_request_without_outputs_responder_or_cancel_flag_gets_none() -> None:
    request = InferRequest("m", "", [Tensor("A", "INT64", np.zeros((0,), np.int64))])
    back = request_from_wire(_crossed(request_to_wire(request)))
    assert back.outputs is None and back.responder is None and back.cancelled is None
    assert back.custom_reserved is None
    assert back.inputs[0].data.shape == (0,) and back.inputs[0].data.dtype == np.int64


def test_a_tensor_keeps_its_defect() -> None:
    """Data that did not fit, found by an ``--http-workers`` worker as it decoded the body, reaches the server
    process's validation (it crossed as a clean placeholder: the model ran on it, or failed on it)."""
    short = DataDefect("byte_size", 16, 12)
    long_string = DataDefect("string_data", 10, 3)
    request = InferRequest("m", "", [Tensor("A", "INT32", np.zeros((1, 4), np.int32), defect=short),
                                     Tensor("B", "BYTES", np.array([b""], np.object_), defect=long_string),
                                     Tensor("C", "FP32", np.zeros((2,), np.float32))])
    back = request_from_wire(_crossed(request_to_wire(request)))
    assert [tensor.defect for tensor in back.inputs] == [short, long_string, None]


def test_results_keep_responses_errors_and_nones_in_order() -> None:
    response = InferResponse("m", "1", [Tensor("Y", "INT32", np.array([[1, 2]], np.int32))], "r", {"k": "v"}, False)
    error = InvalidArgumentError("bad input")
    back = results_from_wire(_crossed(results_to_wire([response, error, None])))
    assert isinstance(back[0], InferResponse)
    assert (back[0].model_name, back[0].model_version, back[0].id, back[0].parameters, back[0].final) == (
        "m", "1", "r", {"k": "v"}, False)
    assert back[0].outputs[0].name == "Y" and back[0].outputs[0].data.tolist() == [[1, 2]]
    assert isinstance(back[1], InvalidArgumentError) and back[1].message == "bad input"
    assert back[2] is None


def test_a_placeholder_crosses_as_its_shape_and_a_broadcast_with_its_values() -> None:
    """A data placeholder (a defect's, a shared memory input's) of 2**40 elements crosses as its shape: a small
    message, a placeholder again on the far side (it was pickled element by element: MemoryError). A broadcast
    a model or client made is data like any other and keeps its values."""
    from serving_pod.core.datatypes import is_placeholder, placeholder

    huge = (2**40,)
    request = InferRequest("m", "", [
        Tensor("S", "BYTES", placeholder("BYTES", huge), defect=DataDefect("too_few_strings", 2**40, 1)),
        Tensor("R", "FP32", placeholder("FP32", (1, 2**40)), {"shared_memory_region": "r"}),
        Tensor("B", "FP32", np.broadcast_to(np.float32(5), (2, 3))),
    ])
    message = pickle.dumps(request_to_wire(request), protocol=pickle.HIGHEST_PROTOCOL)
    assert len(message) < 2000
    strings, region, broadcast = request_from_wire(pickle.loads(message)).inputs
    assert is_placeholder(strings.data) and strings.data.shape == huge and strings.data.dtype == np.object_
    assert strings.defect == DataDefect("too_few_strings", 2**40, 1)
    assert is_placeholder(region.data) and region.data.shape == (1, 2**40) and region.parameters == {
        "shared_memory_region": "r"}
    assert not is_placeholder(broadcast.data) and broadcast.data.tolist() == [[5.0] * 3] * 2
