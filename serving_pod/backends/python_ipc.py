"""A small two-way message channel over a pair of pipes, for isolated python models.

Both ends (the server in ``python_isolated`` and the child in ``python_stub``) use it the
same way: ``call(kind, *args)`` returns a ``Future`` for the peer's answer, ``post(kind,
*args)`` is one-way. Messages are pickled tuples (numpy arrays pickle without per-element
work) framed by ``multiprocessing.connection.Connection``:

    ("call", id, kind, args)   ->   ("reply", id, ok, value_or_error)
    ("post", kind, args)

A reader thread dispatches incoming messages: calls whose kind is in ``inline`` run on it
(they must be quick), others go to ``schedule`` (a thread pool, or the child's main loop),
so a handler waiting on its own ``call`` can never starve the reader. When the peer goes away
every pending future fails with ``ConnectionError`` and ``on_close`` runs once.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any, Callable

_log = logging.getLogger(__name__)

Handler = Callable[[str, tuple], Any]


class Channel:
    def __init__(
        self,
        reader: Connection,
        writer: Connection,
        *,
        name: str,
        on_call: Handler,
        on_post: Handler,
        schedule: Callable[[Callable[[], None]], Any],
        inline: frozenset[str] = frozenset(),
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._name = name
        self._on_call = on_call
        self._on_post = on_post
        self._schedule = schedule
        self._inline = inline
        self._on_close = on_close
        self._ids = itertools.count(1)
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._read_loop, name=f"{name}-reader", daemon=True)

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        self._thread.start()

    def _send(self, message: tuple) -> None:
        with self._write_lock:
            if self._closed:
                raise ConnectionError(f"{self._name}: channel is closed")
            try:
                self._writer.send(message)
            except (OSError, EOFError) as exc:
                raise ConnectionError(f"{self._name}: peer is gone ({exc})") from None

    def call(self, kind: str, *args: Any) -> Future:
        future: Future = Future()
        call_id = next(self._ids)
        with self._lock:
            if self._closed:
                future.set_exception(ConnectionError(f"{self._name}: channel is closed"))
                return future
            self._pending[call_id] = future
        try:
            self._send(("call", call_id, kind, args))
        except Exception as exc:
            with self._lock:
                self._pending.pop(call_id, None)
            future.set_exception(exc if isinstance(exc, ConnectionError) else ConnectionError(str(exc)))
        return future

    def post(self, kind: str, *args: Any) -> None:
        self._send(("post", kind, args))

    def _answer(self, call_id: int, kind: str, args: tuple) -> None:
        try:
            reply = ("reply", call_id, True, self._on_call(kind, args))
        except BaseException as exc:  # the peer gets the error, this side keeps running
            reply = ("reply", call_id, False, exc)
        try:
            self._send(reply)
        except ConnectionError:
            pass
        except Exception as exc:  # an unpicklable value or error: say so instead
            try:
                self._send(("reply", call_id, False, RuntimeError(f"cannot send reply to '{kind}': {exc}")))
            except Exception:
                _log.exception("%s: reply to '%s' could not be sent", self._name, kind)

    def _read_loop(self) -> None:
        try:
            while True:
                message = self._reader.recv()
                tag = message[0]
                if tag == "reply":
                    _, call_id, ok, value = message
                    with self._lock:
                        future = self._pending.pop(call_id, None)
                    if future is not None:
                        if ok:
                            future.set_result(value)
                        else:
                            future.set_exception(value)
                elif tag == "call":
                    _, call_id, kind, args = message
                    if kind in self._inline:
                        self._answer(call_id, kind, args)
                    else:
                        self._schedule(functools.partial(self._answer, call_id, kind, args))
                else:
                    _, kind, args = message
                    try:
                        self._on_post(kind, args)
                    except Exception:
                        _log.exception("%s: handling '%s' failed", self._name, kind)
        except (EOFError, OSError):
            pass
        except Exception:
            _log.exception("%s: reader stopped", self._name)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(ConnectionError(f"{self._name}: peer is gone"))
        if self._on_close is not None:
            try:
                self._on_close()
            except Exception:
                _log.exception("%s: close handler failed", self._name)

    def close(self) -> None:
        """Close both pipe ends; the reader thread then finishes (and fails what is pending)."""
        for conn in (self._writer, self._reader):
            try:
                conn.close()
            except OSError:
                pass
