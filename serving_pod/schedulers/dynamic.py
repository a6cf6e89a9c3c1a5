"""Triton's dynamic batcher: groups queued requests into batches and spreads them over the instances.

Neighbours: ``queue_policy.PriorityQueue`` holds the waiting requests (priorities, timeouts, queue
limits); ``instances.InstancePool`` (or ``rate_limiter.RateLimitedPool``) runs a batch on an
instance and charges statistics; ``batching`` defines rows per request.

Rules (Triton's ``GetDynamicBatch``), evaluated whenever an instance is free and requests wait:

- scan the queue in service order, adding requests while the batch stays <= ``max_batch_size`` and
  the requests are compatible (equal shapes on variable-size inputs unless the input has
  ``allow_ragged_batch``; the same input set when the model has optional inputs); the first
  incompatible request ends the batch;
- ``preferred_batch_size`` (default: ``max_batch_size``): while the oldest request of the batch has
  waited less than ``max_queue_delay_microseconds``, the largest preferred size reached is sent;
- a batch that reached the largest preferred size, could not grow further, or whose oldest request
  waited the full delay is sent whole; with no delay configured, whatever is queued goes at once;
- otherwise the batcher waits (a timer, no polling) for more requests or the delay to pass;
- prefetching (Triton's ``support_prefetching``: no ``priority_levels``, and a default queue policy without
  timeouts or ``max_queue_size``): Triton forms the next batch (a payload) ahead and goes on adding to it
  while it waits for an instance, pass after pass of the rules above with the payload's rows counted in,
  until a pass closes it (a preferred size reached with no delay configured, the largest preferred size
  passed, a request that does not fit or match) or adds nothing. So a batch can pass a preferred size:
  preferred [4], 8 queued -> 5, then 3. Without prefetching, one pass decides.

While every instance is busy, requests keep queueing, so the next free instance takes the largest
batch available (as Triton's payload would have grown meanwhile). One batch runs per free instance.
``preserve_ordering`` hands responses back in the order requests entered batches. Scheduling is event
driven: an arrival (coalesced per loop iteration), a finished execution, a timer, or (rate limiter)
freed resources trigger one pass.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from typing import Any, Awaitable, Callable, Iterator

from serving_pod.core.errors import InternalError, ServerError, UnavailableError, rejected_from_queue
from serving_pod.core.types import InferRequest, InferResponse
from serving_pod.schedulers.clock import Clock, LoopClock, TimerHandle
from serving_pod.schedulers.instances import forward_answer
from serving_pod.schedulers.queue_policy import TIMEOUT_EXPIRED, Entry, PriorityQueue


class DynamicScheduler:
    """Dynamic batching for one model version (``dynamic_batching`` in its config)."""

    def __init__(self, model: Any, pool: Any, *, clock: Clock | None = None) -> None:
        config = model.config
        batching = config.dynamic_batching
        self.model_name = config.name
        self.pool = pool
        self.stats = model.stats
        self.clock = clock or LoopClock()
        self.rows_of: Callable[[InferRequest], int] = model.batch_size_of
        self.max_batch = max(1, config.max_batch_size)
        preferred = sorted(set(batching.preferred_batch_size)) or [self.max_batch]
        self.preferred = frozenset(preferred)
        self.max_preferred = preferred[-1]
        self.delay_ns = batching.max_queue_delay_microseconds * 1000
        self.preserve_ordering = batching.preserve_ordering
        self.queue = PriorityQueue(batching)
        #: Triton's ``support_prefetching``: without priority levels, timeouts or a queue limit, the next batch
        #: (its payload) is formed ahead and keeps growing while it waits for an instance
        policy = batching.default_queue_policy
        self.prefetch = not (
            batching.priority_levels or policy.default_timeout_microseconds or policy.allow_timeout_override
            or policy.max_queue_size
        )
        batched = config.max_batch_size > 0
        self._equal_shape = frozenset(
            tensor.name
            for tensor in config.input
            if batched and -1 in tensor.dims and not tensor.allow_ragged_batch
        )
        self._optional = any(tensor.optional for tensor in config.input)
        self._check_inputs = bool(self._equal_shape) or self._optional
        self._notify: Callable[[Callable[[], None]], None] | None = getattr(
            pool, "notify_when_available", None
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False
        self._waiting_for_pool = False
        self._timer: TimerHandle | None = None
        self._timer_at = 0
        self._tasks: set[asyncio.Task] = set()
        self._completions: deque[list] = deque()
        self._outstanding = 0
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()

    # --- Scheduler protocol ------------------------------------------------------------------
    def pending(self) -> int:
        return self.queue.size

    async def submit(self, request: InferRequest) -> InferResponse:
        if self._closing:
            raise UnavailableError(f"model '{self.model_name}' is unloading")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        entry = Entry(request, loop.create_future(), self.rows_of(request), self.clock.now_ns())
        # a refusal here (queue full) is not charged: Triton's statistics and nv_inference_request_failure
        # never see a request its scheduler would not enqueue
        level = self.queue.level_of(request.parameters)
        self.queue.enqueue(entry, level, request.parameters)
        self._outstanding += 1
        self._idle.clear()
        if not self._scheduled:  # one pass for every arrival of this loop iteration
            self._scheduled = True
            loop.call_soon(self._schedule)
        result = await entry.future
        if isinstance(result, ServerError):
            raise result
        return result

    async def drain(self) -> None:
        self._closing = True
        await self._idle.wait()

    # --- batching ----------------------------------------------------------------------------
    def _schedule(self) -> None:
        """Dispatch one batch per free instance while batches can be formed; else arm a timer."""
        self._scheduled = False
        queue = self.queue
        pool = self.pool
        while queue.size:
            if not pool.idle_count():
                if self._notify is not None and not self._waiting_for_pool:
                    self._waiting_for_pool = True
                    self._notify(self._pool_available)
                break
            now = self.clock.now_ns()
            count, wait_ns = self._next_batch(now)
            if queue.rejected or queue.cancelled:
                self._drop(now)
            if count:
                self._dispatch(pool.try_acquire(), queue.pop(count))
            else:
                if wait_ns:
                    self._arm(now, wait_ns)
                break

    def _next_batch(self, now: int) -> tuple[int, int]:
        """(requests to send now, 0) or (0, nanoseconds to wait); Triton's batch rules.

        With prefetching (module docstring) the batch grows pass after pass, as Triton's payload does while it
        waits for an instance, until a pass closes it or adds nothing; else one pass decides.
        """
        source: Iterator[Entry] = iter(self.queue.walk(now))
        taken = payload = 0
        signature: Any = None
        while True:
            scanned, count, rows, closed, wait_ns, signature = self._pass(source, payload, signature, now)
            if not count:
                break
            taken += count
            payload += rows
            if closed or not self.prefetch:
                break
            source = itertools.chain(scanned[count:], source)  # requests looked at but left: looked at again
        return (taken, 0) if taken else (0, wait_ns)

    def _pass(
        self, source: Iterator[Entry], payload: int, signature: Any, now: int
    ) -> tuple[list[Entry], int, int, bool, int, Any]:
        """One run of Triton's ``GetDynamicBatch`` over ``source`` beside a batch of ``payload`` rows.

        Returns the entries looked at, how many of them (and rows) join the batch, whether the batch is closed
        (Triton's ``payload_saturated_``), the wait when none join, and the batch's input signature.
        """
        max_batch, max_preferred, preferred = self.max_batch, self.max_preferred, self.preferred
        check = self._check_inputs
        scanned: list[Entry] = []
        rows = count = best_rows = best_count = 0
        oldest = now
        send_now = closed = False
        for entry in source:
            scanned.append(entry)
            size = entry.rows
            if payload + count == 0:
                if check:
                    signature = self._signature(entry.request)
            else:
                total = payload + rows + size
                if total > max_preferred and not best_count:
                    best_rows, best_count = rows, count
                    closed = True
                if total > max_batch:
                    send_now = True
                    break
                if check and self._signature(entry.request) != signature:
                    send_now = closed = True
                    break
            rows += size
            count += 1
            oldest = min(oldest, entry.enqueue_ns)
            if payload + rows in preferred:
                best_rows, best_count = rows, count
        delay_ns = self.delay_ns
        waited = now - oldest
        exceeded = delay_ns != 0 and waited >= delay_ns
        if best_count and not exceeded:
            return scanned, best_count, best_rows, closed or not delay_ns, 0, signature
        if not count:
            return scanned, 0, 0, closed, 0, signature
        if send_now or payload + rows >= max_preferred:
            return scanned, count, rows, True, 0, signature
        if exceeded or not delay_ns or (payload and not closed and payload not in preferred):
            return scanned, count, rows, closed, 0, signature
        return scanned, 0, 0, closed, delay_ns - waited, signature

    def _signature(self, request: InferRequest) -> tuple:
        names = self._equal_shape
        shapes = tuple(
            sorted((t.name, t.data.shape[1:]) for t in request.inputs if t.name in names)
        )
        if self._optional:
            return shapes, frozenset(t.name for t in request.inputs)
        return shapes

    def _arm(self, now: int, wait_ns: int) -> None:
        at = now + wait_ns
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.clock.call_later(wait_ns, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._schedule()

    def _pool_available(self) -> None:
        self._waiting_for_pool = False
        self._schedule()

    def _drop(self, now: int) -> None:
        rejected, cancelled = self.queue.take_dropped()
        for entry in rejected:
            self.stats.record_failure(now - entry.request.arrival_ns, "REJECTED")
            entry.future.set_result(rejected_from_queue(TIMEOUT_EXPIRED))
        for entry in cancelled:
            self.stats.record_failure(now - entry.request.arrival_ns, "CANCELED")
        self._finished(len(rejected) + len(cancelled))

    # --- execution ---------------------------------------------------------------------------
    def _dispatch(self, index: int, entries: list[Entry]) -> None:
        slot: list | None = None
        if self.preserve_ordering:
            slot = [entries, None]
            self._completions.append(slot)
        # A fast instance runs right here (no task, no loop turn): ``_schedule``'s loop then goes on with the
        # next batch. Only on a plain pool: a rate limiter's release may call back into the scheduler.
        execute_inline = getattr(self.pool, "execute_inline", None)
        if execute_inline is not None and self.pool.runs_inline(index):
            try:
                results = execute_inline(index, [entry.request for entry in entries], not self.preserve_ordering)
            finally:
                self.pool.release(index)
            self._complete(entries, results, slot)
            return
        assert self._loop is not None
        # started now, not in the task's first step: one loop turn sooner at the instance
        running = self.pool.execute(index, [entry.request for entry in entries], not self.preserve_ordering)
        # held here until it ends (the loop keeps only weak references); no done-callback turn
        self._tasks.add(self._loop.create_task(self._execute(index, entries, slot, running)))

    async def _execute(self, index: int, entries: list[Entry], slot: list | None, running: Awaitable[list]) -> None:
        try:
            results = await running
        except Exception as exc:  # execute never raises by contract; never strand the callers
            results = [InternalError(f"{type(exc).__name__}: {exc}")] * len(entries)
        finally:
            self.pool.release(index)
            self._tasks.discard(asyncio.current_task())  # type: ignore[arg-type]
        if self.queue.size:
            self._schedule()
        self._complete(entries, results, slot)

    def _complete(self, entries: list[Entry], results: list, slot: list | None) -> None:
        """Hand results to their callers (in arrival order with ``preserve_ordering``)."""
        if slot is None:
            self._deliver(entries, results)
            return
        slot[1] = results
        completions = self._completions
        while completions and completions[0][1] is not None:
            done_entries, done_results = completions.popleft()
            self._deliver(done_entries, done_results)

    def _deliver(self, entries: list[Entry], results: list) -> None:
        for entry, result in zip(entries, results):
            future = entry.future
            if isinstance(result, asyncio.Future):  # answered after its execution (``InstancePool.execute``)
                forward_answer(result, future)
            elif not future.done():
                future.set_result(result)
        self._finished(len(entries))

    def _finished(self, count: int) -> None:
        self._outstanding -= count
        if not self._outstanding:
            self._idle.set()
