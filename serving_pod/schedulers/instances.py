"""The instances of one model version, each executing on its own worker thread, and the stats they charge.

Every scheduler runs work through an ``InstancePool``: ``acquire`` an idle instance, ``execute`` a
list of requests on it, ``release`` it. The pool measures the three compute stages as Triton
names them (input: hand-over to the instance; infer: the backend's execute; output: hand-back to the
event loop) and charges the model's statistics for the execution and for each request in it.

Execution modes (model config parameter ``ferry_execution_mode``: ``auto`` (default), ``thread``, ``inline``):
a thread hop costs far more than a small model's whole execution (~150-250 us here against tens of
microseconds), so in ``auto`` an instance that declares itself ``inline_safe`` (it never blocks on the
engine, e.g. no BLS, no decoupled sender, no coroutine) and whose recent executions all took under
``INLINE_ENTER_NS`` of its thread's CPU time (and all but ``INLINE_SLOW_WALLS`` of them under ``INLINE_EXIT_NS`` of
wall time: under load a fast model's thread can wait that long for the GIL now and then, while a model that
sleeps or waits on I/O takes that long every time) runs on the event loop thread directly. An instance that
declares ``cpu_bound`` (it only computes on the CPU, never waiting on a device or I/O: onnxruntime on its CPU
provider) is judged by CPU time alone: its wall time over its CPU time is waiting for the GIL or for a core,
which on a busy shared host can pass ``INLINE_SLOW_WALLS`` for minutes and kept a fast model on its thread. Inline
executions in a row above ``INLINE_EXIT_NS``, at least ``INLINE_EXIT_STRIKES`` of them and ``INLINE_EXIT_HELD_NS`` in
all, send it back to its thread for ``INLINE_COOLDOWN`` executions: a model that turns slow holds the loop about
that long once, while a preempted execution (2 cores shared with clients) or a short spell of a slow host does not
count (this VM runs an onnxruntime session 15-40x slower than usual for tens of milliseconds now and then: two such
executions in a row sent the ONNX MLP back to its thread every few seconds under load).

An instance that declares ``suspends_on_engine`` blocks in its ``execute`` only on the engine (a python model's
BLS call: ``core/suspend.py``). Judged the same way, its waits on the engine left out of its wall time, it goes
"inline" by running ``execute`` in a greenlet on the loop thread: each engine call suspends the execution there,
the loop goes on meanwhile, and no thread is woken at all; the time it holds the loop between its waits is
what counts against ``INLINE_EXIT_NS``. Such an execution does suspend (``runs_inline`` is False for it), and
the instance's ``on_resume`` (restoring its per-thread state) runs before it goes on after each wait. An
instance that waits on the engine on its thread without declaring ``suspends_on_engine`` (a python model whose
BLS call is in a module its source check did not read: one it imports only inside ``execute``, or from elsewhere than
its own directory) stays on its thread from then on: inline, its call could not wait. One whose first such call
comes once it runs inline has that call refused (the request fails with a clear error,
``Engine._refuse_on_loop_thread``) and goes back to its thread for good.

An instance whose execution waits on I/O instead of computing (an isolated python model: its child
process computes) may offer ``execute_on_loop(requests)``: an awaitable the pool awaits on the loop,
with no thread hop either way; None from it sends that execution to the instance's thread.

GIL hand-off: a worker thread woken by the loop must take the GIL before it runs a line. Under load the
loop (uvloop) drops and retakes the GIL between callbacks faster than a woken thread can claim it, and
CPython 3.11 lets the loop win again and again: a batch of a 1 ms ONNX model waited about 560 us to
start (``compute_input``). For an instance that declares ``releases_gil`` (its ``execute`` soon enters
native code without the GIL: onnxruntime, TensorRT), the loop waits on a lock, the GIL released, until
the worker runs (``HANDOFF_TIMEOUT_S`` at most); the worker drops the GIL in the framework call and the
loop goes on. A python model holds the GIL while it runs, so the loop would wait on it instead: its
executions start the ordinary way.

Answers given later: a python model may answer a request after its execution, through the request's response
sender (Triton frees the instance meanwhile). A caller that passes ``answers_later`` to ``execute`` gets an asyncio
future of such an answer in its results and releases the instance as usual. Other callers get the answer itself, the
execution lasting until it is in. Either way the request counts a success, as Triton 2.51's python backend reports it
when ``execute`` returns (``PbMetricReporter``), whatever comes of it later: a client that left or cancelled meanwhile,
an error, an unload before the answer. A caller that gets the future is charged the execution as it ends.

Instance-group updates: a version whose instance groups change is served by a new pool that keeps some of the
previous pool's instances (``adopted``, with their worker threads). Those are ``held``, never idle, until the
registry ``admit``s them once the previous pool's scheduler has drained, so an instance never runs executions of
both pools at once; the previous pool's ``close`` leaves the instances it ``hand_over``-ed running.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Awaitable, Callable

from serving_pod.backends.base import ModelInstance
from serving_pod.core import suspend
from serving_pod.core.errors import InternalError, ServerError, execution_error
from serving_pod.core.statistics import ModelStats
from serving_pod.core.types import InferRequest, InferResponse

_log = logging.getLogger(__name__)

Result = InferResponse | ServerError | None
BatchSizer = Callable[[InferRequest], int]

#: every one of the last INLINE_WINDOW threaded executions must be this fast to go inline
INLINE_ENTER_NS = 500_000
INLINE_WINDOW = 64
#: of those, at most this many may take INLINE_EXIT_NS of wall time or more
INLINE_SLOW_WALLS = INLINE_WINDOW // 8
#: inline executions in a row slower than INLINE_EXIT_NS, this many at least and INLINE_EXIT_HELD_NS in all, return
#: the instance to its thread
INLINE_EXIT_NS = 2_000_000
INLINE_EXIT_STRIKES = 2
INLINE_EXIT_HELD_NS = 50_000_000
INLINE_COOLDOWN = 1_000
#: the longest the loop waits for a woken worker thread to take the GIL (see the module docstring)
HANDOFF_TIMEOUT_S = 0.002


class _Mode:
    """Per-instance execution-mode bookkeeping (see the module docstring)."""

    __slots__ = ("allowed", "forced", "cpu_bound", "suspends", "inline", "fast_streak", "slow_walls", "cooldown",
                 "strikes", "held_ns")

    def __init__(self, allowed: bool, forced: bool, cpu_bound: bool = False, suspends: bool = False) -> None:
        self.allowed = allowed
        self.forced = forced
        self.cpu_bound = cpu_bound
        #: runs "inline" in a greenlet that suspends at engine calls (see the module docstring)
        self.suspends = suspends
        self.inline = forced
        self.fast_streak = 0
        self.slow_walls = 0  # executions of the current streak that took INLINE_EXIT_NS of wall time or more
        self.cooldown = 0
        self.strikes = 0
        self.held_ns = 0  # how long the current streak of slow inline executions held the loop

    def after_thread(self, duration_ns: int, cpu_ns: int) -> None:
        if not self.allowed:
            return
        if self.cooldown:
            self.cooldown -= 1
            return
        # the worker thread's CPU time is what the loop would spend inline; its wall time also counts waits
        # for the GIL while the loop is busy (under load that alone can exceed INLINE_EXIT_NS at times), and
        # is bounded separately so a model that sleeps or waits on I/O (slow every time) never goes inline
        if cpu_ns >= INLINE_ENTER_NS:
            self.fast_streak = self.slow_walls = 0
            return
        self.fast_streak += 1
        if duration_ns >= INLINE_EXIT_NS and not self.cpu_bound:
            self.slow_walls += 1
        if self.fast_streak >= INLINE_WINDOW:
            if self.slow_walls <= INLINE_SLOW_WALLS:
                self.inline = True
            self.fast_streak = self.slow_walls = 0  # else the next INLINE_WINDOW is judged afresh

    def refuse(self, reason: str) -> None:
        """Never inline again (unless forced): the instance turned out to block in a way the loop cannot."""
        if self.allowed and not self.forced:
            _log.info("an instance stays on its thread: %s", reason)
        self.allowed = False
        if not self.forced:
            self.inline = False

    def after_inline(self, duration_ns: int) -> None:
        if duration_ns <= INLINE_EXIT_NS or self.forced:
            self.strikes = self.held_ns = 0
            return
        self.strikes += 1
        self.held_ns += duration_ns
        if self.strikes >= INLINE_EXIT_STRIKES and self.held_ns >= INLINE_EXIT_HELD_NS:
            self.inline = False
            self.fast_streak = self.slow_walls = 0
            self.strikes = self.held_ns = 0
            self.cooldown = INLINE_COOLDOWN


class InstancePool:
    """Idle-instance bookkeeping plus execution on per-instance threads."""

    def __init__(
        self,
        instances: list[ModelInstance],
        names: list[str],
        stats: ModelStats,
        batch_size_of: BatchSizer,
        execution_mode: str = "auto",
        *,
        signatures: list[bytes] | None = None,
        adopted: dict[int, ThreadPoolExecutor] | None = None,
        passive: frozenset[int] = frozenset(),
    ) -> None:
        self.instances = instances
        self.names = names
        self.stats = stats
        self.batch_size_of = batch_size_of
        #: each instance's ``instance_groups.signature``: what a later instance-group update may keep
        self.signatures = signatures or []
        adopted = adopted or {}
        self._executors = [
            adopted.get(index) or ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
            for index, name in enumerate(names)
        ]
        #: instances taken over from the version's previous pool: idle only once ``admit`` says that pool is done
        self.held: set[int] = set(adopted)
        #: instances of ``passive: true`` groups (``instance_groups.passive_indices``): loaded, never scheduled
        self.passive = passive
        #: instances this pool handed over to the next pool of its version: ``close`` leaves them running
        self._handed_over: set[int] = set()
        self._listeners: list[Callable[[], None]] = []
        self._modes = [_mode(instance, execution_mode) for instance in instances]
        #: what a suspended execution restores before it goes on (``suspends_on_engine`` instances)
        self._resume = [getattr(instance, "on_resume", None) for instance in instances]
        #: ``execute_on_loop`` of instances that wait on I/O (an isolated python model's child process)
        self._on_loop = [getattr(instance, "execute_on_loop", None) for instance in instances]
        #: instances whose execution releases the GIL in native code: their worker gets the GIL handed over
        self._hand_off = [bool(getattr(instance, "releases_gil", False)) for instance in instances]
        self._idle: deque[int] = deque(i for i in range(len(instances)) if i not in self.held and i not in passive)
        #: callers of ``acquire`` waiting for an instance, first come first served: ``release`` hands the instance
        #: to the first of them directly, so no caller that comes later can take it before the woken one runs
        self._waiters: deque[asyncio.Future[int]] = deque()

    def __len__(self) -> int:
        return len(self.instances)

    def idle_count(self) -> int:
        return len(self._idle)

    async def acquire(self) -> int:
        """Index of an idle instance, waiting (first come, first served) if all are busy."""
        if self._idle and not self._waiters:
            return self._idle.popleft()
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed an instance as its caller went away: pass it on
                self.release(waiter.result())
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def try_acquire(self) -> int | None:
        """An idle instance now, or None; never one while callers wait for one (fairness)."""
        if self._waiters or not self._idle:
            return None
        return self._idle.popleft()

    def release(self, index: int) -> None:
        """Instance ``index`` is free: the first waiting caller's now, else idle."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(index)
                return
        self._idle.append(index)

    def notify_when_available(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when a held instance is admitted. Only a pool with held instances keeps it: otherwise an
        instance comes back only from an execution, which its scheduler sees end."""
        if self.held:
            self._listeners.append(callback)

    def admit(self, index: int) -> None:
        """A held instance (``held``) is idle from now on: the previous pool of its version has drained."""
        self.held.discard(index)
        if index not in self.passive:
            self.release(index)
        listeners, self._listeners = self._listeners, []
        for callback in listeners:
            callback()

    def worker(self, index: int) -> ThreadPoolExecutor:
        """Instance ``index``'s worker thread (a next pool of this version that keeps the instance runs it there)."""
        return self._executors[index]

    def hand_over(self, index: int) -> None:
        """Instance ``index`` and its worker thread belong to the next pool of this version now: ``close`` keeps them."""
        self._handed_over.add(index)

    def inline_now(self) -> int | None:
        """An instance a request may run on at once without ``acquire``-ing it, or None: one that runs inline and is
        not ``held``. Its executions complete on the loop thread before anything else runs there, so two can never
        overlap, whoever holds the instance (callers waiting for it from its time on its thread need not make later
        ones wait: ``schedulers/default.py``). The mode of an instance changes only as one of its executions ends,
        one at a time, so while it runs inline none of its executions is on its thread.
        """
        for index, mode in enumerate(self._modes):
            if mode.inline and not mode.suspends and index not in self.held and index not in self.passive:
                return index
        return None

    def runs_inline(self, index: int) -> bool:
        """Whether ``execute`` on this instance completes without suspending (see the module docstring)."""
        mode = self._modes[index]
        return mode.inline and not mode.suspends

    def execute(self, index: int, requests: list[InferRequest], answers_later: bool = False) -> Awaitable[list[Result]]:
        """Start ``requests`` on instance ``index`` now; the awaitable gives one result per request.

        Neither this nor the awaitable raises: a failure becomes an error result for each request.
        Starting here rather than in a task's first step saves a loop turn before the work reaches the
        instance's thread or process (an inline instance has run when this returns).

        ``answers_later``: the caller takes, for a request the instance answers after its execution (a python model's
        response sender: the backend gives a ``concurrent.futures.Future``), an asyncio future of the answer, the
        instance being free meanwhile (``_charged``); otherwise the execution ends with every answer in.
        """
        try:
            return self._start(index, requests, answers_later)
        except Exception as exc:  # a backend bug, or a pool shutting down: fail these requests, not the server
            return _failed(exc, len(requests))

    def _start(self, index: int, requests: list[InferRequest], answers_later: bool) -> Awaitable[list[Result]]:
        mode = self._modes[index]
        if mode.inline:
            if mode.suspends:
                return self._run_suspended(index, requests, answers_later)
            done = asyncio.get_running_loop().create_future()
            done.set_result(self.execute_inline(index, requests, answers_later))
            return done
        dispatch_ns = time.monotonic_ns()
        on_loop = self._on_loop[index]
        pending = on_loop(requests) if on_loop is not None else None
        if pending is not None:
            return self._finish_on_loop(pending, requests, dispatch_ns, time.monotonic_ns(), answers_later)
        return self._finish_threaded(self.run_threaded(index, requests, answers_later), mode, requests, dispatch_ns)

    def run_threaded(self, index: int, requests: list[InferRequest],
                     answers_later: bool = False) -> Awaitable[tuple[list[Result], int, int, int, int]]:
        """Start ``requests`` on instance ``index``'s worker thread, uncharged: (results, start, end, thread CPU ns,
        ns the thread spent blocked on the engine).

        The GIL is handed over to the worker when the instance declares ``releases_gil`` (module docstring).
        """
        started = _locked() if self._hand_off[index] else None
        running = asyncio.get_running_loop().run_in_executor(
            self._executors[index], _run_threaded, self.instances[index], requests, started, answers_later
        )
        if started is not None:
            started.acquire(timeout=HANDOFF_TIMEOUT_S)  # the GIL is free until the worker runs
        return running

    async def _finish_on_loop(self, pending: Awaitable[list[Result]], requests: list[InferRequest], dispatch_ns: int,
                              start_ns: int, answers_later: bool) -> list[Result]:
        try:
            results = _checked(list(await pending), requests)
        except ServerError as exc:
            results = [exc] * len(requests)
        except Exception as exc:  # a backend bug must fail these requests, not the server
            results = [InternalError(f"{type(exc).__name__}: {exc}")] * len(requests)
        end_ns = time.monotonic_ns()
        if not answers_later and _owed(results):
            results = [_later(await asyncio.wrap_future(r)) if type(r) is Future else r for r in results]
        return self._charged(requests, results, dispatch_ns, start_ns, end_ns)

    async def _finish_threaded(self, running: Awaitable[tuple[list[Result], int, int, int, int]], mode: _Mode,
                               requests: list[InferRequest], dispatch_ns: int) -> list[Result]:
        results, start_ns, end_ns, cpu_ns, waited_ns = await running
        if waited_ns and mode.allowed and not mode.suspends:  # once: a model kept on its thread waits every time
            mode.refuse(f"model '{requests[0].model_name}' waited on the engine (a BLS call or model loading its "
                        "source check missed), and the event loop thread cannot wait for it there")
        mode.after_thread(end_ns - start_ns - waited_ns, cpu_ns)
        return self._charged(requests, results, dispatch_ns, start_ns, end_ns)

    async def _run_suspended(self, index: int, requests: list[InferRequest], answers_later: bool) -> list[Result]:
        """``execute`` in a greenlet on the loop thread, suspended at its engine calls (module docstring)."""
        dispatch_ns = time.monotonic_ns()
        held = suspend.Run()
        results, start_ns, end_ns = await suspend.run(
            _run, self.instances[index], requests, answers_later, resume=self._resume[index], account=held
        )
        self._modes[index].after_inline(held.blocked_ns)
        return self._charged(requests, results, dispatch_ns, start_ns, end_ns)

    def execute_inline(self, index: int, requests: list[InferRequest], answers_later: bool = False) -> list[Result]:
        """``execute`` on the calling (event loop) thread, for an instance where ``runs_inline`` holds."""
        dispatch_ns = time.monotonic_ns()
        refused = suspend.refusals()
        results, start_ns, end_ns = _run(self.instances[index], requests, answers_later)
        mode = self._modes[index]
        if suspend.refusals() != refused:  # it made a blocking call on the engine: on its thread that call can wait
            mode.refuse(f"model '{requests[0].model_name}' made a blocking call on the engine from the event loop "
                        "thread, which was refused")
        mode.after_inline(end_ns - start_ns)
        return self._charged(requests, results, dispatch_ns, start_ns, end_ns)

    def _charged(self, requests: list[InferRequest], results: list[Result], dispatch_ns: int, start_ns: int,
                 end_ns: int) -> list[Result]:
        """Charge the execution now; a request the instance answers later (``execute``'s ``answers_later``) counts a
        success (module docstring) and its result becomes an asyncio future of its answer."""
        if not _owed(results):
            self.charge(requests, results, dispatch_ns, start_ns, end_ns, time.monotonic_ns())
            return results
        counted = [None if type(r) is Future else r for r in results]
        self.charge(requests, counted, dispatch_ns, start_ns, end_ns, time.monotonic_ns())
        loop = asyncio.get_running_loop()
        return [asyncio.wrap_future(r, loop=loop) if type(r) is Future else r for r in results]

    def charge(
        self,
        requests: list[InferRequest],
        results: list[Result],
        dispatch_ns: int,
        start_ns: int,
        end_ns: int,
        done_ns: int,
        executed_size: int | None = None,
    ) -> None:
        """Charge one execution and each of its requests to the model's statistics. ``executed_size``: the batch
        size the execution ran at, where it held more than ``requests`` (a direct sequence batch padded with null
        requests: Triton counts the padding in ``batch_stats`` only).

        A failed request adds to ``fail`` and not to ``inference_count``, as in Triton; an error the model sent as
        its response (``ServerError.sent_as_response``: a python model's ``InferenceResponse(error=...)``), or gave
        after its execution (``ServerError.answered_later``), is a success there.
        """
        stats = self.stats
        input_ns, infer_ns, output_ns = start_ns - dispatch_ns, end_ns - start_ns, done_ns - end_ns
        batch_size = succeeded = 0
        request_ns: list[int] = []
        queue_ns: list[int] = []
        for request, result in zip(requests, results):
            if request.trace is not None:
                request.trace.computed(dispatch_ns, start_ns, end_ns, done_ns)
            size = self.batch_size_of(request)
            batch_size += size
            if isinstance(result, ServerError) and not (result.sent_as_response or result.answered_later):
                stats.record_failure(done_ns - request.arrival_ns, "BACKEND")
            else:
                succeeded += size
                request_ns.append(done_ns - request.arrival_ns)
                queue_ns.append(dispatch_ns - (request.queue_start_ns or request.arrival_ns))
                if request.stats_sink is not None:  # an ensemble's step: the ensemble is charged it too
                    request.stats_sink.add(input_ns, infer_ns, output_ns)
        stats.record_execution(batch_size if executed_size is None else executed_size, input_ns, infer_ns, output_ns,
                               succeeded)
        if request_ns:
            stats.record_successes(request_ns, queue_ns, input_ns, infer_ns, output_ns)

    def close(self) -> None:
        """Finalize every instance and stop the worker threads (after the scheduler drained), but those handed over."""
        for index, (executor, instance) in enumerate(zip(self._executors, self.instances)):
            if index in self._handed_over:
                continue
            try:
                executor.submit(instance.close).result()
            except Exception:  # a failing finalize must not stop the others
                pass
            executor.shutdown(wait=True)


def _mode(instance: ModelInstance, execution_mode: str) -> _Mode:
    suspends = bool(getattr(instance, "suspends_on_engine", False))
    return _Mode(
        allowed=execution_mode != "thread" and (suspends or bool(getattr(instance, "inline_safe", False))),
        forced=execution_mode == "inline",
        cpu_bound=bool(getattr(instance, "cpu_bound", False)),
        suspends=suspends,
    )


def _locked() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


def _run_threaded(
    instance: ModelInstance, requests: list[InferRequest], started: threading.Lock | None, answers_later: bool = False
) -> tuple[list[Result], int, int, int, int]:
    if started is not None:
        started.release()  # the loop goes on once this thread gives up the GIL
    cpu_ns = time.thread_time_ns()
    waited_ns = suspend.waited_ns()
    results, start_ns, end_ns = _run(instance, requests, answers_later)
    return results, start_ns, end_ns, time.thread_time_ns() - cpu_ns, suspend.waited_ns() - waited_ns


def _run(
    instance: ModelInstance, requests: list[InferRequest], answers_later: bool = False
) -> tuple[list[Result], int, int]:
    start_ns = time.monotonic_ns()
    try:
        results = _checked(list(instance.execute(requests)), requests)
    except ServerError as exc:
        exc.in_execution = True
        results = [exc] * len(requests)
    except Exception as exc:  # a backend bug must fail these requests, not the server
        results = [execution_error(f"{type(exc).__name__}: {exc}")] * len(requests)
    if not answers_later and _owed(results):  # a caller that cannot take them: the execution ends with the answers
        take = _suspended_result if suspend.suspendable() else Future.result
        results = [_later(take(r)) if type(r) is Future else r for r in results]
    return results, start_ns, time.monotonic_ns()


def _suspended_result(answer: Future) -> Result:
    return suspend.wait(asyncio.wrap_future(answer))


def _owed(results: list) -> bool:
    """Whether the instance answers some of ``results`` later (``InstancePool.execute``'s ``answers_later``)."""
    for result in results:
        if type(result) is Future:
            return True
    return False


def forward_answer(answer: asyncio.Future, to: asyncio.Future) -> None:
    """``to`` (a caller's future) gets an answer given later (``InstancePool.execute``) once it is in; a caller that
    went away (``to`` cancelled) cancels ``answer``, so the instance stops waiting for it."""

    def forward(done: asyncio.Future) -> None:
        if not to.done():
            if done.cancelled():
                to.cancel()
            else:
                to.set_result(done.result())

    def back(done: asyncio.Future) -> None:
        if done.cancelled() and not answer.done():
            answer.cancel()

    answer.add_done_callback(forward)
    to.add_done_callback(back)


def _later(answer: Result) -> Result:
    """An answer the instance gave after its execution, to a caller that waited for it: an error counts a success
    (``ServerError.answered_later``, module docstring)."""
    if isinstance(answer, ServerError):
        answer.answered_later = True
    return answer


async def _failed(exc: Exception, count: int) -> list[Result]:
    return [InternalError(f"{type(exc).__name__}: {exc}")] * count


def _checked(results: list[Result], requests: list[InferRequest]) -> list[Result]:
    if len(results) != len(requests):
        error = execution_error(f"backend returned {len(results)} responses for {len(requests)} requests")
        return [error] * len(requests)
    return results
