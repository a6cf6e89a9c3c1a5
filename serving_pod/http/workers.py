"""HTTP protocol worker processes sharing the one engine (``--http-workers N``).

The server process keeps the engine and the whole HTTP application. Each extra worker process listens on
the same port (SO_REUSEPORT: the kernel spreads new connections over the processes) and parses HTTP itself. Inference
requests run through the worker's own ``InferEndpoint`` (body decoding, validation of the wire format,
response encoding and compression all happen in the worker); only the decoded request crosses a Unix
socket to the server process, which runs ``engine.infer`` and sends the domain response back (a raw binary
request, ``http.raw``, first asks the server process for its model's configuration: the worker has no registry). Every
other route is forwarded as plain (method, path, query, headers, body) values and runs through the
server's application. So statistics, model control and scheduling stay in one place, while the protocol
work, the larger part of a small model's request, uses other cores.

Frames on the Unix socket: 4-byte little-endian length, then a pickle of ``(key, kind, payload)``. Tensors
travel as raw bytes inside tuples (``core.interprocess``), several times cheaper than pickling the
dataclasses; frames written in one loop iteration leave in one write. Only the server's own workers
connect (the socket lives in a private temporary directory).

Tracing: a worker stamps HTTP_RECV_*/HTTP_SEND_* as the server process's own front end does (``trace.Frontend``)
while the server traces. The server keeps ``Tracer.enabled`` in the first byte of a two-byte shared file beside the
socket (``flags``, updated as the settings change), which the worker reads once per request (``RemoteTracer``). A
traced request goes as ``TRACED_INFER`` with its receive timestamps; once the worker has written the answer it
sends ``SENT`` with the send timestamps, and the server's trace is written (as ``Tracer.sent`` / ``done`` do for
its own front end). An untraced request pays that read (about 0.1 µs) and one ``is None`` check.

Logging: a worker writes its log as the server process does (``logging_settings``, the same ``--log-file``), so
tritonserver's verbose request lines (``http.app``) come from the process that takes the request; it logs the requests
it forwards too, and the server process does not log them again (``app.FORWARDED``). The server's log settings
can change at run time (``/v2/logging``): it keeps their switches in the second byte of ``flags`` (``log_flags``),
which the worker reads once per read from a client (``LogFollower``) and applies when it changed, before that read's
requests are parsed; so a worker follows a change from the first request that comes after it was answered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import mmap
import os
import pickle
import re
import socket
import struct
import subprocess
import sys
import tempfile
from typing import Any, Callable

from serving_pod.core.errors import InternalError, ServerError, UnavailableError
from serving_pod.core.interprocess import request_from_wire, request_to_wire, response_from_wire, response_to_wire
from serving_pod.core.types import InferRequest, InferResponse
from serving_pod.http.app import FORWARDED, path_as_sent
from serving_pod.logging_settings import LogSettings
from serving_pod.trace import Frontend

log = logging.getLogger("ferry.http.workers")

_LEN = struct.Struct("<I")
INFER, ASGI, HELLO, CONFIG, TRACED_INFER, SENT = 0, 1, 2, 3, 4, 5
#: the two-byte file beside the bridge's socket: whether the server traces, its log settings (module docstring)
FLAGS_FILE = "flags"
_TRACING, _LOGGING = 0, 1
#: ``log_flags`` bits: verbose level above 0, ISO8601 format, log_info, log_warning, log_error
_VERBOSE, _ISO8601, _INFO, _WARNING, _ERROR = 1, 2, 4, 8, 16
OK, ERROR = 0, 1


# -- framing ------------------------------------------------------------------------------------------


class FrameProtocol(asyncio.Protocol):
    """Length-prefixed pickled frames over a stream; ``send`` batches the frames of one loop iteration."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._pending: list[bytes] = []
        self.closed = False

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        position, end = 0, len(buffer)
        while end - position >= 4:
            (size,) = _LEN.unpack_from(buffer, position)
            if end - position - 4 < size:
                break
            frame = pickle.loads(memoryview(buffer)[position + 4 : position + 4 + size])
            position += 4 + size
            self.frame_received(frame)
        del buffer[:position]

    def frame_received(self, frame: Any) -> None:
        raise NotImplementedError

    def send(self, frame: Any) -> None:
        if self.closed or self.transport is None:
            return
        data = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
        self._pending.append(_LEN.pack(len(data)) + data)
        if len(self._pending) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self.closed and self.transport is not None:
            self.transport.write(b"".join(pending))


