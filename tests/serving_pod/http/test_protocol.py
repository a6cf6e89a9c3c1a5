"""The HTTP endpoint's own protocol (``http.protocol``): infer requests answered without the ASGI layer.

Raw sockets check what a client sees on the wire: the direct path and the ASGI path give the same answer,
pipelined and keep-alive requests are answered in order, ``Expect: 100-continue`` and HTTP/1.0 work, and
each bad input (a bad length header, a body past the limit, a vanished client, a failing engine) gets a
clear answer while the connection or the server goes on serving.
"""

from __future__ import annotations

import email.utils
import socket
import time

import httpx
import numpy as np
import orjson
import pytest

from serving_pod.http import protocol
from support.server import test_model_config, write_model

LIMIT = 64 * 1024
BODY = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})


@pytest.fixture
def server(threaded_server, tmp_path):
    write_model(tmp_path, "idt", test_model_config("idt", dims="[ -1 ]"))
    write_model(tmp_path, "slow", test_model_config(
        "slow", dims="[ -1 ]", extra='parameters { key: "execute_delay_ms" value { string_value: "300" } }'))
    return threaded_server([tmp_path], model_control_mode="explicit", load_models=("idt", "slow"),
                           http_max_input_size=LIMIT)


def _port(server) -> int:
    return server.server.http_port


def _request(path: str, body: bytes = BODY, *, headers: dict[str, str] | None = None, version: str = "1.1") -> bytes:
    lines = [f"POST {path} HTTP/{version}", "Host: test", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Wire:
    """A raw HTTP/1.1 connection reading whole responses (content-length framed)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(status_line.split()[1])
        if status == 100:
            return status, headers, b""
        length = int(headers["content-length"])
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, headers, body

    def closed(self) -> bool:
        """True once the server has closed the connection (waits up to the socket timeout)."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, socket.timeout):
            return False

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


def _outputs(body: bytes) -> list:
    return orjson.loads(body)["outputs"][0]["data"]


def _assert_served(wire: Wire) -> None:
    """The connection still serves: an infer request on it is answered 200 with the identity's outputs."""
    wire.send(_request("/v2/models/idt/infer"))
    status, _, body = wire.response()
    assert status == 200 and _outputs(body) == [1, 2, 3, 4]


def test_direct_and_asgi_paths_give_the_same_answer(server):
    wire = Wire(_port(server))
    # "/v2/models/id%74/infer" names the same model; escapes take uvicorn's ASGI path
    wire.send(_request("/v2/models/idt/infer"))
    direct = wire.response()
    wire.send(_request("/v2/models/id%74/infer"))
    asgi = wire.response()
    for status, headers, body in (direct, asgi):
        assert status == 200
        assert headers["content-type"] == "application/json"
        assert _outputs(body) == [1, 2, 3, 4]
    assert direct[2] == asgi[2]
    assert {k for k in direct[1] if k != "date"} == {k for k in asgi[1] if k != "date"}
    # errors agree too: an unknown model
    wire.send(_request("/v2/models/nope/infer"))
    wire.send(_request("/v2/models/no%70e/infer"))
    first, second = wire.response(), wire.response()
    assert first[0] == second[0] == 404
    assert first[2] == second[2] and b"nope" in first[2]
    wire.close()


def test_pipelined_requests_are_answered_in_order(server):
    wire = Wire(_port(server))
    second = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [7, 8]}]})
    # a slow infer, then an infer and a GET behind it in the same segment: neither may overtake it
    wire.send(_request("/v2/models/slow/infer") + _request("/v2/models/idt/infer", second)
              + b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\n\r\n")
    slow, fast, ready = wire.response(), wire.response(), wire.response()
    assert slow[0] == 200 and _outputs(slow[2]) == [1, 2, 3, 4]
    assert fast[0] == 200 and _outputs(fast[2]) == [7, 8]
    assert ready[0] == 200 and ready[2] == b""
    wire.close()


def test_keep_alive_binary_and_compressed_responses(server):
    client = server.client("http")
    module = server.module("http")
    for i in range(3):  # one pooled connection, several requests
        infer_input = module.InferInput("INPUT0", [1, 3], "FP32")
        infer_input.set_data_from_numpy(np.full((1, 3), i, dtype=np.float32), binary_data=True)
        output = module.InferRequestedOutput("OUTPUT0", binary_data=True)
        result = client.infer("idt", [infer_input], outputs=[output], response_compression_algorithm="gzip")
        assert result.as_numpy("OUTPUT0").tolist() == [[i, i, i]]


def test_expect_100_continue(server):
    wire = Wire(_port(server))
    head, _, body = _request("/v2/models/idt/infer", headers={"Expect": "100-continue"}).partition(b"\r\n\r\n")
    wire.send(head + b"\r\n\r\n")
    assert wire.response()[0] == 100  # before the body is sent
    wire.send(body)
    status, _, answer = wire.response()
    assert status == 200 and _outputs(answer) == [1, 2, 3, 4]
    wire.close()


def test_http_1_0_and_connection_close_end_the_connection(server):
    for request in (_request("/v2/models/idt/infer", version="1.0"),
                    _request("/v2/models/idt/infer", headers={"Connection": "close"})):
        wire = Wire(_port(server))
        wire.send(request)
        status, headers, body = wire.response()
        assert status == 200 and _outputs(body) == [1, 2, 3, 4]
        assert headers["connection"] == "close"
        assert wire.closed()
        wire.close()


def test_chunked_body_is_accepted(server):
    wire = Wire(_port(server))
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (BODY[:10], BODY[10:])) + b"0\r\n\r\n"
    wire.send(b"POST /v2/models/idt/infer HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
    status, _, body = wire.response()
    assert status == 200 and _outputs(body) == [1, 2, 3, 4]
    wire.close()


#: what ``curl --http2`` sends with every plain-HTTP request, and a WebSocket handshake
H2C = {"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAARAAAAAAAIAAAAA"}
WEBSOCKET = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
             "Sec-WebSocket-Version": "13"}


