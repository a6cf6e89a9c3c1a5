"""gRPC codec: ``ModelInferRequest`` <-> ``InferRequest``, ``InferResponse`` -> ``ModelInferResponse``.

Protobuf never leaves ``serving_pod.grpc``. Inputs come from ``raw_input_contents`` (zero-copy views),
typed ``contents`` or shared memory, paired with the inputs and refused in the words of Triton's gRPC front
end (``decode_infer_request``); outputs always go out as ``raw_output_contents``, as Triton does. The native front
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
from serving_pod.grpc.unparsable import UNPARSABLE_REQUEST

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


_UINT64_END = 2**64


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


def _tensor_parameters(params) -> dict[str, Any]:
    """A tensor's parameters as python values; a negative shared memory offset or byte size is the size_t Triton
    reads it as (-1: 2**64 - 1), so that the region's bounds refuse it in Triton's words."""
    out = parameters_to_dict(params)
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        if isinstance(out.get(key), int) and out[key] < 0:
            out[key] %= _UINT64_END
    return out


def check_shared_memory_parameters(params, tensor: str) -> None:
    """Triton's gRPC checks of a tensor's ``shared_memory_*`` parameters (kinds; no size or offset without a
    region, no region without a size); the placement itself is checked by ``serving_pod.shm`` once the region
    is known."""
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
    elif "shared_memory_byte_size" not in params:
        raise InvalidArgumentError(
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor "
            f"'{tensor}'"
        )


def _output_parameters(params, name: str) -> dict[str, Any]:
    """A requested output's parameters, with the checks of Triton's gRPC front end (``InferAllocatorPayload``)."""
    check_shared_memory_parameters(params, name)
    if "classification" in params:
        if params["classification"].WhichOneof("parameter_choice") != "int64_param":
            raise InvalidArgumentError("invalid value type for 'classification' parameter, expected int64_param")
        if "shared_memory_region" in params:
            raise InvalidArgumentError("output can't set both 'shared_memory_region' and 'classification'")
    out = _tensor_parameters(params)
    if "shared_memory_region" in out:
        # 'binary_data' is an HTTP parameter: Triton's gRPC ignores it beside a region, HTTP refuses the pair
        out.pop("binary_data", None)
    return out


#: the request parameters Triton's gRPC front end reads itself -> the InferParameter kinds it takes, in its words
_RESERVED_KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "sequence_id": (("int64_param", "string_param"), "int64_param or string_param"),
    "sequence_start": (("bool_param",), "bool_param"),
    "sequence_end": (("bool_param",), "bool_param"),
    "priority": (("int64_param", "uint64_param"), "int64_param or uint64_param"),
    "timeout": (("int64_param",), "int64_param"),
    "triton_enable_empty_final_response": (("bool_param",), "bool_param"),
}

#: reserved keys whose int64_param Triton's gRPC front end takes as the uint64 it stands for (two's complement)
_UNSIGNED_FROM_INT64 = ("sequence_id", "timeout")


def request_parameters(params) -> dict[str, Any]:
    """A request's ``parameters`` as python values, refused as Triton's gRPC front end refuses them
    (``SetInferenceRequestMetadata``): a reserved key of another kind, a negative priority, a value of no kind.
    A negative int64 ``sequence_id`` or ``timeout`` is taken as Triton takes it, as a uint64 (-1: 2**64 - 1).
    The values themselves (an unsigned timeout...) and unknown ``triton_`` keys are the engine's to check,
    for both protocols (``core.parameters``). Other keys take any kind with a value (Triton 2.51 refuses
    ``uint64_param`` there; the model is given it here)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        which = value.WhichOneof("parameter_choice")
        reserved = _RESERVED_KINDS.get(key)
        if reserved is not None:
            if which not in reserved[0]:
                raise InvalidArgumentError(f"invalid value type for '{key}' parameter, expected {reserved[1]}.")
            if which == "int64_param" and key == "priority" and value.int64_param < 0:
                raise InvalidArgumentError("invalid value for 'priority', expected value >= 0.")
            if which == "int64_param" and key in _UNSIGNED_FROM_INT64:
                # Triton hands the int64 to a uint64 setter (infer_handler.cc): -1 is 2**64 - 1, no refusal
                out[key] = value.int64_param % _UINT64_END
                continue
        elif which is None and not key.startswith("triton_"):
            raise InvalidArgumentError(
                f"invalid value type for '{key}' parameter, expected int64_param, bool_param, or string_param."
            )
        out[key] = getattr(value, which) if which else None
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


