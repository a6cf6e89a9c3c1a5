"""gRPC codec: ``ModelInferRequest`` <-> ``InferRequest``, ``InferResponse`` -> ``ModelInferResponse``.

Protobuf never leaves ``serving_pod.grpc``. Inputs come from ``raw_input_contents`` (zero-copy views)
or typed ``contents``; outputs always go out as ``raw_output_contents``, as Triton does. The native front
end hands ``ModelInfer`` its message serialized (``decode_serialized``: a repeated message is built from a
template, ``templates``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from serving_pod.core import datatypes
from serving_pod.core.errors import InternalError, InvalidArgumentError
from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from serving_pod.grpc import templates

_CONTENT_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameters_to_dict(params) -> dict[str, Any]:
    """``map<string, InferParameter>`` -> plain dict of python values."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        which = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, which) if which else None
    return out


#: the shared-memory parameters of a tensor and the one InferParameter kind Triton takes for each
_SHM_PARAMETER_KINDS = {
    "shared_memory_region": "string_param",
    "shared_memory_byte_size": "int64_param",
    "shared_memory_offset": "int64_param",
}


def check_shared_memory_parameters(params, tensor: str) -> None:
    """Triton's gRPC checks of a tensor's ``shared_memory_*`` parameters (kinds; no size or offset without a
    region); the placement itself is checked by ``serving_pod.shm`` once the region is known."""
    for key, kind in _SHM_PARAMETER_KINDS.items():
        if key in params and params[key].WhichOneof("parameter_choice") != kind:
            raise InvalidArgumentError(
                f"invalid value type for '{key}' parameter for tensor '{tensor}', expected {kind}."
            )
    if "shared_memory_region" not in params:
        for key in ("shared_memory_byte_size", "shared_memory_offset"):
            if key in params:
                raise InvalidArgumentError(
                    f"'{key}' can not be specified without 'shared_memory_region' parameter for tensor '{tensor}'"
                )


def _output_parameters(params, name: str) -> dict[str, Any]:
    check_shared_memory_parameters(params, name)
    out = parameters_to_dict(params)
    if "shared_memory_region" in out:
        # 'binary_data' is an HTTP parameter: Triton's gRPC ignores it beside a region, HTTP refuses the pair
        out.pop("binary_data", None)
    return out


def dict_to_parameters(values: dict[str, Any], target) -> None:
    for key, value in values.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            if value >= 2**63:
                param.uint64_param = value
            else:
                param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)


def decode_infer_request(message: pb.ModelInferRequest) -> InferRequest:
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise InvalidArgumentError(
            f"expected {len(message.inputs)} raw_input_contents (one per input), got {len(raw)}"
        )
    inputs: list[Tensor] = []
    for index, item in enumerate(message.inputs):
        name, datatype = item.name, item.datatype
        shape = tuple(item.shape)
        if any(d < 0 for d in shape):
            raise InvalidArgumentError(f"input '{name}' has a negative dimension in shape {list(shape)}")
        datatypes.check_shape(f"input '{name}'", shape)
        params = {}
        if item.parameters:
            check_shared_memory_parameters(item.parameters, name)
            params = parameters_to_dict(item.parameters)
        if raw:
            data = datatypes.from_raw(datatype, shape, raw[index], f"input '{name}'")
        elif "shared_memory_region" in params:
            # placeholder of the right shape, no memory; the engine reads the region into it
            data = np.broadcast_to(np.zeros((), datatypes.numpy_dtype(datatype)), shape)
        elif item.HasField("contents"):
            data = _from_contents(item, datatype, shape)
        else:
            raise InvalidArgumentError(
                f"input '{name}' has no data: set raw_input_contents or contents"
            )
        inputs.append(Tensor(name, datatype, data, params))
    outputs = None
    if message.outputs:
        outputs = [
            RequestedOutput(o.name, _output_parameters(o.parameters, o.name) if o.parameters else {})
            for o in message.outputs
        ]
    return InferRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        inputs=inputs,
        outputs=outputs,
        id=message.id,
        parameters=parameters_to_dict(message.parameters) if message.parameters else {},
    )


