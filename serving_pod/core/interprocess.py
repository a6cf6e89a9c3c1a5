"""The compact form in which requests and responses cross process boundaries (pickled by the caller).

Two places ship requests to another process: ``--http-workers`` (a protocol worker hands decoded requests to
the server process) and isolated python models (the server hands requests to an instance's child process).
Pickling the ``InferRequest`` / ``InferResponse`` dataclasses with their numpy arrays costs several times
more than these plain tuples with raw tensor bytes (about 23 against 5 µs for a round trip of a small
request here), and a request's round trip is paid on every inference.

A tensor's ``defect`` (data that did not fit, found as a protocol worker decoded it) crosses with it, for the
engine's validation to refuse on the far side. A request's ``responder`` and ``cancelled`` objects do not cross:
the tuple says whether the request had them, and ``request_from_wire`` puts ``True`` in their place for the far
side to replace with its own (or ``None`` where there was none). A placeholder (``datatypes.placeholder``: the
data of a tensor in shared memory, of one with a defect or of an unknown datatype) crosses as its shape alone:
its shape is the client's, and pickling its broadcast elements made a 100-byte request claiming 2**30 strings
cost gigabytes (2**40: a MemoryError, answered 500).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from serving_pod.core.datatypes import is_placeholder, placeholder
from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput, Tensor


def tensors_to_wire(tensors: list[Tensor]) -> list[tuple]:
    out: list[tuple] = []
    for tensor in tensors:
        data = tensor.data
        if not data.flags.c_contiguous and is_placeholder(data):  # its shape, never its broadcast elements
            out.append((tensor.name, tensor.datatype, None, None, data.shape, tensor.parameters, tensor.defect))
        elif data.dtype.hasobject:  # BYTES: the object array itself
            out.append((tensor.name, tensor.datatype, data, None, None, tensor.parameters, tensor.defect))
        else:
            # a bytearray (one copy, as ``tobytes``) so the far side's array is writable, as Triton's are
            raw = bytearray(np.ascontiguousarray(data))
            out.append((tensor.name, tensor.datatype, raw, data.dtype.str, data.shape, tensor.parameters,
                        tensor.defect))
    return out


def tensors_from_wire(items: list[tuple]) -> list[Tensor]:
    tensors: list[Tensor] = []
    for name, datatype, data, dtype, shape, parameters, defect in items:
        if dtype is not None:
            data = np.frombuffer(data, dtype).reshape(shape)
        elif data is None:
            data = placeholder(datatype, shape)
        tensors.append(Tensor(name, datatype, data, parameters, defect))
    return tensors


def request_to_wire(request: InferRequest) -> tuple:
    outputs = None if request.outputs is None else [(o.name, o.parameters) for o in request.outputs]
    return (request.model_name, request.model_version, request.id, request.parameters,
            tensors_to_wire(request.inputs), outputs, request.arrival_ns,
            request.responder is not None, request.cancelled is not None, request.custom_reserved)


def request_from_wire(wire: tuple) -> InferRequest:
    model, version, request_id, parameters, inputs, outputs, arrival_ns, responder, cancelled, custom_reserved = wire
    return InferRequest(
        model, version, tensors_from_wire(inputs),
        None if outputs is None else [RequestedOutput(name, params) for name, params in outputs],
        request_id, parameters, arrival_ns,
        responder=True if responder else None, cancelled=True if cancelled else None,
        custom_reserved=custom_reserved,
    )


def response_to_wire(response: InferResponse) -> tuple:
    return (response.model_name, response.model_version, response.id, response.parameters,
            tensors_to_wire(response.outputs), response.final)


def response_from_wire(wire: tuple) -> InferResponse:
    model, version, response_id, parameters, outputs, final = wire
    return InferResponse(model, version, tensors_from_wire(outputs), response_id, parameters, final)


def result_to_wire(result: Any) -> Any:
    """A backend's result (``InferResponse``, ``ServerError`` or None): a response as a tuple, the rest as is."""
    return response_to_wire(result) if type(result) is InferResponse else result


def result_from_wire(result: Any) -> Any:
    return response_from_wire(result) if type(result) is tuple else result


def results_to_wire(results: list[Any]) -> list[Any]:
    return [result_to_wire(result) for result in results]


def results_from_wire(results: list[Any]) -> list[Any]:
    return [result_from_wire(result) for result in results]