#: the typed ``contents`` fields in the order Triton's gRPC front end reads them (``InferGRPCToInput``)
_CONTENTS_ORDER = ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents",
                   "fp32_contents", "fp64_contents", "bytes_contents")
_CONTENTS_TYPES = {"bool_contents": "BOOL", "int64_contents": "INT64", "uint64_contents": "UINT64",
                   "fp32_contents": "FP32", "fp64_contents": "FP64", "bytes_contents": "BYTES"}
_SHARED_MEMORY = object()  # an input's data source: its region, read by the engine
_CONTENTS = object()  # an input's data source: its typed contents


def _contents_type(field: str, declared: str) -> str:
    """The datatype the values of ``field`` have, as Triton sees them: INT8 and INT16 (UINT8, UINT16) travel in
    ``int_contents`` (``uint_contents``), which otherwise hold INT32 (UINT32)."""
    if field == "int_contents":
        return declared if declared in ("INT8", "INT16") else "INT32"
    if field == "uint_contents":
        return declared if declared in ("UINT8", "UINT16") else "UINT32"
    return _CONTENTS_TYPES[field]


def _check_contents(item, model: str) -> None:
    """Triton's words for typed contents that cannot be the input's: a field of another datatype than the
    declared one, or a second field beside it."""
    declared = item.datatype if item.datatype in datatypes.WIRE_TO_NUMPY else "<invalid>"
    found = False
    for field in _CONTENTS_ORDER:
        if not getattr(item.contents, field):
            continue
        where = f"unexpected explicit tensor data for input tensor '{item.name}' for model '{model}'"
        if found:
            raise InvalidArgumentError(f"{where}, binary data was already supplied.")
        carried = _contents_type(field, item.datatype)
        if carried != declared:
            raise InvalidArgumentError(f"{where} of type '{carried}', expected datatype '{declared}'")
        found = True


def _data_sources(message: pb.ModelInferRequest) -> list[Any]:
    """Where each input's data is, as Triton's gRPC front end pairs them: an input in shared memory takes its
    region, one with typed contents those (never beside raw_input_contents), every other input the next
    raw_input_contents entry. Entries left over are refused (Triton 2.51 ignores them: only a client's mistake
    sends them)."""
    raw = message.raw_input_contents
    model = message.model_name
    sources: list[Any] = []
    used = 0
    for item in message.inputs:
        in_region = False
        if item.parameters:
            check_shared_memory_parameters(item.parameters, item.name)
            in_region = "shared_memory_region" in item.parameters
        if in_region:
            if item.HasField("contents"):
                raise InvalidArgumentError(
                    "unexpected 'content' provided when using shared memory for input tensor "
                    f"'{item.name}' for model '{model}'"
                )
            sources.append(_SHARED_MEMORY)
        elif item.HasField("contents"):
            if raw:
                raise InvalidArgumentError(
                    f"contents field must not be specified when using raw_input_contents for '{item.name}' "
                    f"for model '{model}'"
                )
            _check_contents(item, model)
            sources.append(_CONTENTS)
        elif used < len(raw):
            sources.append(raw[used])
            used += 1
        else:
            raise InvalidArgumentError(
                f"unable to find data for input tensor '{item.name}' for model '{model}' in request."
            )
    if used != len(raw):
        per = "one per input" if used == len(sources) else "one per input not in shared memory"
        raise InvalidArgumentError(f"expected {used} raw_input_contents ({per}), got {len(raw)}")
    return sources


