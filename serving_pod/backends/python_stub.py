"""Child-process side of an isolated python model: ``python -m serving_pod.backends.python_stub R W``.

``R``/``W`` are inherited pipe descriptors (server -> child, child -> server). The child hosts
one ``python_model.PythonModelInstance`` and answers the server's calls on its main thread, which
also reads the pipe while idle (``Channel`` in pump mode: no thread hop before ``execute``),
one at a time: ``init(spec)``, ``execute(keys, requests)`` (requests as ``core.interprocess``
tuples), ``autocomplete(file, json, label)``, ``finalize()``. Model-side callbacks travel back over the same channel: decoupled
responses (``respond``), cancellation checks (``cancelled``), BLS (``infer`` / ``stream``),
model loading (``model_control``) and custom metrics (``metric``), all answered by the server's
engine. When the server goes away the child finalizes and exits.

A non-decoupled request the model answers later through its response sender (the instance gives a
``concurrent.futures.Future``) is ``LATER`` in the ``execute`` reply, and its answer an ``answer`` post once the
model sent it, so the child takes the next ``execute`` meanwhile, as Triton's stub does. The server posts
``cancel_later`` when the client of such a request went away. ``finalize(grace)`` waits ``grace`` seconds for the
answers still owed (``python_model.UNLOAD_GRACE_S`` on the server), then answers them ``UNAVAILABLE``.
"""

from __future__ import annotations

import collections
import itertools
import queue
import sys
import threading
from concurrent.futures import Future
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from serving_pod.backends.python_ipc import Channel
from serving_pod.core.interprocess import (
    request_from_wire, request_to_wire, response_from_wire, result_from_wire, result_to_wire, results_to_wire,
)

_END = object()

#: an ``execute`` result meaning "answered later by an ``answer`` post" (the server holds a future for it)
LATER = "answered later"


class _RemoteFlag:
    """``request.cancelled`` in the child: asks the server whether the client went away."""

    __slots__ = ("_channel", "_key")

    def __init__(self, channel: Channel, key: int) -> None:
        self._channel = channel
        self._key = key

    def is_set(self) -> bool:
        try:
            return bool(self._channel.request("cancelled", self._key))
        except ConnectionError:
            return True


class _RemoteEvent(threading.Event):
    """Cancel flag of a decoupled BLS stream; setting it tells the server."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self._channel = channel
        self.key = 0

    def set(self) -> None:
        if not self.is_set() and self.key:
            try:
                self._channel.post("stream_cancel", self.key)
            except ConnectionError:
                pass
        super().set()


class _RemoteMetrics:
    """The server's custom metric store as ``pb_metrics`` sees it from the child.

    Updates are one-way posts (the child already refused what the kind does not support); the
    reader on the server applies posts in order before it reads a later call, so ``value``
    sees every earlier update. Families collected here are closed with the next message.
    """

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._doomed: collections.deque[int] = collections.deque()

    def _call(self, operation: str, *args: Any) -> Any:
        self.flush()
        return self._channel.request("metric", operation, *args)

    def new_family(self, name: str, description: str, kind: int, owner: str = "") -> int:
        return self._call("new_family", name, description, kind)  # the server knows the owner

    def new_metric(self, family: int, labels: dict[str, str], buckets: list[float] | None) -> int:
        return self._call("new_metric", family, labels, buckets)

    def update(self, metric: int, operation: str, value: float) -> None:
        self.flush()
        self._channel.post("metric", "update", metric, operation, value)

    def value(self, metric: int) -> float:
        return self._call("value", metric)

    def delete_family_later(self, family: int) -> None:
        self._doomed.append(family)

    def release(self, owner: str) -> None:
        """Nothing to do: the server releases what this process held when it goes away."""

    def flush(self) -> None:
        while self._doomed:
            self._channel.post("metric", "delete_family", self._doomed.popleft())


class _EngineProxy:
    """The engine as BLS calls, model loading and custom metrics see it from the child: every
    call goes to the server."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._streams: dict[int, queue.Queue] = {}
        self._keys = itertools.count(1)
        self.custom_metrics = _RemoteMetrics(channel)

    def load_model_from_thread(
        self, name: str, config: str | None = None, files: dict[str, bytes] | None = None, wait: bool = True
    ) -> None:
        self._channel.request("model_control", "load", name, config, files, wait)

    def unload_model_from_thread(self, name: str, unload_dependents: bool = False, wait: bool = True) -> None:
        self._channel.request("model_control", "unload", name, unload_dependents, wait)

    def model_ready(self, name: str, version: str = "") -> bool:
        return bool(self._channel.request("model_control", "ready", name, version))

    def new_cancel_event(self) -> threading.Event:
        return _RemoteEvent(self._channel)

    def infer_from_thread(self, request: Any) -> Any:
        request.cancelled = None
        return response_from_wire(self._channel.request("infer", request_to_wire(request)))

    def stream_from_thread(self, request: Any) -> Any:
        key = next(self._keys)
        items: queue.Queue = queue.Queue()
        self._streams[key] = items
        cancel = request.cancelled
        if isinstance(cancel, _RemoteEvent):
            cancel.key = key
        request.cancelled = None
        self._channel.post("stream", key, request_to_wire(request))
        return self._iterate(key, items)

    def _iterate(self, key: int, items: queue.Queue) -> Any:
        try:
            while True:
                self._channel.wait_until(lambda: not items.empty())
                item = items.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._streams.pop(key, None)

    def on_stream(self, kind: str, key: int, value: Any) -> None:
        items = self._streams.get(key)
        if items is None:
            return
        if kind == "stream_item":
            items.put(result_from_wire(value))
            return
        if value is not None:  # the stream ended with an error
            items.put(value)
        items.put(_END)

    def fail_streams(self) -> None:
        for items in list(self._streams.values()):
            items.put(ConnectionError("the server went away"))


