"""Backend "ferry_callable": model instances that call a Python function bound in this process.

The Python-first API (``serving_pod.pyapi``) binds a function as a model: it registers the function
in the process-wide ``CALLABLES`` table under a unique key, writes a model folder whose generated
config names this backend and carries the key as the parameter ``ferry_callable_key``, and asks the
registry to load that folder. Each instance looks its function up by the key when it is created;
the table entry is removed when the model is unbound (instances already built keep their function).

Calling convention (PyTriton's): ``function(requests: list[Request]) -> list[result]`` where a
``Request`` is a dict of input name -> numpy array (with ``.parameters``), and a result is a dict
of output name -> array, a list of arrays in the config's output order, or an exception (that
request alone fails). The function may be ``async def`` (run on the instance's own event loop, in
its worker thread) and, for decoupled models, a generator yielding one list of results per step
(each step becomes one streamed response per request). Anything the function raises becomes an
error of the requests it was called with; the server carries on.

While the function runs, ``current_binding()`` returns the context object the binder registered
(the pyapi decorators read the model's config from it).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from serving_pod.backends.base import InstanceContext, names_network_client
from serving_pod.core.datatypes import config_to_wire, numpy_dtype
from serving_pod.core.errors import InternalError, ModelLoadError, ServerError, UnsupportedError
from serving_pod.core.types import InferRequest, InferResponse, Tensor

log = logging.getLogger("ferry.backends.callable")

KEY_PARAMETER = "ferry_callable_key"


@dataclass(frozen=True, slots=True)
class CallableEntry:
    """A bound model's functions (instance i calls ``functions[i % len]``) and its binding context."""

    functions: tuple[Callable[..., Any], ...]
    context: Any = None


#: key -> bound functions; written by ``serving_pod.pyapi`` (bind / unbind), read at instance creation.
CALLABLES: dict[str, CallableEntry] = {}
_table_lock = threading.Lock()
_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("ferry_current_binding", default=None)


def register(key: str, entry: CallableEntry) -> None:
    with _table_lock:
        if key in CALLABLES:
            raise ValueError(f"callable key '{key}' is already registered")
        CALLABLES[key] = entry


def unregister(key: str) -> None:
    with _table_lock:
        CALLABLES.pop(key, None)


def current_binding() -> Any:
    """The context object of the bound model whose function is running now (None outside a call)."""
    return _CURRENT.get()


def is_async_callable(function: Any) -> bool:
    """True for ``async def`` functions, async generators, and pyapi decorators wrapping them."""
    if getattr(function, "_ferry_async", False):
        return True
    for candidate in (function, getattr(function, "__call__", None)):
        if inspect.iscoroutinefunction(candidate) or inspect.isasyncgenfunction(candidate):
            return True
    return False


class Request(dict):
    """One request as a bound function sees it: input name -> numpy array, plus its parameters."""

    def __init__(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any] | None = None, request_id: str = "") -> None:
        super().__init__(inputs)
        self.parameters = parameters or {}
        self.request_id = request_id


def _call_of(request: InferRequest) -> Request:
    """What the function gets for ``request``: arrays it may write into (``x /= 255``), so a read-only view of
    the request body is copied; the request's parameters and id."""
    inputs = {t.name: t.data if t.data.flags.writeable else t.data.copy() for t in request.inputs}
    return Request(inputs, request.parameters, request.id)


def _source(function: Callable[..., Any]) -> str:
    """The function's source (a callable object's ``__call__``), or "" where Python has none (built in, a REPL)."""
    target = function if inspect.isfunction(function) or inspect.ismethod(function) else type(function).__call__
    try:
        return inspect.getsource(target)
    except (OSError, TypeError):
        return ""


@dataclass(frozen=True, slots=True)
class _Output:
    name: str
    datatype: str
    dims: tuple[int, ...]
    dtype: np.dtype