@pytest.mark.parametrize("upgrade", [H2C, WEBSOCKET], ids=["h2c", "websocket"])
@pytest.mark.parametrize("path", ["/v2/models/idt/infer", "/v2/models/id%74/infer"], ids=["direct", "asgi"])
def test_an_upgrade_request_is_served_as_http_1_1_with_its_body(server, upgrade, path):
    """An upgrade request is answered as tritonserver 2.51 answers it, as the plain request it also is (recorded
    live): its body is read, and the connection goes on. httptools skipped the body of such a request, so Ferry
    answered ``curl --http2 -d @body .../infer`` 400 "Raw request must only have 1 input ..." (an empty body),
    and a POST with ``Upgrade: websocket`` went to a WebSocket protocol that never answered it."""
    wire = Wire(_port(server))
    for split in (False, True):  # the body in the head's read, then in a later one
        request = _request(path, headers=upgrade)
        if split:
            wire.send(request[:-len(BODY)])
            time.sleep(0.05)
            wire.send(request[-len(BODY):])
        else:
            wire.send(request)
        status, headers, body = wire.response()
        assert (status, headers["content-type"], _outputs(body)) == (200, "application/json", [1, 2, 3, 4])
    wire.send(_request("/v2/models/idt/infer") + _request(path, headers=upgrade))  # pipelined behind another
    assert [_outputs(wire.response()[2]) for _ in range(2)] == [[1, 2, 3, 4]] * 2
    wire.close()


@pytest.mark.parametrize("upgrade", [H2C, WEBSOCKET], ids=["h2c", "websocket"])
def test_a_get_with_an_upgrade_is_answered_and_the_connection_goes_on(server, upgrade):
    """Triton answers 200 and reads the next request; Ferry answered a WebSocket handshake 403 and closed."""
    wire = Wire(_port(server))
    head = "".join(f"{name}: {value}\r\n" for name, value in upgrade.items()).encode()
    wire.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\n" + head + b"\r\n")
    assert wire.response()[:1] == (200,)
    _assert_served(wire)
    wire.close()