# -- the server process's side ------------------------------------------------------------------------


async def run_asgi(app: Callable, request: tuple) -> tuple[int, list, bytes]:
    """Run one forwarded request through ``app``; (status, headers, body)."""
    method, path, raw_path, query, headers, body, client = request
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": raw_path, "query_string": query,
        "root_path": "", "headers": headers, "client": client, "server": None, FORWARDED: True,
    }
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    status, out_headers, chunks = 500, [], []

    async def send(message: dict) -> None:
        nonlocal status, out_headers
        if message["type"] == "http.response.start":
            status, out_headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, out_headers, b"".join(chunks)


class _BridgeConnection(FrameProtocol):
    """One worker's connection: runs its inference requests on the engine and its other routes on the app."""

    def __init__(self, bridge: "Bridge") -> None:
        super().__init__()
        self.bridge = bridge
        #: traced requests whose answer the worker has not reported sent: key -> (front end, request)
        self.traced: dict[int, tuple[Frontend, InferRequest]] = {}

    def frame_received(self, frame: Any) -> None:
        key, kind, payload = frame
        if kind == HELLO:  # a worker is listening
            self.bridge.listening(payload)
            return
        if kind == SENT:
            self._sent(key, payload)
            return
        if kind == TRACED_INFER:  # registered now, so that a SENT read in this same batch finds it
            payload = self._traced_request(key, *payload)
        task = asyncio.get_running_loop().create_task(self._answer(key, kind, payload))
        self.bridge.tasks.add(task)
        task.add_done_callback(self.bridge.tasks.discard)

    def _traced_request(self, key: int, wire: tuple, stamps: list[tuple[str, int]]) -> InferRequest:
        """The request, carrying a front end with the worker's receive timestamps (``Tracer.start`` takes them)."""
        request = request_from_wire(wire)
        frontend = Frontend(self.bridge.engine, "HTTP", stamps[0][1])
        frontend.stamps = list(stamps)
        request.trace = frontend
        self.traced[key] = (frontend, request)
        return request

    def _sent(self, key: int, sends: list[tuple[int, int]]) -> None:
        """The worker wrote (or gave up on) the answer of traced request ``key``: its send timestamps, then done."""
        entry = self.traced.pop(key, None)
        if entry is None:
            return
        frontend, request = entry
        if request.trace is frontend:  # the engine has not taken it yet: it traces it without the front end
            request.trace = None
            return
        tracer = frontend.tracer
        for start_ns, end_ns in sends:
            tracer.sent(frontend, start_ns, end_ns)
        tracer.done(frontend)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        for key in list(self.traced):
            self._sent(key, [])

    async def _answer(self, key: int, kind: int, payload: Any) -> None:
        try:
            if kind == INFER:
                result: Any = response_to_wire(await self.bridge.engine.infer(request_from_wire(payload)))
            elif kind == TRACED_INFER:  # payload: the request _traced_request made
                result = response_to_wire(await self.bridge.engine.infer(payload))
            elif kind == CONFIG:  # (model, version) -> the model's configuration as JSON-ready values
                result = self.bridge.engine.model_config_dict(*payload)
            else:
                result = await run_asgi(self.bridge.app, payload)
            self.send((key, OK, result))
        except ServerError as error:
            self.send((key, ERROR, error))
        except Exception as exc:  # the application maps its errors itself; this is a last resort
            log.exception("forwarded request failed")
            self.send((key, ERROR, InternalError(f"{type(exc).__name__}: {exc}")))


