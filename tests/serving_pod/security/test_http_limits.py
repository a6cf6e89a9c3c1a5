"""Request limits: oversized and chunked bodies (every route), decompression bombs, header size, slow clients,
gRPC message size. Each is refused with a clear error while the server keeps serving other clients."""

from __future__ import annotations

import socket
import time
import zlib

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from support.server import test_model_config, write_model

LIMIT = 64 * 1024


@pytest.fixture
def server(threaded_server, tmp_path):
    write_model(tmp_path, "idt", test_model_config("idt", dims="[ -1 ]"))
    return threaded_server(
        [tmp_path], model_control_mode="explicit", load_models=("idt",), http_max_input_size=LIMIT,
        http_max_header_size=8 * 1024, http_read_timeout_secs=0.5, grpc_max_message_size=LIMIT,
    )


def _still_serves(server) -> None:
    client, module = server.client("http"), server.module("http")
    infer_input = module.InferInput("INPUT0", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    assert client.infer("idt", [infer_input]).as_numpy("OUTPUT0").shape == (1, 4)


def _chunks(total: int, size: int = 8192):
    sent = 0
    while sent < total:
        yield b" " * size
        sent += size


@pytest.mark.parametrize("path", ["/v2/models/idt/infer", "/v2/repository/models/idt/load", "/v2/logging"])
def test_oversized_bodies_are_refused_on_every_route(server, path):
    url = f"http://{server.http_url}{path}"
    declared = httpx.post(url, content=b" " * (LIMIT + 1))
    chunked = httpx.post(url, content=_chunks(LIMIT * 4))  # no content-length: refused while streaming
    for response in (declared, chunked):
        assert response.status_code == 400
        assert "exceeds the maximum allowed value of 65536 bytes" in response.json()["error"]
    _still_serves(server)


@pytest.mark.parametrize("encoding", ["deflate", "gzip"])
def test_decompression_bomb_is_bounded(server, encoding):
    wbits = zlib.MAX_WBITS if encoding == "deflate" else 16 + zlib.MAX_WBITS
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    bomb = compressor.compress(b"0" * (LIMIT * 200)) + compressor.flush()
    assert len(bomb) < LIMIT // 4
    response = httpx.post(f"http://{server.http_url}/v2/models/idt/infer", content=bomb,
                          headers={"Content-Encoding": encoding})
    assert response.status_code == 400
    assert "exceeds the maximum allowed value" in response.json()["error"]
    _still_serves(server)


#: the HTTP endpoint and the metrics port (same limits), each with a GET route that answers 200
PORTS = {"http": "/v2/health/live", "metrics": "/metrics"}


def _url(server, port: str) -> str:
    return server.http_url if port == "http" else f"127.0.0.1:{server.server.metrics_port}"


@pytest.mark.parametrize("port", list(PORTS))
def test_oversized_headers_get_431(server, port):
    url = f"http://{_url(server, port)}{PORTS[port]}"
    response = httpx.get(url, headers={"X-Big": "a" * 20000})
    assert response.status_code == 431
    many = {f"X-H{i}": "b" * 100 for i in range(200)}
    assert httpx.get(url, headers=many).status_code == 431
    assert httpx.get(url, headers={"X-Ok": "a" * 2000}).status_code == 200
    _still_serves(server)


def _port(server, port: str = "http") -> int:
    return int(_url(server, port).rsplit(":", 1)[1])


def _read_until_closed(sock: socket.socket, limit_s: float) -> bytes:
    sock.settimeout(limit_s)
    data = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk


@pytest.mark.parametrize(("port", "phase"), [("http", "idle"), ("http", "headers"), ("http", "body"),
                                           ("metrics", "idle"), ("metrics", "headers")])
def test_slow_clients_are_disconnected(server, port, phase):
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", _port(server, port))) as sock:
        if phase == "headers":
            sock.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nX-Slow: " % PORTS[port].encode())
        elif phase == "body":
            sock.sendall(b"POST /v2/models/idt/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"in")
        _still_serves(server)  # other clients are served while this one dawdles
        for _ in range(3 if phase != "idle" else 0):  # trickling bytes does not extend the request deadline
            time.sleep(0.1)
            try:
                sock.sendall(b"a")
            except OSError:
                break
        reply = _read_until_closed(sock, 5.0)
    assert time.monotonic() - start < 4.0
    if phase != "body":
        assert reply.startswith(b"HTTP/1.1 408")
    _still_serves(server)


def test_grpc_message_limit(server):
    client, module = server.client("grpc"), server.module("grpc")
    big = module.InferInput("INPUT0", [1, LIMIT], "FP32")
    big.set_data_from_numpy(np.zeros((1, LIMIT), dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("idt", [big])
    assert info.value.status() == str(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert "larger than max" in info.value.message()
    _still_serves(server)
