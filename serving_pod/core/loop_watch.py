"""Names the model that holds the event loop thread: a watch thread reporting an inline execution that lasts.

A model that runs on the loop thread (``schedulers/instances.py``: ``ferry_execution_mode: inline``, or moved
there by ``auto``) and then blocks there (a network call to this same server made from a helper module, a lock,
a computation that turned long) stops the whole server until it returns. Nothing can interrupt it, but the
operator should learn which model it is, and where it waits: every ``INTERVAL_S`` a daemon thread looks at the
loop thread's stack (``sys._current_frames``). When the very execution seen there at one look (the frame of
``schedulers.instances._run``, which runs inline and suspended executions on that thread) is still on that stack
at the next (the frame object itself, kept from one look to the next, so it cannot be a later call's), it logs a
warning naming the model, how long it has held the loop so far, and the model's stack, once per call. A suspended
execution leaves the loop at each wait, so it is reported only when the stack's top did not move between the two
looks (the same frame at the same line). The request path pays nothing for this: the watch only reads.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
import traceback
from types import FrameType

log = logging.getLogger("ferry.loop")

#: how often the watch looks at the loop thread's stack; a call it sees at two looks in a row has held the loop at
#: least this long
INTERVAL_S = 1.0
#: the function whose frame marks an execution on the loop thread, inline or suspended (``schedulers.instances._run``;
#: on the loop thread it runs only those)
_RUN = ("instances.py", "_run")


class LoopWatch:
    """Looks at one event loop thread every ``INTERVAL_S`` until ``stop``."""

    def __init__(self, loop_thread: int) -> None:
        self._loop_thread = loop_thread
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ferry-loop-watch", daemon=True)

    def start(self) -> LoopWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        # the execution's frame, the stack's top frame and its line at the last look (kept: they cannot be reused)
        seen: FrameType | None = None
        seen_top: FrameType | None = None
        seen_line = 0
        seen_at = 0.0
        reported: FrameType | None = None
        while not self._stopped.wait(INTERVAL_S):
            top = sys._current_frames().get(self._loop_thread)
            if top is None:  # the loop's thread has ended (a server stopped without shutting its engine down)
                return
            frame = _execution_frame(top)
            now = time.monotonic()
            if frame is not None and frame is seen and frame is not reported and (
                _inline(frame) or (top is seen_top and top.f_lineno == seen_line)
            ):
                reported = frame
                _report(frame, top, now - seen_at)
            elif frame is not seen:
                seen, seen_at = frame, now
            seen_top, seen_line = top, top.f_lineno
            del top, frame


def _execution_frame(top: FrameType) -> FrameType | None:
    """The frame of the execution (``_RUN``) on the stack ending at ``top``, if any."""
    for frame, _ in traceback.walk_stack(top):
        code = frame.f_code
        if code.co_name == _RUN[1] and code.co_filename.endswith(_RUN[0]) and "requests" in code.co_varnames:
            return frame
    return None


def _inline(frame: FrameType) -> bool:
    """Whether the execution runs inline (it holds the loop from start to end); else it runs suspended in a greenlet,
    and leaves the loop at each wait, so only a stack that did not move between two looks says it held it."""
    caller = frame.f_back
    return caller is not None and caller.f_code.co_name == "execute_inline"


def _report(frame: FrameType, top: FrameType, held_s: float) -> None:
    """The warning for the execution whose ``_RUN`` frame is ``frame``; ``top``: where it is now."""
    requests = frame.f_locals.get("requests") or [None]
    model = getattr(requests[0], "model_name", "?")
    above = list(itertools.takewhile(lambda step: step[0] is not frame, traceback.walk_stack(top)))
    stack = "".join(traceback.StackSummary.extract(reversed(above)).format())
    log.warning(
        "model '%s' has held the server's event loop thread for %.1f s or more: its execute runs there (parameter "
        "ferry_execution_mode), and the server answers nothing until it returns; if it waits on something (a "
        "network call, a lock), set ferry_execution_mode to 'thread'. Where it is:\n%s", model, held_s, stack)
