"""A request message protobuf cannot parse, answered as Triton 2.51's gRPC front end answers it.

Triton (grpc++) ends such an RPC with INTERNAL ``Unable to parse request``; grpc.aio would end it with UNKNOWN
``Unexpected <class 'DecodeError'>: ...``. ``UnparsableRequests`` (an interceptor of the grpc.aio front end,
``service.build_server``) makes each handler's deserializer hand an unparsable message on as ``UNPARSABLE``, and
the handler end the RPC with Triton's status when it meets one: at once for a unary request, when the stream
reaches it for a stream (the requests before it are answered; Triton ends a stream there with OK, silently
dropping the requests after it, Ferry with the error). The native front end words it the same (``native``).
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Callable

import grpc
from google.protobuf.message import DecodeError

#: Triton's status details for a message it cannot parse (grpc++'s deserialization failure)
UNPARSABLE_REQUEST = "Unable to parse request"
#: what the wrapped deserializer hands on for a message it cannot parse
UNPARSABLE = object()


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError:
            return UNPARSABLE
    return parse


async def _abort(context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.INTERNAL, UNPARSABLE_REQUEST)


class _Unparsable(Exception):
    """Raised where a request stream reaches an unparsable message, caught around the handler: the handler
    answers the requests before it first (an abort from inside its reader would cut them off)."""


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if request is UNPARSABLE:
            raise _Unparsable
        yield request


@contextlib.asynccontextmanager
async def _closing(responses: Any) -> AsyncIterator[Any]:
    """The handler's responses, closed when the RPC ends however it ends (a cancelled call's handler runs its
    ``finally`` at once, not when the generator is collected)."""
    try:
        yield responses
    finally:
        close = getattr(responses, "aclose", None)
        if close is not None:
            await close()


def _wrapped(handler: Any) -> Any:
    kwargs = {"request_deserializer": _tolerant(handler.request_deserializer),
              "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        behaviour = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if request is UNPARSABLE:
                await _abort(context)
            return await behaviour(request, context)
        return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)
    if handler.unary_stream:
        behaviour = handler.unary_stream

        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if request is UNPARSABLE:
                await _abort(context)
            async with _closing(behaviour(request, context)) as responses:
                async for response in responses:
                    yield response
        return grpc.unary_stream_rpc_method_handler(unary_stream, **kwargs)
    if handler.stream_unary:
        behaviour = handler.stream_unary

        async def stream_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            try:
                return await behaviour(_checked(requests), context)
            except _Unparsable:
                await _abort(context)
        return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)
    behaviour = handler.stream_stream

    async def stream_stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async with _closing(behaviour(_checked(requests), context)) as responses:
                async for response in responses:
                    yield response
        except _Unparsable:
            await _abort(context)
    return grpc.stream_stream_rpc_method_handler(stream_stream, **kwargs)


class UnparsableRequests(grpc.aio.ServerInterceptor):
    """Every method's handler answering an unparsable request message with Triton's status (module docstring)."""

    async def intercept_service(self, continuation: Callable, details: Any) -> Any:
        handler = await continuation(details)
        return handler if handler is None else _wrapped(handler)
