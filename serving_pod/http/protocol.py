"""The HTTP/1.1 connection protocol of the HTTP endpoint: uvicorn's, with the limits and a direct infer path.

uvicorn makes every request an ASGI scope, a ``RequestResponseCycle``, a task, and two ``send`` messages
that become two socket writes; for a small model that costs more than the model does. This protocol
recognises ``POST /v2/models/{m}[/versions/{v}]/infer`` when its headers are complete, keeps the body as the
parser hands it over, and at the message's end starts one task that answers through
``http.app.answer_infer`` (the ASGI ``InferEndpoint`` answers through it too, so the paths cannot
disagree) and writes the response in one piece.

Everything else takes uvicorn's ASGI path unchanged: other routes, paths with escapes or a query, an
infer request pipelined behind an unanswered one, and every route that a ``--http-restricted-api`` group
guards. ``InferCycle`` stands in for uvicorn's cycle object where uvicorn's protocol code looks at it
(pipelining, shutdown, disconnects). uvicorn's ASGI scope is built only for a request that takes the
ASGI path (``begin_request``), not when its message begins.

An infer request refused here, before ``answer_infer`` (its headers, a chunked body past the limit), is logged here
at ``--log-verbose`` 1 and above with the ``HTTP request:`` line ``answer_infer`` writes for the others.

Known heads: perf_analyzer, tritonclient and any service calling one model send the same request head (request
line and headers) every time. An infer request that arrives in one read, is answered on the direct path and
carries a plain ``content-length`` has its head's bytes kept (``known_heads``, per server, bounded); a later read
holding exactly such a head and a body of that length is answered without the parser and its dozen callbacks,
as the parser would have answered it: the same bytes mean the same method, target, keep-alive, body length and
``InferHead``. Anything else (a partial read, pipelining, chunked or ``expect`` requests, a request in progress,
``--http-header-forward-pattern``) goes through the parser.

Keep-alive: uvicorn arms a timer after every response and cancels it when the next request arrives. This
protocol's ``on_response_complete`` (both paths end there) instead notes the time and keeps one timer per
connection, which re-arms itself for what is left while requests keep coming: an idle connection still
closes ``timeout_keep_alive`` after its last response, and a busy one creates no timer per request.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any, NamedTuple

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from serving_pod import logging_settings
from serving_pod.core.engine import Engine
from serving_pod.core.errors import ServerError
from serving_pod.http.app import (
    HEADER_NAMES, Answer, InferHead, answer_infer, error_answer, infer_head, log_infer_request,
)
from serving_pod.http.compression import size_error
from serving_pod.http.limits import GuardedHttpToolsProtocol
from serving_pod.trace import Frontend

log = logging.getLogger("ferry.http")

# plain printable-ASCII targets only: %-escapes, a query or other bytes take the ASGI path (uvicorn's handling)
_NAME = rb'[!"$&-.0->@-~]+'  # printable ASCII but / ? % #
_INFER_TARGET = re.compile(rb"^/v2/models/(" + _NAME + rb")(?:/versions/([0-9]+))?/infer$")  # as app._INFER_PATH
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: infer targets seen, each to its (model, version) or None (not an infer target); cleared when full
_TARGETS: dict[bytes, tuple[str, str] | None] = {}
_TARGETS_MAX = 1024
#: status -> (the default header list, status line and those headers); see ``_status_head``
_HEADS: dict[int, tuple[list[tuple[bytes, bytes]], bytes]] = {}
_INTERNAL = b"Internal Server Error"


class _NoEvent:
    """uvicorn's protocol sets its cycle's ``message_event``; nobody waits on an infer cycle's."""

    @staticmethod
    def set() -> None:
        pass


_NO_EVENT = _NoEvent()


class KnownHead(NamedTuple):
    """What the parser made of a request head seen before (``InferHttpProtocol.known_heads``)."""

    model: str
    version: str
    head: InferHead
    keep_alive: bool
    content_length: int


