"""Time as schedulers see it: a monotonic nanosecond clock and one-shot timers.

``LoopClock`` (``time.monotonic_ns`` + the running event loop's ``call_later``) is what servers use;
tests pass their own ``Clock`` to drive queue delays and timeouts without sleeping.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic time in nanoseconds and a timer that fires ``callback`` after ``delay_ns``."""

    def now_ns(self) -> int: ...

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> TimerHandle: ...


def early_delay_s(delay_ns: int) -> float:
    """A timer delay in seconds that never fires after ``delay_ns``: its whole milliseconds only.

    uvloop keeps timers in whole milliseconds and rounds to the nearest, so 1.5 ms would fire at 2 ms,
    half a millisecond past a ``max_queue_delay_microseconds`` of 1500. Callers re-check when the timer
    fires and wait again for what is left; under a millisecond that is the next loop iteration.
    """
    return (delay_ns // 1_000_000) / 1000


class LoopClock:
    """``time.monotonic_ns`` and the event loop's timers (both read the same monotonic clock)."""

    now_ns = staticmethod(time.monotonic_ns)

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> TimerHandle:
        """Fires ``callback`` at most ``delay_ns`` from now (``early_delay_s``); the caller re-checks."""
        return asyncio.get_running_loop().call_later(early_delay_s(delay_ns), callback)
