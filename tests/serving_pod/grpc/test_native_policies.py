"""Connection policies of the native gRPC front end: keepalive pings, client-ping policing and compressed responses.

The policies follow tritonserver's flags (``--grpc-keepalive-*``, ``--grpc-http2-*``,
``--grpc-infer-response-compression-level``) with gRPC core's semantics; a raw HTTP/2 client
(``support.h2client``) sees the frames, tritonclient checks that real clients still work.
"""

from __future__ import annotations

import contextlib
import gzip
import struct
import time
import zlib

import h2.events
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from serving_pod.cli import build_parser, options_from_args
from serving_pod.grpc.wire import message_frame, response_compression
from serving_pod.options import GrpcKeepalive
from support.cli import cli_options
from support.h2client import RawClient, grpc_frame, infer_request
from support.server import ServerThread, make_options, test_model_config, write_model


INFER = b"/inference.GRPCInferenceService/ModelInfer"
STREAM = b"/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    path = tmp_path_factory.mktemp("policies")
    write_model(path, "fp32", test_model_config("fp32"))
    write_model(path, "wide", test_model_config("wide", dims="[ -1 ]"))
    return path


@contextlib.contextmanager
def _connected(repository, **server_options):
    """A server started with ``server_options`` and a raw HTTP/2 client connected to it (h2 answers PINGs)."""
    thread = ServerThread(make_options([repository], **server_options))
    handle = thread.start()
    client = RawClient(handle.server.grpc_port)
    try:
        yield handle, client
    finally:
        client.close()
        thread.stop()


def _pings(client: RawClient) -> list[h2.events.PingReceived]:
    return [e for e in client.events if isinstance(e, h2.events.PingReceived)]


