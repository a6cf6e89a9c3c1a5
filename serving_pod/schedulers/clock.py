"""Time as schedulers see it: a monotonic nanosecond clock and one-shot timers.

``LoopClock`` (``time.monotonic_ns`` + timers to the microsecond on the running event loop, ``fine_timers``)
is what servers use; tests pass their own ``Clock`` to drive queue delays and timeouts without sleeping.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol

from serving_pod.schedulers.fine_timers import fine_timers


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic time in nanoseconds and a timer that fires ``callback`` after ``delay_ns``."""

    def now_ns(self) -> int: ...

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> TimerHandle: ...


def early_delay_s(delay_ns: int) -> float:
    """A timer delay in seconds that never fires after ``delay_ns``: its whole milliseconds only (for the
    loop's own timers, where there are no ``fine_timers``).

    uvloop keeps timers in whole milliseconds and rounds to the nearest, so 1.5 ms would fire at 2 ms,
    half a millisecond past a ``max_queue_delay_microseconds`` of 1500. Callers re-check when the timer
    fires and wait again for what is left; under a millisecond that is the next loop iteration.
    """
    return (delay_ns // 1_000_000) / 1000


#: the last stretch of a wait spent re-checking on every loop turn instead of asleep: a sleeping loop thread
#: takes tens of microseconds to wake (more on a virtual machine), which a request waiting for its batch would
#: pay in latency on every batch at low load
SPIN_NS = 50_000


class LoopClock:
    """``time.monotonic_ns`` and timers on the running event loop (both read the same monotonic clock)."""

    now_ns = staticmethod(time.monotonic_ns)

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> TimerHandle:
        """Fires ``callback`` at most ``delay_ns`` from now; the caller re-checks and waits again for what is
        left. The loop sleeps on its ``fine_timers`` until ``SPIN_NS`` before the end, then the last stretch
        is the next loop turn (re-checked on every turn). Where there are no ``fine_timers``, the loop's own
        timers in whole milliseconds (``early_delay_s``)."""
        loop = asyncio.get_running_loop()
        timers = fine_timers(loop) if delay_ns > SPIN_NS else None
        if timers is not None:
            return timers.call_later(delay_ns - SPIN_NS, callback)
        return loop.call_later(early_delay_s(delay_ns), callback)
