"""Small HTTP helpers shared by the adapter's modules: bounded body reading, raw ASGI responses, JSON bodies,
and ``ServerError`` -> ``{"error": msg}`` with the status from ``core.errors``.

Content types of error answers follow tritonserver 2.51, whose handlers set ``application/json`` as their first
step for some routes only: an answer from a route without one (health, model readiness, an unknown route), or
an inference error found before the request body is parsed, carries libevhtp's default ``text/plain`` while its
body is still the ``{"error": ...}`` object (tritonclient reads the body whatever the type). So does an inference
error that comes from the model's execution (tritonserver sends it from the response callback, which sets no
type), and so does the error of a request a scheduler queued and then dropped unrun (a queue timeout,
``ServerError.from_queue``) or one found while writing the model's response (``ServerError.writing_response``);
errors found while parsing the body, validating the request or queuing it are ``application/json``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

import orjson
from fastapi import Request
from fastapi.responses import Response

from serving_pod.core.errors import InvalidArgumentError, ServerError, http_status
from serving_pod.http.compression import size_error


JSON = b"application/json"
#: libevhtp's default content type, which tritonserver's answers carry where its handler set none (module docstring)
TEXT = b"text/plain"
#: a UTF-8 byte order mark: tritonserver's JSON reader skips one before a body (``parse_json``)
BOM = b"\xef\xbb\xbf"
#: the prefixes of the engine's model lookup errors (``core.errors``): tritonserver finds these before it parses an
#: inference body (``CheckTransactionPolicy``), so it answers them as ``TEXT``
_LOOKUP_ERRORS = ("Request for unknown model: ", "failed to get model version from specified version string")


def error_body(error: ServerError) -> tuple[int, bytes]:
    return http_status(error), orjson.dumps({"error": error.message})


def before_parsing(error: ServerError) -> ServerError:
    """Mark ``error`` as one tritonserver finds before it parses an inference body (a request header, the
    body's encoding, the model's transaction policy): answered as ``TEXT`` (``infer_content_type``)."""
    error.before_parsing = True
    return error


def infer_content_type(error: ServerError) -> bytes:
    """The content type of an inference error answer: ``TEXT`` for what tritonserver finds before parsing the body
    (``before_parsing``, or the model lookup) and for an error of the model's execution (an error the model sent
    as its response, ``ServerError.sent_as_response``, or its failed execution, ``ServerError.in_execution``), for a
    queued request a scheduler dropped (``ServerError.from_queue``) and for an error writing the response
    (``ServerError.writing_response``), else ``JSON``."""
    if (error.before_parsing or error.sent_as_response or error.in_execution or error.from_queue
            or error.writing_response or error.message.startswith(_LOOKUP_ERRORS)):
        return TEXT
    return JSON


async def read_body(receive: Callable, limit: int) -> bytes:
    """The whole request body, refusing anything beyond ``limit`` bytes as it arrives."""
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise size_error(len(body), limit)
        return body
    parts = [body]
    size = len(body)
    while message.get("more_body", False):
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidArgumentError("client disconnected before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise size_error(size, limit)
        parts.append(chunk)
    return b"".join(parts)


async def send_response(
    send: Callable,
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
    content_type: bytes = JSON,
) -> None:
    headers = headers + [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def json_ok() -> Response:
    """An empty 200 from a route whose tritonserver handler sets ``application/json`` (model control, shared
    memory registration)."""
    return Response(status_code=200, media_type="application/json")


def text_response(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> Response:
    """An answer typed ``TEXT`` exactly (Starlette would add a charset to a ``text/`` media type)."""
    return Response(body, status_code=status, headers={**(headers or {}), "content-type": "text/plain"})


def parse_json(raw: bytes | memoryview) -> Any:
    """A request body's JSON document, read as tritonserver reads it: one UTF-8 byte order mark before it is
    skipped, and the tokens of rapidjson's ``kParseNanAndInfFlag`` are numbers (``_NON_FINITE``; tritonclient
    writes ``NaN``, ``Infinity`` and ``-Infinity`` for such floats; orjson refuses them all). InvalidArgumentError
    in Triton's words if it is not JSON (``_refusal``)."""
    if raw[:3] == BOM:  # a memoryview compares by content: no copy per request
        raw = raw[3:]
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        error = exc
    raw = bytes(raw)
    if b"NaN" in raw or b"Inf" in raw:
        document = _with_non_finite(raw)
        if document is not None:
            return document
    raise _refusal(raw, error)


class JsonFollowedByBytes(InvalidArgumentError):
    """A whole JSON document followed by bytes that are not UTF-8: most often binary tensor data sent without the
    ``Inference-Header-Content-Length`` header that tells where the JSON ends (the codec says so)."""


def _refusal(raw: bytes, error: orjson.JSONDecodeError) -> InvalidArgumentError:
    """orjson's words, except for bytes that are not UTF-8, which it places at char 0 ("str is not valid UTF-8:
    surrogates not allowed") whatever they are: then the first such byte, or the length of the whole document
    before it (``JsonFollowedByBytes``)."""
    prefix = "failed to parse the request JSON buffer: "
    try:
        raw.decode()
    except UnicodeDecodeError as exc:
        at = exc.start
    else:
        return InvalidArgumentError(f"{prefix}{error}")
    text = raw[:at].decode()
    try:
        _, end = json.JSONDecoder().raw_decode(text, len(text) - len(text.lstrip()))
    except ValueError:
        return InvalidArgumentError(f"{prefix}invalid UTF-8 at byte {at}")
    size = len(text[:end].encode())
    return JsonFollowedByBytes(f"{prefix}the JSON document ({size} bytes) is followed by {len(raw) - size} bytes "
                               "that are not JSON")


#: a JSON string, or one of the tokens rapidjson reads as a number with ``kParseNanAndInfFlag`` (Triton's
#: ``TritonJson``): ``NaN``, ``Inf`` and ``Infinity``, each with an optional ``-`` (recorded live: Triton 2.51 takes
#: those six and refuses ``+NaN``, ``+Inf``, ``nan``, ``inf``, ``INF``, ``Infin``, ``NaNa`` and ``Infinityx``)
_NON_FINITE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|(-?)(NaN|Inf(?:inity)?)')


def _python_token(match: re.Match[bytes]) -> bytes:
    """The token Python's ``json`` reads for a rapidjson one (strings kept as they are); ``-NaN`` is NaN."""
    if match.group(2) is None:
        return match.group()
    if match.group(2) == b"NaN":
        return b"NaN"
    return match.group(1) + b"Infinity"


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):
        raise ValueError(f"number too big to be stored in double: {text}")
    return value


def _with_non_finite(raw: bytes) -> Any:
    """``raw`` read by Python's ``json``, which takes ``NaN``, ``Infinity`` and ``-Infinity`` (the other tokens of
    ``_NON_FINITE`` written as those first); None where it is not JSON or holds what orjson refuses besides them
    (a lone surrogate, an integer past 64 bits: checked by writing it again) or rapidjson (a number past a double's
    range: Triton's "Number too big to be stored in double", recorded live)."""
    try:
        document = json.loads(_NON_FINITE.sub(_python_token, raw), parse_float=_finite_float)
        orjson.dumps(document)
    except (ValueError, TypeError, orjson.JSONEncodeError):
        return None
    return document


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    data = parse_json(raw)
    if not isinstance(data, dict):
        raise InvalidArgumentError("request body must be a JSON object")
    return data


