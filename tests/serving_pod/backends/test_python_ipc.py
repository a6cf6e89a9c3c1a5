"""The isolated python models' message channel (``backends.python_ipc``) over real pipes, in each way of reading.

Loop mode (the server's end) against a thread-mode peer: calls answered on the loop (``call_async``) and
from another thread (``call``), messages far larger than a pipe (split over many reads), a call that
raises, posts, the peer going away (pending calls fail with ``ConnectionError``, ``on_close`` runs once,
off the loop) and ``close`` from another thread. Pump mode (the child's end): calls run on the thread
that serves, threads of the call's own waiting on the peer read for themselves, and ``serve`` returns
when the peer goes away.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest

from serving_pod.backends.python_ipc import Channel


def _pipes() -> tuple[tuple[Connection, Connection], tuple[Connection, Connection]]:
    """(loop end reader, writer), (thread end reader, writer)."""
    a_r, b_w = os.pipe()
    b_r, a_w = os.pipe()
    return ((Connection(a_r, writable=False), Connection(a_w, readable=False)),
            (Connection(b_r, writable=False), Connection(b_w, readable=False)))


class Peer:
    """The thread-reading end: answers ``echo``, ``double`` and ``fail``; records posts."""

    def __init__(self, reader: Connection, writer: Connection) -> None:
        self.posts: list[tuple[str, tuple]] = []
        self.pool = ThreadPoolExecutor(2)
        self.channel = Channel(reader, writer, name="peer", on_call=self.on_call,
                               on_post=lambda kind, args: self.posts.append((kind, args)), schedule=self.pool.submit)

    def on_call(self, kind: str, args: tuple) -> Any:
        if kind == "echo":
            return args[0]
        if kind == "double":
            return args[0] * 2
        raise ValueError(f"no such call {kind!r}")


@pytest.fixture
def ends():
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, name="loop", daemon=True)
    runner.start()
    (lr, lw), (pr, pw) = _pipes()
    closed: list[str] = []
    pool = ThreadPoolExecutor(2)
    server = Channel(lr, lw, name="server", on_call=lambda kind, args: args[0] + 1,
                     on_post=lambda kind, args: None, schedule=pool.submit,
                     on_close=lambda: closed.append(threading.current_thread().name), loop=loop)
    peer = Peer(pr, pw)
    server.start()
    peer.channel.start()
    yield loop, server, peer, closed
    peer.channel.close()
    server.close()
    loop.call_soon_threadsafe(loop.stop)
    runner.join(5)
    loop.close()
    pool.shutdown()
    peer.pool.shutdown()


def _on_loop(loop: asyncio.AbstractEventLoop, coroutine: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result(30)


def test_call_async_is_answered_on_the_loop(ends) -> None:
    loop, server, peer, _ = ends
    assert server.on_loop and not peer.channel.on_loop

    async def calls() -> list[Any]:
        return list(await asyncio.gather(*(server.call_async("double", i) for i in range(50))))

    assert _on_loop(loop, calls()) == [2 * i for i in range(50)]


def test_messages_larger_than_a_pipe_arrive_whole_both_ways(ends) -> None:
    loop, server, _, _ = ends
    big = np.arange(3_000_000, dtype=np.float32)  # 12 MB: hundreds of pipe-fulls, many reads

    async def roundtrip() -> Any:
        return await server.call_async("echo", big)

    np.testing.assert_array_equal(_on_loop(loop, roundtrip()), big)


def test_a_blocking_call_from_another_thread_still_works(ends) -> None:
    _, server, peer, _ = ends
    assert server.call("double", 21).result(10) == 42
    assert peer.channel.call("add_one", 41).result(10) == 42  # answered by the loop end


def test_an_error_in_the_peer_fails_only_that_call(ends) -> None:
    loop, server, _, _ = ends

    async def calls() -> tuple[Any, Any]:
        bad = server.call_async("nope")
        good = server.call_async("echo", "still here")
        with pytest.raises(ValueError, match="no such call 'nope'"):
            await bad
        return await good, None

    assert _on_loop(loop, calls())[0] == "still here"


def test_posts_reach_the_peer(ends) -> None:
    loop, server, peer, _ = ends

    async def post_then_call() -> Any:
        server.post("note", 1, 2)
        return await server.call_async("echo", "after")  # answered after the post was handled

    assert _on_loop(loop, post_then_call()) == "after"
    assert peer.posts == [("note", (1, 2))]


def test_peer_gone_fails_pending_calls_and_runs_on_close_off_the_loop(ends) -> None:
    loop, server, peer, closed = ends
    started = threading.Event()
    release = threading.Event()

    def slow(kind: str, args: tuple) -> Any:
        started.set()
        release.wait(10)
        return None

    peer.channel._on_call = slow  # the peer is busy on this call when it goes away

    async def pending() -> Any:
        return await server.call_async("slow")

    future = asyncio.run_coroutine_threadsafe(pending(), loop)
    assert started.wait(10)
    peer.channel.close()  # both of the peer's pipe ends: the loop end reads EOF
    with pytest.raises(ConnectionError, match="server: peer is gone"):
        future.result(10)
    release.set()
    for _ in range(200):
        if closed:
            break
        release.wait(0.05)
    assert len(closed) == 1 and closed[0] != "loop"  # once, on the pool, not on the loop's thread
    with pytest.raises(ConnectionError, match="closed"):
        server.call("echo", 1).result(10)


def test_close_from_another_thread_fails_what_is_pending(ends) -> None:
    loop, server, peer, _ = ends
    started, release = threading.Event(), threading.Event()

    def hang(kind: str, args: tuple) -> Any:
        started.set()
        release.wait(10)

    peer.channel._on_call = hang

    async def pending() -> Any:
        return await server.call_async("hang")

    future = asyncio.run_coroutine_threadsafe(pending(), loop)
    assert started.wait(10)
    server.close()
    with pytest.raises(ConnectionError, match="server: peer is gone"):
        future.result(10)
    assert server.closed
    release.set()


# --------------------------------------------------------------------------- pump mode (the child's end)


@pytest.fixture
def pumped():
    """A pump-mode end served by its own 'main' thread, and a thread-mode peer."""
    (pr, pw), (tr, tw) = _pipes()
    seen: dict[str, Any] = {}
    helpers = ThreadPoolExecutor(3)

    def on_call(kind: str, args: tuple) -> Any:
        seen["thread"] = threading.current_thread().name
        if kind == "fan_out":  # waits on its own threads, each waiting on the peer
            return sum(helpers.map(lambda v: channel.request("double", v), args[0]))
        if kind == "ask":  # waits on the peer from the serving thread itself
            return channel.request("double", args[0])
        raise ValueError(kind)

    channel = Channel(pr, pw, name="pumped", on_call=on_call, on_post=lambda kind, args: None, pump=True)
    main = threading.Thread(target=channel.serve, name="main", daemon=True)
    main.start()
    peer = Peer(tr, tw)
    peer.channel.start()
    yield channel, peer, main, seen
    peer.channel.close()
    main.join(10)
    helpers.shutdown()
    peer.pool.shutdown()


def test_pump_mode_runs_calls_on_the_serving_thread(pumped) -> None:
    _, peer, _, seen = pumped
    assert peer.channel.call("ask", 4).result(10) == 8
    assert seen["thread"] == "main"


def test_pump_mode_threads_waiting_on_the_peer_read_for_themselves(pumped) -> None:
    _, peer, _, _ = pumped
    futures = [peer.channel.call("fan_out", list(range(n))) for n in (5, 7)]  # the second queues behind
    assert [f.result(20) for f in futures] == [2 * sum(range(5)), 2 * sum(range(7))]


def test_pump_mode_serve_returns_when_the_peer_goes_away(pumped) -> None:
    channel, peer, main, _ = pumped
    peer.channel.close()
    main.join(10)
    assert not main.is_alive() and channel.closed
    with pytest.raises(ConnectionError):
        channel.request("double", 1)
