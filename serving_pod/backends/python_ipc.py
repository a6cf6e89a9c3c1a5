"""A small two-way message channel over a pair of pipes, for isolated python models.

Both ends (the server in ``python_isolated`` and the child in ``python_stub``) use it the
same way: ``call(kind, *args)`` returns a ``Future`` for the peer's answer, ``post(kind,
*args)`` is one-way. Messages are pickled tuples (numpy arrays pickle without per-element
work) framed by ``multiprocessing.connection.Connection``:

    ("call", id, kind, args)   ->   ("reply", id, ok, value_or_error)
    ("post", kind, args)

Who reads the incoming pipe is chosen when the channel is made; every pending future fails with
``ConnectionError`` and ``on_close`` runs once when the peer goes away, whichever it is:

* a reader thread (the default): calls whose kind is in ``inline`` run on it (they must be quick),
  others go to ``schedule`` (a thread pool), so a handler waiting on its own ``call`` can never starve
  the reader;
* the server's event ``loop`` (``loop=``; the server's end): ``add_reader`` on a non-blocking pipe,
  frames parsed as they arrive, and ``call_async`` answered on the loop with no thread hop at all, which
  on a small VM is most of what an isolated execution costs. ``on_close`` is handed to ``schedule``
  there, since it may wait for the child to exit;
* the owner's main thread and whoever waits (``pump=True``; the child's end): ``serve`` reads while
  idle and runs the peer's calls itself, so an ``execute`` reaches the model with no thread hop. While a
  call runs, any thread waiting on the peer (``wait``, ``wait_until``, ``request``: a BLS call, a
  cancellation check, a metric, a BLS stream) takes the read lock and reads, handing each message on;
  waiting on the peer in any other way would never be answered.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import os
import pickle
import struct
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any, Callable

_log = logging.getLogger(__name__)

Handler = Callable[[str, tuple], Any]

#: ``multiprocessing.connection`` framing: a signed 4-byte length, or -1 then an unsigned 8-byte one
_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")
_READ_SIZE = 256 * 1024


class Channel:
    def __init__(
        self,
        reader: Connection,
        writer: Connection,
        *,
        name: str,
        on_call: Handler,
        on_post: Handler,
        schedule: Callable[[Callable[[], None]], Any] | None = None,
        inline: frozenset[str] = frozenset(),
        on_close: Callable[[], None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        pump: bool = False,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._name = name
        self._on_call = on_call
        self._on_post = on_post
        self._schedule: Callable[[Callable[[], None]], Any]
        if pump:  # ``serve`` runs the peer's calls
            self._schedule = self._enqueue
        elif schedule is not None:
            self._schedule = schedule
        else:
            raise ValueError("a channel that does not pump needs ``schedule`` for the peer's calls")
        self._inline = inline
        self._on_close = on_close
        self._ids = itertools.count(1)
        self._pending: dict[int, Future | asyncio.Future] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._closed = False
        self._loop = loop
        self._buffer = bytearray()
        self._pump = pump
        self._read_lock = threading.Lock()
        #: notified whenever a message was handled, a job queued, the read lock freed or the channel closed
        self._turn = threading.Condition()
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._serving = True
        self._thread = threading.Thread(target=self._read_loop, name=f"{name}-reader", daemon=True)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def on_loop(self) -> bool:
        """Whether this end reads on an event loop (``call_async`` works only then)."""
        return self._loop is not None

    def start(self) -> None:
        if self._pump:
            return
        if self._loop is None:
            self._thread.start()
        else:
            self._run_on_loop(self._attach)

    def _send(self, message: tuple) -> None:
        # plain pickle: ``Connection.send``'s ForkingPickler (fd and socket reducers, unused here) costs
        # about 2.4 µs more per message
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._write_lock:
            if self._closed:
                raise ConnectionError(f"{self._name}: channel is closed")
            try:
                self._writer.send_bytes(data)
            except (OSError, EOFError) as exc:
                raise ConnectionError(f"{self._name}: peer is gone ({exc})") from None

    def call(self, kind: str, *args: Any) -> Future:
        return self._call(Future(), kind, args)

    def call_async(self, kind: str, *args: Any) -> asyncio.Future:
        """``call`` answered on the event loop; only on the loop's thread of a channel that reads there."""
        assert self._loop is not None, "call_async needs a channel that reads on an event loop"
        return self._call(self._loop.create_future(), kind, args)

    def _call(self, future: Any, kind: str, args: tuple) -> Any:
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

    def request(self, kind: str, *args: Any) -> Any:
        """``call`` and wait for the answer (``wait``)."""
        return self.wait(self.call(kind, *args))

    def wait(self, future: Future) -> Any:
        """``future.result()``; in pump mode this thread reads meanwhile whenever no other thread does."""
        if self._pump:
            self._pump_until(future.done)
        return future.result()

    def wait_until(self, ready: Callable[[], bool]) -> None:
        """Pump mode: return once ``ready()`` holds (or the channel closed), reading meanwhile as ``wait``
        does; ``ready`` must become true through a message from the peer. Other modes return at once."""
        if self._pump:
            self._pump_until(ready)

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

    def _dispatch(self, message: tuple) -> None:
        tag = message[0]
        if tag == "reply":
            _, call_id, ok, value = message
            with self._lock:
                future = self._pending.pop(call_id, None)
            if future is not None and not future.done():
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

    def _read_loop(self) -> None:
        while not self._closed:
            self._read_one()

    def _read_one(self) -> None:
        """Read one message and hand it on; the peer gone, or a reader that breaks, closes the channel."""
        try:
            self._dispatch(self._reader.recv())
        except (EOFError, OSError):
            self._shutdown()
        except Exception:
            _log.exception("%s: reader stopped", self._name)
            self._shutdown()
        if self._pump:
            with self._turn:
                self._turn.notify_all()

    # ------------------------------------------------------------------ read by its waiters (pump mode)
    def serve(self) -> None:
        """Pump mode, on the owner's main thread: run the peer's calls and read while none is queued, until
        the channel closes or a call ran ``stop_serving``."""
        assert self._pump, "serve needs a channel made with pump=True"
        while self._serving:
            with self._turn:
                job = self._jobs.popleft() if self._jobs else None
            if job is not None:
                job()
            elif self._closed:
                return
            else:
                self._pump_until(lambda: bool(self._jobs))

    def stop_serving(self) -> None:
        """``serve`` returns after the call running now."""
        self._serving = False

    def _enqueue(self, job: Callable[[], None]) -> None:
        with self._turn:
            self._jobs.append(job)
            self._turn.notify_all()

    def _pump_until(self, ready: Callable[[], bool]) -> None:
        while not ready() and not self._closed:
            if self._read_lock.acquire(blocking=False):
                try:
                    while not ready() and not self._closed:
                        self._read_one()
                finally:
                    self._read_lock.release()
                    with self._turn:
                        self._turn.notify_all()
                return
            with self._turn:
                self._turn.wait_for(lambda: ready() or self._closed or not self._read_lock.locked())

    # ------------------------------------------------------------------ reading on an event loop
    def _run_on_loop(self, callback: Callable[[], None]) -> None:
        assert self._loop is not None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            callback()
            return
        try:
            self._loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop is closed: nothing reads there any more
            callback()

    def _attach(self) -> None:
        assert self._loop is not None
        if self._closed:
            return
        fd = self._reader.fileno()
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._reader.fileno(), _READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._detach()
            return
        buffer = self._buffer
        buffer += chunk
        position = 0
        try:
            while not self._closed:
                available = len(buffer) - position
                if available < _LENGTH.size:
                    break
                (size,) = _LENGTH.unpack_from(buffer, position)
                header = _LENGTH.size
                if size == -1:
                    if available < header + _LONG_LENGTH.size:
                        break
                    (size,) = _LONG_LENGTH.unpack_from(buffer, position + header)
                    header += _LONG_LENGTH.size
                if available < header + size:
                    break
                start, position = position + header, position + header + size
                self._dispatch(pickle.loads(buffer[start:position]))
        except Exception:
            _log.exception("%s: reader stopped", self._name)
            self._detach()
        finally:
            del buffer[:position]

    def _detach(self) -> None:
        """On the loop: stop reading, close both ends, fail what is pending."""
        assert self._loop is not None
        try:
            self._loop.remove_reader(self._reader.fileno())
        except (OSError, ValueError, RuntimeError):  # already closed, or the loop is
            pass
        self._close_connections()
        self._shutdown()

    def _shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionError(f"{self._name}: peer is gone"))
        with self._turn:
            self._turn.notify_all()
        if self._on_close is not None:
            if self._loop is None:
                self._closed_handler()
                return
            try:  # it may wait for the child: never on the loop
                self._schedule(self._closed_handler)
            except RuntimeError:  # the pool is shut down already: its owner is closing, nothing waits
                self._closed_handler()

    def _closed_handler(self) -> None:
        assert self._on_close is not None
        try:
            self._on_close()
        except Exception:
            _log.exception("%s: close handler failed", self._name)

    def close(self) -> None:
        """Close both pipe ends; the reader (thread or loop) then fails what is pending."""
        if self._loop is None:
            self._close_connections()
        else:
            self._run_on_loop(self._detach)

    def _close_connections(self) -> None:
        for conn in (self._writer, self._reader):
            try:
                conn.close()
            except OSError:
                pass
