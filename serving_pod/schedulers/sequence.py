"""Triton's sequence batcher: stateful models, one sequence per instance slot, direct and oldest strategies.

Neighbours: ``sequence_config.py`` parses ``sequence_batching`` and builds the control / state
tensors; ``instances.InstancePool`` runs the batches. The engine hands every request of a
sequence model to ``SequenceScheduler.submit``.

How it works (Triton's ``sequence_batch_scheduler.cc``, re-expressed on asyncio):

- Each instance has ``slots_per_instance`` sequence slots (direct: one per batch index; oldest:
  ``max_candidate_sequences``). A request with ``sequence_start`` takes a free slot (or waits in the
  backlog until one frees) and every later request of that sequence goes to the same slot, so a
  sequence always lands on the same instance and batch index. A slot is released when the request
  with ``sequence_end`` is taken for execution, or when the sequence idled longer than
  ``max_sequence_idle_microseconds`` (a later request then gets Triton's "must specify the START
  flag" error, word for word; the release is logged). The reaper wakes at the next expiry, so
  backlogged sequences take the slots in the order their holders expire.
- A request's ``timeout`` parameter (microseconds) bounds how long its sequence may wait in the backlog, as in
  Triton 2.51: the earliest deadline of the requests that reached it there counts; once past, every request of
  the backlogged sequence fails UNAVAILABLE "timeout of the corresponding sequence has been expired" (each a
  failure of reason ``REJECTED``) and a later request of its id needs START. A request of a sequence that holds a
  slot ignores its ``timeout``.
- One lane task per instance forms a batch from the heads of its slots (at most one request per
  sequence per batch, so a sequence runs in order) and executes it. Direct: slots in index order,
  empty slots below the highest busy one get a null request with READY=0, waiting up to
  ``max_queue_delay_microseconds`` while fewer than ``minimum_slot_utilization`` of the slots are
  ready. Oldest: Triton's dynamic batcher over the heads, oldest first: a batch never grows past the
  largest ``preferred_batch_size`` (else ``max_batch_size``); below that it runs at once at the
  largest preferred size reached, else when the oldest head waited ``max_queue_delay_microseconds``.
- Under ``--rate-limit=execution_count`` a batch, once formed, waits until its instance's
  ``rate_limiter`` resources are free (``RateLimitedPool.acquire_instance``), sharing them with the
  instances of every other model by priority, as Triton's sequence batcher enqueues its payloads in
  the rate limiter.
- ``iterative_sequence`` (Triton's ``IterativeSequencer``): a request without a correlation ID gets one
  of its own (numbered from 1) and START. A request the model releases with RESCHEDULE (the python
  backend answers ``pb_request.Rescheduled``) is queued again on its slot, neither START nor END, its
  client still waiting; one released without it ends its sequence (``_end_iteration``).
- A request whose client goes away while it is queued (a gRPC cancel or deadline, a closed stream) is dropped
  unrun and counts one failure of reason ``CANCELED``, and, as in Triton 2.51, ends its sequence: the requests
  queued behind it fail CANCELLED (each counted so; Triton's error has no words, Ferry's says why), its slot
  frees, and a later request of its id needs START. Triton's default and dynamic schedulers still run such a
  request and count a success; Ferry's drop it as this one does (``default.py``).
- An unload (``drain``) refuses new requests but runs every request already queued, those of sequences still
  waiting for a slot too, each counted a success as Triton 2.51 counts them: Triton's unload answers at once, the
  version UNLOADING until a backlogged sequence got the slot of one that idled out
  (``max_sequence_idle_microseconds``: no request can reach a slotted sequence once the unload began) and ran.
  Ferry's unload waits for the drain, so it hands the slot of a slotted sequence with nothing queued to the backlog
  at once instead of after its idle time.
- Control inputs START / END / READY / CORRID and implicit-state inputs are added to each request;
  the state outputs of a response are kept for the sequence's next request and removed from the
  response the client sees.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

import numpy as np

from serving_pod.backends.pb_request import RESCHEDULE_REFUSED, Rescheduled
from serving_pod.core.errors import (
    CancelledError,
    InternalError,
    InvalidArgumentError,
    ServerError,
    UnavailableError,
    not_enqueued,
    rejected_from_queue,
)
from serving_pod.core.types import InferRequest, InferResponse
from serving_pod.schedulers.clock import LoopClock
from serving_pod.schedulers.instances import InstancePool
from serving_pod.schedulers.queue_policy import request_timeout_us
from serving_pod.schedulers.sequence_batch import StateIO, run_padded
from serving_pod.schedulers.sequence_config import SequenceKey, parse_sequence_config

log = logging.getLogger("ferry.sequence")

#: Triton 2.51's words for the requests of a sequence whose backlog wait passed a request's ``timeout``
BACKLOG_EXPIRED = "timeout of the corresponding sequence has been expired"


class _Pending:
    __slots__ = ("request", "future", "start", "end", "enqueue_ns")

    def __init__(self, request: InferRequest, future: asyncio.Future, start: bool, end: bool, now: int) -> None:
        self.request, self.future, self.start, self.end, self.enqueue_ns = request, future, start, end, now


class _Sequence:
    """One live sequence: its queue of requests, its slot and its implicit state."""

    __slots__ = ("key", "queue", "lane", "slot", "states", "last_ns", "busy", "expires_ns")

    def __init__(self, key: SequenceKey, now: int) -> None:
        self.key = key
        self.queue: deque[_Pending] = deque()
        self.lane: int | None = None
        self.slot = -1
        self.states: dict[str, np.ndarray] | None = None
        self.last_ns = now
        self.busy = False
        self.expires_ns = 0  # while backlogged: the earliest request deadline (``timeout``), 0 for none


class _Lane:
    """The sequence slots of one instance and the task that executes their batches."""

    __slots__ = ("index", "slots", "wake", "task")

    def __init__(self, index: int, slots: int) -> None:
        self.index = index
        self.slots: list[_Sequence | None] = [None] * slots
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None


class SequenceScheduler:
    """Scheduler of a model with ``sequence_batching``."""

    def __init__(
        self,
        model: Any,
        pool: InstancePool,
        *,
        model_dir: Path | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.model = model
        self.pool = pool
        self.spec = spec = parse_sequence_config(model.config, model_dir)
        self.clock = clock
        self._timers = LoopClock()  # a lane's wait for its candidate's delay (real time, to the microsecond)
        self._lanes = [_Lane(index, spec.slots_per_instance) for index in range(len(pool))]
        # free slots as (slot, lane): new sequences spread over instances before filling batch slots
        active = [lane for lane in range(len(pool)) if lane not in getattr(pool, "passive", ())]  # as Triton's
        self._free = [(slot, lane) for slot in range(spec.slots_per_instance) for lane in active]
        heapq.heapify(self._free)
        self._active: dict[SequenceKey, _Sequence] = {}
        self._backlog: deque[_Sequence] = deque()
        self._pending = 0
        self._busy = 0
        self._closing = False
        self._reaper: asyncio.Task | None = None
        self._backlog_timer: asyncio.TimerHandle | None = None
        self._iteration_ids = itertools.count(1)  # Triton's IterativeSequencer numbers from 1
        self.io = StateIO(spec, [output.name for output in model.config.output])

    # --- Scheduler protocol ------------------------------------------------------------------
    def pending(self) -> int:
        return self._pending

    async def submit(self, request: InferRequest) -> InferResponse:
        if self._closing:
            raise UnavailableError(f"model '{request.model_name}' is unloading")
        spec = self.spec
        try:
            key, start, end = spec.sequence_of(request.parameters)
        except ServerError as error:
            raise not_enqueued(error)
        if not key:  # an iterative sequence of its own
            key = next(self._iteration_ids)
            while key in self._active:  # a client's id in use: Triton would mix the two sequences
                key = next(self._iteration_ids)
            request = _with_flags(request, key, True, False)
        if spec.batching and request.inputs and request.inputs[0].data.shape[0] != 1:
            raise not_enqueued(InvalidArgumentError(
                f"inference request to model '{request.model_name}' must specify batch-size 1 due to "
                "requirements of sequence batcher"
            ))
        self._ensure_started()
        now = self.clock()
        sequence = self._active.get(key)
        if sequence is None:
            if not start:
                raise not_enqueued(InvalidArgumentError(self._no_start_message(key)))
            sequence = self._active[key] = _Sequence(key, now)
            self._place(sequence)
        elif start:
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end before "
                "this sequence start. Previous sequence will be terminated early.", key, spec.model_name,
            )
        sequence.last_ns = now
        if sequence.lane is None and (timeout_us := request_timeout_us(request.parameters)):
            self._bound_backlog_wait(sequence, now + timeout_us * 1000)
        future = asyncio.get_running_loop().create_future()
        sequence.queue.append(_Pending(request, future, start, end, now))
        if end:
            # a later START with the same id begins a new sequence (Triton forgets the id here)
            del self._active[key]
        self._pending += 1
        if sequence.lane is not None:
            self._lanes[sequence.lane].wake.set()
        return await future

    async def drain(self) -> None:
        """Stop accepting and run what is queued, the sequences waiting for a slot (the backlog) included, as Triton
        2.51 does at an unload (module docstring); then stop the lanes and the reaper."""
        self._closing = True
        while True:
            for lane in self._lanes:  # no request can reach a slotted sequence now: its slot goes to the backlog
                for sequence in lane.slots:
                    if self._backlog and sequence is not None and not sequence.queue and not sequence.busy:
                        self._release(sequence)
            if not (self._busy or self._backlog or self._queued()):
                break
            await asyncio.sleep(0.005)
        for task in [lane.task for lane in self._lanes] + [self._reaper]:
            if task is not None:
                task.cancel()
        if self._backlog_timer is not None:
            self._backlog_timer.cancel()

    def _queued(self) -> bool:
        return any(sequence is not None and sequence.queue for lane in self._lanes for sequence in lane.slots)

    # --- slots -------------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self._reaper is not None:
            return
        for lane in self._lanes:
            lane.task = asyncio.create_task(self._run_lane(lane), name=f"sequence-lane-{lane.index}")
        self._reaper = asyncio.create_task(self._reap(), name=f"sequence-reaper-{self.spec.model_name}")

    def _place(self, sequence: _Sequence) -> None:
        if self._free:
            slot, lane = heapq.heappop(self._free)
            self._assign(sequence, lane, slot)
        else:
            self._backlog.append(sequence)

    def _assign(self, sequence: _Sequence, lane: int, slot: int) -> None:
        sequence.lane, sequence.slot, sequence.expires_ns = lane, slot, 0  # a slotted sequence has no deadline
        self._lanes[lane].slots[slot] = sequence
        self._lanes[lane].wake.set()

    def _release(self, sequence: _Sequence) -> None:
        """Free the sequence's slot: the oldest backlogged sequence takes it, else it becomes free."""
        lane, slot = sequence.lane, sequence.slot
        if lane is None:
            return
        self._lanes[lane].slots[slot] = None
        sequence.lane, sequence.slot = None, -1
        if self._active.get(sequence.key) is sequence:
            del self._active[sequence.key]
        if self._backlog:
            self._assign(self._backlog.popleft(), lane, slot)
        else:
            heapq.heappush(self._free, (slot, lane))

    def _bound_backlog_wait(self, sequence: _Sequence, deadline_ns: int) -> None:
        """A backlogged sequence's wait ends by ``deadline_ns`` at the latest (module docstring)."""
        if not sequence.expires_ns or deadline_ns < sequence.expires_ns:
            sequence.expires_ns = deadline_ns
        self._set_backlog_timer(self.clock())

    def _set_backlog_timer(self, now: int) -> None:
        """Fire ``_expire_backlog`` at the earliest deadline of the backlogged sequences (none: no timer)."""
        if self._backlog_timer is not None:
            self._backlog_timer.cancel()
            self._backlog_timer = None
        deadlines = [sequence.expires_ns for sequence in self._backlog if sequence.expires_ns]
        if deadlines:
            delay_s = max(min(deadlines) - now, 0) / 1e9
            self._backlog_timer = asyncio.get_running_loop().call_later(delay_s, self._expire_backlog)

    def _expire_backlog(self) -> None:
        """Fail the backlogged sequences past their deadline (module docstring); wait for the next one."""
        self._backlog_timer = None
        now = self.clock()
        expired = [sequence for sequence in self._backlog if sequence.expires_ns and sequence.expires_ns <= now]
        for sequence in expired:
            self._backlog.remove(sequence)
            if self._active.get(sequence.key) is sequence:
                del self._active[sequence.key]
            while sequence.queue:
                pending = sequence.queue.popleft()
                self._pending -= 1
                self.pool.stats.record_failure(now - pending.request.arrival_ns, "REJECTED")
                if not pending.future.done():
                    pending.future.set_exception(rejected_from_queue(BACKLOG_EXPIRED))
        self._set_backlog_timer(now)

    def _no_start_message(self, key: SequenceKey) -> str:
        # Triton 2.51's words also for a sequence released as idle (the release is logged instead)
        return (
            f"inference request for sequence {key} to model '{self.spec.model_name}' must specify the "
            "START flag on the first request of the sequence"
        )

    async def _reap(self) -> None:
        """Release sequences idle longer than ``max_sequence_idle_microseconds``, each at its own expiry."""
        idle_ns = self.spec.idle_ns
        interval_ns = int(min(max(idle_ns / 10, 5e6), 5e8))  # re-reads the clock at least this often
        while True:
            now = self.clock()
            next_ns = interval_ns
            for lane in self._lanes:
                for sequence in lane.slots:
                    if sequence is None or sequence.queue or sequence.busy:
                        continue
                    left = idle_ns - (now - sequence.last_ns)
                    if left > 0:
                        next_ns = min(next_ns, left)
                        continue
                    log.info("sequence %s of model '%s' idle: released", sequence.key, self.spec.model_name)
                    self._release(sequence)
            await asyncio.sleep(max(next_ns, 1_000_000) / 1e9)

    # --- batches -----------------------------------------------------------------------------
    async def _run_lane(self, lane: _Lane) -> None:
        while True:
            lane.wake.clear()
            picks = self._heads(lane)
            if not picks:
                await lane.wake.wait()
                continue
            picks, wait_ns = self._choose(picks)
            if wait_ns > 0:
                timer = self._timers.call_later(wait_ns, lane.wake.set)
                try:
                    await lane.wake.wait()
                finally:
                    timer.cancel()
                continue  # choose again: more heads may be ready, or the delay is over
            taken = [(slot, sequence, sequence.queue.popleft()) for slot, sequence in picks]
            self._pending -= len(taken)
            self._busy += 1
            try:
                await self._execute(lane, taken)
            except Exception as exc:  # a scheduler bug must fail these requests, not stop the lane
                log.exception("sequence batch of model '%s' failed", self.spec.model_name)
                for _, sequence, pending in taken:
                    # the slot of an ended sequence must still free, or each such failure loses a slot for good
                    sequence.busy = False
                    if pending.end:
                        self._release(sequence)
                    elif self.spec.iterative:
                        self._end_iteration(sequence)
                    if not pending.future.done():
                        pending.future.set_exception(InternalError(f"{type(exc).__name__}: {exc}"))
            finally:
                self._busy -= 1

    def _heads(self, lane: _Lane) -> list[tuple[int, _Sequence]]:
        """(slot, sequence) of every slot whose sequence has a request ready; drops cancelled ones."""
        picks = []
        for slot, sequence in enumerate(lane.slots):
            if sequence is None:
                continue
            queue = sequence.queue
            while queue and queue[0].future.done():  # the client went away before it ran
                dropped = queue.popleft()
                self._pending -= 1
                if dropped.request.model_name:  # not the null END request of ``_end_iteration``
                    self._cancelled(dropped)
                if dropped.end:
                    self._release(sequence)
                    # what an iterative sequence rescheduled behind its end has no slot now (Triton: no START)
                    self._fail_queue(sequence, InvalidArgumentError(self._no_start_message(sequence.key)))
                elif self.spec.iterative:  # Triton: a cancelled iterative request ends its sequence
                    self._end_iteration(sequence)
                else:  # Triton: so does any cancelled request; those queued behind it are cancelled too
                    self._cancel_sequence(sequence)
            if queue and sequence.lane == lane.index:
                picks.append((slot, sequence))
        return picks

    def _choose(self, picks: list[tuple[int, _Sequence]]) -> tuple[list[tuple[int, _Sequence]], int]:
        """The heads to execute now and 0, or none and the nanoseconds to wait for a fuller batch."""
        spec = self.spec
        limit = max(1, spec.max_batch_size)
        if spec.strategy == "direct":
            if (
                not spec.queue_delay_ns
                or not spec.minimum_slot_utilization
                or len(picks) / limit >= spec.minimum_slot_utilization
            ):
                return picks, 0
            left = self._delay_left(picks)
            return (picks, 0) if left <= 0 else ([], left)
        # oldest: Triton's dynamic batcher (module docstring)
        picks.sort(key=lambda pick: pick[1].queue[0].enqueue_ns)
        cap = min(limit, max(spec.preferred_batch_sizes, default=limit))
        if len(picks) >= cap:
            return picks[:cap], 0
        left = self._delay_left(picks)
        if left <= 0:
            return picks, 0
        reached = [size for size in spec.preferred_batch_sizes if size <= len(picks)]
        if reached:
            return picks[: max(reached)], 0
        return [], left

    def _delay_left(self, picks: list[tuple[int, _Sequence]]) -> int:
        """Nanoseconds until the oldest of ``picks`` waited ``max_queue_delay_microseconds`` (<= 0: it has)."""
        oldest = min(sequence.queue[0].enqueue_ns for _, sequence in picks)
        return self.spec.queue_delay_ns - (self.clock() - oldest)

    async def _execute(self, lane: _Lane, taken: list[tuple[int, _Sequence, _Pending]]) -> None:
        spec = self.spec
        prepared = []
        for slot, sequence, pending in taken:
            request, sequence.states = self.io.prepare(
                pending.request, sequence.key, pending.start, pending.end, sequence.states
            )
            prepared.append((slot, request))
            sequence.busy = True
            if pending.end:
                self._release(sequence)  # as Triton: the slot frees when END is taken into a batch
        requests = [request for _, request in prepared]
        # with --rate-limit the batch waits for its instance's resources (Triton's payload in the rate limiter)
        acquire = getattr(self.pool, "acquire_instance", None)
        if acquire is not None:
            await acquire(lane.index)
        padded = False
        if spec.strategy == "direct" and spec.batching:
            by_slot = dict(prepared)
            top = max(by_slot)
            if len(by_slot) <= top:
                padded = True
                template = requests[0]
                requests = [by_slot.get(slot) or self.io.null_request(template) for slot in range(top + 1)]
        try:
            if padded:
                real = {id(request) for _, request in prepared}
                results = await run_padded(self.pool, lane.index, requests, real)
            else:
                results = await self.pool.execute(lane.index, requests)
        finally:
            if acquire is not None:
                self.pool.release(lane.index)
            now = self.clock()
            for _, sequence, _ in taken:
                sequence.busy = False
                sequence.last_ns = now
        by_request = {id(request): result for request, result in zip(requests, results)}
        for (_, sequence, pending), (_, request) in zip(taken, prepared):
            self._deliver(sequence, pending, by_request[id(request)])

    def _deliver(self, sequence: _Sequence, pending: _Pending, result: Any) -> None:
        if isinstance(result, Rescheduled):
            if self.spec.iterative:
                self._reschedule(sequence, pending)
                return
            result = InvalidArgumentError(RESCHEDULE_REFUSED)  # a backend that did not check the config
        if self.spec.iterative and not pending.end:
            self._end_iteration(sequence)  # released without RESCHEDULE: its sequence is over
        self.io.take_states(result, sequence.states)
        if pending.future.done():
            return
        if isinstance(result, ServerError):
            pending.future.set_exception(result)
        else:
            pending.future.set_result(result)

    def _reschedule(self, sequence: _Sequence, pending: _Pending) -> None:
        """Queue a request its model released with RESCHEDULE again on its sequence's slot, neither START nor END."""
        if pending.future.done():  # the client went away: the sequence is over
            self._end_iteration(sequence)
            return
        if sequence.lane is None:  # its END was taken, or it idled out: as Triton, a request without START
            pending.future.set_exception(InvalidArgumentError(self._no_start_message(sequence.key)))
            return
        request = _with_flags(pending.request, sequence.key, False, False)
        sequence.queue.append(_Pending(request, pending.future, False, False, self.clock()))
        self._pending += 1
        self._lanes[sequence.lane].wake.set()

    def _end_iteration(self, sequence: _Sequence) -> None:
        """End an iterative sequence as Triton does, with a cancelled null END request behind what it has queued:
        its id is forgotten now, its slot frees once the lane reaches that request (``_heads``)."""
        if self._active.get(sequence.key) is sequence:
            del self._active[sequence.key]
        if sequence.lane is None or any(queued.end for queued in sequence.queue):
            return
        done = asyncio.get_running_loop().create_future()
        done.cancel()
        sequence.queue.append(_Pending(InferRequest("", "", []), done, False, True, self.clock()))
        self._pending += 1
        self._lanes[sequence.lane].wake.set()

    def _cancelled(self, pending: _Pending) -> None:
        """Count a request dropped unrun because its client went away (module docstring)."""
        self.pool.stats.record_failure(time.monotonic_ns() - pending.request.arrival_ns, "CANCELED")

    def _cancel_sequence(self, sequence: _Sequence) -> None:
        """End a sequence whose queued request was cancelled, as Triton does: the requests queued behind it fail
        CANCELLED (each counted), its slot frees and a later request of its id needs START."""
        error = CancelledError(
            f"sequence {sequence.key} of model '{self.spec.model_name}' was cancelled: an earlier request of it "
            "was cancelled by its client before it ran"
        )
        while sequence.queue:
            pending = sequence.queue.popleft()
            self._pending -= 1
            if not pending.future.done():
                pending.future.set_exception(error)
            self._cancelled(pending)
        self._release(sequence)

    def _fail_queue(self, sequence: _Sequence, error: ServerError) -> None:
        while sequence.queue:
            pending = sequence.queue.popleft()
            self._pending -= 1
            if not pending.future.done():
                pending.future.set_exception(error)


def _with_flags(request: InferRequest, key: SequenceKey, start: bool, end: bool) -> InferRequest:
    """``request`` with Triton's sequence parameters as an iterative sequence sets them (the model reads them back
    as ``correlation_id()`` and ``flags()``)."""
    parameters = {**request.parameters, "sequence_id": key, "sequence_start": start, "sequence_end": end}
    return dataclasses.replace(request, parameters=parameters)
