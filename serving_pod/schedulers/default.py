"""Triton's default scheduler: no batching across requests; each request runs on the next idle instance.

With ``instance_group { count: N }`` up to N requests execute at once; the rest wait (in arrival
order) for an instance, and that wait is charged as queue time. An instance that runs inline on the event loop
(``schedulers/instances.py``) never keeps a request waiting: each of its executions ends before anything else runs
on the loop, so a request runs on it as it is read even while earlier ones wait in line for it (``inline_now``).
Such a line forms while the instance still runs on its thread (its first executions, or after a slow spell), and
with load arriving as fast as the line drains (one waiter woken per loop turn) it stayed until the load paused:
perf_analyzer at concurrency 16 on a 90 us ONNX model then saw 2.5 ms of queue time per request instead of
20 us, the figure a queue-time autoscaler scales on.

A request whose client goes away while it waits for an instance (a gRPC cancel or deadline, a closed stream) is
dropped unrun and counts one failure of reason ``CANCELED``, as the dynamic and sequence batchers and the ensemble
scheduler count it, so that every accepted request counts exactly once, as a success or a failure. Triton 2.51
runs it anyway (its model sees ``is_cancelled()`` true from the start) and counts a success; Ferry does not spend
an instance on work nobody will read, while requests behind it wait. Once executing, a request runs to the end
(its model can see ``is_cancelled()``, the instance is free for the next request when it returns) and counts as
its execution ends, as in Triton. An HTTP client that closes its connection is not seen by either server.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable

from serving_pod.core.errors import ServerError, UnavailableError
from serving_pod.core.types import InferRequest, InferResponse
from serving_pod.schedulers.instances import InstancePool, Result


class DefaultScheduler:
    """One request per execution, spread over all instances."""

    def __init__(self, pool: InstancePool) -> None:
        self.pool = pool
        self._pending = 0
        self._inflight = 0
        self._closing = False
        self._idle_event = asyncio.Event()
        self._idle_event.set()

    def pending(self) -> int:
        return self._pending

    async def submit(self, request: InferRequest) -> InferResponse:
        if self._closing:
            raise UnavailableError(f"model '{request.model_name}' is unloading")
        self._inflight += 1
        self._idle_event.clear()
        try:
            index = self.pool.try_acquire()
            shared = self.pool.inline_now() if index is None else None
            if shared is not None:  # no instance free, but this one runs inline: no need to wait (module docstring)
                (result,) = await self.pool.execute(shared, [request], answers_later=True)
            else:
                if index is None:
                    index = await self._wait_for_instance(request)
                result = await self._run(index, request)
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle_event.set()
        if isinstance(result, asyncio.Future):  # answered after its execution (the instance is free already)
            result = await result
        if isinstance(result, ServerError):
            raise result
        return result  # type: ignore[return-value]

    async def _wait_for_instance(self, request: InferRequest) -> int:
        self._pending += 1
        try:
            return await self.pool.acquire()
        except asyncio.CancelledError:  # its client went away: dropped unrun (module docstring)
            self.pool.stats.record_failure(time.monotonic_ns() - request.arrival_ns, "CANCELED")
            raise
        finally:
            self._pending -= 1

    async def _run(self, index: int, request: InferRequest) -> Result | asyncio.Future[Result]:
        """Execute ``request`` on instance ``index``, acquired for it; the instance is released as it ends."""
        if self.pool.runs_inline(index):
            # completes without suspending: nothing can cancel it half-way, and the instance is
            # free again before any other request runs
            try:
                (result,) = await self.pool.execute(index, [request], answers_later=True)
            finally:
                self.pool.release(index)
            return result
        # shielded: a caller that goes away must not free the instance while it still executes,
        # and the execution is still charged to the statistics
        running = self.pool.execute(index, [request], answers_later=True)  # started now, one loop turn sooner
        execution = asyncio.ensure_future(self._finish(index, running))
        (result,) = await asyncio.shield(execution)
        return result

    async def _finish(self, index: int, running: Awaitable[list]) -> list:
        """The execution's results; its instance is free for the next request as soon as they are in."""
        try:
            return await running
        finally:
            self.pool.release(index)

    async def drain(self) -> None:
        self._closing = True
        await self._idle_event.wait()
