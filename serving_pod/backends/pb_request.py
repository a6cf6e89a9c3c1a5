"""Requests, responses and response senders of Ferry's ``triton_python_backend_utils``.

A request a model receives wraps the engine's domain ``InferRequest`` (``_from_domain``: no
copies, inputs wrapped on first use); a request a model builds for BLS is turned into a domain
request at once and sent with ``exec``/``async_exec`` to the engine found by
``current_engine`` (the backend binds it to the thread running model code). Conversions live
in ``python_bridge``.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from typing import Any, Callable, Iterable, Iterator

from serving_pod.backends.pb_tensor import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    PreferredMemory,
    Tensor,
    TritonError,
    TritonModelException,
    bind_arguments,
    incompatible_arguments,
)

_log = logging.getLogger(__name__)

_NO_OUTPUTS: list = []  # the default of ``InferenceResponse(output_tensors=...)``: never handed out

#: Triton's words for a request released with RESCHEDULE by a model that is not an iterative sequence
RESCHEDULE_REFUSED = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                      "configured to handle such a flag.")


class Rescheduled:
    """An instance's answer for a request its model released with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``
    (python backend README, "Request Rescheduling"): the sequence batcher of an iterative sequence queues the
    same request again, on the same sequence slot, instead of answering it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RESCHEDULED"


RESCHEDULED = Rescheduled()


def binding_type(value: Any) -> str:
    """``str(type(value))`` as Triton's stub prints it: its own classes live in ``c_python_backend_utils``."""
    kind = type(value)
    if kind.__module__ == __name__:
        return f"<class 'c_python_backend_utils.{kind.__name__}'>"
    return str(kind)

# --------------------------------------------------------------------------- responses


def _check_parameters(parameters: Any) -> dict:
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise TritonModelException(f"parameters must be a dict, found type '{type(parameters).__name__}'")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return parameters


_REQUEST_SIGNATURE = ("c_python_backend_utils.InferenceRequest(request_id: str = '', correlation_id: int | str = 0, "
                      "inputs: List[c_python_backend_utils.Tensor], requested_output_names: List[str], model_name: str, "
                      "model_version: int = -1, flags: int = 0, timeout: int = 0, preferred_memory: "
                      "c_python_backend_utils.PreferredMemory = ..., trace: c_python_backend_utils.InferenceTrace = ..., "
                      "parameters: object = None)")


