"""HTTP protocol worker processes sharing the one engine (``--http-workers N``).

The server process keeps the engine and the whole HTTP application. Each extra worker process accepts
connections on the same listening socket (inherited file descriptor), parses HTTP with uvicorn/httptools,
and forwards every request, as plain (method, path, query, headers, body) values, over one multiplexed
Unix-socket connection to the server process, which runs it through the same ASGI application and sends
back (status, headers, body). So routes, validation, statistics and model control stay in one place,
while connection handling and HTTP parsing use other cores.

Frames on the Unix socket: 4-byte little-endian length, then a pickle of a tuple. Only the server's own
workers connect (the socket lives in a private temporary directory).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
import tempfile
from typing import Any, Callable

log = logging.getLogger("ferry.http.workers")

_LEN = struct.Struct("<I")


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = _LEN.unpack(await reader.readexactly(4))
    return pickle.loads(await reader.readexactly(size))


def _frame(value: Any) -> bytes:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


async def run_asgi(app: Callable, request: tuple) -> tuple[int, list, bytes]:
    """Run one forwarded request through ``app``; (status, headers, body)."""
    method, path, query, headers, body, client = request
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
        "root_path": "", "headers": headers, "client": client, "server": None,
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


class Bridge:
    """Server side: a Unix socket on which workers' requests run through the server's application."""

    def __init__(self, app: Callable) -> None:
        self.app = app
        self.directory = tempfile.mkdtemp(prefix="ferry-http-")
        self.path = os.path.join(self.directory, "bridge.sock")
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        os.chmod(self.path, 0o600)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                key, request = await _read_frame(reader)
                task = asyncio.create_task(self._answer(key, request, writer))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, key: int, request: tuple, writer: asyncio.StreamWriter) -> None:
        try:
            result = await run_asgi(self.app, request)
        except Exception as exc:  # the application maps errors itself; this is a last resort
            log.exception("forwarded request failed")
            result = (500, [(b"content-type", b"application/json")], b'{"error": "%s"}' % str(exc).encode())
        if not writer.is_closing():
            writer.write(_frame((key, result)))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        try:
            os.unlink(self.path)
            os.rmdir(self.directory)
        except OSError:
            pass


class ForwardingApp:
    """Worker side: an ASGI app that sends each request to the server process and relays the answer."""

    def __init__(self, bridge_path: str, max_input_size: int) -> None:
        self.bridge_path = bridge_path
        self.max_input_size = max_input_size
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._next = 0
        self._connecting: asyncio.Lock | None = None

    async def _connect(self) -> asyncio.StreamWriter:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._writer is None or self._writer.is_closing():
                reader, self._writer = await asyncio.open_unix_connection(self.bridge_path)
                asyncio.get_running_loop().create_task(self._read(reader))
        return self._writer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                key, result = await _read_frame(reader)
                future = self._pending.pop(key, None)
                if future is not None and not future.done():
                    future.set_result(result)
        except (asyncio.IncompleteReadError, ConnectionError):
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("the server process closed the bridge"))
            self._pending.clear()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return
        from serving_pod.core.errors import ServerError
        from serving_pod.http.responses import error_body, read_body, send_response

        try:  # bounded here too, so a worker never buffers more than the server would accept
            body = await read_body(receive, self.max_input_size)
        except ServerError as error:
            await send_response(send, *error_body(error), [])
            return
        client = scope.get("client")
        request = (scope["method"], scope["path"], scope.get("query_string", b""),
                   [(bytes(k), bytes(v)) for k, v in scope["headers"]], body,
                   tuple(client) if client else None)
        try:
            writer = await self._connect()
            self._next += 1
            key = self._next
            future = asyncio.get_running_loop().create_future()
            self._pending[key] = future
            writer.write(_frame((key, request)))
            status, headers, body = await future
        except (ConnectionError, OSError) as exc:
            status, headers = 503, [(b"content-type", b"application/json")]
            body = b'{"error": "server process unavailable: %s"}' % str(exc).encode()
        headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def spawn_workers(
    count: int, listen: socket.socket, bridge_path: str, max_input_size: int
) -> list[subprocess.Popen]:
    """Start ``count`` worker processes accepting on ``listen`` (inherited) and forwarding to the bridge."""
    fd = listen.fileno()
    os.set_inheritable(fd, True)
    return [
        subprocess.Popen(
            [sys.executable, "-m", "serving_pod.http.workers", str(fd), bridge_path, str(max_input_size)],
            pass_fds=(fd,),
        )
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


def worker_main(argv: list[str]) -> int:
    """One worker process: ``python -m serving_pod.http.workers <fd> <bridge path> <max input size>``.

    uvicorn handles SIGTERM here (stop accepting, finish open responses, exit).
    """
    import uvicorn

    fd, bridge_path, max_input_size = int(argv[0]), argv[1], int(argv[2])
    config = uvicorn.Config(
        ForwardingApp(bridge_path, max_input_size), loop="uvloop", http="httptools", lifespan="off",
        log_level="warning", access_log=False, proxy_headers=False, server_header=False,
        timeout_keep_alive=75,
    )
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=fd)])
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
