"""KServe V2 HTTP inference codec: JSON tensors and Triton's binary tensor data extension, both ways.

Request body = JSON header, then raw tensor bytes in the order of the inputs that carry
``binary_data_size`` (``Inference-Header-Content-Length`` gives the JSON length). Responses are plain
JSON unless some output is binary; then JSON header + raw bytes in output order. Binary inputs become
zero-copy ``numpy.frombuffer`` views; every size is checked before use.

Which outputs are binary follows tritonserver 2.51: a request that lists its ``outputs`` gets binary data for
those whose own ``binary_data`` parameter is true, whatever the request's ``binary_data_output``; that one
counts only for a request listing none (no ``outputs``, or an empty list, which asks for every output). An output
listed twice is decided by its first entry (binary data, classification, shared memory), as tritonserver emplaces
each entry into its map; a later entry's classification is still checked. NaN and infinite float elements are
written as tritonserver writes them, ``NaN`` / ``Infinity`` / ``-Infinity`` (``_non_finite_data``). FP16 and
BF16 have no JSON form either way: such an input sent as JSON is refused, and such an output asked for as JSON
fails the response in tritonserver's words (``_refused_as_json``; the generate extension, which cannot ask for
binary data, still writes them as numbers, ``json_data``).
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np
import orjson

from serving_pod import classification
from serving_pod.core import datatypes
from serving_pod.core.errors import InvalidArgumentError, ServerError, writing_response
from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from serving_pod.http import templates
from serving_pod.http.responses import JsonFollowedByBytes, before_parsing, parse_json


def decode_base64(text: str, what: str) -> bytes:
    """Base64 text as Triton's libb64 reads it: line breaks and spaces skipped (the C++ clients, perf_analyzer
    among them, write a newline every 72 characters) and the final ``=`` padding optional (libb64 decodes the last
    two or three characters without it, as unpadded encoders write them: Go's ``RawStdEncoding``, JavaScript's
    base64url helpers); anything else outside the alphabet is refused, and so is one character left over."""
    compact = "".join(text.split())
    try:
        return base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgumentError(f"{what} is not valid base64") from None


def decode_infer_request(
    body: bytes, header_length: int | None, model_name: str, model_version: str
) -> InferRequest:
    """Parse an inference request body into an ``InferRequest`` (InvalidArgumentError on bad input).

    A binary request whose JSON header was seen before is built from that header's template (``templates``).
    """
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise before_parsing(InvalidArgumentError(  # Triton's words
                f"inference header size should be in range (0, {len(body)}), got: {header_length}"))
        header_bytes = body[:header_length]
        template = templates.lookup(header_bytes)
        if template is not None:
            built = template.build(body, header_length, model_name, model_version)
            if built is not None:
                return built
        binary = memoryview(body)[header_length:]
    else:
        header_bytes = body
        binary = memoryview(b"")
    try:
        header = parse_json(header_bytes)
    except JsonFollowedByBytes as exc:
        if header_length is not None:
            raise
        raise InvalidArgumentError(f"{exc.message}; binary tensor data needs the 'Inference-Header-Content-Length' "
                                   "header (the length of the JSON)") from None
    if not isinstance(header, dict):
        raise InvalidArgumentError("failed to parse the request JSON buffer: expected a JSON object")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidArgumentError("inference request JSON must have an 'inputs' array")
    offset = 0
    inputs: list[Tensor] = []
    for item in raw_inputs:
        tensor, offset = _decode_input(item, binary, offset, model_name)
        inputs.append(tensor)
    if offset != len(binary):
        raise InvalidArgumentError(f"unexpected additional input data for model '{model_name}'")  # Triton's words
    parameters = header.get("parameters")
    if type(parameters) is not dict:
        if parameters is not None or "parameters" in header:  # Triton's words
            raise InvalidArgumentError("failed to get request params.: attempt to get members for non-object")
        parameters = {}
    elif parameters:
        _check_http_parameters(parameters)
    outputs = None
    raw_outputs = header.get("outputs")
    if raw_outputs is not None and type(raw_outputs) is not list:
        raise InvalidArgumentError("request 'outputs' must be an array")
    if raw_outputs:  # an empty list asks for every output, as none listed
        outputs = []
        names: set[str] = set()
        repeated = []  # an output listed again: checked, but its first entry decides (module docstring)
        for out in raw_outputs:
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise InvalidArgumentError("each requested output must be an object with a 'name'")
            out_params = out.get("parameters")
            if type(out_params) is not dict:  # one that is not an object has no members to Triton (recorded live)
                out_params = {}
            if "classification" in out_params and "shared_memory_region" in out_params:
                # Triton's words, whatever the count (0 too) and before the region is looked up (recorded live)
                raise InvalidArgumentError("Output can't set both 'shared_memory_region' and 'classification'")
            if type(out_params.get("classification")) is int and out_params["classification"] == 0:
                # Triton's HTTP front end takes 0 classes as no classification
                out_params = {key: value for key, value in out_params.items() if key != "classification"}
            if type(out_params.get("binary_data", False)) is not bool:
                raise InvalidArgumentError(
                    f"output '{out['name']}': Unable to parse 'binary_data': expected true or false, "
                    f"got {out_params['binary_data']!r}"
                )
            listed = RequestedOutput(out["name"], out_params)
            (repeated if listed.name in names else outputs).append(listed)
            names.add(listed.name)
        if repeated:
            classification.requested(repeated)
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgumentError(f"Unable to parse 'id': expected a string, got {request_id!r}")
    request = InferRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=inputs,
        outputs=outputs,
        id=request_id,
        parameters=parameters,
    )
    if header_length is not None and not any(tensor.defect for tensor in inputs):  # a refused one is not kept
        templates.learn(bytes(header_bytes), request)
    return request


#: the request parameters whose type is checked by name (``binary_data_output`` here, the others by
#: ``core.parameters``); any other key, ``headers`` included, must be an int, bool, string or double
_TYPED_PARAMETERS = frozenset({"binary_data_output", "sequence_id", "sequence_start", "sequence_end", "priority",
                               "timeout"})


def _check_http_parameters(parameters: dict[str, Any]) -> None:
    """What Triton's HTTP front end refuses beyond ``core.parameters``: a non-boolean ``binary_data_output``,
    any ``triton_`` key (the reserved one is for gRPC streams), and a value that is an object, array or null."""
    if type(parameters.get("binary_data_output", False)) is not bool:
        raise InvalidArgumentError(
            f"Unable to parse 'binary_data_output': expected true or false, got {parameters['binary_data_output']!r}"
        )
    for key, value in parameters.items():
        if key.startswith("triton_"):
            raise InvalidArgumentError(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        # a parameter reaches the model as an int, bool, string or double; Triton refuses anything else
        if (value is None or isinstance(value, (list, dict))) and key not in _TYPED_PARAMETERS:
            raise InvalidArgumentError(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
            )


def _decode_input(item: Any, binary: memoryview, offset: int, model_name: str) -> tuple[Tensor, int]:
    if not isinstance(item, dict):
        raise InvalidArgumentError("each input must be a JSON object")
    name = item.get("name")
    datatype = item.get("datatype")
    shape = item.get("shape")
    if not isinstance(name, str):
        raise InvalidArgumentError("an input has no 'name'")
    if not isinstance(datatype, str):
        raise InvalidArgumentError(f"input '{name}' has no 'datatype'")
    # ``type`` rather than ``isinstance``: JSON's true and false are Python ints too
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise InvalidArgumentError(f"input '{name}' must have a 'shape' of non-negative integers")
    shape_t = tuple(shape)
    datatypes.check_shape(f"input '{name}'", shape_t)
    params = item.get("parameters")
    if type(params) is not dict:  # one that is not an object has no members to Triton (recorded live)
        params = {}
    if ("data" in item) + (params.get("binary_data_size") is not None) + (params.get("shared_memory_region") is not None) != 1:
        # Triton's words; a region used to win silently over 'data'
        sources = [f"'{k}'" for k in ("data", "binary_data_size", "shared_memory_region")
                   if (k in item if k == "data" else params.get(k) is not None)]
        found = "set " + " ".join(sources) if sources else "no field is set"
        raise InvalidArgumentError(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            f"'shared_memory_region' in 'parameters'. But {found}"
        )
    size = params.get("binary_data_size")
    if size is not None:
        if type(size) is not int or size < 0:
            raise InvalidArgumentError(f"input '{name}': binary_data_size must be a non-negative integer")
        end = offset + size
        if end > len(binary):  # Triton's words
            raise InvalidArgumentError(f"unexpected size for input '{name}', expecting {end - len(binary)} "
                                       f"additional bytes for model '{model_name}'")
        # sizes and an unknown datatype are the model's to refuse, after its other checks (``core.validation``)
        data, defect = datatypes.decode_raw(datatype, shape_t, binary[offset:end])
        return Tensor(name, datatype, data, params, defect), end
    if "shared_memory_region" in params:
        # placeholder of the right shape, no memory; the engine reads the region into it
        datatypes.numpy_dtype(datatype)  # an unknown datatype is refused here, before the region is read
        return Tensor(name, datatype, datatypes.placeholder(datatype, shape_t), params), offset
    dtype = datatypes.WIRE_TO_NUMPY.get(datatype)
    if dtype is None:
        raise InvalidArgumentError(f"invalid datatype for input {name}")  # Triton's words
    values = item["data"]
    if type(values) is not list:  # Triton's words (its status is 500); a scalar is the generate extension's only
        raise InvalidArgumentError("Unable to parse 'data': attempt to access JSON non-array as array")
    refuse_half_precision(datatype, name)
    if datatype == "BYTES":
        # Triton's front end writes the strings as they come; its core counts them (``core.validation``)
        flat = json_flat(values)
        if not all(isinstance(value, str) for value in flat):
            raise InvalidArgumentError(f"input '{name}': BYTES elements must be JSON strings")
        count = datatypes.element_count(shape_t)
        if len(flat) != count:
            defect = datatypes.count_defect(datatype, count, len(flat))
            return Tensor(name, datatype, datatypes.placeholder(datatype, shape_t), params, defect), offset
        values = flat
    data = json_array(values, datatype, dtype, shape_t, name)
    return Tensor(name, datatype, data, params), offset


def refuse_half_precision(datatype: str, name: str) -> None:
    """FP16 and BF16 have no JSON form in Triton: an input of either sent as JSON is refused in its words."""
    if datatype in ("FP16", "BF16"):
        raise InvalidArgumentError(f"receiving {datatype} data via JSON is not supported. Please use the binary "
                                   f"data format for input {name}")


def json_flat(values: Any) -> list:
    """A JSON tensor's elements, flat: a scalar, or arrays nested or flat."""
    if not isinstance(values, list):
        return [values]
    return values if not values or not isinstance(values[0], list) else _flatten(values)


