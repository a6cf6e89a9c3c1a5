"""Blocking code run on the event loop thread, suspended at each wait on the engine (greenlets).

A python model's ``execute`` is synchronous, and a BLS call in it (``InferenceRequest.exec()``) waits for
another model's answer. On an instance thread that wait costs two thread hand-offs (the call to the loop,
its answer back) besides the execution's own two, each a wake-up of a sleeping thread. ``run`` runs such
code on the loop thread instead, in a greenlet: where the code would block on the engine it calls
``wait(awaitable)``, which switches back to the loop; the loop awaits the awaitable and switches the
code back in with its result (or raises its exception there). No thread is woken, and the loop serves
other requests meanwhile.

Only waits made through ``wait`` suspend: code in ``run`` that blocks any other way (a sleep, a lock,
a thread it joins) blocks the loop, so the caller decides what may run here (``schedulers/instances.py``).
``Run.blocked_ns`` is the time the loop spent in the code, its waits excluded. The same code on a thread
blocks on the engine through ``block``/``block_get``, which count the time in ``waited_ns`` (the thread's):
what the code would hold the loop is its wall time less that. A blocking call made on the loop thread outside
``run`` is refused (it would deadlock); ``note_refusal`` counts it for the caller that put the code there.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, TypeVar

import greenlet

T = TypeVar("T")


class _Counts(threading.local):
    """Per thread: ns blocked in ``block``/``block_get`` and blocking calls refused on it (``note_refusal``).
    The class attributes are each thread's starting values (read on every inline execution: a plain attribute
    read, where ``getattr`` with a default raised and caught an AttributeError each time)."""

    ns = 0
    refusals = 0


_counts = _Counts()


class _Suspendable(greenlet.greenlet):
    """A greenlet ``run`` drives: ``wait`` inside it suspends instead of blocking."""


class Run:
    """What one ``run`` measured: how long its code held the loop (``blocked_ns``)."""

    __slots__ = ("blocked_ns",)

    def __init__(self) -> None:
        self.blocked_ns = 0


def suspendable() -> bool:
    """Whether the calling code runs inside ``run`` (a ``wait`` here suspends rather than blocks)."""
    return type(greenlet.getcurrent()) is _Suspendable


def wait(awaitable: Awaitable[T]) -> T:
    """From code inside ``run``: the result of ``awaitable``, awaited on the loop meanwhile (its exception raised
    here). Outside ``run`` a RuntimeError: the caller must block some other way."""
    current = greenlet.getcurrent()
    if type(current) is not _Suspendable:
        raise RuntimeError("suspend.wait() outside suspend.run()")
    return current.parent.switch(awaitable)


def block(future: Future[T], timeout: float | None = None) -> T:
    """``future``'s result, this (non-loop) thread blocking meanwhile (``concurrent.futures.TimeoutError`` after
    ``timeout`` seconds); the wait counts in ``waited_ns``."""
    return _counted(lambda: future.result(timeout))


def block_get(source: queue.Queue) -> Any:
    """``source.get()``, this (non-loop) thread blocking meanwhile; the wait counts in ``waited_ns``."""
    return _counted(source.get)


def _counted(blocking: Callable[[], T]) -> T:
    started = time.monotonic_ns()
    try:
        return blocking()
    finally:
        _counts.ns += time.monotonic_ns() - started


def waited_ns() -> int:
    """Nanoseconds this thread spent in ``block`` and ``block_get`` so far."""
    return _counts.ns


def note_refusal() -> None:
    """Where a blocking call on the engine is refused on the loop thread (outside ``run`` it would deadlock there):
    counted per thread, so the pool that ran the refused code there sends it back to its own thread."""
    _counts.refusals += 1


def refusals() -> int:
    """How many blocking calls were refused on this thread so far (``note_refusal``)."""
    return _counts.refusals


async def run(code: Callable[..., T], *args: Any, resume: Callable[[], None] | None = None,
              account: Run | None = None) -> T:
    """``code(*args)`` on this (the loop's) thread, suspending at each ``wait``; ``resume`` is called before the
    code goes on after a wait (to restore per-thread state that other code on the loop may have changed).
    ``account`` gets the time the loop spent in the code, its waits excluded.

    A cancellation of the awaiting task is raised in the code where it waits: run it in a task of its own
    (shielded) where the code must run to its end whatever becomes of its caller, as a thread would.
    """
    child = _Suspendable(code)
    clock = time.monotonic_ns
    started = clock()
    value: Any = child.switch(*args)
    blocked = clock() - started
    while not child.dead:
        failure: BaseException | None = None
        try:
            outcome = await value
        except BaseException as error:  # the wait's failure is the code's to handle, as a blocking call's would be
            outcome, failure = None, error
        if resume is not None:
            resume()
        started = clock()
        value = child.switch(outcome) if failure is None else child.throw(failure)
        blocked += clock() - started
    if account is not None:
        account.blocked_ns = blocked
    return value
