"""Batch merge/split pure functions: concatenation along dim 0, views on split, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from serving_pod.core.errors import InternalError
from serving_pod.core.types import InferRequest, Tensor
from serving_pod.schedulers.batching import batch_signature, batch_size_of, merge_inputs, split_outputs


def request(rid: str, **inputs: np.ndarray) -> InferRequest:
    tensors = [Tensor(name, "BYTES" if array.dtype == object else "FP32", array) for name, array in inputs.items()]
    return InferRequest("m", "", tensors, id=rid)


def test_batch_size_of_batching_model_is_dim0_of_first_input() -> None:
    req = request("a", X=np.zeros((3, 4), np.float32), Y=np.zeros((3, 2), np.float32))
    assert batch_size_of(req, max_batch_size=8) == 3


def test_batch_size_of_non_batching_model_is_one() -> None:
    req = request("a", X=np.zeros((3, 4), np.float32))
    assert batch_size_of(req, max_batch_size=0) == 1


def test_batch_size_of_scalar_or_no_inputs_is_one() -> None:
    assert batch_size_of(request("a", X=np.float32(1.0) * np.ones((), np.float32)), 8) == 1
    assert batch_size_of(InferRequest("m", "", []), 8) == 1


def test_merge_single_request_passes_arrays_through_without_copy() -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    merged = merge_inputs([request("a", X=x)])
    assert merged["X"] is x


def test_merge_concatenates_by_name_regardless_of_order() -> None:
    a = request("a", X=np.full((1, 2), 1, np.float32), Y=np.full((1, 3), 10, np.float32))
    b = InferRequest(
        "m",
        "",
        [Tensor("Y", "FP32", np.full((2, 3), 20, np.float32)), Tensor("X", "FP32", np.full((2, 2), 2, np.float32))],
        id="b",
    )
    merged = merge_inputs([a, b])
    assert merged["X"].tolist() == [[1, 1], [2, 2], [2, 2]]
    assert merged["Y"][:, 0].tolist() == [10, 20, 20]


def test_merge_bytes_object_arrays() -> None:
    a = np.array([[b"a", b"bb"]], dtype=object)
    b = np.array([[b"", b"\xff\x00"]], dtype=object)
    merged = merge_inputs([request("a", S=a), request("b", S=b)])
    assert merged["S"].dtype == object
    assert merged["S"].tolist() == [[b"a", b"bb"], [b"", b"\xff\x00"]]


def test_merge_incompatible_requests_raise_value_error() -> None:
    with pytest.raises(ValueError, match="input 'Z' is not in the batch"):
        merge_inputs([request("a", X=np.zeros((1, 2), np.float32)), request("b", Z=np.zeros((1, 2), np.float32))])
    with pytest.raises(ValueError, match="has 2 inputs, the batch has 1"):
        merge_inputs(
            [
                request("a", X=np.zeros((1, 2), np.float32)),
                request("b", X=np.zeros((1, 2), np.float32), Y=np.zeros((1, 2), np.float32)),
            ]
        )
    with pytest.raises(ValueError):
        merge_inputs([request("a", X=np.zeros((1, 2), np.float32)), request("b", X=np.zeros((1, 3), np.float32))])


def test_split_returns_views_with_each_requests_rows() -> None:
    out = np.arange(12, dtype=np.int32).reshape(6, 2)
    names = np.array([[b"r0"], [b"r1"], [b"r2"], [b"r3"], [b"r4"], [b"r5"]], dtype=object)
    parts = split_outputs({"O": out, "S": names}, [1, 3, 2])
    assert [p["O"].shape[0] for p in parts] == [1, 3, 2]
    assert parts[1]["O"].tolist() == [[2, 3], [4, 5], [6, 7]]
    assert parts[2]["S"].tolist() == [[b"r4"], [b"r5"]]
    assert np.shares_memory(parts[1]["O"], out)


def test_split_single_request_is_the_same_dict_content() -> None:
    out = np.zeros((4, 2), np.float32)
    (only,) = split_outputs({"O": out}, [4])
    assert only["O"] is out


def test_split_rejects_outputs_without_the_batch_rows() -> None:
    with pytest.raises(InternalError, match="output 'O' has shape \\[5, 2\\]: expected 6 rows"):
        split_outputs({"O": np.zeros((5, 2), np.float32)}, [3, 3])
    with pytest.raises(InternalError, match="output 'S'"):
        split_outputs({"S": np.float32(1) * np.ones((), np.float32)}, [1, 1])


def test_merge_then_split_round_trips() -> None:
    reqs = [request(str(i), X=np.full((i + 1, 3), i, np.float32)) for i in range(4)]
    merged = merge_inputs(reqs)
    sizes = [batch_size_of(r, 8) for r in reqs]
    parts = split_outputs({"X": merged["X"] * 2}, sizes)
    for i, part in enumerate(parts):
        np.testing.assert_array_equal(part["X"], np.full((i + 1, 3), 2 * i, np.float32))


def test_batch_signature_ignores_batch_dim_and_input_order() -> None:
    a = request("a", X=np.zeros((1, 4), np.float32), Y=np.zeros((1, 2), np.float32))
    b = InferRequest(
        "m", "", [Tensor("Y", "FP32", np.zeros((5, 2), np.float32)), Tensor("X", "FP32", np.zeros((5, 4), np.float32))]
    )
    c = request("c", X=np.zeros((1, 5), np.float32), Y=np.zeros((1, 2), np.float32))
    assert batch_signature(a) == batch_signature(b)
    assert batch_signature(a) != batch_signature(c)
