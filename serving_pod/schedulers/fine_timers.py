"""Timers to the microsecond on an event loop, without polling: one Linux ``timerfd`` per loop.

The event loops keep timers in whole milliseconds (uvloop rounds, asyncio's epoll rounds its wait up), so a
``max_queue_delay_microseconds`` of 100 could only be waited for by re-checking on every loop turn: the loop
never slept while a batch waited, and burned a core the clients and the model needed. Here each loop gets one
``timerfd`` (``CLOCK_MONOTONIC``, the clock of ``time.monotonic_ns``) watched by ``add_reader``; a heap of
deadlines keeps it armed (absolute time) for the earliest, and the loop sleeps in epoll until then.

``fine_timers(loop)`` gives the loop's ``FineTimers``, or ``None`` where there is no ``timerfd`` (not Linux);
callers then fall back to the loop's own timers. Everything runs on the loop's thread.
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import logging
import os
import sys
import time
import weakref
from typing import Callable

log = logging.getLogger("ferry.scheduler")

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = 0o2000000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class FineHandle:
    """One pending timer; ``cancel`` keeps its callback from running (it is dropped from the heap lazily)."""

    __slots__ = ("at_ns", "seq", "callback", "cancelled")

    def __init__(self, at_ns: int, seq: int, callback: Callable[[], None]) -> None:
        self.at_ns = at_ns
        self.seq = seq
        self.callback = callback
        self.cancelled = False

    def __lt__(self, other: FineHandle) -> bool:
        return (self.at_ns, self.seq) < (other.at_ns, other.seq)

    def cancel(self) -> None:
        self.cancelled = True


class FineTimers:
    """The timers of one event loop, all on one ``timerfd`` armed for the earliest deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, settime: Callable) -> None:
        self._loop = weakref.ref(loop)  # not the loop itself: it is the key of ``_timers``, which holds this
        self.fd = fd
        self._settime = settime
        self._spec = _Itimerspec()
        self._heap: list[FineHandle] = []
        self._armed_ns = 0  # the deadline the timerfd is set for; 0 while disarmed
        self._seq = itertools.count()
        loop.add_reader(fd, self._fire)

    def call_at(self, at_ns: int, callback: Callable[[], None]) -> FineHandle:
        """Run ``callback`` on the loop once ``time.monotonic_ns()`` reaches ``at_ns`` (at once if it has)."""
        handle = FineHandle(at_ns, next(self._seq), callback)
        heapq.heappush(self._heap, handle)
        if not self._armed_ns or at_ns < self._armed_ns:
            self._arm(at_ns)
        return handle

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> FineHandle:
        return self.call_at(time.monotonic_ns() + max(0, delay_ns), callback)

    def _arm(self, at_ns: int) -> None:
        value = self._spec.it_value
        # 0 would disarm the timerfd: a deadline at the epoch of the clock is in the past anyway
        value.tv_sec, value.tv_nsec = divmod(max(at_ns, 1), 1_000_000_000)
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self._armed_ns = at_ns

    def _fire(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:  # a re-arm after the expiry it would report
            pass
        self._armed_ns = 0
        heap = self._heap
        now = time.monotonic_ns()
        while heap and (heap[0].cancelled or heap[0].at_ns <= now):
            handle = heapq.heappop(heap)
            if handle.cancelled:
                continue
            try:
                handle.callback()
            except Exception as exc:  # one timer's failure must not stop the others
                loop = self._loop()
                if loop is not None:
                    loop.call_exception_handler({"message": "exception in a fine timer callback", "exception": exc})
        # the loop above stops at a live timer not yet due (cancelled ones at the top were dropped)
        if heap and (not self._armed_ns or heap[0].at_ns < self._armed_ns):
            self._arm(heap[0].at_ns)


_timers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FineTimers | None] = weakref.WeakKeyDictionary()


def _libc_timerfd() -> tuple[Callable, Callable] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes, create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.POINTER(_Itimerspec)]
    settime.restype = ctypes.c_int
    return create, settime


def fine_timers(loop: asyncio.AbstractEventLoop) -> FineTimers | None:
    """``loop``'s fine timers, made on first use; ``None`` where the platform has no ``timerfd``."""
    try:
        return _timers[loop]
    except KeyError:
        pass
    timers: FineTimers | None = None
    calls = _libc_timerfd()
    if calls is not None:
        create, settime = calls
        fd = create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            log.warning("timerfd_create failed (errno %d): queue delays re-check on every loop turn",
                        ctypes.get_errno())
        else:
            try:
                timers = FineTimers(loop, fd, settime)
            except (NotImplementedError, RuntimeError, OSError):  # a loop that cannot watch an fd
                os.close(fd)
            else:
                weakref.finalize(loop, os.close, fd)
    _timers[loop] = timers
    return timers
