"""Triton's generate extension: ``POST /v2/models/{m}[/versions/{v}]/generate`` and ``.../generate_stream``.

A text-oriented schema for LLM-style models, mapped onto an ordinary inference request as Triton's HTTP
front end does (``HandleGenerate`` and ``GenerateRequestClass`` in ``src/http_server.cc``, 2.51):

- every top-level key of the JSON object that names a model input becomes that input: a scalar or an array,
  in the input's datatype, its shape filled from the model's dims for as many elements as the outer array has
  (fixed dims divide that count, the innermost variable dim takes the rest, other variable dims are 1), its
  elements those of the arrays flattened, which must fill that shape; ``"parameters"`` is an object whose keys
  map the same way (its errors start ``Converting keyword: 'parameters': ``); every other key becomes a request
  parameter (string, integer, boolean or number; an integer past int64 a double). ``"id"`` is also the request
  id. An input named twice (at the top and in ``"parameters"``, or a key written twice) is refused; a repeated
  key is read by its name each time, which finds its first value. An empty body is refused as no JSON document;
- each response becomes one JSON object: every output tensor under its name (a single element as a scalar,
  else a flat array; BYTES as strings), every response parameter under its name, and ``"id"`` (when set),
  ``"model_name"`` and ``"model_version"``, keys in byte order as Triton's ``std::map`` writes them;
- ``/generate`` answers ``application/json`` and expects exactly one answer from the model, a response (one
  with no output too) or an error response (another number gets Triton's error object; a decoupled model's
  flag-only completion is no answer); ``/generate_stream`` sends each answer as a
  server-sent event (``data: {...}\\n\\n``, ``text/event-stream``), an error as a ``data: {"error": ...}`` event
  after which the stream goes on. The status goes out with the first answer: 400 when it is an error, else 200.
  A request refused before inference (unknown model, a compressed or bad body, inputs that do not suit the
  model) gets the usual JSON error and its status.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import orjson

from serving_pod.core import datatypes, validation
from serving_pod.core.errors import InternalError, InvalidArgumentError, ServerError
from serving_pod.core.types import InferRequest, InferResponse, Tensor
from serving_pod.http.codec import json_array, json_data, json_flat, refuse_half_precision
from serving_pod.http.responses import BOM, error_body

PARAMETERS = "parameters"
SSE_PREFIX, SSE_SUFFIX = b"data: ", b"\n\n"
JSON, EVENT_STREAM = b"application/json", b"text/event-stream; charset=utf-8"
ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
                "generates various number of responses")
#: the status of an answer whose first part is an error: Triton 2.51 reads the code of an error it has already
#: freed (``GenerateRequestClass::InferResponseComplete``) and answers 400 for every code
MODEL_ERROR_STATUS = 400
PARSE_FAILED = "failed to parse the request JSON buffer"
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
UNSUPPORTED_ENCODING = "Unsupported content-encoding, only 'identity' is supported."


def decode_generate_request(body: bytes, metadata: dict[str, Any], model: str, version: str,
                            limit: int) -> InferRequest:
    """The inference request for a generate body; ``metadata`` is the model's (its inputs' datatypes and shapes)."""
    document = _parse(body)
    if not isinstance(document, (dict, _Repeated)):
        raise InvalidArgumentError("generate request must be a JSON object")
    members = list(_members(document))
    request_id = next((value for key, value in members if key == "id"), "")  # the first, as rapidjson finds it
    if not isinstance(request_id, str):
        raise InvalidArgumentError("'id' field must be a string")
    inputs = {item["name"]: item for item in metadata.get("inputs", [])}
    request = InferRequest(model, version, [], None, request_id, {})
    used = [0]
    for key, value in members:
        if key != PARAMETERS:
            _map(request, key, value, inputs, limit, used)
            continue
        if key in inputs:
            raise InvalidArgumentError(f"Keyword '{key}' for nested schema also given as input tensor name")
        if not isinstance(value, (dict, _Repeated)):
            raise InvalidArgumentError(f"Expected JSON object for keyword: '{key}'")
        try:
            for nested, nested_value in _members(value):
                _map(request, nested, nested_value, inputs, limit, used)
        except InvalidArgumentError as error:  # Triton's RETURN_MSG_IF_ERR around the nested schema
            raise InvalidArgumentError(f"Converting keyword: '{key}': {error.message}") from None
    return request


class _Repeated:
    """A JSON object that names a key more than once: its members in order, each with the value its key has first
    (Triton visits every member, and reads its value by name, which finds the first; a dict keeps the last)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{key!r}: {value!r}" for key, value in self.pairs) + "}"


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Repeated:
    first: dict[str, Any] = {}
    for key, value in pairs:
        first.setdefault(key, value)
    return first if len(first) == len(pairs) else _Repeated([(key, first[key]) for key, _ in pairs])


