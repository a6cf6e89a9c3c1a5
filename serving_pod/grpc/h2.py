"""Server-side HTTP/2 (RFC 9113) for the native gRPC front end: framing, flow control, HPACK.

Only what a gRPC server needs: no server push, no priorities, no h2c upgrade. Header blocks are decoded and
built by ``hpack_blocks``; gRPC's keepalive and ping policy (``--grpc-keepalive-*``) is ``pings``. A connection
older than ``--grpc-max-connection-age`` (+-10%) gets GOAWAY (NO_ERROR, debug data ``max_age``, as gRPC core's
max_age filter) and closes when its calls end, or ``--grpc-max-connection-age-grace`` later with them cut off.
``serving_pod.grpc.native`` puts gRPC on top through the ``StreamHandler`` callbacks.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import struct
from typing import TYPE_CHECKING, Protocol


from serving_pod.grpc import hpack_blocks
from serving_pod.grpc.pings import PingPolicy

if TYPE_CHECKING:
    from serving_pod.options import GrpcKeepalive

log = logging.getLogger("ferry.grpc.h2")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
MAX_WINDOW = 2**31 - 1
#: what this server grants: receive windows are replenished once half is received. A frame is at most
#: MAX_RECEIVE_FRAME (an eighth of the window), so no frame can overrun a window this side tracks; what one
#: call may buffer is bounded by the maximum message size instead.
RECEIVE_WINDOW = 8 * 1024 * 1024
MAX_RECEIVE_FRAME = 1024 * 1024
#: open streams one connection may have; beyond it a new stream is refused (REFUSED_STREAM, the client may
#: retry it), so a client cannot hold unbounded calls and their buffers. gRPC clients queue calls past it.
MAX_CONCURRENT_STREAMS = 1024

_HEADER = struct.Struct(">BHBBI")
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")


class ConnectionError_(Exception):
    """A connection-level protocol error: GOAWAY with ``code`` and close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _HEADER.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


class StreamHandler(Protocol):
    """What the connection reports to the layer above (one object per connection)."""

    def stream_started(self, stream: "Stream", headers: list[tuple[bytes, bytes]], end_stream: bool) -> None: ...

    def stream_data(self, stream: "Stream", data: bytes, end_stream: bool) -> None: ...

    def stream_reset(self, stream: "Stream") -> None: ...

    def connection_closed(self) -> None: ...


class Stream:
    """One HTTP/2 stream: its send window and what the layer above keeps on it (``call``)."""

    __slots__ = ("id", "send_window", "recv_unacked", "remote_closed", "local_closed", "call", "_window_waiter")

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.send_window = send_window
        self.recv_unacked = 0
        self.remote_closed = False
        self.local_closed = False
        self.call: object = None
        self._window_waiter: asyncio.Future | None = None


