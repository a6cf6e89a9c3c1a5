"""The native front end's receive buffer (``serving_pod.grpc.h2.H2Connection.data_received``) when the layer above
keeps a DATA payload: the payload is a view of the connection's buffer, and a live view forbids resizing it.

Seen under perf_analyzer gRPC load (concurrency 16, about once in 5 to 10 runs of 10 s): the buffer could not drop
the frames it had read ("BufferError: Existing exports of data: object cannot be re-sized"), the connection failed
with every call on it and perf_analyzer stopped with "Socket closed". Here a handler holds each payload it gets,
deterministically: the connection must go on reading frames, and the held payload keep its bytes.
"""

from __future__ import annotations

import asyncio

import h2.config
import h2.connection

from serving_pod.grpc.h2 import H2Connection, Stream

PATH = b"/inference.GRPCInferenceService/ModelInfer"


class _Transport(asyncio.Transport):
    """Collects what the connection writes; never closes on its own."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.write(chunk)

    def get_extra_info(self, name: str, default=None):
        return default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


class _Holder:
    """A stream handler that keeps every DATA payload it is given (as a view, the way it arrives)."""

    def __init__(self) -> None:
        self.held: list[tuple[int, bytes | memoryview]] = []

    def stream_started(self, stream: Stream, headers, end_stream: bool) -> None:
        pass

    def stream_data(self, stream: Stream, data: bytes | memoryview, end_stream: bool) -> None:
        self.held.append((stream.id, data))

    def stream_reset(self, stream: Stream) -> None:
        pass

    def connection_closed(self) -> None:
        pass


def _client_bytes() -> tuple[bytes, list[bytes]]:
    """A real HTTP/2 client's preface and settings, then one request (HEADERS + DATA) per stream 1, 3, 5."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    start = client.data_to_send()
    requests = []
    for stream_id, body in ((1, b"first message"), (3, b"second message"), (5, b"third")):
        client.send_headers(stream_id, [(b":method", b"POST"), (b":scheme", b"http"), (b":path", PATH),
                                        (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
                                        (b"te", b"trailers")])
        client.send_data(stream_id, body, end_stream=True)
        requests.append(client.data_to_send())
    return start, requests


def test_a_payload_the_layer_above_keeps_does_not_stop_the_connection() -> None:
    holder = _Holder()
    connection = H2Connection(lambda _: holder, max_header_list_size=16 * 1024)
    transport = _Transport()
    connection.connection_made(transport)
    start, requests = _client_bytes()
    connection.data_received(start)
    for request in requests:
        connection.data_received(request)  # each call drops frames read while an earlier payload is still held
    assert not connection.closed and not transport.closing
    assert [(stream_id, bytes(data)) for stream_id, data in holder.held] == [
        (1, b"first message"), (3, b"second message"), (5, b"third")]
    assert sorted(connection.streams) == [1, 3, 5]  # open, awaiting their answers


def test_frames_split_across_reads_are_joined_while_a_payload_is_held() -> None:
    holder = _Holder()
    connection = H2Connection(lambda _: holder, max_header_list_size=16 * 1024)
    connection.connection_made(_Transport())
    start, requests = _client_bytes()
    stream = start + b"".join(requests)
    for offset in range(0, len(stream), 7):  # 7-byte reads: frames end mid-read, the rest waits in the buffer
        connection.data_received(stream[offset:offset + 7])
    assert not connection.closed
    assert [bytes(data) for _, data in holder.held] == [b"first message", b"second message", b"third"]
