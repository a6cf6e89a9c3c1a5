"""Timers to the microsecond on the event loop (``fine_timers``) and ``LoopClock``'s waits on them.

Each case runs on asyncio's own loop and on uvloop (the server's). Nothing asserts how fast this machine is:
timers are checked never to fire before their deadline, and a sub-millisecond wait to leave the loop asleep
for most of it (its thread's CPU time against the wall time waited, a ratio with a wide margin: a loop that
re-checks on every turn spends about all of it).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from typing import Any, Callable, Coroutine

import pytest

from benchmarks.queue_delay import wait  # arms and re-checks as the batchers do
from serving_pod.schedulers import clock as clock_module
from serving_pod.schedulers.clock import SPIN_NS, LoopClock
from serving_pod.schedulers.fine_timers import FineTimers, fine_timers

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")


def _asyncio_run(main: Coroutine) -> Any:
    return asyncio.run(main)


def _uvloop_run(main: Coroutine) -> Any:
    uvloop = pytest.importorskip("uvloop")
    return uvloop.run(main)


@pytest.fixture(params=[_asyncio_run, _uvloop_run], ids=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine], Any]:
    return request.param


def _timers() -> FineTimers:
    timers = fine_timers(asyncio.get_running_loop())
    assert timers is not None
    return timers


def test_timers_fire_in_deadline_order_and_never_early(run) -> None:
    async def main() -> list[tuple[str, int, int]]:
        timers, fired = _timers(), []
        done = asyncio.get_running_loop().create_future()
        now = time.monotonic_ns()
        for label, delay_us in (("3ms", 3000), ("1ms", 1000), ("300us", 300), ("past", -500)):
            at = now + delay_us * 1000
            timers.call_at(at, lambda label=label, at=at: fired.append((label, at, time.monotonic_ns())))
        timers.call_at(now + 3_500_000, lambda: done.set_result(None))
        await asyncio.wait_for(done, 5)
        return fired

    fired = run(main())
    assert [label for label, _, _ in fired] == ["past", "300us", "1ms", "3ms"]
    assert all(when >= at for _, at, when in fired)


def test_a_cancelled_timer_never_runs_and_later_ones_still_do(run) -> None:
    async def main() -> list[str]:
        timers, fired = _timers(), []
        done = asyncio.get_running_loop().create_future()
        first = timers.call_later(200_000, lambda: fired.append("cancelled"))
        timers.call_later(600_000, lambda: fired.append("kept"))
        timers.call_later(800_000, lambda: done.set_result(None))
        first.cancel()
        await asyncio.wait_for(done, 5)
        await asyncio.sleep(0.002)
        return fired

    assert run(main()) == ["kept"]


def test_a_failing_callback_is_reported_and_the_other_timers_run(run) -> None:
    async def main() -> tuple[list[str], list[dict]]:
        loop, timers, fired, reported = asyncio.get_running_loop(), _timers(), [], []
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        done = loop.create_future()

        def fail() -> None:
            raise ValueError("timer callback bug")

        timers.call_later(100_000, fail)
        timers.call_later(100_000, lambda: fired.append("same deadline"))
        timers.call_later(500_000, lambda: fired.append("later"))
        timers.call_later(700_000, lambda: done.set_result(None))
        await asyncio.wait_for(done, 5)
        return fired, reported

    fired, reported = run(main())
    assert fired == ["same deadline", "later"]
    assert [type(c["exception"]) for c in reported] == [ValueError]
    assert "fine timer" in reported[0]["message"]


def test_a_callback_may_arm_the_next_timer(run) -> None:
    async def main() -> int:
        timers, count = _timers(), [0]
        done = asyncio.get_running_loop().create_future()

        def tick() -> None:
            count[0] += 1
            if count[0] < 20:
                timers.call_later(100_000, tick)
            else:
                done.set_result(None)

        timers.call_later(100_000, tick)
        await asyncio.wait_for(done, 5)
        return count[0]

    assert run(main()) == 20


def test_each_loop_has_its_own_timerfd_closed_with_the_loop() -> None:
    async def fd() -> int:
        timers = _timers()
        assert fine_timers(asyncio.get_running_loop()) is timers  # one per loop
        return timers.fd

    loop = asyncio.new_event_loop()
    first = loop.run_until_complete(fd())
    second = asyncio.run(fd())
    assert first != second
    assert _target(first) == "anon_inode:[timerfd]"  # still open while its loop lives
    loop.close()
    del loop
    gc.collect()
    assert _target(first) != "anon_inode:[timerfd]"  # closed (or the number reused by something else)


def _target(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def test_a_sub_millisecond_wait_sleeps_until_its_last_stretch(run) -> None:
    """A batcher's 800 µs ``max_queue_delay``: the loop sleeps on the timerfd to ``SPIN_NS`` before the end,
    then re-checks on each turn (the last stretch). Before fine timers it re-checked on every turn
    throughout, spending about the whole wait on CPU."""
    delay_ns, waits = 800_000, 40

    async def main() -> tuple[int, int, int]:
        clock = LoopClock()
        await wait(clock, delay_ns)  # the loop's timerfd is made on first use
        cpu, wall = time.thread_time_ns(), time.monotonic_ns()
        for _ in range(waits):
            await wait(clock, delay_ns)
        return time.thread_time_ns() - cpu, time.monotonic_ns() - wall, waits * delay_ns

    cpu_ns, wall_ns, waited_ns = run(main())
    assert wall_ns >= waited_ns  # never shorter than asked
    assert cpu_ns < 0.4 * wall_ns, f"{cpu_ns / 1e6:.1f} ms of CPU over {wall_ns / 1e6:.1f} ms of waits"
    assert SPIN_NS < delay_ns


def test_without_a_timerfd_waits_fall_back_to_the_loops_timers(run, monkeypatch) -> None:
    """Where ``fine_timers`` has none (not Linux): whole milliseconds on the loop's timers, then turns."""
    monkeypatch.setattr(clock_module, "fine_timers", lambda loop: None)
    delays: list[float] = []
    whole_ms = clock_module.early_delay_s
    monkeypatch.setattr(clock_module, "early_delay_s", lambda ns: delays.append(whole_ms(ns)) or delays[-1])

    async def main() -> tuple[int, int]:
        started = time.monotonic_ns()
        armed = await wait(LoopClock(), 1_300_000)
        return armed, time.monotonic_ns() - started

    armed, wall_ns = run(main())
    # 1 ms on the loop's timer, then (unless that timer fired late) re-checks on the next turns for the rest
    assert delays[0] == 0.001 and delays[1:] == [0.0] * (armed - 1)
    assert wall_ns >= 1_300_000
