"""Connection-level limits for the HTTP server: request header size and a request read deadline.

uvicorn's httptools protocol bounds neither the size of a request's headers nor the time a client
may take to send a request, so one client trickling bytes (slowloris) could hold connections and
buffers forever. ``GuardedHttpToolsProtocol``, whose limits ``http.protocol.http_protocol`` sets,

- answers 431 and closes when a request's headers exceed ``max_header_bytes``;
- closes a connection whose current request (headers and body) is not fully received within
  ``read_timeout_s`` of its first byte, or that sends nothing within ``read_timeout_s`` of
  connecting. The app then sees ``http.disconnect`` and stops waiting for the body.

A client that half-closes (``shutdown(SHUT_WR)`` after its requests, as ``nc -N`` and some scripts do) still
gets the answers to the requests it sent whole, then the connection closes, as tritonserver answers them
(``eof_received``); uvicorn let asyncio close the connection at once, and answers not yet written were lost.

A request that cannot be read (400: bytes the parser refuses; 431) ends the connection, but the requests
pipelined before it were read whole and are running: they are answered first, then the error, then the
connection closes (uvicorn wrote the error at once and dropped their answers). ``_unanswered`` counts the
connection's requests whose headers were accepted and whose answers are not written yet.

A request that arrives in one read (the common case) never arms a timer, so the hot path pays
only two attribute writes. Body size is bounded separately by ``--http-max-input-size``.

Upgrade requests (``Connection: upgrade`` with an ``Upgrade`` header; ``curl --http2`` sends ``Upgrade: h2c`` on
every plain-HTTP request) are served as the HTTP/1.1 requests they also are, as tritonserver serves them: no
other protocol is spoken here. httptools tells llhttp to skip such a request's body and stops parsing after its
head, so uvicorn answered it with an empty body (an infer request: 400; a load: its parameters lost) or, for
``Upgrade: websocket``, handed the connection to a WebSocket protocol with no route (403, or no answer to a
POST). The head is held instead (``_replay``) and fed again without its ``upgrade`` header, the bytes after
it following, so the request is read and answered like any other (``_feed``).
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol


def _error(status: int, reason: bytes) -> bytes:
    """A plain-text error answer that closes the connection."""
    return (b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
            % (status, reason, len(reason), reason))


class _Head(NamedTuple):
    """An upgrade request's head as the parser read it, to be fed again without the upgrade (module docstring)."""

    method: bytes
    url: bytes
    http_version: str
    headers: list[tuple[bytes, bytes]]

    def without_upgrade(self) -> bytes:
        """The head's bytes less its ``upgrade`` header: llhttp then reads a plain request (and its body)."""
        lines = [b"%s %s HTTP/%s\r\n" % (self.method, self.url, self.http_version.encode())]
        lines += [b"%s: %s\r\n" % (name, value) for name, value in self.headers if name.lower() != b"upgrade"]
        return b"".join(lines) + b"\r\n"


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """httptools protocol with header-size and read-deadline limits (class attributes), serving upgrade requests as
    plain HTTP/1.1 (module docstring)."""

    max_header_bytes: int = 64 * 1024
    read_timeout_s: float = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._mid_message = False
        self._in_headers = False
        self._header_bytes = 0
        self._too_large = False
        self._deadline: asyncio.TimerHandle | None = None
        #: the request uvicorn is answering through the ASGI app (``self.cycle`` may be a newer, queued one)
        self._asgi_cycle: Any = None
        self._unanswered = 0
        self._begun = False  # the current message's headers were accepted (it is counted in ``_unanswered``)
        #: an error answer waiting for the answers before it (module docstring); input is ignored meanwhile
        self._final: bytes | None = None
        #: the head of an upgrade request whose body the parser skips, to be fed again (module docstring)
        self._replay: _Head | None = None
        #: the client half-closed: the connection closes once its requests are answered (``eof_received``)
        self._eof = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._abandon()
        super().connection_lost(exc)

    def eof_received(self) -> bool:
        """The client sends nothing more: keep the connection open to answer the requests it sent whole, then
        close (``answered``); with none waiting, or one cut off mid-way (it can never complete), close now."""
        if self._mid_message or self._unanswered <= 0:
            return False
        self._eof = True
        return True

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._asgi_cycle = cycle
        super()._start_asgi_task(cycle, app)

    def data_received(self, data: bytes) -> None:
        if self._final is not None:
            return
        if self._in_headers or not self._mid_message:
            self._header_bytes += len(data)
        self._feed(data)
        if self._in_headers and self._header_bytes > self.max_header_bytes:
            self._close_with(_error(431, b"Request Header Fields Too Large"))
            return
        if self._mid_message and self._deadline is None and not self.transport.is_closing():
            self._arm()

    def _feed(self, data: bytes) -> None:
        """uvicorn's ``data_received``, with upgrade requests served as plain HTTP/1.1 (module docstring)."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
        except httptools.HttpParserUpgrade as upgrade:
            head, self._replay = self._replay, None
            if head is None:  # CONNECT: uvicorn's warning; the bytes after its head are not read
                self._unsupported_upgrade_warning()
                return
            self._feed(head.without_upgrade() + data[upgrade.args[0]:])

    def on_message_begin(self) -> None:
        self._mid_message = self._in_headers = True
        self._begun = False
        self.start_message()

    def start_message(self) -> None:
        """uvicorn's per-request state and ASGI scope (``http.protocol`` builds the scope later, if at all)."""
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        # Bytes received so far bound the header size; count exactly only when they could exceed it.
        if self._header_bytes > self.max_header_bytes:
            size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
            if size > self.max_header_bytes:
                self._too_large = True
                raise ValueError("request headers too large")  # httptools aborts the parse
        self._header_bytes = 0
        parser = self.parser
        if parser.should_upgrade() and parser.get_method() != b"CONNECT":
            # the parser skips the body and stops: this head is fed again, without the upgrade (_feed)
            names = getattr(self, "header_names", None)  # as sent, where kept (``--http-header-forward-pattern``)
            headers = self.headers if names is None else [(n, v) for n, (_, v) in zip(names, self.headers)]
            self._replay = _Head(parser.get_method(), self.url, parser.get_http_version(), headers)
            return
        self._unanswered += 1
        self._begun = True
        try:
            self.begin_request()
        except BaseException:  # e.g. uvicorn's URL parse: the request got no cycle, and the parser answers 400
            self._unanswered -= 1
            self._begun = False
            raise

    def begin_request(self) -> None:
        """Start answering the request whose headers passed the limits (uvicorn's ASGI cycle here)."""
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if self._too_large:
            self._close_with(_error(431, b"Request Header Fields Too Large"))
        else:
            self._close_with(b"".join(self._400_response(msg)))

    def _400_response(self, msg: str) -> list[bytes]:
        """uvicorn's 400 answer (its ``send_400_response`` without the write)."""
        content = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            content += (name, b": ", value, b"\r\n")
        body = msg.encode("ascii")
        content += (b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                    % len(body), body)
        return content

    def on_response_complete(self) -> None:
        if not self.answered():
            super().on_response_complete()

    def answered(self) -> bool:
        """Count one answer written; True when it was the last one that a deferred error answer, or a client that
        half-closed, waited for: the error is written and the connection closed (``on_response_complete``
        overrides call this first)."""
        self._unanswered -= 1
        if self._unanswered > 0:
            return False
        if self._final is not None:
            final, self._final = self._final, None
            if not self.transport.is_closing():
                self.transport.write(final)
                self.transport.close()
            return True
        if self._eof:
            self.transport.close()
            return True
        return False

    def on_message_complete(self) -> None:
        if self._replay is not None:  # only the head of an upgrade request: it is read again (_feed)
            return
        self.end_message()
        super().on_message_complete()

    def end_message(self) -> None:
        """The whole request is in: no read deadline until the next one begins."""
        self._mid_message = False
        self._disarm()

    # --- internals ---------------------------------------------------------------------------
    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.read_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._mid_message or self.cycle is None:
            if self._in_headers or self.cycle is None:
                self._reject(408, b"Request Timeout")
            else:
                self.transport.close()  # the app's receive() now reports http.disconnect

    def _abandon(self) -> None:
        """The connection closes: the requests still being answered must write nothing more.

        uvicorn marks only ``self.cycle`` (the newest request) disconnected, and only in ``connection_lost``, a
        loop turn after a close; a pipelined request answered through the ASGI app before it would write to
        the closed transport, which uvloop refuses with an exception.
        """
        for cycle in (self._asgi_cycle, self.cycle):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()

    def _reject(self, status: int, reason: bytes) -> None:
        self._close_now(_error(status, reason))

    def _close_now(self, response: bytes) -> None:
        """Write ``response`` and close; the requests still being answered write nothing more."""
        self._abandon()
        self.transport.write(response)
        self.transport.close()

    def _close_with(self, response: bytes) -> None:
        """Answer a request that cannot be read with ``response`` and close, after the requests before it."""
        cycle = self.cycle
        if self._mid_message and self._begun and cycle is not None and not cycle.response_complete:
            # the bad bytes are in this request's body: it was counted, and it can never be answered now
            cycle.disconnected = True
            cycle.message_event.set()
            if self.pipeline and self.pipeline[0][0] is cycle:
                self.pipeline.popleft()
            self._unanswered -= 1
        if self._unanswered > 0 and not self.transport.is_closing():
            self._final = response
            self._disarm()
            return
        self._close_now(response)


class BodyLimit:
    """ASGI middleware bounding request bodies of the ordinary routes (load, trace, logging, ...).

    The lean infer endpoint bounds its own body; this guard covers what FastAPI would otherwise read
    without limit: a declared ``content-length`` above ``limit`` is refused at once, a chunked body is
    refused as soon as it passes ``limit``, and an accepted body is replayed to the app.
    """

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        from serving_pod.core.errors import ServerError
        from serving_pod.http.responses import error_body, read_body, send_response
        from serving_pod.http.compression import size_error

        try:
            for key, value in scope["headers"]:
                if key == b"content-length" and value.isdigit() and int(value) > self.limit:
                    raise size_error(int(value), self.limit)
            body = await read_body(receive, self.limit)
        except ServerError as error:
            await send_response(send, *error_body(error), [])
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)