def test_connect_is_still_refused(server):
    """CONNECT (an upgrade to llhttp) is not fed again: 400 and the connection closes, as before (Triton: 404)."""
    wire = Wire(_port(server))
    wire.send(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    assert wire.response()[0] == 400 and wire.closed()
    wire.close()


@pytest.mark.parametrize("path", ["/v2/models/idt/infer", "/v2/models/id%74/infer"], ids=["direct", "asgi"])
def test_requests_before_a_half_close_are_answered_then_the_connection_closes(server, path):
    """A client that sends its requests and then ``shutdown(SHUT_WR)`` gets every answer, in order, then the
    server's close, as from tritonserver 2.51 (recorded live). uvicorn let asyncio close the connection at the
    client's FIN: answers not yet written were lost (one request: most often; two pipelined: the second)."""
    wire = Wire(_port(server))
    wire.send(_request("/v2/models/slow/infer") + _request(path) + b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n")
    wire.sock.shutdown(socket.SHUT_WR)
    answers = [wire.response() for _ in range(3)]
    assert [status for status, _, _ in answers] == [200, 200, 200]
    assert [_outputs(body) for _, _, body in answers[:2]] == [[1, 2, 3, 4]] * 2
    assert wire.closed()
    wire.close()
    wire = Wire(_port(server))  # one request alone
    wire.send(_request(path))
    wire.sock.shutdown(socket.SHUT_WR)
    assert _outputs(wire.response()[2]) == [1, 2, 3, 4] and wire.closed()
    wire.close()


def test_a_half_close_mid_request_closes_at_once(server):
    """A request whose body can never arrive is not answered: the connection closes at the FIN (as before)."""
    wire = Wire(_port(server))
    wire.send(_request("/v2/models/idt/infer")[:-5])
    wire.sock.shutdown(socket.SHUT_WR)
    assert wire.closed() and wire.buffer == b""
    wire.close()
    assert httpx.post(f"http://{server.http_url}/v2/models/idt/infer", content=BODY, timeout=10).status_code == 200


def test_bad_length_header_gets_400_and_the_connection_goes_on(server):
    wire = Wire(_port(server))
    wire.send(_request("/v2/models/idt/infer", headers={"Inference-Header-Content-Length": "abc"}))
    status, _, body = wire.response()
    assert status == 400  # tritonserver reads the length with atoi: 0, a raw request (``http.raw``) the model refuses
    assert orjson.loads(body)["error"].startswith(
        "[request id: <id_unknown>] input byte size mismatch for input 'raw_input' for model 'idt'.")
    # the refused request's body was skipped: the next request on the connection is parsed and served
    wire.send(_request("/v2/models/idt/infer", headers={"Inference-Header-Content-Length": "9999"}))
    status, headers, body = wire.response()
    assert (status, headers["content-type"]) == (400, "text/plain")  # as tritonserver, found before parsing the body
    assert orjson.loads(body) == {"error": f"inference header size should be in range (0, {len(BODY)}), got: 9999"}
    _assert_served(wire)
    wire.close()


def test_declared_oversized_body_is_refused_before_it_is_read(server):
    wire = Wire(_port(server))
    # only the headers are sent: the answer must not wait for the 1 MB body
    wire.send(f"POST /v2/models/idt/infer HTTP/1.1\r\nHost: test\r\nContent-Length: {1 << 20}\r\n\r\n".encode())
    status, _, body = wire.response()
    assert status == 400
    assert "exceeds the maximum allowed value of 65536 bytes" in orjson.loads(body)["error"]
    wire.close()


def test_vanished_client_does_not_disturb_others(server):
    wire = Wire(_port(server))
    wire.send(_request("/v2/models/slow/infer"))
    time.sleep(0.05)
    wire.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    wire.close()  # reset while the model runs: the answer has nowhere to go
    response = httpx.post(f"http://{server.http_url}/v2/models/idt/infer", content=BODY)
    assert response.status_code == 200 and _outputs(response.content) == [1, 2, 3, 4]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the slow request still ran to its end and was counted
        stats = httpx.get(f"http://{server.http_url}/v2/models/slow/stats").json()["model_stats"][0]
        if stats["inference_stats"]["success"]["count"] == 1:
            break
        time.sleep(0.05)
    assert stats["inference_stats"]["success"]["count"] == 1


BAD_BYTES = {  # bytes the server cannot read -> the status they get
    "malformed": (b"POST * \r\nHost: x\r\n\r\n", 400),
    "URL too long": (b"GET /" + b"a" * (70 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "headers too large": (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (200 * 1024) + b"\r\n\r\n", 431),
    "bad chunk in a body": (b"POST /v2/models/idt/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                            b"zz\r\n", 400),
}


@pytest.mark.parametrize("case", list(BAD_BYTES))
def test_requests_before_bad_bytes_are_answered_then_the_error(server, case):
    """Requests pipelined before bytes the server cannot read were read whole and run: each gets its answer,
    in order, then the error answer, then the connection closes (the answers were dropped and the error
    written at once). The server goes on, and nothing it logs is an error."""
    import logging

    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append  # type: ignore[method-assign]
    logger = logging.getLogger("uvicorn.error")  # where uvicorn reports an exception escaping a request
    logger.addHandler(handler)
    try:
        wire = Wire(_port(server))
        # the ASGI path (a query), then the direct path behind it
        bad, status = BAD_BYTES[case]
        wire.send(_request("/v2/models/slow/infer?q=1", _data_body(4, 3, 2, 1)) + _request("/v2/models/idt/infer")
                  + bad)
        answers = [wire.response() for _ in range(3)]
        assert [answer[0] for answer in answers] == [200, 200, status]
        assert _outputs(answers[0][2]) == [4, 3, 2, 1] and _outputs(answers[1][2]) == [1, 2, 3, 4]
        assert answers[2][1]["connection"] == "close"
        assert wire.closed()
        wire.close()
    finally:
        logger.removeHandler(handler)
    assert not errors, [record.getMessage() + str(record.exc_info) for record in errors]
    response = httpx.post(f"http://{server.http_url}/v2/models/idt/infer", content=BODY)
    assert response.status_code == 200 and _outputs(response.content) == [1, 2, 3, 4]


@pytest.mark.parametrize("case", list(BAD_BYTES))
def test_bad_bytes_alone_are_answered_at_once(server, case):
    bad = BAD_BYTES[case][0]
    wire = Wire(_port(server))
    wire.send(bad)
    answer = wire.response()
    # alone, a long URL is counted against the header limit before the parser sees it whole: 431
    assert answer[0] in (400, 431) and answer[1]["connection"] == "close"
    try:  # closed; reset when the server closed with bytes of the refused request still unread
        assert wire.sock.recv(1) == b""
    except ConnectionResetError:
        pass
    wire.close()


def test_a_request_after_bad_bytes_is_not_read(server):
    """Bytes after the ones the server cannot read are ignored, even a known head's request (fast path)."""
    httpx.post(f"http://{server.http_url}/v2/models/idt/infer", content=BODY)  # now a known head
    wire = Wire(_port(server))
    wire.send(_request("/v2/models/slow/infer", _data_body(1)) + BAD_BYTES["malformed"][0])
    time.sleep(0.1)
    wire.send(_request("/v2/models/idt/infer"))
    assert [wire.response()[0] for _ in range(2)] == [200, 400]
    assert wire.closed()
    wire.close()


def test_engine_failure_gets_500_and_the_server_goes_on(server, monkeypatch):
    engine = server.engine
    real = engine.infer

    async def broken(request):
        if request.model_name == "slow":
            raise RuntimeError("bug")
        return await real(request)

    monkeypatch.setattr(engine, "infer", broken)
    wire = Wire(_port(server))
    wire.send(_request("/v2/models/slow/infer"))
    status, headers, body = wire.response()
    assert (status, body, headers["connection"]) == (500, b"Internal Server Error", "close")
    assert wire.closed()
    wire.close()
    response = httpx.post(f"http://{server.http_url}/v2/models/idt/infer", content=BODY)
    assert response.status_code == 200 and _outputs(response.content) == [1, 2, 3, 4]


@pytest.fixture
def short_keep_alive(monkeypatch):
    """Servers started after this close keep-alive connections idle for 1 s (75 s in production)."""
    import serving_pod.server

    monkeypatch.setattr(serving_pod.server, "KEEP_ALIVE_S", 1.0)


@pytest.mark.parametrize("request_bytes", [_request("/v2/models/idt/infer"),
                                           b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\n\r\n"],
                         ids=["direct", "asgi"])
def test_an_idle_keep_alive_connection_is_closed_after_the_timeout(short_keep_alive, server, request_bytes):
    wire = Wire(_port(server))
    try:
        wire.send(request_bytes)
        assert wire.response()[0] == 200
        began = time.monotonic()
        assert wire.closed()  # the server closes it; the socket's own timeout is 10 s
        assert 0.8 < time.monotonic() - began < 5.0
    finally:
        wire.close()


def test_a_busy_keep_alive_connection_stays_open_past_the_timeout(short_keep_alive, server):
    """An ASGI request, then infer requests every 0.1 s for 3 s (three timeouts), all on one connection."""
    wire = Wire(_port(server))
    try:
        wire.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\n\r\n")
        assert wire.response()[0] == 200
        deadline = time.monotonic() + 3.0
        count = 0
        while time.monotonic() < deadline:
            wire.send(_request("/v2/models/idt/infer"))
            assert wire.response()[0] == 200, f"request {count}"
            count += 1
            time.sleep(0.1)
        assert count >= 20
        assert wire.closed()  # and once idle, it closes
    finally:
        wire.close()


def test_the_date_header_of_direct_answers_follows_the_clock(server):
    """The status line and default headers are made once per uvicorn header list, which gets a new date each second."""
    wire = Wire(_port(server))
    try:
        dates = []
        for _ in range(2):
            wire.send(_request("/v2/models/idt/infer"))
            status, headers, _ = wire.response()
            assert status == 200
            dates.append(email.utils.parsedate_to_datetime(headers["date"]))
            time.sleep(1.3)
        assert (dates[1] - dates[0]).total_seconds() >= 1
        assert abs(dates[1].timestamp() - (time.time() - 1.3)) < 3
    finally:
        wire.close()


def test_status_head_is_made_again_for_a_new_header_list():
    first = [(b"date", b"Wed, 25 Nov 2026 21:00:00 GMT"), (b"server", b"ferry")]
    head = protocol._status_head(200, first)
    assert head == b"HTTP/1.1 200 OK\r\ndate: Wed, 25 Nov 2026 21:00:00 GMT\r\nserver: ferry\r\n"
    assert protocol._status_head(400, first).startswith(b"HTTP/1.1 400 Bad Request\r\ndate: Wed, 25 Nov")
    second = [(b"date", b"Wed, 25 Nov 2026 21:00:01 GMT")]
    assert protocol._status_head(200, second) == b"HTTP/1.1 200 OK\r\ndate: Wed, 25 Nov 2026 21:00:01 GMT\r\n"
    assert protocol._status_head(200, []) == b"HTTP/1.1 200 OK\r\n"


def test_status_heads_of_two_servers_in_one_process_stay_apart():
    """Each server's uvicorn has its own list; alternating between them never answers with the other's."""
    mine, theirs = [(b"server", b"mine")], [(b"server", b"theirs")]
    for _ in range(3):
        assert protocol._status_head(200, mine) == b"HTTP/1.1 200 OK\r\nserver: mine\r\n"
        assert protocol._status_head(200, theirs) == b"HTTP/1.1 200 OK\r\nserver: theirs\r\n"
    assert protocol._status_head(200, theirs) is protocol._status_head(200, theirs)  # made once per list


@pytest.mark.parametrize("url, target", [
    (b"/v2/models/idt/infer", ("idt", "")),
    (b"/v2/models/idt/versions/3/infer", ("idt", "3")),
    (b"/v2/models/id%74/infer", None),  # escapes take the ASGI path
    (b"/v2/models/idt/infer?x=1", None),
    (b"/v2/models/idt/ready", None),
    (b"/v2/models/a/b/infer", None),
])
def test_infer_targets(url, target):
    assert protocol._infer_target(url) == target
    assert protocol._infer_target(url) == target  # remembered


def test_remembered_infer_targets_are_bounded(monkeypatch):
    monkeypatch.setattr(protocol, "_TARGETS", {})
    for index in range(protocol._TARGETS_MAX * 3):
        assert protocol._infer_target(b"/v2/models/m%d/infer" % index) == (f"m{index}", "")
        assert len(protocol._TARGETS) <= protocol._TARGETS_MAX


# --------------------------------------------------------------------------- known heads


def _protocol_class(server) -> type:
    return server.server._http.config.http_protocol_class


def _count_parsed_headers(monkeypatch, server) -> list[bytes]:
    """The header names the parser hands over from now on (none for a read answered by a known head)."""
    cls, seen = _protocol_class(server), []
    parent = cls.on_header

    def on_header(self, name: bytes, value: bytes) -> None:
        seen.append(name)
        parent(self, name, value)

    monkeypatch.setattr(cls, "on_header", on_header)
    return seen


def _data_body(*values: float) -> bytes:
    return orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, len(values)], "datatype": "FP32",
                                     "data": list(values)}]})


def test_a_known_head_is_answered_without_the_parser_with_each_bodys_answer(server, monkeypatch):
    parsed = _count_parsed_headers(monkeypatch, server)
    wire = Wire(_port(server))
    try:
        for value in range(1, 5):  # bodies of one length, so one head
            wire.send(_request("/v2/models/idt/infer", _data_body(value, value + 1)))
            status, _, answer = wire.response()
            assert status == 200 and _outputs(answer) == [value, value + 1]
        assert parsed == [b"Host", b"Content-Length"]  # the first request only
        (known,) = _protocol_class(server).known_heads.values()
        assert (known.model, known.version, known.keep_alive) == ("idt", "", True)
        # a known head whose body comes in a second read: the parser's, with the same answer
        request = _request("/v2/models/idt/infer", _data_body(8, 9))
        wire.send(request[:-5])
        time.sleep(0.2)
        wire.send(request[-5:])
        assert _outputs(wire.response()[2]) == [8, 9]
        # two known requests in one read (pipelined): the parser's, answered in order
        wire.send(_request("/v2/models/idt/infer", _data_body(1, 2)) + _request("/v2/models/idt/infer", _data_body(3, 4)))
        assert [_outputs(wire.response()[2]) for _ in range(2)] == [[1, 2], [3, 4]]
        assert len(parsed) == 2 * 4  # the first, the split and the two pipelined requests
    finally:
        wire.close()


def test_heads_that_are_never_known(server):
    """Bad requests, chunked and expect-100 bodies, HTTP/1.0 and other routes are not kept; every answer stays right."""
    known = _protocol_class(server).known_heads
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (BODY[:10], BODY[10:])) + b"0\r\n\r\n"
    for _ in range(2):
        wire = Wire(_port(server))
        try:
            wire.send(_request("/v2/models/idt/infer", headers={"Inference-Header-Content-Length": "abc"}))
            assert wire.response()[0] == 400
            wire.send(_request("/v2/models/nope/infer"))
            assert wire.response()[0] == 404
            wire.send(b"POST /v2/models/idt/infer HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
            assert _outputs(wire.response()[2]) == [1, 2, 3, 4]
            wire.send(_request("/v2/models/id%74/infer"))  # the ASGI path
            assert _outputs(wire.response()[2]) == [1, 2, 3, 4]
            wire.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\n\r\n")
            assert wire.response()[0] == 200
        finally:
            wire.close()
    # known: the 404 comes from the engine, as before; a length atoi reads as 0 is a raw request's (``http.raw``), a
    # head as good as any
    assert [k.model for k in known.values()] == ["idt", "nope"]
    wire = Wire(_port(server))
    wire.send(_request("/v2/models/nope/infer"))
    assert wire.response()[0] == 404
    wire.close()


def test_a_known_connection_close_head_still_closes(server):
    for _ in range(2):
        wire = Wire(_port(server))
        wire.send(_request("/v2/models/idt/infer", version="1.0"))
        status, headers, body = wire.response()
        assert status == 200 and _outputs(body) == [1, 2, 3, 4] and headers["connection"] == "close"
        assert wire.closed()
        wire.close()
    assert [k.keep_alive for k in _protocol_class(server).known_heads.values()] == [False]


def test_known_heads_are_bounded(server, monkeypatch):
    monkeypatch.setattr(protocol, "KNOWN_HEADS_MAX", 4)
    wire = Wire(_port(server))
    try:
        for index in range(7):
            wire.send(_request("/v2/models/idt/infer", headers={"X-Client": str(index)}))
            assert _outputs(wire.response()[2]) == [1, 2, 3, 4]
    finally:
        wire.close()
    assert 0 < len(_protocol_class(server).known_heads) <= 4


@pytest.fixture
def limited_server(threaded_server, tmp_path):
    """A server with a 1.5 s read deadline and 1 KiB of request headers at most."""
    write_model(tmp_path, "idt", test_model_config("idt", dims="[ -1 ]"))
    return threaded_server([tmp_path], model_control_mode="explicit", load_models=("idt",),
                           http_max_input_size=LIMIT, http_read_timeout_secs=1.5, http_max_header_size=1024)


def _teach(server, monkeypatch) -> list[bytes]:
    """Answer the idt request once on its own connection, so its head is known; the headers parsed from now on."""
    teacher = Wire(_port(server))
    teacher.send(_request("/v2/models/idt/infer"))
    assert teacher.response()[0] == 200
    teacher.close()
    return _count_parsed_headers(monkeypatch, server)


def _known_first_request(server, monkeypatch) -> Wire:
    """A new connection whose first request was answered by a known head (learned on another connection)."""
    parsed = _teach(server, monkeypatch)
    wire = Wire(_port(server))
    _assert_served(wire)
    assert parsed == []  # the known head: no parser
    return wire


def test_a_request_after_a_known_head_gets_its_own_read_deadline(limited_server, monkeypatch):
    """The deadline runs from a request's first byte: the one armed when the connection opened ends with the
    first request, answered by a known head or by the parser (it once stayed armed and cut the next request)."""
    wire = _known_first_request(limited_server, monkeypatch)
    try:
        head, _, body = _request("/v2/models/idt/infer", _data_body(5, 6)).partition(b"\r\n\r\n")
        time.sleep(0.9)
        wire.send(head + b"\r\n\r\n")
        time.sleep(0.9)  # 1.8 s after the connection opened, 0.9 s after this request began
        wire.send(body)
        status, _, answer = wire.response()
        assert status == 200 and _outputs(answer) == [5, 6]
    finally:
        wire.close()


def test_a_known_head_restarts_the_header_count(limited_server, monkeypatch):
    """Blank lines before a request are skipped but counted toward the header limit until a request's headers
    end; a request answered by a known head ends them too (it once kept them, and a later head arriving in
    two reads got 431)."""
    parsed = _teach(limited_server, monkeypatch)
    wire = Wire(_port(limited_server))
    try:
        wire.send(b"\r\n" * 500)  # 1000 bytes, under the 1024 limit
        time.sleep(0.2)
        wire.send(_request("/v2/models/idt/infer"))  # its own read: the known head
        assert _outputs(wire.response()[2]) == [1, 2, 3, 4]
        assert parsed == []
        request = _request("/v2/models/idt/infer", _data_body(7))
        wire.send(request[:40])
        time.sleep(0.2)
        wire.send(request[40:])
        status, _, answer = wire.response()
        assert status == 200 and _outputs(answer) == [7]
    finally:
        wire.close()