def decode_infer_request(message: pb.ModelInferRequest) -> InferRequest:
    """``ModelInferRequest`` -> ``InferRequest``, refused in the order Triton's gRPC front end refuses: the
    request's parameters, each input's data, the requested outputs' parameters, then the tensors' shapes (a
    negative dimension: Ferry's words; ``InferenceService`` looks the model up first when this fails). Data that
    does not fit its shape, and an unknown datatype, are left to the model's checks (``core.validation``), which
    Triton's core makes after the model's others."""
    parameters = request_parameters(message.parameters) if message.parameters else {}
    sources = _data_sources(message)
    outputs = None
    if message.outputs:
        outputs = [
            RequestedOutput(o.name, _output_parameters(o.parameters, o.name) if o.parameters else {})
            for o in message.outputs
        ]
    inputs: list[Tensor] = []
    for item, source in zip(message.inputs, sources):
        name, datatype = item.name, item.datatype
        shape = tuple(item.shape)
        if any(d < 0 for d in shape):
            raise InvalidArgumentError(f"input '{name}' has a negative dimension in shape {list(shape)}")
        datatypes.check_shape(f"input '{name}'", shape)
        params = _tensor_parameters(item.parameters) if item.parameters else {}
        defect = None
        if source is _SHARED_MEMORY:
            # placeholder of the right shape, no memory; the engine reads the region into it
            datatypes.numpy_dtype(datatype)  # an unknown datatype is refused here, before the region is read
            data = datatypes.placeholder(datatype, shape)
        elif source is _CONTENTS:
            data, defect = _from_contents(item, datatype, shape)
        else:
            # sizes and an unknown datatype are the model's to refuse, after its other checks (``core.validation``)
            data, defect = datatypes.decode_raw(datatype, shape, source)
        inputs.append(Tensor(name, datatype, data, params, defect))
    return InferRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        inputs=inputs,
        outputs=outputs,
        id=message.id,
        parameters=parameters,
    )


def decode_serialized(body: bytes) -> InferRequest:
    """A serialized ``ModelInferRequest`` -> ``InferRequest``: from a template when one fits (``templates``),
    else parsed, decoded and offered to the templates. A message protobuf cannot parse is an ``InternalError``
    in Triton's words (``unparsable.UNPARSABLE_REQUEST``)."""
    request = templates.lookup(body)
    if request is not None:
        return request
    try:
        message = pb.ModelInferRequest.FromString(body)
    except DecodeError as error:
        raise InternalError(UNPARSABLE_REQUEST) from None
    request = decode_infer_request(message)
    if not any(tensor.defect for tensor in request.inputs):  # a refused one is not kept
        templates.learn(body, message, request)
    return request


def _from_contents(item, datatype: str, shape: tuple[int, ...]) -> tuple[np.ndarray, datatypes.DataDefect | None]:
    """An input's typed contents as an array; too many or too few values are a defect (placeholder data), which
    Triton's core words as for raw bytes: a byte size, or a count of strings."""
    field = _CONTENT_FIELDS.get(datatype)
    if field is None:
        datatypes.numpy_dtype(datatype)  # unknown datatype -> clear error
        raise InvalidArgumentError(
            f"input '{item.name}': datatype {datatype} cannot be sent as typed contents; use raw_input_contents"
        )
    values = getattr(item.contents, field)
    count = datatypes.element_count(shape)
    if len(values) != count:
        return datatypes.placeholder(datatype, shape), datatypes.count_defect(datatype, count, len(values))
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = list(values)
        return array.reshape(shape), None
    try:
        return np.asarray(values, dtype=datatypes.numpy_dtype(datatype)).reshape(shape), None
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
    raw_view = datatypes.raw_view  # the join below is the one copy of each output's bytes
    for tensor in outputs:
        raw = raw_view(tensor.datatype, tensor.data)
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