def _check_request_arguments(request_id: Any, correlation_id: Any, inputs: Any, requested_output_names: Any,
                             model_name: Any, model_version: Any, flags: Any, timeout: Any,
                             preferred_memory: Any = None) -> None:
    """Triton's binding: a value of the wrong type is pybind11's TypeError; a None input or an empty output
    name is the backend's TritonModelException."""
    def integer(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    fits = (isinstance(request_id, str) and (integer(correlation_id) or isinstance(correlation_id, str))
            and isinstance(inputs, (list, tuple)) and isinstance(requested_output_names, (list, tuple))
            and all(isinstance(name, str) for name in requested_output_names) and isinstance(model_name, str)
            and integer(model_version) and integer(flags) and flags >= 0 and integer(timeout) and timeout >= 0
            and (preferred_memory is None or isinstance(preferred_memory, PreferredMemory)))
    if not fits:
        given = {"request_id": request_id, "correlation_id": correlation_id, "inputs": inputs,
                 "requested_output_names": requested_output_names, "model_name": model_name,
                 "model_version": model_version, "flags": flags, "timeout": timeout}
        if preferred_memory is not None:
            given["preferred_memory"] = preferred_memory
        raise incompatible_arguments(_REQUEST_SIGNATURE, (), given)
    where = f"for request with id '{request_id}' and model name '{model_name}' should not be empty."
    if any(tensor is None for tensor in inputs):
        raise TritonModelException(f"Input tensor {where}")
    if any(name == "" for name in requested_output_names):
        raise TritonModelException(f"Requested output name {where}")


_RESPONSE_SIGNATURE = ("c_python_backend_utils.InferenceResponse(output_tensors: List[c_python_backend_utils.Tensor] "
                       "= [], error: c_python_backend_utils.TritonError = None)")


class InferenceResponse:
    """``InferenceResponse(output_tensors=[...], error=None, parameters=None)``.

    As Triton's binding: ``output_tensors`` is a sequence of ``Tensor`` (not None), ``error`` a ``TritonError`` or
    None; anything else is pybind11's ``TypeError``, raised where the model builds the response. ``parameters``
    (a dict of bool, int or str) comes from later Tritons.
    """

    __slots__ = ("_outputs", "_error", "_parameters")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not kwargs and len(args) == 1 and type(args[0]) is list:  # the common calls first
            outputs, error, parameters = args[0], None, None
        elif not args and len(kwargs) == 1 and type(kwargs.get("output_tensors")) is list:
            outputs, error, parameters = kwargs["output_tensors"], None, None
        else:
            outputs, error, parameters = self._bound(args, kwargs)
        for tensor in outputs:
            if type(tensor) is not Tensor and not isinstance(tensor, Tensor):
                if tensor is None:  # pybind11 lets None through as a null Tensor; the backend refuses it
                    raise TritonModelException("Output tensor for inference response should not be empty.")
                raise incompatible_arguments(_RESPONSE_SIGNATURE, args, kwargs)
        self._outputs = outputs
        self._error = error
        self._parameters = _check_parameters(parameters) if parameters else None

    @staticmethod
    def _bound(args: tuple, kwargs: dict) -> tuple[list, Any, Any]:
        outputs, error, parameters = bind_arguments(
            ("output_tensors", "error", "parameters"), (_NO_OUTPUTS, None, None), args, kwargs, _RESPONSE_SIGNATURE)
        if outputs is _NO_OUTPUTS:
            outputs = []
        elif isinstance(outputs, (str, bytes)) or not isinstance(outputs, (list, tuple)):
            raise incompatible_arguments(_RESPONSE_SIGNATURE, args, kwargs)
        if error is not None and not isinstance(error, TritonError):
            raise incompatible_arguments(_RESPONSE_SIGNATURE, args, kwargs)
        return list(outputs), error, parameters

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters or {})


_SEND_SIGNATURE = ("(self: c_python_backend_utils.InferenceResponseSender, response: "
                   "c_python_backend_utils.InferenceResponse = None, flags: int = 0) -> None")


class InferenceResponseSender:
    """What ``request.get_response_sender()`` returns: ``send(response=None, flags=0)``."""

    __slots__ = ("_request", "_closed", "_sent", "_lock", "_answered", "_waiter")

    def __init__(self, request: "InferenceRequest") -> None:
        self._request = request
        self._closed = False
        self._sent = 0
        self._lock = threading.Lock()
        #: non-decoupled: its one answer was delivered (``request._result`` holds it)
        self._answered = False
        #: non-decoupled: called once the answer is delivered (``when_answered``)
        self._waiter: Callable[[], None] | None = None

    def send(self, *args: Any, **kwargs: Any) -> None:
        """``send(response=None, flags=0)``."""
        response, flags = self._bound(args, kwargs)
        if flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL and flags != 0:
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        link = self._request._link
        if link is None:
            raise TritonModelException("Unable to send response: this request was not sent to the model.")
        with self._lock:
            if not link.decoupled:
                if response is not None and self._sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response."
                    )
                if response is None and final and self._sent == 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final "
                        "before sending a response."
                    )
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if final:
                self._closed = True
            self._sent += 1
        link.deliver(self._request, response, final)
        if not link.decoupled:
            with self._lock:
                self._answered = True
                waiter, self._waiter = self._waiter, None
            if waiter is not None:
                waiter()

    def _bound(self, args: tuple, kwargs: dict) -> tuple[InferenceResponse | None, int]:
        """``send``'s arguments as Triton's binding takes them: anything but an ``InferenceResponse`` (or None) and an
        int is pybind11's ``TypeError`` (Ferry raised TritonModelException for a response of another type)."""
        try:
            response, flags = bind_arguments(("response", "flags"), (None, 0), args, kwargs, _SEND_SIGNATURE)
        except TypeError:
            response = flags = None
        if not (response is None or isinstance(response, InferenceResponse)) or not isinstance(flags, int):
            raise incompatible_arguments(_SEND_SIGNATURE, (self, *args), kwargs, "send")
        return response, flags

    def __repr__(self) -> str:
        return f"<c_python_backend_utils.InferenceResponseSender object at {id(self):#x}>"

    def when_answered(self, callback: Callable[[], None]) -> bool:
        """Non-decoupled, after ``execute`` returned None for this request: call ``callback`` (on the sending
        thread) once the model sent its answer, as Triton waits for it with the instance free for the next
        ``execute``. False when it is answered already (``callback`` is not called)."""
        with self._lock:
            if self._answered:
                return False
            self._waiter = callback
            return True

    def is_cancelled(self) -> bool:
        return self._request.is_cancelled()


