"""``InstancePool.execute``: where each instance's execution runs, and that nothing it does raises.

Instances here implement the backend interface directly (``execute``, ``close`` and, for the on-loop path,
``execute_on_loop``), so each path is driven on its own: on the instance's thread, awaited on the loop,
the on-loop path declining (None: the thread runs it) and a backend that raises on either path; the
GIL hand-off to the worker thread of an instance that declares ``releases_gil``; and an instance that blocks
on the engine (``suspends_on_engine``: a BLS model) moving to the loop thread, suspended at its waits, and
back to its thread when it holds the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, AsyncIterator

import numpy as np
import pytest

from serving_pod.core import suspend
from serving_pod.core.errors import InternalError
from serving_pod.core.statistics import ModelStats
from serving_pod.core.types import InferRequest, InferResponse, Tensor
from serving_pod.schedulers import instances
from serving_pod.schedulers.instances import InstancePool


def _request(value: float) -> InferRequest:
    return InferRequest("m", "1", [Tensor("X", "FP32", np.array([value], np.float32))])


def _answer(request: InferRequest, where: str) -> InferResponse:
    x = request.inputs[0].data
    return InferResponse("m", "1", [Tensor("Y", "FP32", x * 2)], parameters={"where": where})


class Threaded:
    """Executes on whatever thread calls it."""

    def execute(self, requests: list[InferRequest]) -> list[Any]:
        return [_answer(r, threading.current_thread().name) for r in requests]

    def close(self) -> None:
        pass


class OnLoop(Threaded):
    """Answers on the loop when ``accept`` holds, else declines to the thread; ``fail`` raises."""

    def __init__(self, accept: bool = True, fail: bool = False) -> None:
        self.accept, self.fail = accept, fail

    def execute_on_loop(self, requests: list[InferRequest]) -> Any:
        if self.fail:
            raise RuntimeError("backend bug")
        if not self.accept:
            return None

        async def answered() -> list[Any]:
            await asyncio.sleep(0)
            return [_answer(r, "loop") for r in requests]

        return answered()


class Gated(Threaded):
    """Releases the GIL as a framework call would: waits for ``go`` once it has ``entered``."""

    releases_gil = True

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()

    def execute(self, requests: list[InferRequest]) -> list[Any]:
        self.entered.set()
        self.go.wait(30)
        return super().execute(requests)


class Raising(Threaded):
    def execute(self, requests: list[InferRequest]) -> list[Any]:
        raise RuntimeError("execute blew up")


def _pool(instance: Any, execution_mode: str = "thread") -> InstancePool:
    return InstancePool([instance], ["m_0"], ModelStats("m", "1"), lambda r: 1, execution_mode=execution_mode)


async def _run(instance: Any, count: int = 2) -> tuple[list[Any], InstancePool]:
    pool = _pool(instance)
    try:
        results = await pool.execute(0, [_request(i) for i in range(count)])
    finally:
        await asyncio.to_thread(pool.close)
    return results, pool


async def test_a_plain_instance_runs_on_its_own_thread() -> None:
    results, pool = await _run(Threaded())
    loop_thread = threading.current_thread().name
    assert all(r.parameters["where"].startswith("m_0") and r.parameters["where"] != loop_thread for r in results)
    assert [r.outputs[0].data.tolist() for r in results] == [[0.0], [2.0]]
    assert pool.stats.execution_count == 1 and pool.stats.inference_count == 2


async def test_an_on_loop_instance_is_awaited_on_the_loop() -> None:
    results, pool = await _run(OnLoop())
    assert [r.parameters["where"] for r in results] == ["loop", "loop"]
    assert pool.stats.execution_count == 1 and pool.stats.inference_count == 2


async def test_declining_sends_the_execution_to_the_thread() -> None:
    results, _ = await _run(OnLoop(accept=False))
    assert all(r.parameters["where"].startswith("m_0") for r in results)


async def test_a_raising_backend_fails_its_requests_on_either_path() -> None:
    for instance, message in ((OnLoop(fail=True), "RuntimeError: backend bug"),
                              (Raising(), "RuntimeError: execute blew up")):
        results, _ = await _run(instance)
        assert [type(r) for r in results] == [InternalError, InternalError]
        assert all(r.message == message for r in results)


async def test_a_closed_pool_fails_requests_instead_of_raising() -> None:
    pool = _pool(Threaded())
    await asyncio.to_thread(pool.close)  # its worker thread is gone
    results = await pool.execute(0, [_request(1)])
    assert isinstance(results[0], InternalError) and "cannot schedule new futures" in results[0].message


async def test_a_freed_instance_goes_to_the_callers_waiting_first() -> None:
    """First come, first served: a caller whose ``acquire`` runs after the instance came free but before the woken
    waiter does (a request read in the same loop turn) queues behind the waiters instead of taking it (an
    ``asyncio.Queue`` let it: at c=16 on one BLS instance, p50 0.8 ms against p99 72 ms)."""
    pool = _pool(Threaded())
    order: list[str] = []

    async def take(name: str) -> None:
        index = await pool.acquire()
        order.append(name)
        await asyncio.sleep(0)
        pool.release(index)

    try:
        first = await pool.acquire()
        waiters = [asyncio.create_task(take(name)) for name in "abc"]
        await asyncio.sleep(0)  # all three wait
        assert pool.try_acquire() is None
        late = asyncio.create_task(take("late"))  # its first step runs before the woken waiter's
        pool.release(first)
        await asyncio.gather(*waiters, late)
        assert order == ["a", "b", "c", "late"]
        cancelled = asyncio.create_task(take("gone"))
        held = await pool.acquire()
        await asyncio.sleep(0)
        cancelled.cancel()  # a waiter that leaves is forgotten: the instance comes back idle
        await asyncio.gather(cancelled, return_exceptions=True)
        pool.release(held)
        assert pool.idle_count() == 1 and pool.try_acquire() == 0
    finally:
        await asyncio.to_thread(pool.close)


class Later(Threaded):
    """Answers every request later, through a ``concurrent.futures.Future`` the test sets (a python model's sender)."""

    def __init__(self) -> None:
        self.owed: list[Future] = []

    def execute(self, requests: list[InferRequest]) -> list[Any]:
        self.owed = [Future() for _ in requests]
        return list(self.owed)


def _counted(stats: ModelStats) -> tuple[int, int, int, dict[str, int]]:
    return stats.success.count, stats.fail.count, stats.inference_count, {k: v for k, v in stats.failures.items() if v}


async def test_a_request_answered_later_counts_a_success_when_its_execution_ends() -> None:
    """As Triton 2.51's python backend (``PbMetricReporter``): counted at the end of ``execute``, before the answer;
    a caller that went away (its future cancelled) or an error answer changes nothing."""
    instance = Later()
    pool = _pool(instance)
    try:
        gone, errs = await pool.execute(0, [_request(1), _request(2)], answers_later=True)
        assert _counted(pool.stats) == (2, 0, 2, {}) and pool.stats.execution_count == 1
        gone.cancel()  # the client left (Ferry counted a BACKEND failure for it)
        instance.owed[1].set_result(InternalError("the model's answer failed"))
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert isinstance(await errs, InternalError)
        await asyncio.sleep(0)
        assert _counted(pool.stats) == (2, 0, 2, {})
    finally:
        await asyncio.to_thread(pool.close)


async def test_a_caller_that_waits_for_a_later_answer_gets_its_error_counted_a_success() -> None:
    """Without ``answers_later`` the execution lasts until the answer is in; an error given later is the caller's
    answer (as the client's) but counts a success, as Triton counted it when ``execute`` returned."""
    instance = Later()
    pool = _pool(instance)
    try:
        running = asyncio.ensure_future(pool.execute(0, [_request(1)]))
        while not instance.owed:
            await asyncio.sleep(0.001)
        instance.owed[0].set_result(InternalError("unloaded before it answered"))
        (result,) = await running
        assert isinstance(result, InternalError) and result.message == "unloaded before it answered"
        assert _counted(pool.stats) == (1, 0, 1, {})
    finally:
        await asyncio.to_thread(pool.close)


@contextlib.asynccontextmanager
async def _gated(monkeypatch: pytest.MonkeyPatch, handoff_timeout_s: float) -> AsyncIterator[tuple[Gated, InstancePool]]:
    """A ``Gated`` instance's pool, with no forced GIL switch (CPython's 5 ms): only the hand-off decides who runs."""
    monkeypatch.setattr(instances, "HANDOFF_TIMEOUT_S", handoff_timeout_s, raising=False)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    instance = Gated()
    pool = _pool(instance)
    try:
        yield instance, pool
    finally:
        instance.go.set()
        await asyncio.to_thread(pool.close)
        sys.setswitchinterval(interval)


async def test_a_gil_releasing_instance_is_running_when_execute_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    async with _gated(monkeypatch, 30.0) as (instance, pool):
        instance.go.set()
        await pool.execute(0, [_request(0)])  # the worker thread exists (starting one releases the GIL)
        instance.entered.clear()
        instance.go.clear()
        pending = pool.execute(0, [_request(1), _request(2)])
        # the loop waited, GIL released, until the worker ran into the (GIL-free) framework call
        assert instance.entered.is_set()
        instance.go.set()
        results = await pending
    assert [r.outputs[0].data.tolist() for r in results] == [[2.0], [4.0]]
    assert pool.stats.execution_count == 2 and pool.stats.inference_count == 3


async def test_a_hand_off_to_a_busy_worker_gives_up_and_the_execution_still_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with _gated(monkeypatch, 0.05) as (instance, pool):
        first = pool.execute(0, [_request(1)])
        assert instance.entered.is_set()
        second = pool.execute(0, [_request(3)])  # its worker is busy: the loop stops waiting after the timeout
        instance.go.set()
        results = [*(await first), *(await second)]
    assert [r.outputs[0].data.tolist() for r in results] == [[2.0], [6.0]]
    assert pool.stats.execution_count == 2


# -- when an ``auto`` instance goes inline: its threaded executions' CPU and wall times ----------------------

FAST_CPU = instances.INLINE_ENTER_NS // 10
SLOW_WALL = instances.INLINE_EXIT_NS * 2
QUICK_WALL = instances.INLINE_EXIT_NS // 10


def _executions_until_inline(walls: list[int], cpu_ns: int = FAST_CPU, limit: int = 2000,
                             cpu_bound: bool = False) -> int | None:
    """Threaded executions (wall times cycled from ``walls``) until the mode goes inline; None if it never does."""
    mode = instances._Mode(allowed=True, forced=False, cpu_bound=cpu_bound)
    for count in range(1, limit + 1):
        mode.after_thread(walls[count % len(walls)], cpu_ns)
        if mode.inline:
            return count
    return None


def test_a_fast_instance_goes_inline_after_one_window():
    assert _executions_until_inline([QUICK_WALL]) == instances.INLINE_WINDOW


def test_a_fast_instance_whose_thread_waits_for_the_gil_now_and_then_still_goes_inline():
    # one execution in 8 waits past INLINE_EXIT_NS for the GIL (a busy loop): before, each reset the streak
    assert _executions_until_inline([SLOW_WALL] + [QUICK_WALL] * 7) == instances.INLINE_WINDOW


def test_instances_that_wait_or_compute_stay_on_their_thread():
    assert _executions_until_inline([SLOW_WALL]) is None  # sleeps or waits on I/O every time
    assert _executions_until_inline([SLOW_WALL, SLOW_WALL, QUICK_WALL]) is None  # most of the time
    assert _executions_until_inline([QUICK_WALL], cpu_ns=instances.INLINE_ENTER_NS) is None  # too much CPU


def test_a_cpu_bound_instance_is_judged_by_its_cpu_time_alone():
    # an onnxruntime session on the CPU whose thread waits for the GIL or a core most of the time (a busy host)
    assert _executions_until_inline([SLOW_WALL], cpu_bound=True) == instances.INLINE_WINDOW
    assert _executions_until_inline([SLOW_WALL], cpu_ns=instances.INLINE_ENTER_NS, cpu_bound=True) is None


def test_a_slow_execution_restarts_the_count():
    mode = instances._Mode(allowed=True, forced=False)
    for _ in range(instances.INLINE_WINDOW - 1):
        mode.after_thread(QUICK_WALL, FAST_CPU)
    mode.after_thread(QUICK_WALL, instances.INLINE_ENTER_NS)  # one execution with too much CPU
    for _ in range(instances.INLINE_WINDOW - 1):
        mode.after_thread(QUICK_WALL, FAST_CPU)
    assert not mode.inline
    mode.after_thread(QUICK_WALL, FAST_CPU)
    assert mode.inline


def _inline_executions_until_thread(walls: list[int], limit: int = 2000) -> int | None:
    """Inline executions (wall times cycled from ``walls``) until the mode goes back to the thread; None if never."""
    mode = instances._Mode(allowed=True, forced=False, cpu_bound=True)
    mode.inline = True
    for count in range(1, limit + 1):
        mode.after_inline(walls[(count - 1) % len(walls)])
        if not mode.inline:
            return count
    return None


def test_a_model_that_turns_slow_inline_goes_back_to_its_thread_once_it_held_the_loop_long_enough():
    just_slow = instances.INLINE_EXIT_NS * 5 // 4
    assert _inline_executions_until_thread([just_slow]) == math.ceil(instances.INLINE_EXIT_HELD_NS / just_slow)
    assert _inline_executions_until_thread([instances.INLINE_EXIT_HELD_NS]) == instances.INLINE_EXIT_STRIKES
    assert _inline_executions_until_thread([10 * instances.INLINE_EXIT_HELD_NS]) == instances.INLINE_EXIT_STRIKES


def test_short_slow_spells_of_the_host_do_not_send_an_inline_instance_back():
    # five executions in a row at 1.5x the limit, then a usual one, over and over: a slow host, not a slow model
    # (with two strikes alone it went back at the second execution)
    spell = [instances.INLINE_EXIT_NS * 3 // 2] * 5
    assert _inline_executions_until_thread(spell + [QUICK_WALL]) is None
    assert _inline_executions_until_thread(spell * 10) == math.ceil(instances.INLINE_EXIT_HELD_NS / spell[0])


# -- an instance that blocks on the engine (a BLS model): on the loop thread, suspended at its waits --------


async def _engine_answer(value: float, delay_s: float) -> float:
    await asyncio.sleep(delay_s)
    return value


class Calling(Threaded):
    """Each execution waits ``wait_s`` on an "engine call" as a BLS model's ``exec()`` does (suspended on the loop
    thread, blocked on its own), then holds the thread ``hold_s`` (busy, or asleep when ``sleeps``)."""

    suspends_on_engine = True

    def __init__(self, loop: asyncio.AbstractEventLoop, wait_s: float = 0.003) -> None:
        self.loop, self.wait_s = loop, wait_s
        self.hold_s, self.sleeps = 0.0, False
        self.resumed = 0

    def on_resume(self) -> None:
        self.resumed += 1

    def execute(self, requests: list[InferRequest]) -> list[Any]:
        where = threading.current_thread().name
        call = _engine_answer(2.0, self.wait_s)
        if suspend.suspendable():
            factor = suspend.wait(call)
        else:
            factor = suspend.block(asyncio.run_coroutine_threadsafe(call, self.loop))
        if self.sleeps:
            time.sleep(self.hold_s)
        else:
            deadline = time.monotonic() + self.hold_s
            while time.monotonic() < deadline:
                pass
        return [InferResponse("m", "1", [Tensor("Y", "FP32", r.inputs[0].data * factor)], parameters={"where": where})
                for r in requests]


async def _wheres(pool: InstancePool, count: int) -> list[str]:
    wheres = []
    for value in range(count):
        (result,) = await pool.execute(0, [_request(value)])
        assert result.outputs[0].data.tolist() == [2.0 * value]
        wheres.append(result.parameters["where"])
    return wheres


#: the limits these tests run under: far above what a busy host adds to an execution's CPU and wall time (a
#: thread's CPU for the same code here varies from 150 to 650 us, GIL waits add milliseconds), far under the
#: engine waits they make
EXIT_NS = 20_000_000
ENTER_NS = 5_000_000


def _limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instances, "INLINE_EXIT_NS", EXIT_NS)
    monkeypatch.setattr(instances, "INLINE_ENTER_NS", ENTER_NS)


async def test_an_instance_blocking_on_the_engine_moves_to_the_loop_its_waits_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every execution waits 30 ms (over INLINE_EXIT_NS) on the engine, yet holds its thread for far less: after one
    window it runs on the loop thread, suspended while it waits, never counted as an inline (non-suspending) one."""
    _limits(monkeypatch)
    instance = Calling(asyncio.get_running_loop(), wait_s=0.03)
    pool = _pool(instance, "auto")
    loop_thread = threading.current_thread().name
    try:
        wheres = await _wheres(pool, instances.INLINE_WINDOW + 3)
        assert not pool.runs_inline(0)
    finally:
        await asyncio.to_thread(pool.close)
    assert all(w.startswith("m_0") for w in wheres[:instances.INLINE_WINDOW])
    assert wheres[instances.INLINE_WINDOW:] == [loop_thread] * 3
    assert instance.resumed == 3  # once after each suspended execution's wait
    assert pool.stats.execution_count == pool.stats.inference_count == instances.INLINE_WINDOW + 3


async def test_a_suspended_instance_that_holds_the_loop_goes_back_to_its_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    _limits(monkeypatch)
    instance = Calling(asyncio.get_running_loop(), wait_s=0.0)
    pool = _pool(instance, "auto")
    try:
        await _wheres(pool, instances.INLINE_WINDOW)
        assert (await _wheres(pool, 1))[0] == threading.current_thread().name
        instance.hold_s = 2 * EXIT_NS / 1e9  # its code now holds the loop 40 ms per execution
        wheres = await _wheres(pool, instances.INLINE_EXIT_STRIKES + 2)
    finally:
        await asyncio.to_thread(pool.close)
    assert wheres[instances.INLINE_EXIT_STRIKES - 1] == threading.current_thread().name
    assert all(w.startswith("m_0") for w in wheres[instances.INLINE_EXIT_STRIKES:])


async def test_instances_blocking_otherwise_or_told_to_use_a_thread_stay_on_their_thread() -> None:
    sleeper = Calling(asyncio.get_running_loop(), wait_s=0.0)
    sleeper.hold_s, sleeper.sleeps = 2 * instances.INLINE_EXIT_NS / 1e9, True  # time.sleep: no engine wait
    for instance, mode in ((sleeper, "auto"), (Calling(asyncio.get_running_loop()), "thread")):
        pool = _pool(instance, mode)
        try:
            wheres = await _wheres(pool, instances.INLINE_WINDOW + 2)
        finally:
            await asyncio.to_thread(pool.close)
        assert all(w.startswith("m_0") for w in wheres), mode


async def test_a_forced_inline_instance_blocking_on_the_engine_runs_suspended_from_the_first_execution() -> None:
    instance = Calling(asyncio.get_running_loop(), wait_s=0.05)
    pool = _pool(instance, "inline")
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    ticker = asyncio.create_task(ticking())
    try:
        wheres = await _wheres(pool, 2)
    finally:
        ticker.cancel()
        await asyncio.to_thread(pool.close)
    assert wheres == [threading.current_thread().name] * 2
    assert ticks >= 5  # the loop went on during the 100 ms of waits