def json_array(values: Any, datatype: str, dtype: np.dtype, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A tensor of ``shape`` from JSON ``values`` (a scalar, which only the generate extension passes, or arrays
    nested or flat; BYTES from strings)."""
    flat = json_flat(values)
    count = datatypes.element_count(shape)
    if len(flat) != count:  # Triton's front end's words (its status is 500)
        raise InvalidArgumentError("Unable to parse 'data': Shape does not match true shape of 'data' field")
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        for index, value in enumerate(flat):
            if isinstance(value, str):
                array[index] = value.encode("utf-8")
            else:
                raise InvalidArgumentError(f"input '{name}': BYTES elements must be JSON strings")
        return array.reshape(shape)
    # numpy would turn "1.5" or true into a number and truncate 1.5 into an integer: Triton refuses each
    allowed, expected = _JSON_ELEMENT_TYPES[dtype.kind]
    if not set(map(type, flat)) <= allowed:
        if datatype == "BOOL":
            raise InvalidArgumentError(f"input '{name}': BOOL elements must be true or false")
        bad = next(v for v in flat if type(v) not in allowed)
        raise InvalidArgumentError(f"input '{name}': data does not fit {datatype}: expected {expected}, got {bad!r}")
    try:
        array = np.asarray(flat, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgumentError(f"input '{name}': data does not fit {datatype}: {exc}") from None
    return array.reshape(shape)


#: numpy kind of a JSON tensor -> (the JSON element types it takes, their description for errors)
_JSON_ELEMENT_TYPES: dict[str, tuple[frozenset[type], str]] = {
    "b": (frozenset({bool}), "true or false"),
    "i": (frozenset({int}), "integers"),
    "u": (frozenset({int}), "integers"),
    "f": (frozenset({int, float}), "numbers"),
}


def _flatten(values: list) -> list:
    out: list = []
    stack = [values]
    # iterative, so deeply nested input cannot exhaust the recursion limit
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def encode_infer_response(
    response: InferResponse, request: InferRequest
) -> tuple[bytes, int | None]:
    """Response body, and the JSON header length when binary outputs follow (else None)."""
    # binary_data_output counts only where no output is listed (module docstring)
    if request.outputs:
        default_binary = False
        wanted = {out.name: out.parameters for out in request.outputs}
    else:
        default_binary = bool(request.parameters.get("binary_data_output", False))
        wanted = {}
    outputs_json = []
    chunks: list[bytes | memoryview] = []
    for tensor in response.outputs:
        params = wanted.get(tensor.name)
        binary = default_binary
        if params and "binary_data" in params:
            binary = bool(params["binary_data"])
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.data.shape),
        }
        if tensor.parameters:
            if "shared_memory_region" in tensor.parameters:  # written to shared memory by the engine
                outputs_json.append(entry)  # as Triton: name, datatype and shape only
                continue
            entry["parameters"] = dict(tensor.parameters)
        if binary:
            raw = datatypes.raw_view(tensor.datatype, tensor.data)  # copied once, by the join below
            entry.setdefault("parameters", {})["binary_data_size"] = len(raw)
            chunks.append(raw)
        elif tensor.datatype in _BINARY_ONLY:
            raise _refused_as_json(tensor.datatype)
        elif tensor.data.dtype.kind == "f" and not np.isfinite(tensor.data).all():
            entry["data"] = _non_finite_data(json_data(tensor))
        else:
            entry["data"] = json_data(tensor)
        outputs_json.append(entry)
    # Triton's order: id, model_name, model_version, parameters, outputs
    body: dict[str, Any] = {"id": response.id} if response.id else {}
    body["model_name"] = response.model_name
    body["model_version"] = response.model_version
    if response.parameters:
        body["parameters"] = response.parameters
    body["outputs"] = outputs_json
    header = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


#: output datatypes tritonserver writes only as binary data: one asked for as JSON fails the response
_BINARY_ONLY = frozenset({"FP16", "BF16"})


def _refused_as_json(datatype: str) -> ServerError:
    """tritonserver's answer to an FP16 or BF16 output asked for as JSON (``binary_data`` false, or no flag and no
    ``binary_data_output``), in its words, which name no output: a 400, typed text/plain as it is found while the
    response is written (the model ran and counts a success)."""
    return writing_response(InvalidArgumentError(
        f"sending {datatype} data via JSON is not supported. Please use the binary data format for output"))


def _non_finite_data(values: list[float]) -> orjson.Fragment:
    """Float elements as tritonserver's JSON writer puts them: NaN and the infinities as the tokens ``NaN``,
    ``Infinity`` and ``-Infinity``. Not JSON, but what tritonclient (python-rapidjson) and Python's ``json`` read
    back as those values; orjson's ``null`` came back from tritonclient as NaN, an infinity included."""
    pieces = orjson.dumps(values).split(b"null")  # a number never contains "null": one per value not finite
    tokens = [b"NaN" if value != value else b"Infinity" if value > 0 else b"-Infinity"
              for value in values if not math.isfinite(value)]
    joined = [pieces[0]]
    for token, piece in zip(tokens, pieces[1:]):
        joined += [token, piece]
    return orjson.Fragment(b"".join(joined))


def json_data(tensor: Tensor) -> list:
    """A tensor's elements as a flat JSON list (BYTES as text, BF16 as float)."""
    data = tensor.data
    if tensor.datatype == "BYTES":
        return [
            item.decode("utf-8", errors="replace") if isinstance(item, (bytes, bytearray)) else str(item)
            for item in data.flat
        ]
    if tensor.datatype == "BF16":
        return datatypes.bf16_to_fp32(data).reshape(-1).tolist()
    return data.reshape(-1).tolist()