# --------------------------------------------------------------------------- requests


class InferenceTrace:
    def get_context(self) -> None:
        return None


class InferenceRequest:
    """A request a model receives in ``execute``, or a BLS request a model builds.

    BLS form (Triton's signature)::

        pb_utils.InferenceRequest(model_name="m", inputs=[...], requested_output_names=[...])

    then ``.exec()`` (or ``.exec(decoupled=True)`` -> iterator) or ``await .async_exec()``.
    """

    __slots__ = ("_domain", "_link", "_inputs", "_sender", "_engine", "_flags_override", "_result", "_parameters_text",
                 "_release_flags", "_released")

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str | None = None,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict | None = None,
    ) -> None:
        from serving_pod.backends import python_bridge

        _check_request_arguments(request_id, correlation_id, inputs, requested_output_names, model_name,
                                 model_version, flags, timeout, preferred_memory)
        self._domain = python_bridge.bls_domain_request(
            request_id=request_id, correlation_id=correlation_id, inputs=inputs,
            requested_output_names=requested_output_names, model_name=model_name,
            model_version=model_version, flags=flags, timeout=timeout,
            parameters=_check_parameters(parameters),
        )
        self._link: Any = None
        self._inputs: list[Tensor] | None = list(inputs)
        self._sender: InferenceResponseSender | None = None
        self._engine: Any = current_engine(sys._getframe(1))
        self._flags_override: int | None = None
        self._result: Any = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._released: str | None = None
        #: a request the model builds reads its parameters back as Triton's binding wrote them: ``json.dumps``
        self._parameters_text: str | None = json.dumps(parameters) if parameters else "{}"

    @classmethod
    def _from_domain(cls, domain: Any, link: Any) -> "InferenceRequest":
        """Trusted fast path: wrap an engine request for ``execute`` (no copies)."""
        request = object.__new__(cls)
        request._domain = domain
        request._link = link
        request._inputs = None
        request._sender = None
        request._engine = None
        request._flags_override = None
        request._result = None
        request._parameters_text = None
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        request._released = None
        return request

    # model-side accessors -------------------------------------------------------------
    def inputs(self) -> list[Tensor]:
        inputs = self._inputs
        if inputs is None:
            wrap = Tensor._wrap
            inputs = self._inputs = [wrap(t.name, t.data, t.datatype) for t in self._domain.inputs]
        return inputs

    def request_id(self) -> str:
        return self._domain.id

    def correlation_id(self) -> int | str:
        value = self._domain.parameters.get("sequence_id", 0)
        return value if isinstance(value, (int, str)) else int(value)

    def flags(self) -> int:
        if self._flags_override is not None:
            return self._flags_override
        params = self._domain.parameters
        flags = 0
        if params.get("sequence_start"):
            flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        if params.get("sequence_end"):
            flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
        return flags

    def set_flags(self, flags: int) -> None:
        self._flags_override = int(flags)

    def timeout(self) -> int:
        return int(self._domain.parameters.get("timeout", 0) or 0)

    def parameters(self) -> str:
        from serving_pod.backends import python_bridge

        if self._parameters_text is not None:
            return self._parameters_text
        return python_bridge.parameters_json(self._domain.parameters, self._domain.custom_reserved)

    def trace(self) -> InferenceTrace:
        return InferenceTrace()

    def requested_output_names(self) -> set[str]:
        """A ``set``, as Triton's binding returns (its ``std::set``): a model cannot index it or rely on an order."""
        outputs = self._domain.outputs
        if outputs is None:
            return set(self._link.output_names) if self._link is not None else set()
        return {o.name for o in outputs}

    def get_response_sender(self) -> InferenceResponseSender:
        sender = self._sender
        if sender is None:
            sender = self._sender = InferenceResponseSender(self)
        return sender

    def is_cancelled(self) -> bool:
        cancelled = self._domain.cancelled
        return cancelled is not None and cancelled.is_set()

    def set_release_flags(self, flags: int) -> None:
        """How the request is released when ``execute`` returns: ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` runs it
        again in a later batch (``Rescheduled``), where the model is configured for it (an iterative sequence)."""
        if isinstance(flags, bool) or not isinstance(flags, int) or not 0 <= flags < 2**32:
            raise TypeError("set_release_flags(): incompatible function arguments. The following argument types are "
                            "supported:\n    1. (self: c_python_backend_utils.InferenceRequest, arg0: int) -> None")
        if self._released is not None and flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            # Triton reads the flags once the stub's execute call returned: set later (an ``async def execute`` of a
            # decoupled model runs on after it), the flag does nothing, as there; say so, since the client then
            # waits for a final response the model meant to send in a later execution
            _log.warning("python model '%s': set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) after "
                         "execute returned has no effect: the request was released already", self._released)
        self._release_flags = flags

    def _release(self, instance_name: str) -> None:
        """``execute`` returned (its release flags were read): a later ``set_release_flags`` does nothing."""
        self._released = instance_name

    def _rescheduled(self) -> bool:
        return bool(self._release_flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)

    # BLS ----------------------------------------------------------------------------
    def exec(self, decoupled: bool = False) -> Any:
        from serving_pod.backends import python_bridge

        _check_in_execute(sys._getframe(1))
        engine = self._engine if self._engine is not None else current_engine()
        return python_bridge.bls_exec(engine, self._domain, decoupled)

    def async_exec(self, decoupled: bool = False) -> Any:
        import asyncio

        from serving_pod.backends import python_bridge

        _check_in_execute(sys._getframe(1))
        loop = asyncio.get_running_loop()
        engine = self._engine if self._engine is not None else current_engine()
        return loop.run_in_executor(None, python_bridge.bls_exec, engine, self._domain, decoupled)