def _read_for(client: RawClient, seconds: float) -> None:
    """Collect whatever the server sends for ``seconds`` (the raw client acknowledges PINGs itself)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not client.eof:
        client.sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            client.receive()
        except TimeoutError:
            break


def _infer_values(reply_data: bytes, compressed_with: bytes | None) -> list[float]:
    flag, size = reply_data[0], struct.unpack(">I", reply_data[1:5])[0]
    body = reply_data[5:5 + size]
    assert flag == (1 if compressed_with else 0)
    if compressed_with == b"gzip":
        body = gzip.decompress(body)
    elif compressed_with == b"deflate":
        body = zlib.decompress(body)
    response = pb.ModelInferResponse.FromString(body)
    return np.frombuffer(response.raw_output_contents[0], np.float32).tolist()


# -- keepalive --------------------------------------------------------------------------------------------


def test_keepalive_pings_are_sent_and_an_answering_client_stays(repository):
    policy = GrpcKeepalive(time_ms=100, timeout_ms=300, permit_without_calls=True, max_pings_without_data=0)
    with _connected(repository, grpc_keepalive=policy) as (handle, client):
        _read_for(client, 1.0)
        assert len(_pings(client)) >= 3
        assert client.terminated() is None and not client.eof
        reply = client.call(client_body := grpc_frame(infer_request(values=(1.0, 2.0, 3.0, 4.0))))
        assert client_body and reply.status == 0 and reply.infer_output() == [1.0, 2.0, 3.0, 4.0]  # fp32 is an identity


def test_keepalive_closes_a_connection_whose_peer_does_not_answer(repository):
    policy = GrpcKeepalive(time_ms=100, timeout_ms=200, permit_without_calls=True)
    with _connected(repository, grpc_keepalive=policy) as (handle, client):
        client.sock.settimeout(3)
        # read raw bytes without answering the server's PING
        received = b""
        started = time.monotonic()
        while chunk := client.sock.recv(65536):
            received += chunk
        elapsed = time.monotonic() - started
        assert b"ferry-ka" in received  # the ping's payload went out
        assert 0.2 <= elapsed < 2.0
        # the server goes on serving new connections
        fresh = RawClient(handle.server.grpc_port)
        assert fresh.call(grpc_frame(infer_request())).status == 0
        fresh.close()


def test_no_keepalive_pings_without_calls_unless_permitted(repository):
    policy = GrpcKeepalive(time_ms=50, timeout_ms=1000, permit_without_calls=False)
    with _connected(repository, grpc_keepalive=policy) as (handle, client):
        _read_for(client, 0.5)  # frames may still come (the SETTINGS ACK), but no PING
        assert _pings(client) == []
        assert client.terminated() is None and not client.eof


# -- pings from the client --------------------------------------------------------------------------------


def test_too_many_pings_without_data_get_goaway_enhance_your_calm(repository):
    with _connected(repository, grpc_keepalive=GrpcKeepalive(max_ping_strikes=2)) as (handle, client):
        for count in range(6):
            client.conn.ping(f"ping-{count:03d}".encode()[:8])
            client.flush()
        client.sock.settimeout(3)
        while not client.eof and client.terminated() is None:
            client.receive()
        terminated = client.terminated()
        assert terminated is not None
        assert terminated.error_code == 0xB  # ENHANCE_YOUR_CALM
        assert terminated.additional_data == b"too_many_pings"
        acks = [e for e in client.events if isinstance(e, h2.events.PingAckReceived)]
        # every ping up to the third strike is answered, that one too (tritonserver 2.51, recorded: 4 of 5 pings
        # 10 ms apart answered, then GOAWAY); the pings after it find the connection closed
        assert len(acks) == 4
        assert RawClient(handle.server.grpc_port).call(grpc_frame(infer_request())).status == 0


def test_pings_between_responses_are_never_strikes(repository):
    with _connected(repository, grpc_keepalive=GrpcKeepalive(max_ping_strikes=1)) as (handle, client):
        for count in range(5):
            client.conn.ping(f"p{count:07d}".encode())
            client.flush()
            assert client.call(grpc_frame(infer_request())).status == 0  # the server sent data: strikes reset
        assert client.terminated() is None


def test_strike_limit_zero_means_unlimited(repository):
    with _connected(repository, grpc_keepalive=GrpcKeepalive(max_ping_strikes=0)) as (handle, client):
        for count in range(10):
            client.conn.ping(f"q{count:07d}".encode())
        client.flush()
        client.until(lambda: len([e for e in client.events if isinstance(e, h2.events.PingAckReceived)]) == 10)
        assert client.terminated() is None


# -- compressed responses ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("level", "accepted", "expected"), [
    ("none", b"identity,deflate,gzip", None),
    ("low", b"identity,deflate,gzip", b"gzip"),
    ("med", b"identity,deflate,gzip", b"deflate"),
    ("high", b"identity,deflate,gzip", b"deflate"),
    ("high", b"identity,gzip", b"gzip"),
    ("low", b"identity", None),
    ("high", b"", None),
])
def test_compression_level_picks_among_accepted_algorithms(level, accepted, expected):
    assert response_compression(level, accepted, INFER) == expected
    assert response_compression(level, accepted, STREAM) == expected


@pytest.mark.parametrize("path", [b"/inference.GRPCInferenceService/ModelMetadata",
                                  b"/inference.GRPCInferenceService/RepositoryIndex", b"/grpc.health.v1.Health/Check"])
def test_compression_level_leaves_answers_other_than_inference_uncompressed(path):
    assert response_compression("high", b"identity,deflate,gzip", path) is None


def test_a_message_compression_would_not_shrink_goes_uncompressed():
    """gRPC core's rule, seen from tritonserver 2.51 at --grpc-infer-response-compression-level=high: its small
    inference responses come with ``grpc-encoding: deflate`` and the compressed flag 0."""
    small = infer_request(values=(1.0, 2.0, 3.0, 4.0))
    assert message_frame(small, b"deflate") == grpc_frame(small)
    zeros = bytes(4096)
    packed = message_frame(zeros, b"gzip")
    assert isinstance(packed, bytes) and packed[0] == 1 and gzip.decompress(packed[5:]) == zeros


@pytest.mark.parametrize("level", ["low", "high"])
def test_compressed_responses_on_the_wire_and_through_tritonclient(repository, level):
    with _connected(repository, grpc_response_compression=level) as (handle, client):
        accept = ((b"grpc-accept-encoding", b"identity,deflate,gzip"),)
        values = (1.0,) * 1000
        reply = client.call(grpc_frame(infer_request("wide", values)), extra=accept)
        algorithm = b"gzip" if level == "low" else b"deflate"
        assert reply.status == 0 and reply.headers[b"grpc-encoding"] == algorithm
        assert _infer_values(reply.data, algorithm) == list(values)  # an identity model
        small = client.call(grpc_frame(infer_request(values=(1.0, 2.0, 3.0, 4.0))), extra=accept)
        assert small.headers[b"grpc-encoding"] == algorithm  # named, but this message is not worth compressing
        assert _infer_values(small.data, None) == [1.0, 2.0, 3.0, 4.0]
        metadata = client.call(grpc_frame(pb.ModelMetadataRequest(name="wide").SerializeToString()), extra=accept,
                               path=b"/inference.GRPCInferenceService/ModelMetadata")
        assert metadata.status == 0 and b"grpc-encoding" not in metadata.headers and metadata.data[0] == 0
        plain = client.call(grpc_frame(infer_request(values=(1.0, 1.0, 1.0, 1.0))))  # no grpc-accept-encoding sent
        assert b"grpc-encoding" not in plain.headers
        assert _infer_values(plain.data, None) == [1.0, 1.0, 1.0, 1.0]
        triton = grpcclient.InferenceServerClient(handle.grpc_url)
        data = np.arange(4, dtype=np.float32).reshape(1, 4)
        inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32")]
        inputs[0].set_data_from_numpy(data)
        assert triton.infer("fp32", inputs).as_numpy("OUTPUT0").tolist() == data.tolist()
        triton.close()


# -- flags ------------------------------------------------------------------------------------------------


def test_tritonserver_grpc_flags_reach_the_options():
    parser = build_parser()
    args = parser.parse_args([
        "--grpc-keepalive-time=1000", "--grpc-keepalive-timeout=500", "--grpc-keepalive-permit-without-calls=true",
        "--grpc-http2-max-pings-without-data=0", "--grpc-http2-min-recv-ping-interval-without-data=10",
        "--grpc-http2-max-ping-strikes=5", "--grpc-infer-allocation-pool-size=16",
        "--grpc-infer-response-compression-level=med",
    ])
    options = options_from_args(args, parser)
    assert options.grpc_keepalive == GrpcKeepalive(1000, 500, True, 0, 10, 5)
    assert options.grpc_response_compression == "med"
    defaults = options_from_args(parser.parse_args([]), parser)
    assert defaults.grpc_keepalive == GrpcKeepalive(7_200_000, 20_000, False, 2, 300_000, 2)


@pytest.mark.parametrize("flag", [
    "--grpc-keepalive-time=0", "--grpc-keepalive-timeout=-1", "--grpc-http2-max-ping-strikes=x",
    "--grpc-infer-response-compression-level=max", "--grpc-keepalive-permit-without-calls=maybe",
])
def test_bad_grpc_flag_values_exit_2(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([flag])
    assert exit_info.value.code == 2
    assert flag.split("=")[0] in capsys.readouterr().err


# -- connection age (--grpc-max-connection-age, --grpc-max-connection-age-grace) ----------------------------


@pytest.fixture(scope="module")
def slow_repository(tmp_path_factory):
    path = tmp_path_factory.mktemp("aged")
    write_model(path, "fp32", test_model_config("fp32"))
    write_model(path, "slow", test_model_config(
        "slow", extra='parameters { key: "execute_delay_ms" value { string_value: "800" } }'))
    return path


def _until_closed(client: RawClient, limit_s: float) -> float:
    started = time.monotonic()
    client.sock.settimeout(limit_s)
    while not client.eof:
        client.receive()
    return time.monotonic() - started


def test_max_connection_age_sends_goaway_and_closes_an_idle_connection(repository):
    with _connected(repository, grpc_keepalive=GrpcKeepalive(max_connection_age_ms=300)) as (handle, client):
        elapsed = _until_closed(client, 3)
        terminated = client.terminated()
        assert terminated is not None and terminated.error_code == 0 and terminated.additional_data == b"max_age"
        assert 0.15 <= elapsed < 1.5  # 300 ms +-10% after the handshake, then closed at once: no call was open
        fresh = RawClient(handle.server.grpc_port)  # a client that reconnects is served
        assert fresh.call(grpc_frame(infer_request())).status == 0
        fresh.close()


def _slow_call(port: int) -> tuple[float, object]:
    """One 800 ms call from tritonclient (python-hyper's h2 ends a connection at GOAWAY; gRPC core drains it)."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), 3.0, np.float32))
    started = time.monotonic()
    try:
        outcome: object = client.infer("slow", [tensor]).as_numpy("OUTPUT0").tolist()
    except InferenceServerException as error:
        outcome = error
    finally:
        client.close()
    return time.monotonic() - started, outcome


def test_a_call_open_at_max_age_is_answered_before_the_connection_closes(slow_repository):
    thread = ServerThread(make_options([slow_repository], grpc_keepalive=GrpcKeepalive(max_connection_age_ms=100)))
    handle = thread.start()
    try:
        elapsed, outcome = _slow_call(handle.server.grpc_port)  # the GOAWAY comes at ~100 ms, mid-call
        assert outcome == [[3.0, 3.0, 3.0, 3.0]] and elapsed >= 0.8
    finally:
        thread.stop()


def test_max_connection_age_grace_closes_a_connection_with_a_call_still_open(slow_repository):
    policy = GrpcKeepalive(max_connection_age_ms=100, max_connection_age_grace_ms=200)
    thread = ServerThread(make_options([slow_repository], grpc_keepalive=policy))
    handle = thread.start()
    try:
        elapsed, outcome = _slow_call(handle.server.grpc_port)
        assert isinstance(outcome, InferenceServerException) and outcome.status() == "StatusCode.UNAVAILABLE"
        assert elapsed < 0.8  # GOAWAY at ~100 ms, closed 200 ms later: the 800 ms call is cut off
        # the server and the model go on: a fresh connection is served
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{handle.server.grpc_port}")
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("fp32", [tensor]).as_numpy("OUTPUT0").tolist() == [[1.0, 1.0, 1.0, 1.0]]
        client.close()
    finally:
        thread.stop()


@pytest.mark.parametrize("grpc_server", ["native", "grpcio"])
def test_tritonclient_reconnects_across_connection_ages(repository, grpc_server):
    """What the flag is for: a real gRPC client keeps working, on new connections (spread by a load balancer)."""
    thread = ServerThread(make_options([repository], grpc_server=grpc_server,
                                       grpc_keepalive=GrpcKeepalive(max_connection_age_ms=150)))
    handle = thread.start()
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{handle.server.grpc_port}")
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        port = handle.server.grpc_port
        started = time.monotonic()
        answered = 0
        client_ports = set()  # the client ends of its connections to the server: new ones as old ones age out
        # until 10 answers over at least 3 connections (about 1 s, 6 connection ages; longer on a loaded machine)
        while (answered < 10 or len(client_ports) < 3) and time.monotonic() - started < 20.0:
            result = client.infer("fp32", [tensor])
            answered += result.as_numpy("OUTPUT0").tolist() == [[1.0, 1.0, 1.0, 1.0]]
            client_ports |= {c.laddr.port for c in psutil.net_connections("tcp")
                             if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED}
            time.sleep(0.05)
        assert answered >= 10
        assert len(client_ports) >= 3, client_ports
        client.close()
    finally:
        thread.stop()


def test_connection_age_flags_parse_as_tritonservers():
    options = cli_options("--grpc-max-connection-age=60000", "--grpc-max-connection-age-grace=5000")
    assert (options.grpc_keepalive.max_connection_age_ms, options.grpc_keepalive.max_connection_age_grace_ms) == (60000, 5000)
    assert cli_options().grpc_keepalive.max_connection_age_ms == 0
