"""Batch merge and split as pure functions: the hot path between a scheduler's batch and a backend.

A scheduler groups compatible requests (same input names, datatypes and non-batch dims, see
``batch_signature``); a backend calls ``merge_inputs`` to concatenate their inputs along dim 0,
runs the model once, and ``split_outputs`` to slice each request's rows back out. Splitting
returns views into the batch outputs (no copies); a single request passes through untouched.

No I/O, no state, no imports beyond numpy, so the dynamic batcher, the backends and the tests
share one definition of "batch size" and "compatible".
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from serving_pod.core.errors import InternalError
from serving_pod.core.types import InferRequest

Signature = tuple[tuple[str, str, tuple[int, ...]], ...]


def batch_size_of(request: InferRequest, max_batch_size: int) -> int:
    """Rows a request contributes to a batch: dim 0 of its first input when the model batches, else 1."""
    if max_batch_size > 0 and request.inputs:
        shape = request.inputs[0].data.shape
        if shape:
            return shape[0]
    return 1


def batch_signature(request: InferRequest) -> Signature:
    """What must be equal for two requests to share a batch: each input's name, datatype and non-batch dims.

    Inputs are keyed by name so their order in the request does not matter.
    """
    if len(request.inputs) == 1:
        tensor = request.inputs[0]
        return ((tensor.name, tensor.datatype, tensor.data.shape[1:]),)
    return tuple(
        sorted((tensor.name, tensor.datatype, tensor.data.shape[1:]) for tensor in request.inputs)
    )


def merge_inputs(requests: Sequence[InferRequest]) -> dict[str, np.ndarray]:
    """Concatenate the inputs of ``requests`` along dim 0, by input name (object/BYTES arrays too).

    One request: its arrays as they are (no copy). Raises ``ValueError`` when the requests do not
    share the same input names or non-batch dims (the scheduler should not have grouped them).
    """
    if len(requests) == 1:
        return {tensor.name: tensor.data for tensor in requests[0].inputs}
    first = requests[0].inputs
    parts: dict[str, list[np.ndarray]] = {tensor.name: [tensor.data] for tensor in first}
    count = len(first)
    for request in requests[1:]:
        inputs = request.inputs
        if len(inputs) != count:
            raise ValueError(
                f"cannot batch request '{request.id}': it has {len(inputs)} inputs, the batch has {count}"
            )
        for tensor in inputs:
            try:
                parts[tensor.name].append(tensor.data)
            except KeyError:
                raise ValueError(
                    f"cannot batch request '{request.id}': input '{tensor.name}' is not in the batch"
                ) from None
    # np.concatenate raises ValueError itself when non-batch dims differ.
    return {name: np.concatenate(arrays) for name, arrays in parts.items()}


def split_outputs(
    outputs: Mapping[str, np.ndarray], batch_sizes: Sequence[int]
) -> list[dict[str, np.ndarray]]:
    """Slice each output's rows back into one dict per request (views, no copies).

    ``batch_sizes[i]`` is request i's row count (``batch_size_of``). An output whose dim 0 does not
    equal the batch total is a model bug and raises ``InternalError`` naming the output.
    """
    if len(batch_sizes) == 1:
        return [dict(outputs)]
    total = 0
    bounds: list[tuple[int, int]] = []
    for size in batch_sizes:
        bounds.append((total, total + size))
        total += size
    for name, array in outputs.items():
        rows = array.shape[0] if array.ndim else None
        if rows != total:
            raise InternalError(
                f"output '{name}' has shape {list(array.shape)}: expected {total} rows for a batch "
                f"of {len(batch_sizes)} requests"
            )
    return [{name: array[start:end] for name, array in outputs.items()} for start, end in bounds]