#: heads kept per server, and their size, at most (the table is emptied when full)
KNOWN_HEADS_MAX = 64
KNOWN_HEAD_BYTES = 4096
#: a response body at least this large goes out beside its head (a vectored write) instead of joined to it
WRITE_APART = 64 * 1024


class InferCycle:
    """One directly answered infer request: the body as it arrives, and uvicorn's cycle flags."""

    __slots__ = ("model", "version", "head", "chunks", "size", "keep_alive", "response_complete",
                 "disconnected", "more_body")

    message_event = _NO_EVENT

    def __init__(self, model: str, version: str, head: InferHead, keep_alive: bool) -> None:
        self.model = model
        self.version = version
        self.head = head
        self.chunks: list[bytes] = []
        self.size = 0
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.more_body = True  # uvicorn's flag; the body is in ``chunks``


def _status_head(status: int, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The status line and uvicorn's default headers (``date`` and ``--header``s), made once per list.

    uvicorn replaces the list every second (a new ``date``). Each entry keeps the list it was made from and
    is replaced as one tuple, so servers in threads of one process never get each other's headers.
    """
    entry = _HEADS.get(status)
    if entry is not None and entry[0] is default_headers:
        return entry[1]
    head = STATUS_LINE[status] + b"".join(b"%s: %s\r\n" % (name, value) for name, value in default_headers)
    _HEADS[status] = (default_headers, head)
    return head


def _infer_target(url: bytes) -> tuple[str, str] | None:
    """(model, version or "") when ``url`` is a plain infer target (``_INFER_TARGET``), else None."""
    try:
        return _TARGETS[url]
    except KeyError:
        pass
    match = _INFER_TARGET.match(url)
    target = None if match is None else (match.group(1).decode(), (match.group(2) or b"").decode())
    if len(_TARGETS) >= _TARGETS_MAX:
        _TARGETS.clear()
    _TARGETS[url] = target
    return target


class InferHttpProtocol(GuardedHttpToolsProtocol):
    """The limits-enforcing protocol answering infer requests itself (set up by ``http_protocol``)."""

    engine: Engine
    max_input_size: int = 64 * 1024 * 1024
    direct_infer: bool = True
    #: ``--http-header-forward-pattern`` (None: no header becomes a request parameter)
    header_forward: re.Pattern[str] | None = None
    cycle: Any  # uvicorn's RequestResponseCycle, or an InferCycle standing in for it
    #: the current request's header names as sent (``ForwardingHttpProtocol``; None: not kept)
    header_names: list[bytes] | None = None
    #: request heads (without the blank line) answered directly before, of this server (module docstring)
    known_heads: dict[bytes, KnownHead]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idle_since = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        #: the read being parsed when it began a message (its head may be learned: ``_learn``)
        self._read: bytes | None = None

    def data_received(self, data: bytes) -> None:
        if self._mid_message or not self.direct_infer or self._final is not None:
            super().data_received(data)
            return
        end = data.find(b"\r\n\r\n")
        if end > 0:
            known = self.known_heads.get(data[:end])
            if (known is not None and len(data) - end - 4 == known.content_length
                    and (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing()):
                # what the parser's callbacks leave behind (``limits``): the header count restarts and the read
                # deadline ends, else the connection's first deadline, or CRLFs counted between requests,
                # would cut a later request that the parser path lets in
                self._header_bytes = 0
                if self._deadline is not None:
                    self._disarm()
                self._unanswered += 1
                cycle = self.cycle = InferCycle(known.model, known.version, known.head, known.keep_alive)
                cycle.chunks.append(data[end + 4:])
                cycle.size = known.content_length
                self._start_answer(cycle)
                return
        self._read = data
        try:
            super().data_received(data)
        finally:
            self._read = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        super().connection_lost(exc)

    def start_message(self) -> None:
        """uvicorn's per-request state, less the ASGI scope (``begin_request`` makes it when needed)."""
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def begin_request(self) -> None:
        if not self._begin_infer():
            self._asgi_scope()
            super().begin_request()

    def _asgi_scope(self) -> None:
        """uvicorn's scope for this request, as its ``on_message_begin`` would have made it."""
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        HttpToolsProtocol.on_message_begin(self)  # resets the three
        self.url, self.headers, self.expect_100_continue = url, headers, expect
        self.scope["headers"] = headers

    def _begin_infer(self) -> bool:
        """Take the request on the direct path when it is an unpipelined infer request."""
        if not self.direct_infer or (self.cycle is not None and not self.cycle.response_complete):
            return False
        parser = self.parser
        if parser.get_method() != b"POST" or parser.should_upgrade():
            return False
        target = _infer_target(self.url)
        if target is None:
            return False
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        try:
            head = infer_head(self.headers, self.max_input_size, self.header_forward, self.header_names)
        except ServerError as error:
            if logging_settings.VERBOSE:  # refused before ``answer_infer``, which logs the others
                log_infer_request(*target)
            cycle = self.cycle = InferCycle("", "", InferHead(None, None, ""), keep_alive)
            self._respond(cycle, error_answer(error))  # at once: the body, if any, is skipped
            return True
        self.cycle = InferCycle(target[0], target[1], head, keep_alive)
        if self.expect_100_continue:
            self.transport.write(_CONTINUE)
        return True

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is not InferCycle:
            super().on_body(body)
            return
        if cycle.response_complete:
            return
        cycle.size += len(body)
        if cycle.size > self.max_input_size:  # a chunked body past the limit: refuse before keeping it
            if logging_settings.VERBOSE:
                log_infer_request(cycle.model, cycle.version)
            self._respond(cycle, error_answer(size_error(cycle.size, self.max_input_size)))
            cycle.chunks.clear()
            return
        cycle.chunks.append(body)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if type(cycle) is not InferCycle or self._replay is not None:
            super().on_message_complete()  # the read deadline; uvicorn's flags on its cycle; an upgrade's head
            return
        self.end_message()  # the read deadline (uvicorn's flags mean nothing to an InferCycle)
        if not cycle.response_complete:
            if self._read is not None:
                self._learn(cycle)
            self._start_answer(cycle)

    def _start_answer(self, cycle: InferCycle) -> None:
        task = self.loop.create_task(self._answer(cycle))
        self.tasks.add(task)  # the server's graceful shutdown waits for it
        task.add_done_callback(self.tasks.discard)

    def _learn(self, cycle: InferCycle) -> None:
        """Keep the head of a request that was the whole read and had a plain ``content-length`` (docstring)."""
        read: bytes = self._read  # type: ignore[assignment]
        end = read.find(b"\r\n\r\n")
        if (end <= 0 or end > KNOWN_HEAD_BYTES or len(read) - end - 4 != cycle.size
                or self.expect_100_continue or self.header_forward is not None):
            return
        lengths = [value for name, value in self.headers if name == b"content-length"]
        if (lengths != [b"%d" % cycle.size]
                or any(name == b"transfer-encoding" for name, _ in self.headers)):
            return
        known = self.known_heads
        if len(known) >= KNOWN_HEADS_MAX:
            known.clear()
        known[read[:end]] = KnownHead(cycle.model, cycle.version, cycle.head, cycle.keep_alive, cycle.size)

    async def _answer(self, cycle: InferCycle) -> None:
        """Answer a buffered infer request; while tracing is on the engine sees a ``Frontend``, which stamps the
        message read and written (HTTP_RECV_*, HTTP_SEND_*)."""
        frontend = Frontend(self.engine, "HTTP") if self.engine.tracer.enabled else None
        chunks = cycle.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        cycle.chunks = []
        try:
            try:
                answer = await answer_infer(self.engine if frontend is None else frontend, cycle.head, body,
                                            cycle.model, cycle.version, self.max_input_size)
            except Exception:  # answer_infer turns ServerErrors into answers; anything else is a bug
                log.exception("inference request for model '%s' failed", cycle.model)
                cycle.keep_alive = False
                answer = 500, _INTERNAL, [], b"text/plain; charset=utf-8"
            if self.flow.write_paused and not cycle.disconnected:
                await self.flow.drain()
            if frontend is None:
                self._respond(cycle, answer)
                return
            start = time.monotonic_ns()
            self._respond(cycle, answer)
            frontend.sent(start)
        finally:
            if frontend is not None:
                frontend.done()

    def _respond(self, cycle: InferCycle, answer: Answer) -> None:
        """Write the whole response, then let uvicorn go on (pipelined request, keep-alive timer)."""
        status, payload, headers, content_type = answer
        if not cycle.disconnected and not self.transport.is_closing():
            parts = [_status_head(status, self.server_state.default_headers)]
            for name, value in headers:
                parts += (name, b": ", value, b"\r\n")
            parts += (b"content-type: ", content_type, b"\r\ncontent-length: ", b"%d" % len(payload), b"\r\n")
            if not cycle.keep_alive:
                parts.append(b"connection: close\r\n")
            if len(payload) < WRITE_APART:
                parts += (b"\r\n", payload)
                self.transport.write(b"".join(parts))
            else:  # a large body is not copied behind its head: both go out in one vectored write
                parts.append(b"\r\n")
                self.transport.writelines((b"".join(parts), payload))
            if self.access_log:
                self.access_logger.info('%s - "POST /v2/models/%s/infer HTTP/1.1" %d', self.client, cycle.model,
                                        status)
        cycle.response_complete = True
        if not cycle.keep_alive:
            self.transport.close()
        self.on_response_complete()

    def on_response_complete(self) -> None:
        """uvicorn's, with the connection's one idle timer for its per-response one (direct and ASGI answers)."""
        self.server_state.total_requests += 1
        if self.answered() or self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_later(self.timeout_keep_alive, self._idle_check)

    def _idle_check(self) -> None:
        """Close the connection once it has been idle ``timeout_keep_alive`` since its last response."""
        self._idle_timer = None
        if self.transport.is_closing():
            return
        if self._mid_message or (self.cycle is not None and not self.cycle.response_complete):
            return  # a request in progress arms the timer again when it is answered
        left = self._idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self._idle_timer = self.loop.call_later(left, self._idle_check)
        else:
            self.transport.close()


class ForwardingHttpProtocol(InferHttpProtocol):
    """The protocol with ``--http-header-forward-pattern``: also keeps each header name as the client sent it.

    uvicorn lowers header names; Triton matches the pattern against, and forwards, the names as received
    (``X-Tenant`` stays ``X-Tenant``). Only this class pays for the second list; the ASGI path finds it in the
    scope's ``extensions`` under ``app.HEADER_NAMES``.
    """

    def start_message(self) -> None:
        super().start_message()
        self.header_names = []

    def _asgi_scope(self) -> None:
        super()._asgi_scope()
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})  # type: ignore[typeddict-item,assignment]
        extensions[HEADER_NAMES] = self.header_names

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self.header_names.append(name)  # type: ignore[union-attr]


def http_protocol(
    *, engine: Engine, max_input_size: int, max_header_bytes: int, read_timeout_s: float,
    restrictions: dict[str, Any] | None = None, header_forward: re.Pattern[str] | None = None,
) -> type[InferHttpProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` serving ``engine`` with these limits.

    A restricted ``inference`` group turns the direct path off: the ASGI guard must see those requests.
    """
    settings: dict[str, Any] = {
        "engine": engine, "max_input_size": max_input_size, "max_header_bytes": max_header_bytes,
        "read_timeout_s": read_timeout_s, "direct_infer": "inference" not in (restrictions or {}),
        "header_forward": header_forward, "known_heads": {},
    }
    base = InferHttpProtocol if header_forward is None else ForwardingHttpProtocol
    return type("FerryHttpProtocol", (base,), settings)