class CallableInstance:
    """One instance of a bound model: converts requests, calls the function, checks its outputs."""

    def __init__(self, context: InstanceContext, function: Callable[..., Any], binding: Any) -> None:
        from tritonclient.grpc import model_config_pb2 as mc

        config = context.config
        self.model = context.model_name
        self.function = function
        self.binding = binding
        self.batching = config.max_batch_size > 0
        self.decoupled = config.model_transaction_policy.decoupled
        self.outputs = {}
        for out in config.output:
            datatype = config_to_wire(mc.DataType.Name(out.data_type))
            self.outputs[out.name] = _Output(out.name, datatype, tuple(out.dims), numpy_dtype(datatype))
        self.is_async = is_async_callable(function)
        #: a plain function may run on the event loop when fast (schedulers/instances.py); coroutines, streams and
        #: functions that name a network client (they may call this server) need the instance's own thread
        self.inline_safe = not self.is_async and not self.decoupled and not names_network_client(_source(function))
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- execution ---------------------------------------------------------------------------
    def execute(self, requests: list[InferRequest]) -> list[InferResponse | ServerError | None]:
        if self.decoupled:
            return self._execute_stream(requests)
        calls = [_call_of(r) for r in requests]
        token = _CURRENT.set(self.binding)
        try:
            results = self._results(self._resolve(self.function(calls)), len(requests))
        except (Exception, SystemExit) as exc:
            return [self._failure(exc)] * len(requests)
        finally:
            _CURRENT.reset(token)
        return [self._response(request, item) for request, item in zip(requests, results)]

    def _execute_stream(self, requests: list[InferRequest]) -> list[InferResponse | ServerError | None]:
        answers: list[InferResponse | ServerError | None] = [None] * len(requests)
        live = []
        for index, request in enumerate(requests):
            if request.responder is None:
                answers[index] = UnsupportedError(
                    f"model '{self.model}' is decoupled: its responses can only be delivered over a stream"
                )
            else:
                live.append(request)
        if not live:
            return answers
        streams: list[InferRequest | None] = list(live)  # None once answered or gone
        calls = [_call_of(r) for r in live]
        token = _CURRENT.set(self.binding)
        try:
            produced = self._resolve(self.function(calls))
            for step in self._steps(produced):
                results = self._results(step, len(live))
                for index, (stream, item) in enumerate(zip(streams, results)):
                    if stream is None:
                        continue
                    response = self._response(stream, item)
                    failed = isinstance(response, ServerError)
                    stream.responder(response, failed)  # an error ends that request's stream
                    if failed or (stream.cancelled is not None and stream.cancelled.is_set()):
                        streams[index] = None
                if not any(streams):
                    self._close_stream(produced)  # every client is answered or gone: stop generating
                    break
            for open_request in streams:
                if open_request is not None:
                    open_request.responder(None, True)
        except (Exception, SystemExit) as exc:
            error = self._failure(exc)
            for open_request in streams:
                if open_request is not None:
                    open_request.responder(error, True)
        finally:
            _CURRENT.reset(token)
        return answers

    def _steps(self, produced: Any) -> Any:
        """The steps of a decoupled function: a generator, an async generator, or one list."""
        if inspect.isasyncgen(produced):
            while True:
                try:
                    yield self._await(produced.__anext__())
                except StopAsyncIteration:
                    return
        elif isinstance(produced, (list, tuple)):
            yield produced
        else:
            yield from produced

    def _close_stream(self, produced: Any) -> None:
        if inspect.isasyncgen(produced):
            self._await(produced.aclose())
        elif inspect.isgenerator(produced):
            produced.close()

    def _resolve(self, result: Any) -> Any:
        return self._await(result) if inspect.isawaitable(result) else result

    def _await(self, awaitable: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:  # only reachable for a function that hid being async from is_async_callable
            raise InternalError(
                f"model '{self.model}': the bound function returned a coroutine while running on the "
                "server's event loop; declare it 'async def' or set parameter ferry_execution_mode to 'thread'"
            )
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(awaitable)

    # --- results -----------------------------------------------------------------------------
    def _results(self, results: Any, count: int) -> list[Any]:
        if not isinstance(results, (list, tuple)):
            raise InternalError(
                f"model '{self.model}': the bound function must return a list with one result per "
                f"request, got {type(results).__name__} (decorate it with @batch to work on stacked arrays)"
            )
        if len(results) != count:
            raise InternalError(
                f"model '{self.model}': the bound function returned {len(results)} results for {count} requests"
            )
        return list(results)

    def _response(self, request: InferRequest, item: Any) -> InferResponse | ServerError:
        if isinstance(item, BaseException):
            return self._failure(item)
        try:
            named = self._named(item)
            rows = request.inputs[0].data.shape[0] if self.batching and request.inputs else None
            tensors = [self._tensor(self.outputs[name], named.pop(name), rows) for name in list(self.outputs) if name in named]
        except ServerError as exc:
            return exc
        return InferResponse(request.model_name, request.model_version, tensors, request.id)

    def _named(self, item: Any) -> dict[str, Any]:
        if isinstance(item, dict):
            named = dict(item)
        elif isinstance(item, (list, tuple)):
            if len(item) != len(self.outputs):
                raise InternalError(
                    f"model '{self.model}': the bound function returned {len(item)} outputs as a list; "
                    f"the model declares {len(self.outputs)} ({', '.join(self.outputs)})"
                )
            named = dict(zip(self.outputs, item))
        else:
            raise InternalError(
                f"model '{self.model}': a result must be a dict of output name -> array (or a list in "
                f"output order), got {type(item).__name__}"
            )
        unknown = sorted(set(named) - set(self.outputs))
        if unknown:
            raise InternalError(
                f"model '{self.model}': the bound function returned output(s) {unknown} that the model "
                f"does not declare (outputs: {list(self.outputs)})"
            )
        missing = [name for name in self.outputs if name not in named]
        if missing:
            raise InternalError(f"model '{self.model}': the bound function did not return output(s) {missing}")
        return named

    def _tensor(self, spec: _Output, value: Any, rows: int | None) -> Tensor:
        array = _coerce(self.model, spec, np.asarray(value) if not isinstance(value, np.ndarray) else value)
        expected = ((rows,) if rows is not None else ()) + spec.dims
        if len(array.shape) != len(expected) or any(w != -1 and g != w for g, w in zip(array.shape, expected)):
            shown = [-1 if d == -1 else d for d in expected]
            raise InternalError(
                f"model '{self.model}': output '{spec.name}' has shape {list(array.shape)}, expected {shown}"
                + (" (dim 0 is the request's batch size)" if rows is not None else "")
            )
        return Tensor(spec.name, spec.datatype, array)

    def _failure(self, exc: BaseException) -> ServerError:
        if isinstance(exc, ServerError):
            return exc
        log.warning("model '%s': the bound function raised %s: %s", self.model, type(exc).__name__, exc)
        return InternalError(f"model '{self.model}': {type(exc).__name__}: {exc}")

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None


def _coerce(model: str, spec: _Output, array: np.ndarray) -> np.ndarray:
    """``array`` in the output's declared dtype; lossless-kind casts only (float64 -> FP32 yes, float -> INT no)."""
    if spec.datatype == "BYTES":
        if array.dtype.kind == "O":
            return array
        if array.dtype.kind in "SU":
            flat = [item.encode("utf-8") if isinstance(item, str) else bytes(item) for item in array.ravel().tolist()]
            converted = np.empty(len(flat), dtype=np.object_)
            converted[:] = flat
            return converted.reshape(array.shape)
    elif array.dtype == spec.dtype:
        return array
    elif array.dtype.kind != "O" and np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
        return array.astype(spec.dtype)
    raise InternalError(
        f"model '{model}': output '{spec.name}' has numpy dtype {array.dtype}, which does not convert to "
        f"the declared {spec.datatype}"
    )


class CallableBackend:
    name = "ferry_callable"

    def default_model_filename(self) -> str:
        return ""

    def auto_complete(self, config: Any, model_dir: Path, version_dir: Path | None) -> None:
        return None  # pyapi writes complete configs

    def create_instance(self, context: InstanceContext) -> CallableInstance:
        entry = context.config.parameters.get(KEY_PARAMETER)
        key = entry.string_value if entry is not None else ""
        with _table_lock:
            bound = CALLABLES.get(key)
        if bound is None:
            raise ModelLoadError(
                f"model '{context.model_name}': backend 'ferry_callable' serves only functions bound in "
                f"this process (serving_pod.pyapi bind); no function is registered under key '{key}'"
            )
        index = int(context.name.rsplit("_", 1)[-1]) if context.name.rsplit("_", 1)[-1].isdigit() else 0
        return CallableInstance(context, bound.functions[index % len(bound.functions)], bound.context)


def create_backend() -> CallableBackend:
    return CallableBackend()
