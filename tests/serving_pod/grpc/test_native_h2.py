"""Wire-level behaviour and bad input of the native gRPC front end (``serving_pod.grpc.h2`` and ``.native``).

Frame-level cases drive a raw HTTP/2 client (the ``h2`` package over a plain socket): bad connection preface,
PING and SETTINGS acknowledgements, HTTP status for non-gRPC requests, malformed, oversized, truncated and
compressed messages, grpc-timeout, flow control against a tiny client window, RST_STREAM and abrupt closes,
oversized header lists and graceful stop. Call-level cases use real clients (``tritonclient.grpc``, its aio
twin and plain ``grpc`` channels): unknown methods, gzip, deadlines, large tensors both ways, 200 concurrent
streams on one connection, and a parity subset that must answer identically on the native and grpcio front
ends. Every error case then proves the server still serves a good request.

Where tritonserver 2.51 (gRPC core) answers otherwise on purpose here (a side-by-side sweep, recorded live):
a unary call with 0 or 2 messages (Triton: INTERNAL 'Unable to parse request', or the first message served;
here UNIMPLEMENTED, doc/statuscodes.md); a compressed flag without grpc-encoding (Triton reads the message as
uncompressed; here INTERNAL); an unsupported grpc-encoding or a malformed grpc-timeout (Triton: RST_STREAM
INTERNAL_ERROR, no status; here UNIMPLEMENTED with grpc-accept-encoding, or INTERNAL); GET or a non-gRPC
content-type (Triton: UNKNOWN 'Bad method header', RST_STREAM; here HTTP 405/415); no content-type, te or
:authority (Triton: served, UNKNOWN 'Missing :te header', UNKNOWN 'Missing :authority header'; here 415, served,
served); streams past MAX_CONCURRENT_STREAMS (Triton advertises no limit; here REFUSED_STREAM); header lists
over the advertised size (the same RESOURCE_EXHAUSTED, Triton's limit is 16 KiB and its words name the field);
frame-level protocol errors Triton ignores or answers by closing without GOAWAY (DATA on stream 0, a PING on a
stream, a bad preface, PUSH_PROMISE: here GOAWAY with the RFC 9113 error code); a client's GOAWAY (Triton goes
on taking streams; here the open ones finish and the connection closes); a client ignoring flow control
(Triton: RST_STREAM; here its data is read as it comes, up to the message size limit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gzip
import logging
import socket
import struct
import time

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from h2.settings import SettingCodes
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from serving_pod.core.validation import BATCH_NOTE
from serving_pod.grpc.hpack_blocks import encode_headers
from support.h2client import INFER, RawClient, grpc_frame, infer_request
from support.server import ServerThread, make_options, test_model_config, write_model

SLOW_MS = 300
SMALL_LIMIT = 1024  # grpc_max_message_size and grpc_max_metadata_size of the ``small`` server
THREAD = 'parameters { key: "ferry_execution_mode" value { string_value: "thread" } }'


def _repository(path):
    write_model(path, "fp32", test_model_config("fp32"))
    write_model(path, "big", test_model_config("big", dims="[ -1, -1 ]", max_batch_size=0))
    write_model(path, "slow", test_model_config("slow", extra=(
        f'parameters {{ key: "execute_delay_ms" value {{ string_value: "{SLOW_MS}" }} }}\n{THREAD}\n'
        "instance_group [ { count: 4 kind: KIND_CPU } ]")))
    return path


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return _repository(tmp_path_factory.mktemp("native_h2"))


@pytest.fixture(scope="module")
def server(repository):
    thread = ServerThread(make_options([repository]))
    yield thread.start()
    thread.stop()


@pytest.fixture(scope="module")
def small(repository):
    """Small limits: 1 KiB messages and 1 KiB header lists."""
    thread = ServerThread(make_options([repository], grpc_max_message_size=SMALL_LIMIT,
                                      grpc_max_metadata_size=SMALL_LIMIT))
    yield thread.start()
    thread.stop()


def _port(handle) -> int:
    return handle.server.grpc_port


@pytest.fixture
def raw():
    """``raw(handle, **kwargs)`` -> a connected RawClient, closed after the test."""
    clients: list[RawClient] = []

    def connect(handle, **kwargs) -> RawClient:
        client = RawClient(_port(handle), **kwargs)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()


def assert_serving(handle, model: str = "fp32") -> None:
    """A good request through tritonclient.grpc on a new connection gets the right answer."""
    array = np.array([[1.5, -2.0, 3.25, 4.0]], dtype=np.float32)
    client = grpcclient.InferenceServerClient(handle.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(array)
        result = client.infer(model, [tensor], client_timeout=30)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)
    finally:
        client.close()


def assert_raw_serving(client: RawClient) -> None:
    """A good request on an existing raw connection gets the right answer."""
    reply = client.call(grpc_frame(infer_request(values=(9, 8, 7, 6))))
    assert reply.status == 0, reply.message
    assert reply.infer_output() == [9, 8, 7, 6]


def wait_in_flight(handle) -> None:
    """Until the engine holds a request (the slow model is running it)."""
    deadline = time.monotonic() + 5
    while not handle.engine._inflight:
        assert time.monotonic() < deadline, "the request never reached the engine"
        time.sleep(0.005)


def assert_no_errors(caplog) -> None:
    errors = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


# -- 1. connection preface, PING, SETTINGS ---------------------------------------------------------------


def _read_frames(sock: socket.socket) -> list[tuple[int, int, int, bytes]]:
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    frames = []
    while len(data) >= 9:
        size = int.from_bytes(data[:3], "big")
        kind, flags, sid = data[3], data[4], int.from_bytes(data[5:9], "big")
        frames.append((kind, flags, sid, data[9:9 + size]))
        data = data[9 + size:]
    assert not data, "a partial frame before EOF"
    return frames


def test_bad_preface_gets_goaway_protocol_error(server):
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        frames = _read_frames(sock)  # until the server closes
    kinds = [kind for kind, *_ in frames]
    assert kinds[0] == 0x4  # the server's SETTINGS come first
    goaways = [payload for kind, _, _, payload in frames if kind == 0x7]
    assert len(goaways) == 1
    last_stream, code = struct.unpack(">II", goaways[0][:8])
    assert (last_stream, code) == (0, 0x1)  # PROTOCOL_ERROR
    assert b"preface" in goaways[0][8:]
    assert_serving(server)


def test_ping_and_settings_acknowledged(server, raw):
    client = raw(server)
    remote = next(e for e in client.events if isinstance(e, h2.events.RemoteSettingsChanged)).changed_settings
    assert remote[SettingCodes.MAX_HEADER_LIST_SIZE].new_value == 64 * 1024  # grpc_max_metadata_size
    assert remote[SettingCodes.ENABLE_PUSH].new_value == 0

    def acks():
        return [e for e in client.events if isinstance(e, h2.events.SettingsAcknowledged)]

    client.until(lambda: len(acks()) == 1)  # the client's preface SETTINGS
    client.conn.ping(b"8 bytes!")
    client.conn.update_settings({SettingCodes.MAX_FRAME_SIZE: 32768})
    client.flush()
    client.until(lambda: any(isinstance(e, h2.events.PingAckReceived) for e in client.events) and len(acks()) == 2)
    (ack,) = [e for e in client.events if isinstance(e, h2.events.PingAckReceived)]
    assert ack.ping_data == b"8 bytes!"
    assert acks()[1].changed_settings[SettingCodes.MAX_FRAME_SIZE].new_value == 32768
    assert_raw_serving(client)


# -- 2, 3. routing: unknown method, non-gRPC requests ----------------------------------------------------


def test_unknown_method_unimplemented(server, raw):
    client = raw(server)
    reply = client.call(grpc_frame(b""), path=b"/inference.GRPCInferenceService/NoSuchMethod")
    assert reply.http_status == 200
    assert (reply.status, reply.message) == (12, "")  # Triton 2.51's (grpc++): no details
    assert reply.data == b""  # trailers-only
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as info:
            call(b"", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert info.value.details() == ""
    assert_raw_serving(client)
    assert_serving(server)


@pytest.mark.parametrize("method, content_type, status", [
    (b"POST", b"application/json", 415),
    (b"POST", b"text/plain", 415),
    (b"GET", b"application/grpc", 405),
])
def test_non_grpc_requests_get_http_status(server, raw, method, content_type, status):
    client = raw(server)
    reply = client.call(grpc_frame(infer_request()), method=method, content_type=content_type)
    assert reply.http_status == status
    assert b"grpc-status" not in reply.headers
    assert_raw_serving(client)


# -- 4. message framing ------------------------------------------------------------------------------------


def test_malformed_protobuf_internal(server, raw):
    client = raw(server)
    reply = client.call(grpc_frame(b"\xff\xff\xff\xff"))
    assert reply.status == 13
    assert reply.message == "Unable to parse request"  # Triton 2.51's words (grpc++)
    assert_raw_serving(client)


def test_prefix_beyond_max_message_size_resource_exhausted(small, raw):
    client = raw(small)
    # the prefix alone says too much: refused without waiting for the rest (or for END_STREAM)
    header = b"\x00" + struct.pack(">I", SMALL_LIMIT * 1024)
    reply = client.call(header + b"\0" * 100, end=False)
    assert reply.status == 8
    assert reply.message == f"Received message larger than max ({SMALL_LIMIT * 1024} vs. {SMALL_LIMIT})"
    # a whole message one byte over the limit, with END_STREAM
    reply = client.call(grpc_frame(b"\0" * (SMALL_LIMIT + 1)))
    assert reply.status == 8
    assert reply.message == f"Received message larger than max ({SMALL_LIMIT + 1} vs. {SMALL_LIMIT})"
    assert_raw_serving(client)
    assert_serving(small)


@pytest.mark.parametrize("body", [
    grpc_frame(infer_request())[:-3],  # END_STREAM mid-message
    b"\x00\x00\x00",  # mid-prefix
    grpc_frame(infer_request()) + b"\x00\x00",  # a whole message, then part of a second prefix
])
def test_truncated_message_internal(server, raw, body):
    client = raw(server)
    reply = client.call(body)
    assert (reply.status, reply.message) == (13, "Incomplete gRPC message at the end of the stream")
    assert_raw_serving(client)


@pytest.mark.parametrize("count", [0, 2])
def test_request_cardinality_violation_unimplemented(server, raw, count):
    # doc/statuscodes.md: a method that takes one request, sent some other number -> UNIMPLEMENTED
    client = raw(server)
    reply = client.call(grpc_frame(infer_request()) * count if count else None)
    assert (reply.status, reply.message) == (12, f"Expected one request message, received {count}")
    assert_raw_serving(client)


# -- 5. compression ----------------------------------------------------------------------------------------


def test_tritonclient_gzip_request(server):
    array = np.arange(64, dtype=np.float32).reshape(1, 64)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for algorithm in ("gzip", "deflate"):
            tensor = grpcclient.InferInput("INPUT0", [1, 64], "FP32")
            tensor.set_data_from_numpy(array)
            result = client.infer("big", [tensor], compression_algorithm=algorithm, client_timeout=30)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)
    finally:
        client.close()


def test_raw_gzip_request(server, raw):
    client = raw(server)
    body = grpc_frame(gzip.compress(infer_request(values=(4, 3, 2, 1))), compressed=True)
    reply = client.call(body, extra=((b"grpc-encoding", b"gzip"),))
    assert reply.status == 0, reply.message
    assert reply.infer_output() == [4, 3, 2, 1]
    # an uncompressed message under grpc-encoding: gzip is fine too (the flag decides, per message)
    reply = client.call(grpc_frame(infer_request(values=(5, 6, 7, 8))), extra=((b"grpc-encoding", b"gzip"),))
    assert reply.status == 0, reply.message
    assert reply.infer_output() == [5, 6, 7, 8]


def test_unknown_encoding_unimplemented_with_accept_encoding(server, raw):
    client = raw(server)
    body = grpc_frame(b"not brotli", compressed=True)
    reply = client.call(body, extra=((b"grpc-encoding", b"br"),))
    assert reply.status == 12
    assert "'br'" in reply.message and "gzip" in reply.message
    # doc/compression.md: the response lists what the server accepts, and not the rejected encoding
    accepted = reply.headers[b"grpc-accept-encoding"].split(b",")
    assert b"gzip" in accepted and b"br" not in accepted
    assert_raw_serving(client)


def test_compressed_flag_with_identity_internal(server, raw):
    client = raw(server)
    body = grpc_frame(gzip.compress(infer_request()), compressed=True)
    for extra in ((), ((b"grpc-encoding", b"identity"),)):
        reply = client.call(body, extra=extra)
        assert (reply.status, reply.message) == (13, "Compressed message without a grpc-encoding")
    assert_raw_serving(client)


@pytest.mark.parametrize("damage", ["cut trailer", "bad crc", "not gzip"])
def test_corrupt_gzip_internal(server, raw, damage):
    client = raw(server)
    compressed = gzip.compress(infer_request())
    if damage == "cut trailer":
        compressed = compressed[:-8]  # the deflate data is whole; CRC and size are missing
    elif damage == "bad crc":
        compressed = compressed[:-8] + bytes([compressed[-8] ^ 0xFF]) + compressed[-7:]
    else:
        compressed = b"plain bytes"
    reply = client.call(grpc_frame(compressed, compressed=True), extra=((b"grpc-encoding", b"gzip"),))
    assert reply.status == 13
    assert reply.message.startswith("Failed to decompress the message")
    assert_raw_serving(client)


def test_decompression_bomb_resource_exhausted(small, raw):
    client = raw(small)
    bomb = gzip.compress(b"\0" * (256 * 1024))
    assert len(bomb) < SMALL_LIMIT // 2  # the compressed message is within the limit
    reply = client.call(grpc_frame(bomb, compressed=True), extra=((b"grpc-encoding", b"gzip"),))
    assert reply.status == 8
    assert reply.message == f"Received message larger than max (more than {SMALL_LIMIT} bytes decompressed)"
    assert_raw_serving(client)


# -- 6. deadlines ------------------------------------------------------------------------------------------


def test_tritonclient_deadline_exceeded(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("slow", [tensor], client_timeout=0.05)
        assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    finally:
        client.close()
    assert_serving(server)


def test_server_enforces_grpc_timeout(server, raw):
    client = raw(server)
    start = time.monotonic()
    reply = client.call(grpc_frame(infer_request("slow")), extra=((b"grpc-timeout", b"50m"),))
    elapsed = time.monotonic() - start
    # the raw client enforces nothing: the status comes from the server, before the model finishes
    assert (reply.status, reply.message) == (4, "Deadline Exceeded")
    assert elapsed < SLOW_MS / 1000
    reply = client.call(grpc_frame(infer_request("slow")), extra=((b"grpc-timeout", b"5S"),))
    assert reply.status == 0, reply.message
    assert_raw_serving(client)


@pytest.mark.parametrize("value", [b"1x", b"S", b"-1S", b"1.5S", b"", b"5"])
def test_malformed_grpc_timeout_internal(server, raw, value):
    client = raw(server)
    reply = client.call(grpc_frame(infer_request()), extra=((b"grpc-timeout", value),))
    assert (reply.status, reply.message) == (13, f"Invalid grpc-timeout '{value.decode()}'")
    assert_raw_serving(client)


@pytest.mark.parametrize("value", [b"123456789S", b"99999999999999999999H", b"1000000001n"])
def test_grpc_timeout_beyond_eight_digits_served(front_end, raw, value):
    """More digits than the spec's 8 are read as gRPC core (tritonserver 2.51 and the grpcio front end) reads
    them: the request is served (an amount above 1,000,000,000 units is no deadline at all), not INTERNAL."""
    client = raw(front_end)
    reply = client.call(grpc_frame(infer_request(values=(2, 4, 6, 8))), extra=((b"grpc-timeout", value),))
    assert reply.status == 0, reply.message
    assert reply.infer_output() == [2, 4, 6, 8]


def test_invalid_binary_metadata_internal(server, raw, caplog):
    client = raw(server)
    reply = client.call(grpc_frame(infer_request()), extra=((b"x-trace-bin", b"a"),))
    assert reply.status == 13
    assert "x-trace-bin" in reply.message
    assert_raw_serving(client)  # the connection survives
    assert_no_errors(caplog)


# -- 7. flow control ----------------------------------------------------------------------------------------


def test_large_request_and_response_over_tritonclient(server):
    # 12 MiB each way: more than the server's 8 MiB receive window (it must send WINDOW_UPDATE) and far more
    # than the client's initial 64 KiB window (the server must wait for the client's)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for seed in (1, 2):
            array = np.random.default_rng(seed).random((1, 3 * 1024 * 1024), dtype=np.float32)
            tensor = grpcclient.InferInput("INPUT0", list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            result = client.infer("big", [tensor], client_timeout=30)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)
    finally:
        client.close()


@pytest.mark.parametrize("pieces", [1, 3], ids=["one-data-frame", "three-data-frames"])
def test_large_message_in_one_frame_each_way(server, raw, pieces: int):
    """A 300 KB request and response where windows and frame sizes allow: the request read out of the DATA frame(s)
    it came in (one frame with END_STREAM: never buffered; three: buffered, then read), the response one DATA frame
    written beside its message prefix (``wire.message_frame``), byte for byte what was sent."""
    client = raw(server, window=(1 << 24) - 1)
    client.conn.update_settings({SettingCodes.MAX_FRAME_SIZE: (1 << 24) - 1})
    client.conn.increment_flow_control_window(1 << 24)
    client.flush()
    values = np.random.default_rng(pieces).random(75_000, dtype=np.float32)  # 300 KB
    body = grpc_frame(infer_request("big", values))
    sid = client.send(None, end=False)
    cuts = [len(body) * i // pieces for i in range(pieces + 1)]
    for start, stop in zip(cuts, cuts[1:]):
        client.send_data(sid, body[start:stop], end=stop == len(body))
    reply = client.reply(sid)
    assert reply.status == 0, reply.message
    assert reply.frames == [len(reply.data)]  # the whole message in one DATA frame
    assert reply.infer_output() == values.tolist()
    assert_raw_serving(client)


def test_tiny_client_window_response_complete(server, raw):
    window = 100
    client = raw(server, window=window)
    values = np.arange(20_000, dtype=np.float32)  # an 80 KB response: beyond the 64 KiB connection window too
    stalls = []

    def slowly(reply, event):
        if not reply.frames:
            # hold the first acknowledgement: the server must not send past the window meanwhile
            time.sleep(0.05)
            client.sock.settimeout(0.05)
            try:
                client.receive()
            except TimeoutError:
                pass
            finally:
                client.sock.settimeout(5)
            stalls.append([e for e in client.events if isinstance(e, h2.events.DataReceived)
                           and e.stream_id == event.stream_id])

    reply = client.reply(client.send(grpc_frame(infer_request("big", values))), on_data=slowly)
    assert reply.status == 0, reply.message
    assert max(reply.frames) <= window
    assert sum(len(e.data) for e in stalls[0]) <= window
    assert reply.infer_output() == values.tolist()
    assert_raw_serving(client)


# -- 8. resets and abrupt closes -------------------------------------------------------------------------


def test_client_reset_mid_request(server, raw, caplog):
    client = raw(server)
    body = grpc_frame(infer_request())
    sid = client.send(body[:10], end=False)
    client.conn.reset_stream(sid, error_code=0x8)  # CANCEL
    client.flush()
    # and a reset while the model runs
    sid = client.send(grpc_frame(infer_request("slow")))
    wait_in_flight(server)
    client.conn.reset_stream(sid, error_code=0x8)
    client.flush()
    assert_raw_serving(client)  # the same connection goes on
    time.sleep(SLOW_MS / 1000)  # let the cancelled execution end
    assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in client.events)
    assert_raw_serving(client)
    assert_no_errors(caplog)


def test_headers_after_end_stream_leave_the_call_alone(server, raw, caplog):
    # RFC 9113 5.1: a frame on a stream the client already ended is its error, not a second end of the request;
    # the call it made stands (it was cancelled and answered UNIMPLEMENTED "received 0")
    client = raw(server)
    sid = client.send(grpc_frame(infer_request("slow", values=(4, 3, 2, 1))))
    wait_in_flight(server)
    block = encode_headers([(b"x-late", b"1")])  # literals: the client's HPACK table stays in step
    client.sock.sendall(struct.pack(">BHBBI", 0, len(block), 0x1, 0x5, sid) + block)  # HEADERS, END_STREAM
    reply = client.reply(sid)
    assert reply.status == 0, reply.message
    assert reply.infer_output() == [4, 3, 2, 1]
    assert_raw_serving(client)
    assert_no_errors(caplog)


def test_client_vanishes_during_slow_request(server, raw, caplog):
    client = raw(server)
    client.send(grpc_frame(infer_request("slow")))
    wait_in_flight(server)
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN
    client.sock.close()
    time.sleep(SLOW_MS / 1000 + 0.1)
    assert_serving(server)
    assert_no_errors(caplog)


# -- 10. many streams on one connection -----------------------------------------------------------------


def test_200_concurrent_streams_on_one_connection(server):
    import tritonclient.grpc.aio as aioclient

    async def body():
        client = aioclient.InferenceServerClient(server.grpc_url)
        try:
            async def one(index: int):
                array = np.full((1, 4), index, dtype=np.float32)
                tensor = aioclient.InferInput("INPUT0", [1, 4], "FP32")
                tensor.set_data_from_numpy(array)
                result = await client.infer("fp32", [tensor], request_id=str(index))
                return result.get_response().id, result.as_numpy("OUTPUT0")

            return await asyncio.gather(*(one(i) for i in range(200)))
        finally:
            await client.close()

    results = asyncio.run(body())
    assert [rid for rid, _ in results] == [str(i) for i in range(200)]
    for index, (_, output) in enumerate(results):
        np.testing.assert_array_equal(output, np.full((1, 4), index, dtype=np.float32))


def test_streams_beyond_the_concurrent_limit_refused(front_end, raw):
    """MAX_CONCURRENT_STREAMS is advertised; a client that opens one more gets REFUSED_STREAM on it, the
    connection and the open streams go on, and a stream freed makes room for a new one. Both front ends."""
    from serving_pod.grpc.h2 import MAX_CONCURRENT_STREAMS

    client = raw(front_end)
    client.until(lambda: client.conn.remote_settings.max_concurrent_streams == MAX_CONCURRENT_STREAMS)
    # this client ignores the advertised limit (python-hyper's h2 would enforce it on the client side)
    client.conn.remote_settings[SettingCodes.MAX_CONCURRENT_STREAMS] = 2**31 - 1
    client.conn.remote_settings.acknowledge()
    body = grpc_frame(infer_request(values=(5, 6, 7, 8)))
    held = [client.send(body[:3], end=False) for _ in range(MAX_CONCURRENT_STREAMS)]  # half-sent requests
    refused = client.reply(client.send(body))
    assert refused.reset == 0x7 and not refused.headers  # REFUSED_STREAM: never started
    client.send_data(held[0], body[3:], True)  # one held request completes, freeing its stream
    reply = client.reply(held[0])
    assert reply.status == 0, reply.message
    assert reply.infer_output() == [5, 6, 7, 8]
    assert_raw_serving(client)  # the freed slot takes a new stream
    assert client.terminated() is None
    assert_serving(front_end)

# -- 11. header list size -----------------------------------------------------------------------------------


def test_oversized_header_list_refused_connection_kept(small, raw):
    client = raw(small)
    remote = next(e for e in client.events if isinstance(e, h2.events.RemoteSettingsChanged)).changed_settings
    assert remote[SettingCodes.MAX_HEADER_LIST_SIZE].new_value == SMALL_LIMIT
    # x-after follows the oversized field: the server must still decode it into its HPACK table, since the
    # client's encoder indexed it and refers to it in the next request on this connection
    reply = client.call(grpc_frame(infer_request()), extra=((b"x-big", b"a" * 2000), (b"x-after", b"1")))
    assert reply.status == 8
    assert reply.message == f"Header list larger than {SMALL_LIMIT} bytes"
    reply = client.call(grpc_frame(infer_request(values=(1, 1, 2, 3))), extra=((b"x-after", b"1"),))
    assert reply.status == 0, reply.message
    assert reply.infer_output() == [1, 1, 2, 3]
    assert_serving(small)


def _frames_until_closed(client: RawClient) -> dict[str, list]:
    """The frames the server sends until it closes the connection: stream id -> [("headers", dict) |
    ("data", bytes) | ("reset", code)], and "goaway" -> [(error code, last stream id, debug data)]."""
    decoder = hpack.Decoder()  # the server's blocks are literals: a fresh table decodes them
    out: dict = {"goaway": []}
    for kind, _, sid, payload in _read_frames(client.sock):
        if kind == 0x1:
            out.setdefault(sid, []).append(("headers", dict(decoder.decode(payload, raw=True))))
        elif kind == 0x0:
            out.setdefault(sid, []).append(("data", payload))
        elif kind == 0x3:
            out.setdefault(sid, []).append(("reset", struct.unpack(">I", payload)[0]))
        elif kind == 0x7:
            last, code = struct.unpack(">II", payload[:8])
            out["goaway"].append((code, last & 0x7FFFFFFF, payload[8:]))
    return out


def _frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload


def _oversized(how: str, sid: int) -> bytes:
    """A request header block past the ``small`` server's hard limit, END_STREAM set: an HPACK bomb (one 4 KB
    field put in the dynamic table, then referenced by 1-byte indexes) in one HEADERS frame, or a 100 KB field
    list in HEADERS and CONTINUATION frames (past the limit before it is whole)."""
    if how == "bomb":
        block = hpack.Encoder().encode([(b":method", b"POST"), (b":path", INFER)] + [(b"x-pad", b"a" * 4000)] * 30,
                                       huffman=False)
        assert len(block) < 4200
        return _frame(0x1, 0x5, sid, block)
    block = encode_headers([(b":method", b"POST"), (b":path", INFER), (b"x-big", b"a" * 100_000)])
    pieces = [block[i:i + 16384] for i in range(0, len(block), 16384)]
    return (_frame(0x1, 0x1, sid, pieces[0]) + b"".join(_frame(0x9, 0, sid, p) for p in pieces[1:-1])
            + _frame(0x9, 0x4, sid, pieces[-1]))


REQUEST_HEADERS = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", INFER), (b":authority", b"localhost"),
                   (b"content-type", b"application/grpc"), (b"te", b"trailers")]
OVERSIZED = (b"8", f"Header list larger than {SMALL_LIMIT} bytes".encode())


def test_undecodable_header_block_goaway_compression_error(server, raw):
    # an HPACK integer that never ends: GOAWAY COMPRESSION_ERROR (a connection error, RFC 9113 4.3), its debug
    # data hpack's words without the address of the server's buffer
    client = raw(server)
    client.sock.sendall(_frame(0x1, 0x5, 1, b"\xff\xff\xff\xff\xff"))
    frames = _frames_until_closed(client)
    assert frames["goaway"] == [
        (0x9, 0, b"header block: Unable to decode HPACK integer representation from the block")]
    assert_serving(server)


@pytest.mark.parametrize("how", ["bomb", "continuations"])
def test_header_list_beyond_hard_limit_refused_then_goaway(small, raw, how):
    # decoding stops mid-block past the hard limit (or the block is not kept whole), so the HPACK table is out
    # of step with the client's: the stream gets RESOURCE_EXHAUSTED (what tritonserver answers), then GOAWAY
    # ENHANCE_YOUR_CALM naming it the last stream; with no other call open the connection then closes
    client = raw(small)
    client.sock.sendall(_oversized(how, 1))
    frames = _frames_until_closed(client)
    (kind, trailers), = frames[1]
    assert kind == "headers" and (trailers[b"grpc-status"], trailers[b"grpc-message"]) == OVERSIZED
    assert frames["goaway"] == [(0xB, 1, b"header list beyond the hard limit")]  # ENHANCE_YOUR_CALM
    assert_serving(small)


@pytest.mark.parametrize("how", ["bomb", "continuations"])
def test_header_list_beyond_hard_limit_lets_open_calls_finish(small, raw, how):
    # a call in flight on the connection is not lost with it (tritonserver keeps the connection): it is
    # answered after the GOAWAY, a stream opened after the GOAWAY is refused (REFUSED_STREAM: never started, safe
    # to retry), and the connection closes when the last call ends
    client = raw(small)
    body = grpc_frame(infer_request("slow", values=(3, 1, 4, 1)))
    client.sock.sendall(_frame(0x1, 0x4, 1, encode_headers(REQUEST_HEADERS)) + _frame(0x0, 0, 1, body[:10]))
    client.sock.sendall(_oversized(how, 3))
    client.sock.sendall(_frame(0x1, 0x5, 5, encode_headers(REQUEST_HEADERS)) + _frame(0x0, 0x1, 1, body[10:]))
    frames = _frames_until_closed(client)
    # the second GOAWAY, as the connection closes, names no stream after the first's (RFC 9113 6.8)
    assert frames["goaway"] == [(0xB, 3, b"header list beyond the hard limit"), (0x0, 3, b"")]
    assert [kind for kind, _ in frames[3]] == ["headers"]
    assert (frames[3][0][1][b"grpc-status"], frames[3][0][1][b"grpc-message"]) == OVERSIZED
    assert frames[5] == [("reset", 0x7)]  # REFUSED_STREAM
    headers, data, trailers = frames[1]
    assert (headers[0], data[0], trailers[0]) == ("headers", "data", "headers")
    assert trailers[1][b"grpc-status"] == b"0"
    response = pb.ModelInferResponse.FromString(data[1][5:])
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [3, 1, 4, 1]
    assert_serving(small)


# -- 12. graceful stop --------------------------------------------------------------------------------------


def test_graceful_stop_finishes_in_flight_then_refuses(repository):
    thread = ServerThread(make_options([repository]))
    handle = thread.start()
    port = _port(handle)
    client = RawClient(port)
    stopped = False
    try:
        sid = client.send(grpc_frame(infer_request("slow", (3, 1, 4, 1))))
        wait_in_flight(handle)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            stopping = pool.submit(thread.stop)
            reply = client.reply(sid)
            assert reply.status == 0, reply.message
            assert reply.infer_output() == [3, 1, 4, 1]
            stopping.result(10)
            stopped = True
        client.until(lambda: client.terminated() is not None)
        terminated = client.terminated()
        assert (terminated.error_code, terminated.last_stream_id) == (0, sid)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        client.close()
        if not stopped:
            thread.stop()


# -- 13. parity with the grpcio front end ----------------------------------------------------------------


@pytest.fixture(scope="module", params=["native", "grpcio"])
def front_end(request, repository):
    thread = ServerThread(make_options([repository], grpc_server=request.param))
    yield thread.start()
    thread.stop()


PARITY = {
    # case: (model, input name, shape, datatype) -> (status, message)
    "unknown model": (("nope", "INPUT0", [1, 4], "FP32"),
                      ("StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found")),
    "wrong shape": (("fp32", "INPUT0", [1, 5], "FP32"),
                    ("StatusCode.INVALID_ARGUMENT",
                     "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'fp32'. Expected [-1,4], "
                     f"got [1,5]. {BATCH_NOTE}")),
    "wrong datatype": (("fp32", "INPUT0", [1, 4], "INT32"),
                       ("StatusCode.INVALID_ARGUMENT",
                        "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'INT32', but model 'fp32' "
                        "expects 'FP32'")),
}


@pytest.mark.parametrize("case", list(PARITY))
def test_errors_identical_on_both_front_ends(front_end, case):
    (model, name, shape, datatype), expected = PARITY[case]
    client = grpcclient.InferenceServerClient(front_end.grpc_url)
    try:
        tensor = grpcclient.InferInput(name, shape, datatype)
        tensor.set_data_from_numpy(np.zeros(shape, dtype=np.int32 if datatype == "INT32" else np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, [tensor], client_timeout=30)
    finally:
        client.close()
    assert (info.value.status(), info.value.message()) == expected
    assert_serving(front_end)


def test_malformed_stream_message_ends_the_stream_with_an_error(front_end):
    # the requests before it are answered, then the RPC fails (it ended OK, the bad message silently dropped);
    # the status is a malformed unary request's, Triton's: INTERNAL 'Unable to parse request'
    stream = grpc.insecure_channel(front_end.grpc_url).stream_stream(
        "/inference.GRPCInferenceService/ModelStreamInfer", request_serializer=None, response_deserializer=None)
    responses = stream(iter([infer_request(values=(1, 2, 3, 4)), b"\xff\xff\xff"]), timeout=30)
    first = pb.ModelStreamInferResponse.FromString(next(responses))
    assert np.frombuffer(first.infer_response.raw_output_contents[0], np.float32).tolist() == [1, 2, 3, 4]
    with pytest.raises(grpc.RpcError) as info:
        next(responses)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INTERNAL, "Unable to parse request")
    assert_serving(front_end)