def _members(document: dict[str, Any] | _Repeated) -> Iterable[tuple[str, Any]]:
    return document.pairs if isinstance(document, _Repeated) else document.items()


def _parse(body: bytes) -> Any:
    """The body's JSON document (rapidjson refuses an empty one as Triton's front end does). orjson keeps the
    last of a repeated key: where the body may repeat one (a top-level or ``parameters`` key written twice), it is
    read again keeping every member. One UTF-8 byte order mark before it is skipped, as rapidjson skips it."""
    if body.startswith(BOM):
        body = body[len(BOM):]
    if not body.strip():
        raise InvalidArgumentError(f"{PARSE_FAILED}: The document is empty.")
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"{PARSE_FAILED}: {exc}") from None
    if isinstance(document, dict):
        keys = list(document)
        nested = document.get(PARAMETERS)
        if isinstance(nested, dict):
            keys += nested
        if any(body.count(orjson.dumps(key)) > 1 for key in keys):
            document = json.loads(body, object_pairs_hook=_object)
    return document


def _map(request: InferRequest, key: str, value: Any, inputs: dict[str, Any], limit: int, used: list[int]) -> None:
    """One key: the input of that name, else a request parameter (Triton's exact mapping)."""
    spec = inputs.get(key)
    if spec is None:
        if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            value = float(value)  # rapidjson's IsInt64 fails: Triton sets a double parameter
        if isinstance(value, (str, bool, int, float)):
            request.parameters[key] = value
            return
        raise InvalidArgumentError(
            f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")
    if any(tensor.name == key for tensor in request.inputs):  # named twice: at the top and in "parameters"
        raise InvalidArgumentError(f"{validation.prefix(request)}input '{key}' already exists in request")
    datatype = spec["datatype"]
    refuse_half_precision(datatype, key)
    count = len(value) if isinstance(value, list) else 1  # the shape's element count, as Triton counts
    # the elements: nested arrays flattened, as Triton's reader walks them; they must number ``count``
    if not isinstance(value, list):
        values = [value]
    elif any(isinstance(item, list) for item in value):
        values = json_flat([value])
    else:
        values = value
    dtype = datatypes.numpy_dtype(datatype)
    if datatype == "BYTES":
        if not all(isinstance(item, str) for item in values):
            raise InvalidArgumentError(f"input '{key}': BYTES elements must be JSON strings")
        size = sum(4 + len(item.encode("utf-8")) for item in values)
    else:
        size = len(values) * dtype.itemsize
    if used[0] + size > limit:
        raise InvalidArgumentError(
            f"request size of {used[0]} bytes with input '{key}' of size {size} bytes exceeds the maximum allowed "
            f"input size of {limit}. Use --http-max-input-size to increase the limit.")
    used[0] += size
    shape = _shape(key, count, [int(d) for d in spec["shape"]])
    if datatype not in ("BOOL", "BYTES") and any(isinstance(item, (bool, str)) for item in values):
        raise InvalidArgumentError(f"input '{key}': elements must be numbers for datatype {datatype}")
    if datatype == "BYTES" and len(values) != count:
        # Triton's front end writes the strings as they come; its core counts them (``core.validation``)
        defect = datatypes.count_defect(datatype, count, len(values))
        request.inputs.append(Tensor(key, datatype, datatypes.placeholder(datatype, shape), defect=defect))
        return
    array = json_array(values, datatype, dtype, shape, key)
    request.inputs.append(Tensor(key, datatype, array))


def _shape(name: str, count: int, dims: list[int]) -> tuple[int, ...]:
    """The input's dims with the variable ones filled so that they hold ``count`` elements (Triton's two passes)."""
    left = count
    for dim in reversed(dims):
        if dim != -1:
            if dim == 0 or left % dim:
                raise InvalidArgumentError(f"The schema can not convert input '{name}' to tensor with proper shape")
            left //= dim
    shape = list(dims)
    for index in range(len(shape) - 1, -1, -1):
        if shape[index] == -1:
            shape[index], left = left, 1
    if left != 1:
        raise InvalidArgumentError(f"The schema can not convert input '{name}' to tensor with proper shape")
    return tuple(shape)


def encode_generate_response(response: InferResponse) -> bytes:
    """One response as Triton's generate JSON object."""
    fields: dict[str, Any] = {}
    for name, value in response.parameters.items():
        if not isinstance(value, (str, bool, int, float)):
            raise InternalError(f"Response parameter '{name}' has type '{type(value).__name__}' which is not "
                                "currently supported")
        fields[name] = value
    for tensor in response.outputs:
        data = json_data(tensor)
        fields[tensor.name] = data[0] if len(data) == 1 else data
    if response.id:
        fields["id"] = response.id
    fields["model_name"] = response.model_name
    fields["model_version"] = response.model_version
    return orjson.dumps({key: fields[key] for key in sorted(fields, key=lambda k: k.encode())})


def _encoded(answer: InferResponse | ServerError) -> tuple[bytes, bool]:
    """An answer's JSON object, and whether it is an error object (the model's error, or a response JSON cannot
    hold: Triton's ``FinalizeResponse`` fails on it)."""
    if isinstance(answer, ServerError):
        return error_body(answer)[1], True
    try:
        return encode_generate_response(answer), False
    except ServerError as error:
        return error_body(error)[1], True


async def _answers(stream: AsyncIterator[InferResponse | ServerError]) -> AsyncIterator[InferResponse | ServerError]:
    """The model's answers to one request as Triton's generate endpoint counts them: each response and each error
    response (the engine raises the one that ends the stream), in order; the final flag a decoupled model sends
    alone is none (``stream_infer`` yields it as a ``FinalFlag``), while any response the model sent is an
    answer even with no output (a decoupled model's empty response with the final flag too, as Triton counts
    it). A request refused before it was queued (the engine's ``refused_before_queue``: no such model version,
    inputs that do not suit it) raises its error: no answer was sent for it."""
    try:
        async for item in stream:
            if isinstance(item, ServerError) or not item.flag_only:
                yield item
    except ServerError as error:
        if error.refused_before_queue:
            raise
        yield error
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:  # a client gone before the last answer: nobody reads the model's stream now
            await close()


Answer = tuple[int, bytes, "bytes | AsyncIterator[bytes]"]


async def answer_generate(engine: Any, body: bytes, model: str, version: str, limit: int,
                          streaming: bool, encoding: str | None = None) -> Answer:
    """(status, content type, body or async chunks) for one generate request; ``encoding``: its Content-Encoding
    (None when absent): anything but ``identity``, matched exactly, is refused (``http.compression``).

    A request refused before inference (an unknown model, an encoded or bad body, validation) is a JSON error
    with its status. Otherwise the status goes out with the model's first answer, as in Triton 2.51: 200, or 400
    when that answer is an error (whatever its code); ``/generate_stream`` then sends every answer, errors
    included, as an event, and ``/generate`` the one answer it expects (an error object when there are more, or
    none).
    """
    try:
        metadata = engine.model_metadata(model, version)
        if encoding is not None and encoding != "identity":  # checked once the model is found, as Triton does
            raise InvalidArgumentError(UNSUPPORTED_ENCODING)
        request = decode_generate_request(body, metadata, model, version, limit)
        answers = _answers(engine.stream_infer(request))
        first = await anext(answers, None)
    except ServerError as error:
        status, payload = error_body(error)
        return status, JSON, payload
    payload, failed = _encoded(first) if first is not None else (b"", False)
    status = MODEL_ERROR_STATUS if failed else 200
    if streaming:
        return status, EVENT_STREAM, _events(payload if first is not None else None, answers)
    count = 0 if first is None else 1
    async for _ in answers:
        count += 1
    if count != 1:
        payload = error_body(InternalError(ONE_RESPONSE))[1]
    return status, JSON, payload


async def _events(first: bytes | None, answers: AsyncIterator[InferResponse | ServerError]) -> AsyncIterator[bytes]:
    """Each answer as an event: ``first`` (already encoded), then the rest, errors as error objects."""
    try:
        if first is not None:
            yield SSE_PREFIX + first + SSE_SUFFIX
        async for answer in answers:
            yield SSE_PREFIX + _encoded(answer)[0] + SSE_SUFFIX
    finally:
        await answers.aclose()  # type: ignore[attr-defined]  # an async generator (``_answers``)
