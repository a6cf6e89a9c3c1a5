"""The native gRPC front end: gRPC's wire protocol over ``serving_pod.grpc.h2``, on the event loop.

It serves the very servicers of ``serving_pod.grpc.service`` (same methods, same error mapping) through a
``context.Context`` that has the part of ``grpc.aio.ServicerContext`` they use; ``wire`` holds gRPC's
conventions (status trailers, message frames, compression, timeouts, metadata). Why it exists: grpcio's asyncio
server costs more Python time per RPC than the whole engine path (a canned-response servicer tops out
below Triton), while an RPC here is a few frames parsed and written from one ``data_received``.
``--grpc-server=grpcio`` keeps the grpc.aio server.

At ``--log-verbose`` 1 and above each RPC started is logged with the line tritonserver's gRPC front end writes as
it takes one (``grpc.verbose``); at level 0 that costs one flag check per RPC.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
import time
from dataclasses import dataclass
from typing import Any, Callable

import grpc
from google.protobuf import message_factory

from serving_pod import logging_settings
from serving_pod.grpc import h2
from serving_pod.grpc.context import Context
from serving_pod.grpc.hpack_blocks import encode_headers
from serving_pod.grpc.unparsable import UNPARSABLE_REQUEST
from serving_pod.grpc.verbose import RpcLog
from serving_pod.grpc.wire import (
    ACCEPT_ENCODING, HEADERS_FOR, OK_TRAILERS, RESERVED, RpcError, decompress, joined, message_frame,
    metadata_headers, metadata_value, parse_timeout, response_compression, response_header_list, status_block,
)

log = logging.getLogger("ferry.grpc")


@dataclass(frozen=True)
class Method:
    """One RPC: its handler and how its messages flow."""

    path: bytes
    handler: Callable[..., Any]
    #: bytes -> what the handler takes: the request class's ``FromString``, or the bytes themselves for a
    #: unary handler marked ``wire.takes_serialized``
    parse: Callable[[bytes], Any]
    client_streaming: bool
    server_streaming: bool


def method_table(services: list[tuple[Any, Any]]) -> dict[bytes, Method]:
    """``(service descriptor, servicer)`` pairs -> methods by ``/package.Service/Method`` path."""
    table: dict[bytes, Method] = {}
    for descriptor, servicer in services:
        for method in descriptor.methods:
            path = f"/{descriptor.full_name}/{method.name}".encode()
            handler = getattr(servicer, method.name)
            serialized = getattr(handler, "takes_serialized", False) and not method.client_streaming
            parse = bytes if serialized else message_factory.GetMessageClass(method.input_type).FromString
            table[path] = Method(path, handler, parse, method.client_streaming, method.server_streaming)
    return table


class Call:
    """One RPC on one stream: the request bytes as they arrive, the handler task, the response."""

    __slots__ = ("connection", "stream", "method", "encoding", "buffer", "queue", "task", "cancelled",
                 "finished", "headers_sent", "context", "compress")

    def __init__(self, connection: "GrpcConnection", stream: h2.Stream, method: Method, encoding: bytes) -> None:
        self.connection = connection
        self.stream = stream
        self.method = method
        self.encoding = encoding
        self.buffer = bytearray()
        self.queue: asyncio.Queue | None = asyncio.Queue() if method.client_streaming else None
        self.task: asyncio.Task | None = None
        self.cancelled = False
        self.finished = False
        self.headers_sent = False
        self.context: Context | None = None
        self.compress: bytes | None = None

    def send_headers(self, metadata: tuple = ()) -> None:
        """The response headers, with the servicer's custom initial metadata; once per call."""
        if not self.headers_sent:
            self.headers_sent = True
            block = HEADERS_FOR[self.compress]
            if metadata:
                block = encode_headers(response_header_list(self.compress) + metadata_headers(metadata))
            self.connection.h2.send_headers(self.stream, block)

    def messages(self, final: bool, whole: memoryview | bytes | None = None) -> list[bytes]:
        """Complete length-prefixed messages from the buffer, decompressed; from ``whole`` instead when the request
        came in one piece (``GrpcConnection.stream_data``), which then never enters the buffer."""
        out: list[bytes] = []
        buffer: Any = self.buffer if whole is None else whole
        limit = self.connection.server.max_message_size
        position = 0
        with memoryview(buffer) as view:  # a message is copied once, out of the view (released before the del)
            while len(buffer) - position >= 5:
                compressed = buffer[position]
                size = int.from_bytes(buffer[position + 1 : position + 5], "big")
                if size > limit:
                    raise RpcError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"Received message larger than max ({size} vs. {limit})")
                if len(buffer) - position - 5 < size:
                    break
                data = bytes(view[position + 5 : position + 5 + size])
                position += 5 + size
                out.append(decompress(data, self.encoding, limit) if compressed else data)
        if whole is None:
            del buffer[:position]
        else:
            buffer = buffer[position:]
        if final and buffer:
            raise RpcError(grpc.StatusCode.INTERNAL, "Incomplete gRPC message at the end of the stream")
        return out


