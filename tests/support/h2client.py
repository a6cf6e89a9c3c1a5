"""A raw HTTP/2 gRPC client for wire-level tests: python-hyper's ``h2`` on a blocking socket.

``RawClient`` sends hand-built gRPC requests (any headers, bodies, compression flags, windows) and collects
each stream's headers, trailers and DATA as a ``Reply``; ``grpc_frame`` and ``infer_request`` build bodies.
"""

from __future__ import annotations

import socket
import struct
import urllib.parse
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.settings
import numpy as np
from h2.settings import SettingCodes
from tritonclient.grpc import service_pb2 as pb

INFER = b"/inference.GRPCInferenceService/ModelInfer"


def grpc_frame(message: bytes, compressed: bool = False) -> bytes:
    return bytes([compressed]) + struct.pack(">I", len(message)) + message


def infer_request(model: str = "fp32", values=(1.0, 2.0, 3.0, 4.0)) -> bytes:
    array = np.asarray(values, dtype=np.float32).reshape(1, -1)
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(array.shape))
    request.raw_input_contents.append(array.tobytes())
    return request.SerializeToString()


@dataclass
class Reply:
    """One response stream: headers and trailers together, the DATA bytes, how it ended."""

    headers: dict[bytes, bytes] = field(default_factory=dict)
    data: bytes = b""
    frames: list[int] = field(default_factory=list)  # DATA frame sizes
    ended: bool = False
    reset: int | None = None

    @property
    def http_status(self) -> int:
        return int(self.headers[b":status"])

    @property
    def status(self) -> int:
        return int(self.headers[b"grpc-status"])

    @property
    def message(self) -> str:
        return urllib.parse.unquote(self.headers.get(b"grpc-message", b"").decode())

    def infer_output(self) -> list[float]:
        assert self.data[:1] == b"\x00"
        (size,) = struct.unpack(">I", self.data[1:5])
        assert len(self.data) == 5 + size
        response = pb.ModelInferResponse.FromString(self.data[5:])
        return np.frombuffer(response.raw_output_contents[0], np.float32).tolist()


class RawClient:
    """An HTTP/2 client connection (python-hyper ``h2``) on a blocking socket."""

    def __init__(self, port: int, *, window: int | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        if window is not None:
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.conn.initiate_connection()
        self.flush()
        self.events: list[h2.events.Event] = []
        self.eof = False
        self.until(lambda: any(isinstance(e, h2.events.RemoteSettingsChanged) for e in self.events))

    def close(self) -> None:
        self.sock.close()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def receive(self) -> list[h2.events.Event]:
        data = self.sock.recv(1 << 16)
        if not data:
            self.eof = True
            return []
        events = self.conn.receive_data(data)
        self.events += events
        self.flush()
        return events

    def until(self, condition) -> None:
        while not condition():
            assert not self.eof, "the server closed the connection"
            self.receive()

    def send(self, body: bytes | None, *, path: bytes = INFER, method: bytes = b"POST",
             content_type: bytes = b"application/grpc", extra: tuple = (), end: bool = True) -> int:
        sid = self.conn.get_next_available_stream_id()
        headers = [(b":method", method), (b":scheme", b"http"), (b":path", path), (b":authority", b"localhost"),
                   (b"content-type", content_type), (b"te", b"trailers"), *extra]
        self.conn.send_headers(sid, headers, end_stream=body is None and end)
        if body is not None:
            self.send_data(sid, body, end)
        self.flush()
        return sid

    def send_data(self, sid: int, body: bytes, end: bool) -> None:
        view = memoryview(body)
        while True:
            size = min(len(view), self.conn.max_outbound_frame_size)
            while size and self.conn.local_flow_control_window(sid) < size:
                self.flush()
                self.receive()  # wait for the server's WINDOW_UPDATE
            last = size == len(view)
            self.conn.send_data(sid, bytes(view[:size]), end_stream=end and last)
            view = view[size:]
            if last:
                break
        self.flush()

    def reply(self, sid: int, *, on_data=None) -> Reply:
        """Read until stream ``sid`` ends or is reset, acknowledging its DATA (``on_data`` runs first)."""
        reply = Reply()
        position = 0
        while True:
            while position < len(self.events):
                event = self.events[position]
                position += 1
                if getattr(event, "stream_id", None) != sid:
                    continue
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    reply.headers.update(event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    if on_data is not None:
                        on_data(reply, event)
                    reply.data += event.data
                    reply.frames.append(len(event.data))
                    self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
                    self.flush()
                elif isinstance(event, h2.events.StreamEnded):
                    reply.ended = True
                    return reply
                elif isinstance(event, h2.events.StreamReset):
                    reply.reset = event.error_code
                    return reply
            assert not self.eof, "the server closed the connection"
            self.receive()

    def call(self, body: bytes | None, **kwargs) -> Reply:
        return self.reply(self.send(body, **kwargs))

    def terminated(self) -> h2.events.ConnectionTerminated | None:
        return next((e for e in self.events if isinstance(e, h2.events.ConnectionTerminated)), None)
