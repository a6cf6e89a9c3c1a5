"""The blocking form of the Python-first API: ``Engine`` (in-process) and ``Server`` (plus HTTP/gRPC).

The engine is asyncio-based, so each of these runs its ``AsyncEngine`` / ``AsyncServer`` on an
event loop in a background thread and turns every verb into a blocking call. ``infer_async``
awaits the same work from any other event loop (a FastAPI handler, a notebook cell). ``Server``
adds ``serve()``, which blocks until SIGINT/SIGTERM as ``tritonserver`` and PyTriton do.
"""

from __future__ import annotations

import asyncio
import queue
import signal
import threading
from typing import Any, Callable, Coroutine, Iterator, Mapping, Sequence

import numpy as np

from serving_pod.core import suspend
from serving_pod.pyapi.aio import AsyncEngine, AsyncServer, Repository
from serving_pod.pyapi.config import BoundModel, ModelConfig, Tensor


class LoopThread:
    """An event loop running forever on a daemon thread; ``call`` runs a coroutine there and waits."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        if threading.current_thread() is self._thread:
            coroutine.close()
            suspend.note_refusal()
            raise RuntimeError("a blocking engine call was made from the engine's own event loop thread")
        # counted as a wait on the engine: a bound function that makes this call on its instance thread stays there
        # (``schedulers/instances.py``), since on the loop thread the call could not wait
        return suspend.block(self.submit(coroutine), timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


class Engine:
    """The inference engine in this process, behind blocking calls (see ``AsyncEngine`` for the arguments).

    ``with Engine("models/") as engine: engine.infer("simple", {"INPUT0": x, "INPUT1": y})``
    """

    def __init__(self, model_repository: Repository = None, **options: Any) -> None:
        self._aio = self._make(model_repository, options)
        self._thread: LoopThread | None = None

    def _make(self, model_repository: Repository, options: dict[str, Any]) -> AsyncEngine:
        return AsyncEngine(model_repository, **options)

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        if self._thread is None:
            coroutine.close()
            raise RuntimeError("the engine is not started: use 'with' or call start()")
        return self._thread.call(coroutine)

    def _run(self, function: Callable[[], Any]) -> Any:
        """A synchronous engine read, done on the loop thread (statistics are updated there)."""
        async def read() -> Any:
            return function()

        return self._call(read())

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "Engine":
        if self._thread is not None:
            raise RuntimeError("the engine is already started")
        self._thread = LoopThread("ferry-pyapi")
        try:
            self._thread.call(self._aio.start())
        except BaseException:
            self._thread.close()
            self._thread = None
            raise
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        try:
            self._thread.call(self._aio.stop())
        finally:
            self._thread.close()
            self._thread = None

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def startup_failures(self) -> dict[str, str]:
        return self._run(lambda: self._aio.startup_failures)

    # --- models ------------------------------------------------------------------------------
    def bind(self, model_name: str, infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
             inputs: Sequence[Tensor], outputs: Sequence[Tensor], config: ModelConfig | None = None) -> BoundModel:
        """Serve ``infer_func`` as ``model_name``; the model is loaded when this returns."""
        return self._call(self._aio.bind(model_name, infer_func, inputs, outputs, config))

    def unbind(self, model_name: str) -> None:
        self._call(self._aio.unbind(model_name))

    def load(self, model_name: str, config: Mapping[str, Any] | str | None = None) -> None:
        self._call(self._aio.load(model_name, config))

    def unload(self, model_name: str) -> None:
        self._call(self._aio.unload(model_name))

    def models(self) -> list[dict[str, str]]:
        return self._run(self._aio.models)

    def is_ready(self, model_name: str = "", version: str = "") -> bool:
        return self._run(lambda: self._aio.is_ready(model_name, version))

    def model_config(self, model_name: str, version: str = "") -> dict[str, Any]:
        return self._run(lambda: self._aio.model_config(model_name, version))

    def model_metadata(self, model_name: str, version: str = "") -> dict[str, Any]:
        return self._run(lambda: self._aio.model_metadata(model_name, version))

    # --- inference ---------------------------------------------------------------------------
    def infer(self, model_name: str, inputs: Mapping[str, Any], **options: Any) -> dict[str, np.ndarray]:
        """One inference (options: version, outputs, parameters, request_id). Raises ``ServerError``."""
        return self._call(self._aio.infer(model_name, inputs, **options))

    async def infer_async(self, model_name: str, inputs: Mapping[str, Any], **options: Any) -> dict[str, np.ndarray]:
        """``infer`` awaited from another event loop (the engine keeps running on its own thread)."""
        if self._thread is None:
            raise RuntimeError("the engine is not started: use 'with' or call start()")
        return await asyncio.wrap_future(self._thread.submit(self._aio.infer(model_name, inputs, **options)))

    def stream(self, model_name: str, inputs: Mapping[str, Any], **options: Any) -> Iterator[dict[str, np.ndarray]]:
        """The responses of a decoupled model as they come; leaving the loop early cancels the request."""
        if self._thread is None:
            raise RuntimeError("the engine is not started: use 'with' or call start()")
        out: queue.Queue = queue.Queue()
        done = object()

        async def pump() -> None:
            try:
                async for item in self._aio.stream(model_name, inputs, **options):
                    out.put(item)
            except Exception as exc:  # handed to the consuming thread
                out.put(exc)
            finally:
                out.put(done)

        future = self._thread.submit(pump())
        try:
            while (item := out.get()) is not done:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            future.cancel()

    # --- statistics --------------------------------------------------------------------------
    def statistics(self, model_name: str = "", version: str = "") -> list[dict[str, Any]]:
        return self._run(lambda: self._aio.statistics(model_name, version))

    def metrics(self) -> str:
        return self._run(self._aio.metrics)


class Server(Engine):
    """``Engine`` whose models also answer HTTP, gRPC and metrics (see ``AsyncServer`` for the arguments).

    ``with Server(http_port=0, grpc_port=0) as server: server.bind(...); server.serve()``
    """

    _aio: AsyncServer

    def _make(self, model_repository: Repository, options: dict[str, Any]) -> AsyncEngine:
        return AsyncServer(model_repository, **options)

    @property
    def http_port(self) -> int:
        return self._aio.http_port

    @property
    def grpc_port(self) -> int:
        return self._aio.grpc_port

    @property
    def metrics_port(self) -> int:
        return self._aio.metrics_port

    @property
    def http_url(self) -> str:
        return self._aio.http_url

    @property
    def grpc_url(self) -> str:
        return self._aio.grpc_url

    @property
    def metrics_url(self) -> str:
        return self._aio.metrics_url

    def serve(self, stop: threading.Event | None = None) -> None:
        """Block until SIGINT/SIGTERM (or ``stop`` is set), then shut down: drain, unload, close ports."""
        if self._thread is None:
            self.start()
        stop = stop or threading.Event()
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda *_: stop.set())
        try:
            while not stop.wait(0.2):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()
