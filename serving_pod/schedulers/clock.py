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


class LoopClock:
    """``time.monotonic_ns`` and the event loop's timers (both read the same monotonic clock)."""

    now_ns = staticmethod(time.monotonic_ns)

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(delay_ns / 1e9, callback)