class _Stub:
    def __init__(self, channel_factory: Any) -> None:
        self.instance: Any = None
        self.channel: Channel = channel_factory(self)
        self.engine = _EngineProxy(self.channel)
        #: answers the model still owes through response senders, by request key
        self.later: dict[int, Future] = {}
        self._later_lock = threading.Lock()

    def on_call(self, kind: str, args: tuple) -> Any:
        if kind == "init":
            from serving_pod.backends.python_model import PythonModelInstance

            self.instance = PythonModelInstance(args[0], self.engine)
            return True
        if kind == "execute":
            keys, shipped = args
            requests = [request_from_wire(wire) for wire in shipped]
            for key, request in zip(keys, requests):
                # the server sends True where the request has a responder / cancel flag
                request.responder = partial(self._respond, key) if request.responder else None
                request.cancelled = _RemoteFlag(self.channel, key) if request.cancelled else None
            try:
                results = self.instance.execute(requests)
                return results_to_wire([self._answer_later(key, result) if type(result) is Future else result
                                        for key, result in zip(keys, results)])
            finally:
                self.engine.custom_metrics.flush()
        if kind == "autocomplete":
            from serving_pod.backends.python import _auto_complete_in_process

            return _auto_complete_in_process(*args)
        if kind == "finalize":
            if args:  # the server's grace for answers still owed
                from serving_pod.backends import python_model

                python_model.UNLOAD_GRACE_S = args[0]
            self.finalize()
            self.channel.stop_serving()
            return True
        raise ValueError(f"unknown call '{kind}'")

    def on_post(self, kind: str, args: tuple) -> None:
        if kind in ("stream_item", "stream_end"):
            self.engine.on_stream(kind, *args)
        elif kind == "cancel_later":  # the client went away: the instance stops waiting for the answer
            with self._later_lock:
                later = self.later.pop(args[0], None)
            if later is not None:
                later.cancel()

    def _answer_later(self, key: int, later: Future) -> str:
        """``LATER`` for a request the model answers through its response sender; the answer follows as an
        ``answer`` post (module docstring), possibly before this ``execute``'s reply."""
        with self._later_lock:
            self.later[key] = later
        later.add_done_callback(partial(self._answered, key))
        return LATER

    def _answered(self, key: int, later: Future) -> None:
        with self._later_lock:
            self.later.pop(key, None)
        if later.cancelled():  # the server cancelled it: nobody waits
            return
        try:
            self.channel.post("answer", key, result_to_wire(later.result()))
        except ConnectionError:
            pass
        except Exception as exc:  # e.g. an unpicklable response parameter
            from serving_pod.core.errors import InternalError

            try:
                self.channel.post("answer", key, InternalError(f"cannot send response: {exc}"))
            except ConnectionError:
                pass

    def _respond(self, key: int, message: Any, final: bool) -> None:
        try:
            self.channel.post("respond", key, result_to_wire(message), final)
        except ConnectionError:
            raise
        except Exception as exc:  # e.g. an unpicklable response parameter
            from serving_pod.core.errors import InternalError

            self.channel.post("respond", key, InternalError(f"cannot send response: {exc}"), final)

    def finalize(self) -> None:
        if self.instance is not None:
            self.instance.close()

    def run(self) -> None:
        self.channel.serve()
        self.finalize()


def main(argv: list[str]) -> int:
    from serving_pod.allocator import keep_freed_memory

    keep_freed_memory()  # the model's tensors are allocated here
    read_fd, write_fd = int(argv[1]), int(argv[2])
    reader = Connection(read_fd, writable=False)
    writer = Connection(write_fd, readable=False)

    def make_channel(stub: _Stub) -> Channel:
        return Channel(
            reader, writer, name="python-stub",
            on_call=stub.on_call, on_post=stub.on_post, on_close=lambda: stub.engine.fail_streams(), pump=True,
        )

    _Stub(make_channel).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