class GrpcConnection:
    """gRPC on one HTTP/2 connection (the ``StreamHandler`` of ``h2.H2Connection``)."""

    def __init__(self, server: "NativeGrpcServer", connection: h2.H2Connection) -> None:
        self.server = server
        self.h2 = connection

    @property
    def peer(self) -> str:
        return self.h2.peer

    def stream_started(self, stream: h2.Stream, headers: list[tuple[bytes, bytes]] | None, end_stream: bool) -> None:
        server = self.server
        if headers is None:
            self._refuse(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"Header list larger than {server.max_metadata_size} bytes")
            return
        path = b""
        content_type = b""
        http_method = b""
        encoding = b"identity"
        accepted = b""
        deadline: float | None = None
        metadata: list[tuple[str, Any]] = []
        try:
            for key, value in headers:
                if key[:1] == b":":
                    if key == b":path":
                        path = value
                    elif key == b":method":
                        http_method = value
                elif key == b"content-type":
                    content_type = value
                elif key == b"grpc-timeout":
                    timeout = parse_timeout(value)
                    deadline = None if timeout is None else time.monotonic() + timeout
                elif key == b"grpc-encoding":
                    encoding = value
                elif key == b"grpc-accept-encoding":
                    accepted = value
                elif key not in RESERVED:
                    metadata.append(metadata_value(key, value))
        except RpcError as error:
            self._refuse(stream, error.code, error.details)
            return
        if http_method != b"POST" or not content_type.startswith(b"application/grpc"):
            status = b"405" if http_method != b"POST" else b"415"
            self.h2.send_headers(stream, encode_headers([(b":status", status)]), end_stream=True)
            return
        method = server.methods.get(path)
        if method is None:
            self._refuse(stream, grpc.StatusCode.UNIMPLEMENTED, "")  # Triton's (grpc++'s): no details
            return
        if encoding not in (b"identity", b"gzip", b"deflate"):
            # doc/compression.md: UNIMPLEMENTED, naming the supported ones, with grpc-accept-encoding
            self._refuse(stream, grpc.StatusCode.UNIMPLEMENTED,
                         f"Compression algorithm '{encoding.decode('latin-1')}' is not supported "
                         f"(supported: {ACCEPT_ENCODING.decode()})",
                         (("grpc-accept-encoding", ACCEPT_ENCODING),))
            return
        denied = server.denied(path, metadata)
        if denied:
            if logging_settings.VERBOSE:  # as tritonserver: its line first, then the restriction's refusal
                server.rpc_log.started(path.decode("latin-1"))
            self._refuse(stream, grpc.StatusCode.UNAVAILABLE, denied)
            return
        call = Call(self, stream, method, encoding)
        if server.response_compression != "none":
            call.compress = response_compression(server.response_compression, accepted, path)
        call.context = Context(call, tuple(metadata), deadline)
        stream.call = call
        if method.client_streaming:
            self._start(call, None)
        if end_stream:
            self.stream_data(stream, b"", True)

    def _refuse(self, stream: h2.Stream, code: grpc.StatusCode, details: str, trailing: tuple = ()) -> None:
        self.h2.send_headers(stream, status_block(code, details, with_headers=True, trailing=trailing),
                             end_stream=True)

    def stream_data(self, stream: h2.Stream, data: bytes, end_stream: bool) -> None:
        call: Call | None = stream.call  # type: ignore[assignment]
        if call is None:
            return
        whole = None
        if data:
            if end_stream and call.queue is None and not call.buffer:
                whole = data  # a unary request in one DATA frame: its message is copied out of it, not buffered
            else:
                call.buffer += data
        try:
            if call.queue is not None:
                for message in call.messages(end_stream):
                    call.queue.put_nowait(message)
                if end_stream:
                    call.queue.put_nowait(None)
                return
            if not end_stream:
                buffer = call.buffer
                limit = self.server.max_message_size
                if len(buffer) > limit + 5 or (len(buffer) >= 5 and int.from_bytes(buffer[1:5], "big") > limit):
                    call.messages(False)  # raises RESOURCE_EXHAUSTED (known from the prefix alone)
                return
            messages = call.messages(True, whole)
            if len(messages) != 1:  # a cardinality violation: UNIMPLEMENTED (doc/statuscodes.md)
                raise RpcError(grpc.StatusCode.UNIMPLEMENTED, f"Expected one request message, received {len(messages)}")
        except RpcError as error:
            self._fail(call, error)
            return
        self._start(call, messages[0])

    def _start(self, call: Call, message: bytes | None) -> None:
        """Run the handler (``message``: a unary request's bytes; None: requests stream from the queue)."""
        if logging_settings.VERBOSE:
            self.server.rpc_log.started(call.method.path.decode("latin-1"))
        calls = self.server.calls
        call.task = asyncio.get_running_loop().create_task(self._run(call, message))
        calls.add(call.task)
        call.task.add_done_callback(calls.discard)

    def connection_closed(self) -> None:
        self.server.connections.discard(self.h2)

    def stream_reset(self, stream: h2.Stream) -> None:
        call: Call | None = stream.call  # type: ignore[assignment]
        if call is not None and not call.finished:
            call.cancelled = True
            if call.task is not None:
                call.task.cancel()

    def _fail(self, call: Call, error: RpcError) -> None:
        """The request itself is bad: stop a running handler and end the call with ``error``."""
        if call.task is not None and not call.task.done():
            call.task.cancel()
        self._finish(call, error.code, error.details)

    async def _requests(self, call: Call):
        parse = call.method.parse
        queue = call.queue
        while True:
            message = await queue.get()  # type: ignore[union-attr]
            if message is None:
                return
            try:
                request = parse(message)
            except Exception:  # noqa: BLE001 - a malformed protobuf, as a unary request's
                raise RpcError(grpc.StatusCode.INTERNAL, UNPARSABLE_REQUEST) from None
            yield request

    async def _run(self, call: Call, message: bytes | None) -> None:
        method = call.method
        context = call.context
        deadline = context._deadline  # type: ignore[union-attr]
        try:
            if message is not None:
                try:
                    request: Any = method.parse(message)
                except Exception:  # noqa: BLE001 - a malformed protobuf
                    raise RpcError(grpc.StatusCode.INTERNAL, UNPARSABLE_REQUEST) from None
            else:
                request = self._requests(call)
            if deadline is None:
                await self._respond(call, request)
            else:
                async with asyncio.timeout_at(asyncio.get_running_loop().time() + deadline - time.monotonic()):
                    await self._respond(call, request)
        except RpcError as error:
            self._finish(call, error.code, error.details)
        except TimeoutError:
            self._finish(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except asyncio.CancelledError:
            if call.cancelled or call.finished or self.h2.closed:
                return
            self._finish(call, grpc.StatusCode.CANCELLED, "Cancelled")
            raise
        except Exception as error:  # noqa: BLE001 - a servicer bug must not take the connection down
            code = context.code() if context is not None else None  # type: ignore[union-attr]
            if code is None or code == grpc.StatusCode.OK:
                log.exception("gRPC method %s failed", method.path.decode())
                self._finish(call, grpc.StatusCode.UNKNOWN, f"Unexpected {type(error)}: {error}")
            else:
                self._finish(call, code, context.details())  # type: ignore[union-attr]

    async def _respond(self, call: Call, request: Any) -> None:
        method = call.method
        context = call.context
        result = method.handler(request, context)
        connection = self.h2
        if method.server_streaming:
            async for response in result:
                call.send_headers()
                await connection.send_data(call.stream, joined(message_frame(response.SerializeToString(),
                                                                            call.compress)))
            self._finish(call, context.code() or grpc.StatusCode.OK, context.details())  # type: ignore[union-attr]
            return
        if inspect.isawaitable(result):
            result = await result
        if call.finished:
            return
        code = context.code()  # type: ignore[union-attr]
        if code is not None and code != grpc.StatusCode.OK:
            self._finish(call, code, context.details())  # type: ignore[union-attr]
            return
        payload = message_frame(result if type(result) is bytes else result.SerializeToString(), call.compress)
        trailing = context._trailing  # type: ignore[union-attr]
        trailers = OK_TRAILERS if not trailing else status_block(grpc.StatusCode.OK, "", with_headers=False,
                                                                 trailing=trailing)
        call.finished = True
        headers = None if call.headers_sent else HEADERS_FOR[call.compress]
        call.headers_sent = True
        if connection.try_send(call.stream, headers, payload, trailers):
            return
        if headers is not None:
            connection.send_headers(call.stream, headers)
        await connection.send_data(call.stream, joined(payload))
        connection.send_headers(call.stream, trailers, end_stream=True)

    def _finish(self, call: Call, code: grpc.StatusCode, details: str) -> None:
        if call.stream.local_closed:
            call.finished = True
            return
        call.finished = True
        trailing = call.context._trailing if call.context is not None else ()
        if code == grpc.StatusCode.OK and call.headers_sent and not trailing:
            block = OK_TRAILERS
        else:
            block = status_block(code, details, with_headers=not call.headers_sent, trailing=trailing)
        self.h2.send_headers(call.stream, block, end_stream=True)


class NativeGrpcServer:
    """Listens, accepts HTTP/2 connections and serves the method table; ``stop`` drains gracefully."""

    def __init__(
        self,
        services: list[tuple[Any, Any]],
        *,
        denied: Callable[[bytes, list[tuple[str, Any]]], str | None] | None = None,
        max_message_size: int,
        max_metadata_size: int,
        ssl_context: ssl.SSLContext | None = None,
        keepalive: Any = None,
        response_compression: str = "none",
    ) -> None:
        self.methods = method_table(services)
        self.keepalive = keepalive
        self.response_compression = response_compression
        self._denied = denied
        self.max_message_size = max_message_size
        self.max_metadata_size = max_metadata_size
        self.ssl_context = ssl_context
        self.calls: set[asyncio.Task] = set()
        self.connections: set[h2.H2Connection] = set()
        self._servers: list[asyncio.AbstractServer] = []
        #: numbers the verbose lines of the RPCs started
        self.rpc_log = RpcLog()

    def denied(self, path: bytes, metadata: list[tuple[str, Any]]) -> str | None:
        return self._denied(path, metadata) if self._denied is not None else None

    def _protocol(self) -> h2.H2Connection:
        connection = h2.H2Connection(
            lambda conn: GrpcConnection(self, conn), max_header_list_size=self.max_metadata_size,
            keepalive=self.keepalive,
        )
        self.connections.add(connection)
        return connection

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen on ``host:port`` (port 0: a free one) and return the bound port (``reuse_port``: SO_REUSEPORT)."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(self._protocol, host or None, port, ssl=self.ssl_context,
                                          reuse_address=True, reuse_port=reuse_port or None, backlog=1024)
        self._servers.append(server)
        return server.sockets[0].getsockname()[1]

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, let running RPCs finish for ``grace`` seconds, then cancel them and close."""
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.goaway()
        if self.calls and grace:
            await asyncio.wait(list(self.calls), timeout=grace)
        for task in list(self.calls):
            task.cancel()
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        self.connections.clear()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()


def server_ssl_context(cert: str, key: str, ca: str | None, mutual: bool) -> ssl.SSLContext:
    """TLS for gRPC: HTTP/2 through ALPN, the client certificate required with ``mutual``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if ca:
        context.load_verify_locations(ca)
    if mutual:
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    return context