class ResponseIterator:
    """Responses of a decoupled BLS call (``exec(decoupled=True)``), in order.

    As Triton's: the iteration ends with the last response (the called model's final one, or an error), and
    the responses are kept, so once all were read a new ``for`` loop over the iterator reads them again from
    the first (one broken out of resumes where it stopped).
    """

    def __init__(self, source: Iterable[Any], convert: Callable[[Any], InferenceResponse], cancel: Any) -> None:
        self._source: Iterator[Any] = iter(source)
        self._convert = convert
        self._cancel = cancel
        self._done = False
        self._responses: list[InferenceResponse] = []
        self._index = 0  # the next kept response to give once done

    def __iter__(self) -> "ResponseIterator":
        if self._done and self._index >= len(self._responses):
            self._index = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            if self._index >= len(self._responses):
                raise StopIteration
            self._index += 1
            return self._responses[self._index - 1]
        try:
            item = next(self._source)
        except StopIteration:
            self._finish()
            raise
        except Exception as exc:  # an engine error mid-stream becomes the last response
            item, last = exc, True
        else:
            last = bool(getattr(item, "final", True))
        response = self._convert(item)
        self._responses.append(response)
        if last:
            self._finish()
        return response

    def _finish(self) -> None:
        self._done = True
        self._index = len(self._responses)

    def cancel(self) -> None:
        if self._cancel is not None:
            self._cancel.set()


