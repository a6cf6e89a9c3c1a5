"""Classification extension: an output requested with ``classification: N`` becomes its top-N classes.

Triton's format: a BYTES tensor of ``"value:index"`` or ``"value:index:label"`` strings, shape
``[batch, min(N, classes)]`` for batching models, ``[min(N, classes)]`` otherwise. Values print as
C++ ``std::to_string`` does (``%f`` for floats, plain integers); labels are the lines of the output's
``label_filename`` in the model directory (read once per loaded model version, and only from
inside that directory). Used by the engine after inference, for both protocols.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any, Callable

import numpy as np

from serving_pod.core.errors import InvalidArgumentError, writing_response
from serving_pod.core.types import InferResponse, RequestedOutput, Tensor

#: Triton's cap against pathological classification outputs.
MAX_ELEMENTS = 1_000_000
_SUPPORTED = {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"}


def requested(outputs: list[RequestedOutput]) -> dict[str, int] | None:
    """``{output: N}`` for the outputs asking for classification, or None. An output listed twice keeps the first
    count asked for (tritonserver 2.51 emplaces each into its map); every count is checked."""
    counts: dict[str, int] | None = None
    for output in outputs:
        if "classification" not in output.parameters:
            continue
        value = output.parameters["classification"]  # None (JSON null, an unset gRPC value) is refused too
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgumentError(
                f"output '{output.name}': 'classification' must be a positive integer, got {value!r}"
            )
        if counts is None:
            counts = {}
        counts.setdefault(output.name, value)
    return counts


def _format(value: Any, floating: bool) -> str:
    return f"{float(value):f}" if floating else str(int(value))


def top_k(values: np.ndarray, count: int, labels: list[str]) -> list[bytes]:
    """Top ``count`` of a 1-D array as Triton's ``value:index[:label]`` strings (ties: lower index first)."""
    floating = values.dtype.kind == "f"
    order = np.argsort(-values.astype(np.float64), kind="stable")[:count]
    out = []
    for index in order:
        text = f"{_format(values[index], floating)}:{int(index)}"
        if index < len(labels) and labels[index]:
            text += ":" + labels[index]
        out.append(text.encode("utf-8"))
    return out


def classify(tensor: Tensor, count: int, batching: bool, labels: list[str]) -> Tensor:
    """The classification tensor that replaces ``tensor`` in the response."""
    if tensor.datatype not in _SUPPORTED:
        raise writing_response(InvalidArgumentError(
            f"class result not available for output due to unsupported type '{tensor.datatype}'"
        ))
    data = np.asarray(tensor.data)
    if data.size > MAX_ELEMENTS:
        raise writing_response(InvalidArgumentError("classification output tensor too large"))
    batched = batching and data.ndim > 0
    rows = data.reshape(data.shape[0], -1) if batched else data.reshape(1, -1)
    width = min(count, rows.shape[1])
    result = np.empty((rows.shape[0], width), dtype=np.object_)
    for index, row in enumerate(rows):
        result[index, :] = top_k(row, count, labels)
    return Tensor(tensor.name, "BYTES", result if batched else result.reshape(width))


class LabelCache:
    """Labels of each loaded model's outputs, read once per model version."""

    def __init__(self, locate: Callable[[Any], Path | None]) -> None:
        self._locate = locate
        self._cache: weakref.WeakKeyDictionary[Any, dict[str, list[str]]] = weakref.WeakKeyDictionary()

    def labels(self, model: Any, output: str) -> list[str]:
        per_model = self._cache.get(model)
        if per_model is None:
            per_model = self._cache[model] = self._load(model)
        return per_model.get(output, [])

    def _load(self, model: Any) -> dict[str, list[str]]:
        files = {o.name: o.label_filename for o in model.config.output if o.label_filename}
        if not files:
            return {}
        directory = self._locate(model)
        if directory is None:
            return {}
        return {name: read_labels(directory, filename) for name, filename in files.items()}


def read_labels(model_dir: Path, filename: str) -> list[str]:
    """Lines of ``model_dir/filename``; a name that leaves the model directory is refused."""
    root = os.path.realpath(model_dir)
    path = os.path.realpath(os.path.join(root, filename))
    if os.path.commonpath([root, path]) != root:
        raise InvalidArgumentError(
            f"label_filename '{filename}' is outside the model directory; labels must be inside it"
        )
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().splitlines()
    except OSError as exc:
        raise InvalidArgumentError(f"unable to read label file '{filename}': {exc.strerror}") from None


def apply(
    response: InferResponse, counts: dict[str, int], model: Any, labels: LabelCache
) -> None:
    """Replace the requested outputs of ``response`` by their classifications, in place."""
    batching = model.max_batch_size > 0
    response.outputs = [
        classify(t, counts[t.name], batching, labels.labels(model, t.name)) if t.name in counts else t
        for t in response.outputs
    ]
