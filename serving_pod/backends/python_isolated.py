"""Isolated python models: the model runs in a child process (``python_stub``).

Opt-in per model (see ``python.py``). The child is a plain ``subprocess`` of the chosen
interpreter talking over two inherited pipes (``python_ipc.Channel``). Executed requests and their
responses, BLS requests and responses, and decoupled and streamed responses travel in
``core.interprocess``'s compact form; everything else as pickled objects. The child's stderr is
forwarded to the server's and its tail kept, so a child that dies — at start, in ``initialize`` or
mid-``execute`` — yields a clear error naming the model and exit code instead of taking the server down. After a crash the next ``execute``
starts a fresh child (and re-runs ``initialize``).

Decoupled responses, cancellation checks, BLS calls, model loading calls and custom metrics come
back from the child over the same channel and are served here with the real responders and
engine. The metric families a child created belong to it: they go when it exits (the model is
unloaded, or it crashed and a fresh child re-runs ``initialize``).

A non-decoupled request the model answers later through its response sender is ``python_stub.LATER`` in the child's
reply: ``execute`` gives a ``concurrent.futures.Future`` for it (as ``PythonModelInstance`` does in-process, so the
instance is free for the next ``execute``), set by the child's ``answer`` post; a caller that cancels it has the child
stop waiting (``cancel_later``). A child that dies fails what it still owes; an unload waits
``python_model.UNLOAD_GRACE_S`` for it in the child, then answers it ``UNAVAILABLE``.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import itertools
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Awaitable

from serving_pod.backends import pb_metrics, pb_model_loader, python_bridge, python_model
from serving_pod.backends.base import VersionLoadError
from serving_pod.backends.pb_metrics import metric_store
from serving_pod.backends.python_ipc import Channel
from serving_pod.backends.python_stub import LATER
from serving_pod.core import errors
from serving_pod.core.interprocess import (
    request_from_wire, request_to_wire, response_to_wire, result_from_wire, result_to_wire, results_from_wire,
)
from serving_pod.core.types import InferRequest

_log = logging.getLogger(__name__)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
#: executions whose input tensors total more than this go through the instance's thread: writing them
#: to the child's pipe could stall the event loop while the child drains it
LOOP_SEND_LIMIT = 48 * 1024


def resolve_environment(env_path: str, model_name: str) -> str:
    """``EXECUTION_ENV_PATH`` -> a python executable (file, env directory or packed env)."""
    path = Path(env_path)
    if path.name.endswith((".tar.gz", ".tgz", ".tar")) and path.is_file():
        path = _unpack(path)
    if path.is_dir():
        for candidate in (path / "bin" / "python3", path / "bin" / "python"):
            if candidate.is_file():
                return str(candidate)
    elif path.is_file() and os.access(path, os.X_OK):
        return str(path)
    raise errors.ModelLoadError(
        f"model '{model_name}': EXECUTION_ENV_PATH '{env_path}' is not a python executable, an "
        "environment directory with bin/python3, or a .tar.gz of one"
    )


def _unpack(archive: Path) -> Path:
    stat = archive.stat()
    digest = hashlib.sha256(f"{archive.resolve()}:{stat.st_mtime_ns}:{stat.st_size}".encode()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / "ferry-python-envs" / digest
    if not (target / ".ferry-complete").exists():
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            try:
                tar.extractall(target, filter="data")
            except TypeError:  # python without extraction filters
                tar.extractall(target)  # noqa: S202
        (target / ".ferry-complete").touch()
    return target


class _Child:
    """One child process with its pipes and a stderr forwarder."""

    def __init__(self, executable: str, label: str) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
        try:
            self.process = subprocess.Popen(
                [executable, "-m", "serving_pod.backends.python_stub", str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,  # the server, not the terminal, decides when it stops
            )
        except OSError as exc:
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                os.close(fd)
            raise errors.ModelLoadError(f"model '{label}': cannot start {executable}: {exc}") from None
        os.close(to_child_r)
        os.close(from_child_w)
        self.writer = Connection(to_child_w, readable=False)
        self.reader = Connection(from_child_r, writable=False)
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        #: requests this child is working on, by key (decoupled ones until their final response)
        self.requests: dict[int, InferRequest] = {}
        #: answers the model owes through response senders (``python_stub.LATER``), by request key
        self.later: dict[int, Future] = {}
        #: cancel flags of the BLS streams the child has open, by the child's stream key
        self.streams: dict[int, threading.Event] = {}
        self.channel: Channel | None = None
        #: owner key of the custom metric families this child creates
        self.owner = f"{label}#{self.process.pid}"
        self._stderr = threading.Thread(target=self._forward, name=f"python-stub-{label}-stderr", daemon=True)
        self._stderr.start()

    def _forward(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        try:
            for raw in stream:
                line = raw.decode("utf-8", "replace")
                self.tail.append(line.rstrip())
                sys.stderr.write(line)
        finally:
            stream.close()

    def describe_exit(self) -> str:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._stderr.join(timeout=2)
        tail = "\n".join(self.tail)
        status = f"exit code {code}" if code is not None else "still running"
        return f"{status}" + (f"; last output:\n{tail}" if tail else "")

    def stop(self, timeout: float) -> None:
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


def _input_bytes(requests: list[InferRequest], limit: int) -> int:
    """Bytes the requests' input tensors carry (BYTES elements counted by length), up to just past ``limit``."""
    size = 0
    for request in requests:
        for tensor in request.inputs:
            data = tensor.data
            if data.dtype == object:
                for item in data.flat:
                    size += len(item) if isinstance(item, (bytes, str)) else 8
                    if size > limit:
                        return size
            else:
                size += data.nbytes
            if size > limit:
                return size
    return size


