"""What a batcher's wait for its queue delay costs the event loop thread: CPU and lateness per wait.

Waits as ``DynamicScheduler`` makes them (``LoopClock.call_later``, re-checked on firing until the delay is
over) on uvloop, one after another, for each delay; prints the loop thread's CPU time and how late the wait
ended, per wait. ``--spin-only`` measures the loop's own timers instead (no ``fine_timers``: a delay under a
millisecond re-checked on every loop turn, as before 2026-11-27), for an A/B in one checkout::

    python -m benchmarks.queue_delay                 # 100, 200 and 500 us, 2000 waits each
    python -m benchmarks.queue_delay --spin-only
"""

from __future__ import annotations

import argparse
import asyncio
import time

from serving_pod.schedulers import clock


async def wait(loop_clock: clock.LoopClock, delay_ns: int) -> int:
    """Arm, and on firing re-check and arm again for what is left, as the batchers do; returns the number of
    timers armed."""
    loop, deadline, armed = asyncio.get_running_loop(), time.monotonic_ns() + delay_ns, 0
    while (left := deadline - time.monotonic_ns()) > 0:
        fired = loop.create_future()
        loop_clock.call_later(left, lambda fired=fired: fired.set_result(None))
        armed += 1
        await fired
    return armed


async def measure(delays_us: list[int], waits: int) -> list[tuple[int, float, float]]:
    """(delay µs, CPU µs per wait, µs late per wait) for each delay."""
    loop_clock, rows = clock.LoopClock(), []
    for delay_us in delays_us:
        await wait(loop_clock, delay_us * 1000)
        cpu, wall = time.thread_time_ns(), time.monotonic_ns()
        for _ in range(waits):
            await wait(loop_clock, delay_us * 1000)
        cpu_us = (time.thread_time_ns() - cpu) / waits / 1000
        late_us = (time.monotonic_ns() - wall) / waits / 1000 - delay_us
        rows.append((delay_us, cpu_us, late_us))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.queue_delay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--delays-us", default="100,200,500", help="comma list of delays in microseconds")
    p.add_argument("--waits", type=int, default=2000)
    p.add_argument("--spin-only", action="store_true", help="the loop's own timers, no fine_timers")
    args = p.parse_args(argv)
    try:
        delays = [int(d) for d in args.delays_us.split(",")]
    except ValueError:
        p.error(f"--delays-us must be a comma list of integers, got {args.delays_us!r}")
    if args.waits < 1 or min(delays) < 1:
        p.error("--waits and every delay must be at least 1")
    import uvloop

    label = "loop timers only" if args.spin_only else f"fine timers, last {clock.SPIN_NS // 1000} us re-checked"
    print(f"{label}: per wait, on the loop thread")
    fine_timers = clock.fine_timers
    if args.spin_only:
        clock.fine_timers = lambda loop: None  # type: ignore[assignment]
    try:
        rows = uvloop.run(measure(delays, args.waits))
    finally:
        clock.fine_timers = fine_timers  # type: ignore[assignment]
    for delay_us, cpu_us, late_us in rows:
        print(f"  {delay_us:5d} us delay: CPU {cpu_us:6.1f} us, ended {late_us:5.1f} us late")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
