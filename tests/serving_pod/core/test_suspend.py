"""``core/suspend.py``: synchronous code run on the loop thread, suspended where it waits on an awaitable.

The code runs on the loop's own thread, the loop serves other tasks while it waits, a failed wait raises
in the code (which may catch it and go on), the resume hook runs before each continuation, the time held
on the loop leaves the waits out, and code that waits outside ``run`` gets a RuntimeError instead of a
deadlock. ``block``/``block_get`` count a thread's own waits.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from serving_pod.core import suspend


async def _later(value: object, delay: float = 0.0) -> object:
    await asyncio.sleep(delay)
    return value


async def _failing() -> None:
    await asyncio.sleep(0)
    raise ValueError("the wait failed")


async def test_the_code_runs_on_the_loop_thread_and_the_loop_goes_on_while_it_waits() -> None:
    seen: list[str] = []
    loop_thread = threading.get_ident()

    def code(x: int) -> int:
        assert suspend.suspendable()
        assert threading.get_ident() == loop_thread
        seen.append("code before")
        doubled = suspend.wait(_later(2 * x, 0.02))
        seen.append("code after")
        return doubled + 1

    async def other() -> None:
        await asyncio.sleep(0.005)
        seen.append("other")

    other_task = asyncio.create_task(other())
    assert await suspend.run(code, 20) == 41
    await other_task
    assert seen == ["code before", "other", "code after"]
    assert not suspend.suspendable()


async def test_a_failed_wait_raises_in_the_code_which_may_go_on() -> None:
    def code() -> str:
        try:
            suspend.wait(_failing())
        except ValueError as exc:
            return f"caught: {exc}; then {suspend.wait(_later('more'))}"
        return "not raised"

    assert await suspend.run(code) == "caught: the wait failed; then more"


async def test_an_exception_of_the_code_reaches_the_caller() -> None:
    def code() -> None:
        suspend.wait(_later(None))
        raise KeyError("model bug")

    with pytest.raises(KeyError, match="model bug"):
        await suspend.run(code)


async def test_resume_runs_before_each_continuation_and_blocked_time_leaves_the_waits_out() -> None:
    resumed: list[int] = []
    held = suspend.Run()

    def code() -> None:
        deadline = time.monotonic() + 0.02
        while time.monotonic() < deadline:  # holds the loop 20 ms
            pass
        for step in range(3):
            assert resumed == list(range(step))  # not yet resumed after this wait
            suspend.wait(_later(None, 0.05))  # 150 ms of waits in all

    await suspend.run(code, resume=lambda: resumed.append(len(resumed)), account=held)
    assert resumed == [0, 1, 2]
    assert 20_000_000 <= held.blocked_ns < 100_000_000


async def test_nested_runs_suspend_independently() -> None:
    def inner() -> str:
        return "inner " + suspend.wait(_later("waited"))

    def outer() -> str:
        return "outer(" + suspend.wait(suspend.run(inner)) + ")"

    assert await suspend.run(outer) == "outer(inner waited)"


def test_waiting_outside_run_is_refused() -> None:
    awaitable = _later(None)
    with pytest.raises(RuntimeError, match=r"suspend.wait\(\) outside suspend.run\(\)"):
        suspend.wait(awaitable)
    awaitable.close()


def test_a_threads_blocking_waits_are_counted() -> None:
    counted: list[int] = []
    walls: list[int] = []

    def timed(call: Callable[[], object]) -> object:
        started = time.monotonic_ns()
        try:
            return call()
        finally:
            walls.append(time.monotonic_ns() - started)

    def on_thread() -> None:
        start = suspend.waited_ns()
        answer: Future = Future()
        threading.Timer(0.03, answer.set_result, args=("done",)).start()
        assert timed(lambda: suspend.block(answer)) == "done"
        items: queue.Queue = queue.Queue()
        threading.Timer(0.03, items.put, args=("item",)).start()
        assert timed(lambda: suspend.block_get(items)) == "item"
        counted.append(suspend.waited_ns() - start)

    before = suspend.waited_ns()
    worker = threading.Thread(target=on_thread)
    worker.start()
    worker.join(10)
    # the timers start before the calls, so a busy host shortens the waits themselves; what is
    # counted is the time spent inside the two calls (at most their wall time, most of it)
    assert counted and len(walls) == 2
    assert sum(walls) // 2 <= counted[0] <= sum(walls)
    assert counted[0] >= 10_000_000
    assert suspend.waited_ns() == before  # the count is the thread's own