class H2Connection(asyncio.Protocol):
    """One client connection: parses frames, keeps stream state and flow control, writes frames."""

    def __init__(self, handler_factory, *, max_header_list_size: int,
                 keepalive: "GrpcKeepalive | None" = None) -> None:
        self._handler_factory = handler_factory
        self.pings = PingPolicy(self, keepalive) if keepalive is not None else None
        self._keepalive = keepalive
        self._age_timer: asyncio.TimerHandle | None = None
        self.handler: StreamHandler | None = None
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.streams: dict[int, Stream] = {}
        self._buffer = bytearray()
        self._preface_seen = False
        self._blocks = hpack_blocks.HeaderBlocks(max_header_list_size)
        self._max_header_list_size = max_header_list_size
        self._last_stream = 0
        self._goaway_last_stream: int | None = None  # as the GOAWAY sent said: a later one may not name more
        # stream id, flags, block so far (None: over the hard limit, its CONTINUATIONs dropped until END_HEADERS)
        self._headers_in_progress: tuple[int, int, bytearray | None] | None = None
        # a header block was given up mid-way: the HPACK table is out of step with the client's, so no block is
        # decoded again; the connection goes away once its open streams finish (``_header_list_beyond_limit``)
        self._table_lost = False
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self.peer_initial_window = DEFAULT_WINDOW
        self.conn_send_window = DEFAULT_WINDOW
        self._conn_recv_unacked = 0
        self._conn_waiters: list[asyncio.Future] = []
        self._paused = False
        self._drain_waiter: asyncio.Future | None = None
        self.closed = False
        self._going_away = False
        self._goaway_sent = False

    # -- asyncio.Protocol --------------------------------------------------------------------------------

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        if self.pings is not None:
            self.pings.start()
        if self._keepalive is not None and self._keepalive.max_connection_age_ms:
            # gRPC core's max_age: +-10% so that connections opened together do not all end together
            age_s = self._keepalive.max_connection_age_ms / 1000 * random.uniform(0.9, 1.1)
            self._age_timer = asyncio.get_running_loop().call_later(age_s, self._aged)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - platform dependent
                pass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            host = peer[0]
            self.peer = f"ipv6:[{host}]:{peer[1]}" if ":" in host else f"ipv4:{host}:{peer[1]}"
        self.handler = self._handler_factory(self)
        settings = [
            (SETTINGS_ENABLE_PUSH, 0),
            (SETTINGS_MAX_CONCURRENT_STREAMS, MAX_CONCURRENT_STREAMS),
            (SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW),
            (SETTINGS_MAX_FRAME_SIZE, MAX_RECEIVE_FRAME),
            (SETTINGS_MAX_HEADER_LIST_SIZE, self._max_header_list_size),
        ]
        transport.write(
            frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in settings))
            + frame(WINDOW_UPDATE, 0, 0, _U32.pack(RECEIVE_WINDOW - DEFAULT_WINDOW))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.pings is not None:
            self.pings.stop()
        if self._age_timer is not None:
            self._age_timer.cancel()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            self._wake(stream)
            if self.handler is not None:
                self.handler.stream_reset(stream)
        for waiter in self._conn_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._conn_waiters.clear()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        if self.handler is not None:
            self.handler.connection_closed()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        self._drain_waiter = None

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        try:
            if not self._preface_seen:
                if len(buffer) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buffer)):
                        raise ConnectionError_(PROTOCOL_ERROR, "invalid connection preface")
                    return
                if not buffer.startswith(PREFACE):
                    raise ConnectionError_(PROTOCOL_ERROR, "invalid connection preface")
                del buffer[: len(PREFACE)]
                self._preface_seen = True
            position = 0
            end = len(buffer)
            # DATA payloads reach the layer above as views of the buffer (it copies them into its message
            # buffer); the view is released before the buffer is resized
            view = memoryview(buffer)
            payload: memoryview | None = None
            try:
                while end - position >= 9:
                    high, low, kind, flags, stream_id = _HEADER.unpack_from(buffer, position)
                    size = (high << 16) | low
                    if size > MAX_RECEIVE_FRAME:
                        raise ConnectionError_(FRAME_SIZE_ERROR, f"frame of {size} bytes")
                    if end - position - 9 < size:
                        break
                    start = position + 9
                    position = start + size
                    payload = view[start:position]
                    self._frame(kind, flags, stream_id & 0x7FFFFFFF, payload if kind == DATA else bytes(payload))
                    if self.closed:
                        return
            finally:
                payload = None  # the last slice: the buffer cannot be resized while a view of it lives
                view.release()
            self._consumed(buffer, position)
        except ConnectionError_ as error:
            self.close(error.code, str(error))

    def _consumed(self, buffer: bytearray, position: int) -> None:
        """Drop the first ``position`` bytes read. A view of a DATA payload the layer above still holds forbids
        resizing the buffer (BufferError, seen once in a while under perf_analyzer gRPC load: something kept a
        handled payload's frames alive past this call); the rest then moves to a new buffer and the old one stays,
        unchanged, with whoever holds the view, instead of the connection failing with its calls."""
        try:
            del buffer[:position]
        except BufferError:
            self._buffer = buffer[position:]  # a copy; the old buffer keeps its bytes for the views on it

    # -- receiving ---------------------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes | memoryview) -> None:
        if self._headers_in_progress is not None and kind != CONTINUATION:
            raise ConnectionError_(PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == PING:
            if len(payload) != 8 or stream_id:
                raise ConnectionError_(FRAME_SIZE_ERROR, "bad PING")
            if flags & FLAG_ACK:
                if self.pings is not None:
                    self.pings.acknowledged(payload)
            else:  # answered before it is weighed, as gRPC core (tritonserver) does: the one past the strikes too
                self._write(frame(PING, FLAG_ACK, 0, payload))
                if self.pings is not None:
                    self.pings.allowed()  # False: the connection was closed for it
        elif kind == RST_STREAM:
            if len(payload) != 4 or not stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "bad RST_STREAM")
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                stream.remote_closed = stream.local_closed = True
                self._wake(stream)
                self.handler.stream_reset(stream)  # type: ignore[union-attr]
        elif kind == GOAWAY:
            self._going_away = True
            if not self.streams:
                self.close(NO_ERROR, "")
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "clients cannot push")
        # PRIORITY and unknown frame types are ignored (RFC 9113 5.5)

    def _strip_padding(self, flags: int, payload: bytes) -> bytes:
        if flags & FLAG_PADDED:
            if not payload:
                raise ConnectionError_(PROTOCOL_ERROR, "padding without length")
            pad = payload[0]
            if pad >= len(payload):
                raise ConnectionError_(PROTOCOL_ERROR, "padding exceeds frame")
            payload = payload[1 : len(payload) - pad]
        return payload

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        flow = len(payload)
        self._conn_recv_unacked += flow
        if self._conn_recv_unacked >= RECEIVE_WINDOW // 2:
            self._write(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._conn_recv_unacked)))
            self._conn_recv_unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream_id > self._last_stream:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream this side already closed or reset: ignored (RFC 9113 5.4.2)
        end_stream = bool(flags & FLAG_END_STREAM)
        if end_stream:
            stream.remote_closed = True
        else:
            stream.recv_unacked += flow
            if stream.recv_unacked >= RECEIVE_WINDOW // 2:
                self._write(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.recv_unacked)))
                stream.recv_unacked = 0
        self.handler.stream_data(stream, self._strip_padding(flags, payload), end_stream)  # type: ignore[union-attr]
        self._maybe_forget(stream)

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        payload = self._strip_padding(flags, payload)
        if flags & FLAG_PRIORITY:
            payload = payload[5:]
        if flags & FLAG_END_HEADERS:
            self._header_block(stream_id, flags, payload)
        else:
            self._headers_in_progress = (stream_id, flags, bytearray(payload))

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        progress = self._headers_in_progress
        if progress is None or progress[0] != stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "unexpected CONTINUATION")
        block = progress[2]
        if block is not None:
            block.extend(payload)
            if len(block) > 4 * self._max_header_list_size + 65536:
                block = None  # not kept: the rest of the block is dropped as it comes
                self._headers_in_progress = (stream_id, progress[1], None)
        if flags & FLAG_END_HEADERS:
            self._headers_in_progress = None
            self._header_block(stream_id, progress[1], None if block is None else bytes(block))

    def _header_block(self, stream_id: int, flags: int, block: bytes | None) -> None:
        """A whole header block (``None``: one too large to keep, already dropped)."""
        lost_now = False
        headers: list[tuple[bytes, bytes]] | None = None
        if block is None:
            lost_now = not self._table_lost
        elif not self._table_lost:  # once lost, never decoded: trailers need no fields, new streams are refused
            try:
                headers = self._blocks.decode(block)
            except hpack_blocks.BlockError as error:
                if error.code != ENHANCE_YOUR_CALM:
                    raise ConnectionError_(error.code, str(error)) from None
                lost_now = True
        if lost_now:
            self._header_list_beyond_limit(stream_id, flags)
            return
        self._stream_headers(stream_id, flags, headers)

    def _stream_headers(self, stream_id: int, flags: int, headers: list[tuple[bytes, bytes]] | None) -> None:
        """What a header block does to its stream: a client's trailers end its call, a new stream starts (or is
        refused); ``headers`` None: a list over the limit, which the handler refuses."""
        end_stream = bool(flags & FLAG_END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client
            if stream.remote_closed:
                return  # after END_STREAM (a stream error, RFC 9113 5.1): ignored, as DATA is, not a 2nd end
            if not end_stream:
                raise ConnectionError_(PROTOCOL_ERROR, "trailers without END_STREAM")
            stream.remote_closed = True
            self.handler.stream_data(stream, b"", True)  # type: ignore[union-attr]
            self._maybe_forget(stream)
            return
        if stream_id % 2 == 0:
            raise ConnectionError_(PROTOCOL_ERROR, f"stream {stream_id} cannot be opened by a client")
        if stream_id <= self._last_stream:
            return  # late frames of a stream this side already closed
        self._last_stream = stream_id
        stream = Stream(stream_id, self.peer_initial_window)
        stream.remote_closed = end_stream
        if self._going_away or self._table_lost or len(self.streams) >= MAX_CONCURRENT_STREAMS:
            self._write(frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        self.streams[stream_id] = stream
        self.handler.stream_started(stream, headers, end_stream)  # type: ignore[arg-type, union-attr]

    def _header_list_beyond_limit(self, stream_id: int, flags: int) -> None:
        """A header block past the hard limit (an HPACK bomb, or a field list far over the advertised size),
        given up mid-way: the HPACK table is lost. Its stream, if new, is refused as an oversized one is
        (RESOURCE_EXHAUSTED, as tritonserver's gRPC core answers it); then GOAWAY ENHANCE_YOUR_CALM, and the
        calls already open finish before the connection closes (their DATA needs no HPACK)."""
        if stream_id in self.streams:  # trailers of an open call: its request ends here, END_STREAM or not
            flags |= FLAG_END_STREAM
        self._stream_headers(stream_id, flags, None)  # a new stream is opened while the table counts as kept
        self._table_lost = True
        log.debug("HTTP/2 connection from %s: header list beyond the hard limit; going away", self.peer)
        self.goaway(b"header list beyond the hard limit", code=ENHANCE_YOUR_CALM)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if not increment:
                raise ConnectionError_(PROTOCOL_ERROR, "zero WINDOW_UPDATE")
            self.conn_send_window += increment
            if self.conn_send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window overflow")
            waiters, self._conn_waiters = self._conn_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            return
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.send_window += increment
            self._wake(stream)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & FLAG_ACK:
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "bad SETTINGS")
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    self._wake(stream)
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "bad MAX_FRAME_SIZE")
                self.peer_max_frame = value
            elif key == SETTINGS_HEADER_TABLE_SIZE:
                pass  # the server's blocks never use the dynamic table
        self._write(frame(SETTINGS, FLAG_ACK, 0))

    # -- sending -----------------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def _wake(self, stream: Stream) -> None:
        waiter = stream._window_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        stream._window_waiter = None

    def _maybe_forget(self, stream: Stream) -> None:
        if stream.remote_closed and stream.local_closed:
            self.streams.pop(stream.id, None)
            if self._going_away and not self.streams:
                self.close(NO_ERROR, "")

    def send_headers(self, stream: Stream, block: bytes, end_stream: bool = False) -> None:
        """A complete header block in one HEADERS frame (gRPC blocks are small)."""
        if stream.local_closed:
            return
        flags = FLAG_END_HEADERS | (FLAG_END_STREAM if end_stream else 0)
        self._write(frame(HEADERS, flags, stream.id, block))
        if self.pings is not None:
            self.pings.sent_data()
        if end_stream:
            self._end_local(stream)

    def try_send(self, stream: Stream, headers: bytes | None, data: bytes | tuple[bytes, ...],
                 trailers: bytes) -> bool:
        """A whole response (``headers`` unless already sent, one DATA frame, trailers) in one write, when the
        windows and the peer's frame size allow it; False: nothing was sent. ``data`` in pieces (a large message
        apart from its prefix, ``wire.message_frame``) goes out as one vectored write, its pieces not copied."""
        size = len(data) if type(data) is bytes else sum(map(len, data))
        if size > stream.send_window or size > self.conn_send_window or size > self.peer_max_frame:
            return False
        if stream.local_closed:
            return True
        stream.send_window -= size
        self.conn_send_window -= size
        end = frame(HEADERS, FLAG_END_HEADERS | FLAG_END_STREAM, stream.id, trailers)
        start = b"" if headers is None else frame(HEADERS, FLAG_END_HEADERS, stream.id, headers)
        if type(data) is bytes:
            self._write(b"".join((start, frame(DATA, 0, stream.id, data), end)))
        elif not self.closed and self.transport is not None:
            data_head = _HEADER.pack(size >> 16, size & 0xFFFF, DATA, 0, stream.id)  # one frame of all the pieces
            self.transport.writelines((start + data_head + data[0], *data[1:], end))
        if self.pings is not None:
            self.pings.sent_data()
        self._end_local(stream)
        return True

    async def send_data(self, stream: Stream, data: bytes) -> None:
        """DATA frames within the peer's frame size and flow-control windows, waiting for window updates."""
        view = memoryview(data)
        while view and not stream.local_closed and not self.closed:
            allowed = min(len(view), stream.send_window, self.conn_send_window, self.peer_max_frame)
            if allowed <= 0:
                loop = asyncio.get_running_loop()
                waiter = loop.create_future()
                if stream.send_window <= 0:
                    stream._window_waiter = waiter
                else:
                    self._conn_waiters.append(waiter)
                await waiter
                continue
            stream.send_window -= allowed
            self.conn_send_window -= allowed
            self._write(frame(DATA, 0, stream.id, bytes(view[:allowed])))
            if self.pings is not None:
                self.pings.sent_data()
            view = view[allowed:]
        if self._paused and not self.closed:
            loop = asyncio.get_running_loop()
            self._drain_waiter = self._drain_waiter or loop.create_future()
            await self._drain_waiter

    def _end_local(self, stream: Stream) -> None:
        stream.local_closed = True
        if not stream.remote_closed:
            # the response is complete: the rest of the request is not needed (gRPC servers do the same)
            self._write(frame(RST_STREAM, 0, stream.id, _U32.pack(NO_ERROR)))
            stream.remote_closed = True
        self._maybe_forget(stream)

    def send_ping(self, payload: bytes) -> None:
        self._write(frame(PING, 0, 0, payload))

    def goaway(self, debug: bytes = b"", *, code: int = NO_ERROR) -> None:
        """Graceful close: no new streams, close once the open ones finish (``debug``: GOAWAY's debug data,
        ``code``: its error code)."""
        if self.closed or self._goaway_sent:
            return
        self._going_away = self._goaway_sent = True
        self._goaway_last_stream = self._last_stream
        self._write(frame(GOAWAY, 0, 0, _U32.pack(self._last_stream) + _U32.pack(code) + debug))
        if not self.streams and self.transport is not None:
            self.transport.close()

    def _aged(self) -> None:
        """``--grpc-max-connection-age`` reached: GOAWAY; after the grace period (if any) close regardless."""
        self._age_timer = None
        if self.closed:
            return
        self.goaway(b"max_age")
        grace = self._keepalive.max_connection_age_grace_ms if self._keepalive is not None else 0
        if grace and not self.closed:
            self._age_timer = asyncio.get_running_loop().call_later(grace / 1000, self._grace_over)

    def _grace_over(self) -> None:
        self._age_timer = None
        self.close(NO_ERROR, "max_age grace period over")  # open calls end as if the client went away

    def close(self, code: int, message: str) -> None:
        if self.closed:
            return
        if code != NO_ERROR:
            log.debug("closing HTTP/2 connection from %s: %s", self.peer, message)
        last = self._last_stream if self._goaway_last_stream is None else self._goaway_last_stream
        self._write(frame(GOAWAY, 0, 0, _U32.pack(last) + _U32.pack(code) + message.encode()[:256]))
        self.closed = True
        if self.transport is not None:
            self.transport.close()
