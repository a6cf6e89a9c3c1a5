"""Small HTTP helpers shared by the adapter's modules: bounded body reading, raw ASGI responses, JSON bodies,
and ``ServerError`` -> ``{"error": msg}`` with the status from ``core.errors``."""

from __future__ import annotations

from typing import Any, Callable

import orjson
from fastapi import Request
from fastapi.responses import Response

from serving_pod.core.errors import InvalidArgumentError, ServerError, http_status
from serving_pod.http.compression import size_error


def error_body(error: ServerError) -> tuple[int, bytes]:
    return http_status(error), orjson.dumps({"error": error.message})


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
    content_type: bytes = b"application/json",
) -> None:
    headers = headers + [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgumentError("request body must be a JSON object")
    return data


