"""``DefaultScheduler``: requests wait in line for a busy instance, but never for one that runs inline.

The instances implement the backend interface directly. One whose first execution waits on a gate on its thread
stands for a fast model's first executions, judged on its thread before it moves to the loop: the requests that
come meanwhile wait in line, and once it runs inline a request that comes later runs as it comes instead of
joining that line (with load coming as fast as the line drained, it stayed for good).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from serving_pod.core.errors import UnavailableError
from serving_pod.core.statistics import ModelStats
from serving_pod.core.types import InferRequest, InferResponse, Tensor
from serving_pod.schedulers import instances
from serving_pod.schedulers.default import DefaultScheduler
from serving_pod.schedulers.instances import InstancePool


def _request(value: float) -> InferRequest:
    return InferRequest("m", "1", [Tensor("X", "FP32", np.array([value], np.float32))])


class FirstGated:
    """Records each request it executes and the thread it ran on; its first execution waits for ``go``. Judged by
    its CPU time alone (``cpu_bound``), so that the wait, however long a loaded host makes it, does not count."""

    inline_safe = True
    cpu_bound = True

    def __init__(self) -> None:
        self.go = threading.Event()
        self.executed: list[tuple[float, str]] = []

    def execute(self, requests: list[InferRequest]) -> list[Any]:
        if not self.executed:
            self.go.wait(30)
        answers = []
        for r in requests:
            self.executed.append((float(r.inputs[0].data[0]), threading.current_thread().name))
            answers.append(InferResponse("m", "1", [Tensor("Y", "FP32", r.inputs[0].data * 2)]))
        return answers

    def close(self) -> None:
        pass


def _scheduler(instance: Any, execution_mode: str = "auto") -> DefaultScheduler:
    return DefaultScheduler(InstancePool([instance], ["m_0"], ModelStats("m", "1"), lambda r: 1,
                                         execution_mode=execution_mode))


async def _until(condition: Any) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


@pytest.fixture
def one_execution_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The instance goes inline after a single fast execution on its thread."""
    monkeypatch.setattr(instances, "INLINE_WINDOW", 1)


async def test_requests_wait_in_line_while_the_instance_runs_on_its_thread() -> None:
    instance = FirstGated()
    scheduler = _scheduler(instance, execution_mode="thread")
    try:
        tasks = [asyncio.create_task(scheduler.submit(_request(v))) for v in range(4)]
        await _until(lambda: scheduler.pending() == 3)
        instance.go.set()
        answers = await asyncio.gather(*tasks)
        assert [a.outputs[0].data.tolist() for a in answers] == [[0.0], [2.0], [4.0], [6.0]]
        assert [v for v, _ in instance.executed] == [0, 1, 2, 3]  # first come, first served
        assert all(where.startswith("m_0") for _, where in instance.executed)
    finally:
        await asyncio.to_thread(scheduler.pool.close)


async def test_a_request_coming_once_the_instance_runs_inline_does_not_join_the_line(one_execution_window) -> None:
    instance = FirstGated()
    scheduler = _scheduler(instance)
    loop_thread = threading.current_thread().name
    try:
        first = asyncio.create_task(scheduler.submit(_request(0)))
        waiting = [asyncio.create_task(scheduler.submit(_request(v))) for v in range(1, 11)]
        await _until(lambda: scheduler.pending() == 10)
        instance.go.set()
        await first  # its execution on the thread was fast: the instance runs inline from now on
        assert scheduler.pool.runs_inline(0)
        in_line = scheduler.pending()
        late = await scheduler.submit(_request(99))
        assert in_line > 0 and late.outputs[0].data.tolist() == [198.0]
        await asyncio.gather(*waiting)
        order = [v for v, _ in instance.executed]
        # the line's last ones ran after the late request; without the bypass it ran after the whole line
        assert order.index(99) == 11 - in_line and sorted(order) == [*range(11), 99]
        assert [v for v in order if v != 99] == list(range(11))  # the line keeps its order
        assert all(where == loop_thread for v, where in instance.executed if v != 0)
        assert scheduler.pool.stats.execution_count == 12 and scheduler.pool.stats.inference_count == 12
        assert scheduler.pool.idle_count() == 1 and scheduler.pending() == 0
    finally:
        await asyncio.to_thread(scheduler.pool.close)


async def test_a_held_or_threaded_instance_is_never_run_without_being_acquired() -> None:
    threaded = _scheduler(FirstGated(), execution_mode="thread").pool
    forced = _scheduler(FirstGated(), execution_mode="inline").pool
    try:
        assert threaded.inline_now() is None
        assert forced.inline_now() == 0
        forced.held.add(0)  # kept from the version's previous pool, not admitted yet (instance-group update)
        assert forced.inline_now() is None
    finally:
        await asyncio.to_thread(threaded.close)
        await asyncio.to_thread(forced.close)


async def test_an_unloading_model_refuses_new_requests_with_a_clear_error() -> None:
    scheduler = _scheduler(FirstGated(), execution_mode="inline")
    try:
        await scheduler.drain()
        with pytest.raises(UnavailableError, match="model 'm' is unloading"):
            await scheduler.submit(_request(1))
    finally:
        await asyncio.to_thread(scheduler.pool.close)