class Bridge:
    """Server side: a Unix socket on which workers' requests reach the engine and the application."""

    def __init__(self, app: Callable, engine: Any) -> None:
        self.app = app
        self.engine = engine
        self.directory = tempfile.mkdtemp(prefix="ferry-http-")
        self.path = os.path.join(self.directory, "bridge.sock")
        self._server: asyncio.AbstractServer | None = None
        self.tasks: set[asyncio.Task] = set()
        self._listening: set[int] = set()
        self._changed = asyncio.Event()
        flags = os.path.join(self.directory, FLAGS_FILE)
        with open(os.open(flags, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), "r+b") as file:
            file.write(b"\0\0")
            file.flush()
            self._flags: mmap.mmap | None = mmap.mmap(file.fileno(), 2)

    def _tracing_changed(self, enabled: bool) -> None:
        """``Tracer`` listener: the workers read the byte before each request."""
        if self._flags is not None:
            self._flags[_TRACING] = int(enabled)

    def _logging_changed(self, settings: LogSettings) -> None:
        """``LogSettings`` listener: the workers read the byte at each read from a client."""
        if self._flags is not None:
            self._flags[_LOGGING] = log_flags(settings)

    def listening(self, pid: int) -> None:
        self._listening.add(pid)
        self._changed.set()

    async def wait_for_workers(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` workers listen on the port; False (logged) when ``timeout`` passes first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self._listening) < count:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), deadline - loop.time())
            except TimeoutError:
                log.warning("%d of %d HTTP workers listening after %.0f s", len(self._listening), count, timeout)
                return False
        return True

    async def start(self) -> None:
        tracer = self.engine.tracer
        self._tracing_changed(tracer.enabled)
        tracer.listeners.append(self._tracing_changed)
        self._logging_changed(self.engine.log_settings)
        self.engine.log_settings.listeners.append(self._logging_changed)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _BridgeConnection(self), path=self.path)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self.tasks):
            task.cancel()
        for listeners, listener in ((self.engine.tracer.listeners, self._tracing_changed),
                                    (self.engine.log_settings.listeners, self._logging_changed)):
            if listener in listeners:
                listeners.remove(listener)
        if self._flags is not None:
            self._flags.close()
            self._flags = None
        for path in (self.path, os.path.join(self.directory, FLAGS_FILE)):
            try:
                os.unlink(path)
            except OSError:
                pass
        try:
            os.rmdir(self.directory)
        except OSError:
            pass


# -- the worker's side --------------------------------------------------------------------------------


class BridgeClient(FrameProtocol):
    """Worker side of the bridge: ``call`` sends one request and waits for its answer."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self._pending_calls: dict[int, asyncio.Future] = {}
        self._next = 0
        self._connecting: asyncio.Lock | None = None

    def next_key(self) -> int:
        self._next += 1
        return self._next

    async def call(self, kind: int, payload: Any, key: int = 0) -> Any:
        """The answer's payload; raises the ``ServerError`` the server answered, or ConnectionError. ``key``:
        one taken with ``next_key`` (a traced request's, which its ``SENT`` frame names), else a new one."""
        if self.transport is None or self.closed:
            await self._connect()
        key = key or self.next_key()
        future = asyncio.get_running_loop().create_future()
        self._pending_calls[key] = future
        self.send((key, kind, payload))
        status, result = await future
        if status == ERROR:
            raise result
        return result

    async def _connect(self) -> None:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self.transport is None or self.closed:
                self.closed = False
                self._buffer.clear()
                await asyncio.get_running_loop().create_unix_connection(lambda: self, self.path)

    def frame_received(self, frame: Any) -> None:
        key, status, result = frame
        future = self._pending_calls.pop(key, None)
        if future is not None and not future.done():
            future.set_result((status, result))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.transport = None
        calls, self._pending_calls = self._pending_calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(ConnectionError("the server process closed the bridge"))


def log_flags(settings: LogSettings) -> int:
    """The switches of ``settings`` a worker follows, as one byte (``LogFollower``)."""
    switches = (settings.verbose > 0, settings.format == "ISO8601", settings.info, settings.warning, settings.error)
    return sum(bit for bit, on in zip((_VERBOSE, _ISO8601, _INFO, _WARNING, _ERROR), switches) if on)


def read_flags(path: str) -> mmap.mmap:
    """The worker's read-only view of the server's ``flags`` file."""
    with open(path, "rb") as file:
        return mmap.mmap(file.fileno(), 2, access=mmap.ACCESS_READ)


class LogFollower:
    """A worker's log settings, following the server's (the shared byte, module docstring); ``follow`` applies a
    change, and costs a byte read and a comparison otherwise."""

    def __init__(self, flags: mmap.mmap, settings: LogSettings) -> None:
        self._flags = flags
        self.settings = settings
        self._seen = -1

    def follow(self) -> None:
        state = self._flags[_LOGGING]
        if state == self._seen:
            return
        self._seen = state
        settings = self.settings
        # the level matters only as verbose or not here: a worker writes no message of a higher level
        settings.verbose = int(bool(state & _VERBOSE))
        settings.format = "ISO8601" if state & _ISO8601 else "default"
        settings.info, settings.warning, settings.error = (bool(state & bit) for bit in (_INFO, _WARNING, _ERROR))
        settings.apply()


class RemoteTracer:
    """A worker's side of the server's ``Tracer``, as ``trace.Frontend`` uses it: ``enabled`` is the server's
    (the shared byte), ``sent`` keeps a traced request's send timestamps and ``done`` reports them."""

    def __init__(self, client: BridgeClient, flags: mmap.mmap) -> None:
        self.client = client
        self._flag = flags
        #: traced requests sent to the server: front end -> (bridge key, send timestamps)
        self.calls: dict[Frontend, tuple[int, list[tuple[int, int]]]] = {}

    @property
    def enabled(self) -> bool:
        return self._flag[_TRACING] != 0

    def key(self, frontend: Frontend) -> int:
        """The bridge key for ``frontend``'s request, which its ``SENT`` frame names."""
        key = self.client.next_key()
        self.calls[frontend] = (key, [])
        return key

    def sent(self, frontend: Frontend, start_ns: int, end_ns: int) -> None:
        call = self.calls.get(frontend)
        if call is not None:
            call[1].append((start_ns, end_ns))

    def done(self, frontend: Frontend) -> None:
        call = self.calls.pop(frontend, None)
        if call is not None:
            self.client.send((call[0], SENT, call[1]))


class RemoteEngine:
    """The engine as a worker sees it: ``infer`` runs in the server process."""

    def __init__(self, client: BridgeClient, tracer: RemoteTracer) -> None:
        self.client = client
        #: the server's tracing state; a ``Frontend`` wraps this engine while it is on
        self.tracer = tracer

    async def infer(self, request: InferRequest) -> InferResponse:
        frontend = request.trace  # the ``Frontend`` of a request received while tracing was on
        try:
            if frontend is None:
                wire = await self.client.call(INFER, request_to_wire(request))
            else:
                wire = await self.client.call(TRACED_INFER, (request_to_wire(request), frontend.stamps),
                                              self.tracer.key(frontend))
        except (ConnectionError, OSError) as exc:
            raise UnavailableError(f"server process unavailable: {exc}") from None
        return response_from_wire(wire)

    async def model_config_dict(self, name: str, version: str = "") -> dict[str, Any]:
        """The configuration of a ready model version, from the server process (a raw binary request needs it)."""
        try:
            return await self.client.call(CONFIG, (name, version))
        except (ConnectionError, OSError) as exc:
            raise UnavailableError(f"server process unavailable: {exc}") from None


class ForwardingApp:
    """Worker side: an ASGI app that sends each (non-inference) request to the server process."""

    def __init__(self, client: BridgeClient, max_input_size: int) -> None:
        self.client = client
        self.max_input_size = max_input_size

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return
        from serving_pod.http.responses import error_body, read_body, send_response

        try:  # bounded here too, so a worker never buffers more than the server would accept
            body = await read_body(receive, self.max_input_size)
        except ServerError as error:
            await send_response(send, *error_body(error), [])
            return
        client = scope.get("client")
        request = (scope["method"], scope["path"], path_as_sent(scope),
                   scope.get("query_string", b""),
                   [(bytes(k), bytes(v)) for k, v in scope["headers"]], body,
                   tuple(client) if client else None)
        try:
            status, headers, body = await self.client.call(ASGI, request)
        except ServerError as error:
            await send_response(send, *error_body(error), [])
            return
        except (ConnectionError, OSError) as exc:
            status, headers = 503, [(b"content-type", b"application/json")]
            body = b'{"error": "server process unavailable: %s"}' % str(exc).encode()
        headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def worker_app(engine: RemoteEngine, max_input_size: int, restrictions: dict[str, Any],
               header_forward: re.Pattern[str] | None = None) -> Callable:
    """The worker's ASGI application: the lean infer endpoint on the remote engine, the rest forwarded."""
    from serving_pod.http.app import InferEndpoint

    app: Callable = InferEndpoint(ForwardingApp(engine.client, max_input_size), engine, max_input_size,
                                  header_forward)
    if restrictions:
        from serving_pod.security import RestrictedHttp

        app = RestrictedHttp(app, restrictions)
    return app


def spawn_workers(
    count: int, address: str, port: int, bridge_path: str, *, max_input_size: int, max_header_bytes: int,
    read_timeout_s: float, restrictions: dict[str, Any] | None = None, header_forward: str = "", log_file: str = "",
) -> list[subprocess.Popen]:
    """Start ``count`` worker processes listening on ``address:port`` (SO_REUSEPORT, like the server's own
    socket, so the kernel spreads connections over all of them) and forwarding to the bridge. They enforce
    the server's HTTP limits themselves, and log to ``log_file`` (the server's; "": stderr)."""
    settings = json.dumps({
        "max_input_size": max_input_size, "max_header_bytes": max_header_bytes, "read_timeout_s": read_timeout_s,
        "restrictions": {group: [r.header, r.value] for group, r in (restrictions or {}).items()},
        "header_forward": header_forward, "log_file": log_file,
    })
    return [
        subprocess.Popen([sys.executable, "-m", "serving_pod.http.workers", address, str(port), bridge_path, settings])
        for _ in range(count)
    ]


def stop_workers(processes: list[subprocess.Popen], timeout: float = 10.0) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _hello(bridge_path: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hello:
        hello.connect(bridge_path)
        data = pickle.dumps((0, HELLO, os.getpid()), protocol=pickle.HIGHEST_PROTOCOL)
        hello.sendall(_LEN.pack(len(data)) + data)


def worker_main(argv: list[str]) -> int:
    """One worker: ``python -m serving_pod.http.workers <address> <port> <bridge path> <settings JSON>``.

    It serves HTTP with the server's protocol (limits, direct infer path) on the remote engine. uvicorn
    handles SIGTERM here (stop accepting, finish open responses, exit).
    """
    import uvicorn

    from serving_pod.allocator import keep_freed_memory
    from serving_pod.http.protocol import http_protocol
    from serving_pod.security import Restriction
    from serving_pod.sockets import bind_socket

    keep_freed_memory()  # these processes read and write the request and response bodies
    address, port, bridge_path, settings = argv[0], int(argv[1]), argv[2], json.loads(argv[3])
    restrictions = {group: Restriction(*pair) for group, pair in settings["restrictions"].items()}
    max_input_size = settings["max_input_size"]
    header_forward = re.compile(settings["header_forward"]) if settings.get("header_forward") else None
    flags = read_flags(os.path.join(os.path.dirname(bridge_path), FLAGS_FILE))
    logs = LogFollower(flags, LogSettings(file=settings.get("log_file", "")))
    logs.settings.install()
    logs.follow()
    sock = bind_socket(address, port, reuse_port=True)
    sock.listen(2048)  # connections queue here from now on; then tell the server this process takes its share
    _hello(bridge_path)
    client = BridgeClient(bridge_path)
    engine = RemoteEngine(client, RemoteTracer(client, flags))
    served = http_protocol(
        engine=engine, max_input_size=max_input_size,  # type: ignore[arg-type]
        max_header_bytes=settings["max_header_bytes"], read_timeout_s=settings["read_timeout_s"],
        restrictions=restrictions, header_forward=header_forward,
    )
    follow = logs.follow

    class FollowingProtocol(served):  # type: ignore[valid-type,misc]
        """The server's protocol, following the server's log settings at each read (module docstring)."""

        def data_received(self, data: bytes) -> None:
            follow()
            super().data_received(data)

    config = uvicorn.Config(
        worker_app(engine, max_input_size, restrictions, header_forward), loop="uvloop", http=FollowingProtocol,
        lifespan="off", log_level="warning", access_log=False, proxy_headers=False, server_header=False,
        timeout_keep_alive=75,
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