class IsolatedInstance:
    """A python model instance living in its own process (same contract as in-process)."""

    def __init__(self, spec: Any, engine: Any, executable: str) -> None:
        self._spec = spec
        self._engine = engine
        self._executable = executable
        self._label = spec.instance_name
        self._keys = itertools.count(1)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"python-bls-{self._label}")
        self._child: _Child | None = None
        self._channel: Channel | None = None
        self._closed = False
        try:
            self._start()
        except BaseException:
            self._pool.shutdown(wait=False)
            raise

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        child = _Child(self._executable, self._label)
        channel = Channel(
            child.reader, child.writer, name=f"python-model-{self._label}",
            on_call=partial(self._on_call, child), on_post=partial(self._on_post, child),
            schedule=self._pool.submit, inline=frozenset({"cancelled", "metric"}),
            on_close=partial(self._on_child_gone, child), loop=self._reading_loop(),
        )
        self._child, self._channel, child.channel = child, channel, channel
        channel.start()
        try:
            channel.call("init", self._spec).result()
        except ConnectionError:
            detail = child.describe_exit()
            channel.close()
            raise VersionLoadError(  # Triton's words first, then what became of the process
                f"Stub process '{self._spec.instance_name}' is not healthy. Its isolated process "
                f"exited during initialize ({detail})"
            ) from None
        except Exception as exc:
            child.process.kill()
            child.stop(timeout=5)
            channel.close()
            if isinstance(exc, errors.ServerError):
                raise
            raise VersionLoadError(f"{type(exc).__name__}: {exc}") from None  # Triton's words: the bare exception

    def _reading_loop(self) -> asyncio.AbstractEventLoop | None:
        """The engine's running loop, for the channel to read on; None off an engine or on the loop's thread
        (starting waits for the child's ``initialize``, which needs the loop to read the answer)."""
        loop = getattr(self._engine, "loop", None)
        if loop is None or loop.is_closed() or not loop.is_running():
            return None
        try:
            return None if asyncio.get_running_loop() is loop else loop
        except RuntimeError:
            return loop

    def _crash_error(self, child: _Child) -> errors.InternalError:
        detail = child.describe_exit()
        return errors.InternalError(
            f"python model '{self._spec.model_name}' (isolated process of instance "
            f"'{self._label}') stopped unexpectedly: {detail}"
        )

    def _on_child_gone(self, child: _Child) -> None:
        metric_store(self._engine).release(child.owner)
        with self._lock:
            open_requests, child.requests = child.requests, {}
        if self._closed:
            self._fail_later(child, python_model.unloaded_before_answer(self._spec.model_name))
        if self._closed or not open_requests:
            return
        error = self._crash_error(child)
        self._fail_later(child, error)
        for request in open_requests.values():
            if request.responder is not None and self._spec.decoupled:
                try:
                    request.responder(error, True)
                except Exception:
                    _log.exception("python model '%s': delivering a crash error failed", self._label)

    def close(self) -> None:
        """Finalize the model in the child and wait for it to exit."""
        if self._closed:
            return
        self._closed = True
        channel, child = self._channel, self._child
        if channel is not None and not channel.closed:
            try:
                channel.call("finalize", python_model.UNLOAD_GRACE_S).result(timeout=30 + python_model.UNLOAD_GRACE_S)
            except Exception:
                _log.warning("python model '%s': finalize in the isolated process failed", self._label)
        if child is not None:
            child.writer.close()
            child.stop(timeout=10)
            metric_store(self._engine).release(child.owner)
            self._fail_later(child, python_model.unloaded_before_answer(self._spec.model_name))
        if channel is not None:
            channel.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _fail_later(self, child: _Child, error: errors.ServerError) -> None:
        """Answer what the child still owes (it is gone, or the model unloaded) with ``error``."""
        with self._lock:
            owed, child.later = child.later, {}
        for later in owed.values():
            python_model.settle_later(later, error)

    # ------------------------------------------------------------------ execute
    def execute(self, requests: list[InferRequest]) -> list[Any]:
        """Same contract as ``PythonModelInstance.execute`` (decoupled: ``None`` per request)."""
        if self._channel is None or self._channel.closed:
            if self._closed:
                return [errors.UnavailableError(f"model '{self._spec.model_name}' is unloaded")] * len(requests)
            try:
                _log.warning("python model '%s': restarting its isolated process", self._label)
                self._start()
            except errors.ServerError as exc:
                return [errors.UnavailableError(exc.message) for _ in requests]
        child, channel = self._child, self._channel
        assert child is not None and channel is not None
        keys, shipped = self._ship(child, requests)
        try:
            results = results_from_wire(channel.call("execute", keys, shipped).result())
        except ConnectionError:
            return self._lost(child, len(requests))
        except Exception as exc:
            results = self._failed(exc, len(requests))
        return self._settle(child, keys, results)

    def execute_on_loop(self, requests: list[InferRequest]) -> Awaitable[list[Any]] | None:
        """``execute`` sent to the child now and awaited on the event loop, with no thread in between, when
        the channel reads there and the inputs are small; None: use ``execute`` on the instance's thread."""
        child, channel = self._child, self._channel
        if child is None or channel is None or channel.closed or not channel.on_loop:
            return None
        if _input_bytes(requests, LOOP_SEND_LIMIT) > LOOP_SEND_LIMIT:
            return None
        keys, shipped = self._ship(child, requests)
        return self._answered(child, keys, channel.call_async("execute", keys, shipped))

    async def _answered(self, child: _Child, keys: list[int], reply: asyncio.Future) -> list[Any]:
        try:
            results = results_from_wire(await reply)
        except ConnectionError:  # naming the exit waits for the child: off the loop
            return await asyncio.get_running_loop().run_in_executor(self._pool, self._lost, child, len(keys))
        except Exception as exc:
            results = self._failed(exc, len(keys))
        return self._settle(child, keys, results)

    def _ship(self, child: _Child, requests: list[InferRequest]) -> tuple[list[int], list[tuple]]:
        """Register ``requests`` with the child, and their wire form (``core.interprocess``) that travels to it."""
        keys: list[int] = []
        with self._lock:
            for request in requests:
                key = next(self._keys)
                keys.append(key)
                child.requests[key] = request
        return keys, [request_to_wire(request) for request in requests]

    def _settle(self, child: _Child, keys: list[int], results: list[Any]) -> list[Any]:
        """Forget the requests that are answered, and give a future for each one answered later (``LATER``). A
        decoupled request is answered by its final ``respond``, even when its execution failed (the error comes both
        ways, and the ``respond`` post may still be on its way); only one without a responder is answered by its
        result."""
        decoupled = self._spec.decoupled
        owed: list[tuple[int, Future]] = []
        settled = list(results)
        with self._lock:
            for index, (key, result) in enumerate(zip(keys, results)):
                if type(result) is str and result == LATER:  # the ``answer`` post may be in already
                    later = child.later.get(key)
                    if later is None:
                        later = child.later[key] = Future()
                    owed.append((key, later))
                    settled[index] = later
                elif not decoupled:
                    child.requests.pop(key, None)
                elif result is not None:
                    request = child.requests.get(key)
                    if request is not None and request.responder is None:
                        del child.requests[key]
        for key, later in owed:  # run at once for one answered already
            later.add_done_callback(partial(self._later_done, child, key))
        return settled

    def _later_done(self, child: _Child, key: int, later: Future) -> None:
        """An answer given later is in, or its caller went away (cancelled): the child stops waiting for it then."""
        with self._lock:
            if child.later.get(key) is later:
                del child.later[key]
            child.requests.pop(key, None)
        channel = child.channel
        if later.cancelled() and channel is not None and not channel.closed:
            try:
                channel.post("cancel_later", key)
            except ConnectionError:
                pass

    def _lost(self, child: _Child, count: int) -> list[Any]:
        if self._spec.decoupled:  # the responders get the error (``_on_child_gone``)
            return [None] * count
        error = self._crash_error(child)
        return [errors.InternalError(error.message) for _ in range(count)]

    def _failed(self, exc: Exception, count: int) -> list[Any]:
        message = f"python model '{self._spec.model_name}': {type(exc).__name__}: {exc}"
        return [errors.InternalError(message) for _ in range(count)]

    # ------------------------------------------------------------------ child -> server
    def _on_call(self, child: _Child, kind: str, args: tuple) -> Any:
        if kind == "cancelled":
            request = child.requests.get(args[0])
            return request is not None and request.cancelled is not None and request.cancelled.is_set()
        if kind == "metric":
            return pb_metrics.serve(metric_store(self._engine), child.owner, args[0], args[1:])
        if kind == "model_control":
            return pb_model_loader.serve(self._engine, args[0], args[1:])
        if kind == "infer":
            request = request_from_wire(args[0])
            if self._engine is None:
                raise errors.UnavailableError(
                    f"BLS request to model '{request.model_name}' failed: this python model instance "
                    "is not attached to an inference engine"
                )
            return response_to_wire(python_bridge.bls_infer(self._engine, request))
        raise ValueError(f"unknown call '{kind}'")

    def _on_post(self, child: _Child, kind: str, args: tuple) -> None:
        if kind == "respond":
            key, message, final = args
            with self._lock:
                request = child.requests.pop(key, None) if final else child.requests.get(key)
            if request is not None and request.responder is not None:
                request.responder(result_from_wire(message), final)
        elif kind == "answer":  # a request answered later (``LATER``), maybe before its ``execute`` reply
            key, message = args
            with self._lock:
                later = child.later.get(key)
                if later is None and key in child.requests:  # else its caller went away
                    later = child.later[key] = Future()
            if later is not None:
                python_model.settle_later(later, result_from_wire(message))
        elif kind == "stream":
            key, wire = args
            self._pool.submit(self._stream, child, key, request_from_wire(wire))
        elif kind == "metric":
            try:
                pb_metrics.serve(metric_store(self._engine), child.owner, args[0], args[1:])
            except errors.ServerError as exc:
                _log.warning("python model '%s': custom metric %s refused: %s", self._label, args[0], exc)
        elif kind == "stream_cancel":
            event = child.streams.get(args[0])
            if event is not None:
                event.set()

    def _stream(self, child: _Child, key: int, request: InferRequest) -> None:
        channel = child.channel
        assert channel is not None
        request.cancelled = child.streams[key] = threading.Event()
        try:
            if self._engine is None:
                raise errors.UnavailableError(
                    f"BLS request to model '{request.model_name}' failed: this python model "
                    "instance is not attached to an inference engine"
                )
            for item in python_bridge.bls_stream(self._engine, request):
                channel.post("stream_item", key, result_to_wire(item))
            channel.post("stream_end", key, None)
        except ConnectionError:
            pass
        except Exception as exc:
            try:
                channel.post("stream_end", key, exc if isinstance(exc, errors.ServerError) else
                             errors.InternalError(f"{type(exc).__name__}: {exc}"))
            except ConnectionError:
                pass
        finally:
            child.streams.pop(key, None)


def run_auto_complete(executable: str, model_file: str, config_text: str, label: str) -> Any:
    """Run ``auto_complete_config`` in a short-lived child with the model's interpreter."""
    child = _Child(executable, label)
    pool = ThreadPoolExecutor(max_workers=1)

    def refuse(kind: str, args: tuple) -> Any:
        raise ValueError(f"'{kind}' is not available during auto-complete")

    channel = Channel(
        child.reader, child.writer, name=f"python-autocomplete-{label}",
        on_call=refuse, on_post=lambda kind, args: None, schedule=pool.submit,
    )
    channel.start()
    try:
        return channel.call("autocomplete", model_file, config_text, label).result()
    except ConnectionError:
        raise errors.ModelLoadError(
            f"auto-complete of python model '{label}' failed: its isolated process exited "
            f"({child.describe_exit()})"
        ) from None
    finally:
        try:
            channel.call("finalize").result(timeout=10)
        except Exception:
            pass
        child.writer.close()
        child.stop(timeout=10)
        channel.close()
        pool.shutdown(wait=False)