def decode_serialized(body: bytes) -> InferRequest:
    """A serialized ``ModelInferRequest`` -> ``InferRequest``: from a template when one fits (``templates``),
    else parsed, decoded and offered to the templates. A message protobuf cannot parse is an ``InternalError``
    ("Failed to parse the request", as grpcio reports it)."""
    request = templates.lookup(body)
    if request is not None:
        return request
    try:
        message = pb.ModelInferRequest.FromString(body)
    except DecodeError as error:
        raise InternalError(f"Failed to parse the request: {error}") from None
    request = decode_infer_request(message)
    templates.learn(body, message, request)
    return request


def _from_contents(item, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    field = _CONTENT_FIELDS.get(datatype)
    if field is None:
        datatypes.numpy_dtype(datatype)  # unknown datatype -> clear error
        raise InvalidArgumentError(
            f"input '{item.name}': datatype {datatype} cannot be sent as typed contents; use raw_input_contents"
        )
    values = getattr(item.contents, field)
    count = datatypes.check_element_count(item.name, shape, len(values))
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = list(values)
        return array.reshape(shape)
    try:
        return np.asarray(values, dtype=datatypes.numpy_dtype(datatype)).reshape(shape)
    except OverflowError:  # INT8, INT16, UINT8 and UINT16 travel in 32-bit fields
        raise InvalidArgumentError(
            f"input '{item.name}': a value of its contents is out of range for {datatype}"
        ) from None


#: (model, version, outputs' names, datatypes and shapes) -> the serialized response up to its tensor bytes
_RESPONSE_PREFIXES: dict[tuple, bytes] = {}
_RESPONSE_PREFIXES_MAX = 1024
_RAW_OUTPUT_TAG = b"\x32"  # field 6 (raw_output_contents), wire type 2 (length-delimited)


def encode_serialized(response: InferResponse) -> bytes:
    """``encode_infer_response(response).SerializeToString()``, for the native front end.

    ``raw_output_contents`` is the response's last field, so a response is the serialized rest (model, version,
    id, outputs' metadata; made once per model, version and output shapes and kept) followed by one entry per
    output. A response with parameters, on its own or on an output, or with an id, is serialized whole.
    """
    outputs = response.outputs
    if response.parameters or response.id or any(t.parameters for t in outputs):
        return encode_infer_response(response).SerializeToString()
    key = (response.model_name, response.model_version, *[(t.name, t.datatype, t.data.shape) for t in outputs])
    prefix = _RESPONSE_PREFIXES.get(key)
    if prefix is None:
        message = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version)
        for tensor in outputs:
            message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.data.shape)
        if len(_RESPONSE_PREFIXES) >= _RESPONSE_PREFIXES_MAX:
            _RESPONSE_PREFIXES.clear()
        prefix = _RESPONSE_PREFIXES[key] = message.SerializeToString()
    parts = [prefix]
    to_raw = datatypes.to_raw
    for tensor in outputs:
        raw = to_raw(tensor.datatype, tensor.data)
        parts += (_RAW_OUTPUT_TAG, templates.varint(len(raw)), raw)
    return b"".join(parts)


def encode_infer_response(response: InferResponse) -> pb.ModelInferResponse:
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
    )
    if response.parameters:
        dict_to_parameters(response.parameters, message.parameters)
    raw = message.raw_output_contents
    for tensor in response.outputs:
        out = message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.data.shape)
        if tensor.parameters:
            if "shared_memory_region" in tensor.parameters:  # written to shared memory by the engine
                raw.append(b"")  # as Triton: one (empty) raw entry per output
                continue
            dict_to_parameters(tensor.parameters, out.parameters)
        raw.append(datatypes.to_raw(tensor.datatype, tensor.data))
    return message