# --------------------------------------------------------------------------- context

_local = threading.local()
_fallback: dict[str, Any] = {"engine": None, "model_dir": ""}
#: model module name -> (engine, model dir, instance name, model name), for threads a model starts
#: itself. The module name (unique per instance) is also the instance's owner key for custom metrics.
_modules: dict[str, tuple[Any, str, str, str]] = {}


def bind_thread(engine: Any, model_dir: str, owner: str = "") -> None:
    """Called by the backend on the thread about to run model code (``owner``: its module name)."""
    _local.engine = engine
    _local.model_dir = model_dir
    _local.owner = owner
    if engine is not None:
        _fallback["engine"] = engine
    _fallback["model_dir"] = model_dir


#: owner keys whose instance is not serving: before ``initialize`` returns and from ``finalize`` on
_not_serving: set[str] = set()


def running_model_dir() -> str:
    """The version directory bound to this thread by the backend ("" when none): no fallbacks."""
    return getattr(_local, "model_dir", "") or ""


def register_module(
    module_name: str, engine: Any, model_dir: str, instance_name: str = "", model_name: str = ""
) -> None:
    _modules[module_name] = (engine, model_dir, instance_name, model_name)
    _not_serving.add(module_name)


def unregister_module(module_name: str) -> None:
    _modules.pop(module_name, None)
    _not_serving.discard(module_name)


def set_serving(module_name: str, serving: bool) -> None:
    """The backend marks an instance serving once ``initialize`` returned, and not before ``finalize``."""
    if serving:
        _not_serving.discard(module_name)
    else:
        _not_serving.add(module_name)


def _check_in_execute(frame: Any) -> None:
    """BLS from ``initialize`` or ``finalize`` is refused, in Triton's words."""
    if _not_serving and current_owner(frame) in _not_serving:
        raise TritonModelException("BLS is only supported during the 'execute' function.")


def current_owner(frame: Any = None) -> str:
    """The owner key (model module name) of the instance whose code is running, or ""."""
    owner = getattr(_local, "owner", "")
    if not owner and frame is not None:
        name = frame.f_globals.get("__name__", "")
        owner = name if name in _modules else ""
    return owner


def instance_name(owner: str) -> str:
    """The instance name of an owner key ("" when unknown), as Triton names it in messages."""
    entry = _modules.get(owner)
    return entry[2] if entry is not None else ""


def model_name(owner: str) -> str:
    """The model name of an owner key ("" when unknown)."""
    entry = _modules.get(owner)
    return entry[3] if entry is not None else ""


def current_engine(frame: Any = None) -> Any:
    """The engine for BLS calls made from here.

    The thread's binding when the backend runs model code on it; for threads a model started
    itself, the engine of the model module that builds the request (``frame``), else the
    last engine seen (a server process has one).
    """
    try:
        return _local.engine
    except AttributeError:
        pass
    if frame is not None:
        entry = _modules.get(frame.f_globals.get("__name__", ""))
        if entry is not None:
            return entry[0]
    return _fallback["engine"]


def get_model_dir() -> str:
    """Directory of the model version whose code is running (Triton's ``get_model_dir``)."""
    model_dir = getattr(_local, "model_dir", None)
    if model_dir is None:
        entry = _modules.get(sys._getframe(1).f_globals.get("__name__", ""))
        model_dir = entry[1] if entry is not None else _fallback["model_dir"]
    return model_dir
