"""Conversions between the engine's domain values and ``pb_utils`` objects.

Used by the in-process python model instance (``python_model``) and by ``pb_utils`` itself
for BLS. The hot path is ``ResponseLink.to_domain``: it wraps the model's numpy arrays into
domain tensors without copying, prunes outputs the client did not ask for (Triton returns
only requested outputs, all of the config's outputs when none were named) and picks each
output's wire datatype: the config's when the array matches it, else numpy's own, as
Triton's python backend reports the array's type.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Iterator

import numpy as np

from serving_pod.backends import pb_utils
from serving_pod.core import errors
from serving_pod.core.datatypes import WIRE_TO_NUMPY, wire_datatype
from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput
from serving_pod.core.types import Tensor as DomainTensor

#: request parameters the protocols consume themselves; ``request.parameters()`` hides them. Triton 2.51 hides the
#: same ones (HTTP's ``binary_data_output`` included), but a request-level ``binary_data_size`` (an input's parameter
#: on the wire) is nobody's: Triton hands it to the model over HTTP and gRPC alike, and so do we.
RESERVED_PARAMETERS = frozenset(
    {
        "sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
        "binary_data_output", "triton_enable_empty_final_response",
    }
)

_CODE_TO_ERROR: dict[int, type[errors.ServerError]] = {
    pb_utils.TritonError.UNKNOWN: errors.UnknownError,
    pb_utils.TritonError.INTERNAL: errors.InternalError,
    pb_utils.TritonError.NOT_FOUND: errors.NotFoundError,
    pb_utils.TritonError.INVALID_ARG: errors.InvalidArgumentError,
    pb_utils.TritonError.UNAVAILABLE: errors.UnavailableError,
    pb_utils.TritonError.UNSUPPORTED: errors.UnsupportedError,
    pb_utils.TritonError.ALREADY_EXISTS: errors.AlreadyExistsError,
    pb_utils.TritonError.CANCELLED: errors.CancelledError,
}
_ERROR_TO_CODE: dict[str, int] = {
    "UNKNOWN": pb_utils.TritonError.UNKNOWN,
    "INTERNAL": pb_utils.TritonError.INTERNAL,
    "NOT_FOUND": pb_utils.TritonError.NOT_FOUND,
    "INVALID_ARG": pb_utils.TritonError.INVALID_ARG,
    "UNAVAILABLE": pb_utils.TritonError.UNAVAILABLE,
    "UNSUPPORTED": pb_utils.TritonError.UNSUPPORTED,
    "ALREADY_EXISTS": pb_utils.TritonError.ALREADY_EXISTS,
    "CANCELLED": pb_utils.TritonError.CANCELLED,
}


def server_error(error: pb_utils.TritonError) -> errors.ServerError:
    """A model's ``TritonError`` -> the engine's error with the same code and message, marked ``sent_as_response``.

    The model answered its request with this error (``InferenceResponse(error=...)``): its execution succeeded,
    and Triton 2.51 counts such a request a success (``success``, ``nv_inference_request_success``, its batch in
    ``inference_count``), unlike one whose ``execute`` raised (``InstancePool.charge``).
    """
    converted = _CODE_TO_ERROR.get(error.code(), errors.InternalError)(error.message())
    converted.sent_as_response = True
    return converted


def triton_error(exc: BaseException) -> pb_utils.TritonError:
    """An engine error (or any exception) -> a ``TritonError`` for a BLS response."""
    if isinstance(exc, errors.ServerError):
        return pb_utils.TritonError(exc.message, _ERROR_TO_CODE.get(exc.code, pb_utils.TritonError.INTERNAL))
    return pb_utils.TritonError(f"{type(exc).__name__}: {exc}", pb_utils.TritonError.INTERNAL)


def parameters_json(parameters: dict[str, Any], custom_reserved: dict[str, Any] | None = None) -> str:
    """Triton's ``request.parameters()``: the client's custom parameters as a JSON string (``custom_reserved``:
    a BLS caller's custom parameters named like reserved ones, see ``bls_domain_request``)."""
    if not parameters and not custom_reserved:
        return "{}"
    custom = {k: v for k, v in parameters.items() if k not in RESERVED_PARAMETERS}
    if custom_reserved:
        custom.update(custom_reserved)
    return json.dumps(custom, separators=(",", ":"))  # compact, as Triton's


class ResponseLink:
    """Per-instance knowledge needed to turn a model's responses into domain responses."""

    __slots__ = ("model_name", "model_version", "decoupled", "output_names", "_all", "_declared")

    def __init__(
        self,
        model_name: str,
        model_version: str,
        decoupled: bool,
        output_types: tuple[tuple[str, str], ...],
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.decoupled = decoupled
        self.output_names = tuple(name for name, _ in output_types)
        #: what a request that names no outputs gets: the config's outputs, none where it has none (Triton core
        #: asks for the config's outputs; the stub drops any other a model returns)
        self._all: frozenset[str] = frozenset(self.output_names)
        self._declared = {name: (wire, WIRE_TO_NUMPY.get(wire)) for name, wire in output_types}

    def _datatype(self, tensor: pb_utils.Tensor, array: np.ndarray) -> str:
        declared = self._declared.get(tensor._name)
        if declared is not None:
            wire, dtype = declared
            actual = array.dtype
            if actual is dtype or actual == dtype or (wire == "BYTES" and actual.kind in "OSU"):
                return wire
        if tensor._datatype is not None and WIRE_TO_NUMPY.get(tensor._datatype) == array.dtype:
            return tensor._datatype
        return wire_datatype(array)

    def to_domain(
        self, request: InferRequest, response: Any, final: bool = True
    ) -> InferResponse | errors.ServerError:
        """One ``pb_utils.InferenceResponse`` for ``request`` -> domain response or error."""
        if not isinstance(response, pb_utils.InferenceResponse):
            return errors.InternalError(
                "Expected an 'InferenceResponse' object in the execute function return list, "
                f"found type '{type(response)}'."
            )
        if response._error is not None:
            return server_error(response._error)
        requested = request.outputs
        allowed = self._all if requested is None else {o.name for o in requested}
        outputs: list[DomainTensor] = []
        for tensor in response._outputs:
            if type(tensor) is not pb_utils.Tensor and not isinstance(tensor, pb_utils.Tensor):
                return errors.InternalError(
                    f"model '{self.model_name}' returned an output that is not a pb_utils.Tensor: "
                    f"{type(tensor).__name__}"
                )
            if allowed is not None and tensor._name not in allowed:
                continue
            array = tensor._array
            try:
                if array is None:  # in GPU memory (DLPack): copied to host as the response leaves the model
                    array = tensor._host()
                datatype = self._datatype(tensor, array)
            except (errors.ServerError, ValueError) as exc:
                return errors.InternalError(f"output '{tensor._name}' of model '{self.model_name}': {exc}")
            outputs.append(DomainTensor(tensor._name, datatype, array))
        if response._parameters:
            return InferResponse(
                self.model_name, self.model_version, outputs, request.id,
                dict(response._parameters), final,
            )
        return InferResponse(self.model_name, self.model_version, outputs, request.id, final=final)

    def deliver(self, request: pb_utils.InferenceRequest, response: Any, final: bool) -> None:
        """What a response sender does with one ``send``."""
        domain = request._domain
        if not self.decoupled:
            if response is not None:  # the final flag alone keeps the response already sent
                request._result = response
            return
        message = None if response is None else self.to_domain(domain, response, final)
        try:
            domain.responder(message, final)
        except Exception as exc:
            raise pb_utils.TritonModelException(f"Unable to send response: {exc}") from exc


# --------------------------------------------------------------------------- BLS


def bls_domain_request(
    *,
    request_id: str,
    correlation_id: int | str,
    inputs: list[pb_utils.Tensor],
    requested_output_names: list[str],
    model_name: str,
    model_version: int,
    flags: int,
    timeout: int,
    parameters: dict[str, Any],
) -> InferRequest:
    """A BLS ``pb_utils.InferenceRequest(...)`` -> the engine's request.

    ``parameters`` are custom, as in Triton, whose python backend sets each on the called request with
    ``TRITONSERVER_InferenceRequestSet*Parameter``: one named ``timeout`` or ``sequence_id`` is not the
    request's timeout or correlation id (those are the arguments) but reaches the called model's
    ``request.parameters()`` like any other (``InferRequest.custom_reserved``).
    """
    tensors: list[DomainTensor] = []
    for tensor in inputs:
        if not isinstance(tensor, pb_utils.Tensor):
            raise pb_utils.TritonModelException(
                f"InferenceRequest inputs must be pb_utils.Tensor objects, found type '{type(tensor).__name__}'"
            )
        array = tensor._array
        if array is None:  # in GPU memory (DLPack): the engine takes host arrays
            try:
                array = tensor._host()
            except ValueError as exc:
                raise pb_utils.TritonModelException(f"input '{tensor._name}': {exc}") from None
        datatype = tensor._datatype
        if datatype is None or WIRE_TO_NUMPY.get(datatype) != array.dtype:
            datatype = wire_datatype(array)
        tensors.append(DomainTensor(tensor._name, datatype, array))
    params = {k: v for k, v in parameters.items() if k not in RESERVED_PARAMETERS}
    custom_reserved = {k: v for k, v in parameters.items() if k in RESERVED_PARAMETERS} or None
    if correlation_id:
        params["sequence_id"] = correlation_id
    if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        params["sequence_start"] = True
    if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        params["sequence_end"] = True
    if timeout:
        params["timeout"] = int(timeout)
    outputs = [RequestedOutput(str(n)) for n in requested_output_names] or None
    version = "" if model_version is None or int(model_version) < 0 else str(int(model_version))
    return InferRequest(str(model_name), version, tensors, outputs, str(request_id), params,
                        custom_reserved=custom_reserved)


def pb_response(item: Any) -> pb_utils.InferenceResponse:
    """An engine response (or error) -> the ``InferenceResponse`` a BLS caller sees."""
    if isinstance(item, BaseException):
        return pb_utils.InferenceResponse(error=triton_error(item))
    wrap = pb_utils.Tensor._wrap
    outputs = [wrap(t.name, t.data, t.datatype) for t in item.outputs]
    response = pb_utils.InferenceResponse(outputs)
    if item.parameters:
        response._parameters = dict(item.parameters)
    return response


def bls_exec(engine: Any, request: InferRequest, decoupled: bool) -> Any:
    """Run a BLS request on ``engine``; errors come back inside the response, as in Triton."""
    if engine is None:
        error = pb_utils.TritonError(
            f"BLS request to model '{request.model_name}' failed: this python model instance is "
            "not attached to an inference engine",
            pb_utils.TritonError.UNAVAILABLE,
        )
        if decoupled:
            return pb_utils.ResponseIterator([errors.UnavailableError(error.message())], pb_response, None)
        return pb_utils.InferenceResponse(error=error)
    # A fresh engine request per call: the same BLS object may be executed more than once.
    call = InferRequest(
        request.model_name, request.model_version, request.inputs, request.outputs,
        request.id, dict(request.parameters), custom_reserved=request.custom_reserved,
    )
    if decoupled:
        call.cancelled = getattr(engine, "new_cancel_event", threading.Event)()
        try:
            stream = bls_stream(engine, call)
        except Exception as exc:
            return pb_utils.ResponseIterator([exc], pb_response, None)
        return pb_utils.ResponseIterator(stream, pb_response, call.cancelled)
    try:
        return pb_response(bls_infer(engine, call))
    except Exception as exc:
        return pb_utils.InferenceResponse(error=triton_error(exc))


def bls_infer(engine: Any, call: InferRequest) -> InferResponse:
    """``engine.infer_from_thread(call)`` for a BLS call made with ``decoupled=False`` (``bls_error``)."""
    try:
        return engine.infer_from_thread(call)
    except errors.ServerError as exc:
        worded = bls_error(exc, call.model_name, decoupled=False)
        if worded is exc:
            raise
        raise worded from None


def bls_stream(engine: Any, call: InferRequest) -> Iterator[InferResponse]:
    """``engine.stream_from_thread(call)`` for a BLS call made with ``decoupled=True`` (``bls_error``); started
    at once, as the engine's stream is (an isolated instance's proxy sends the request as it is called)."""
    return _worded(engine.stream_from_thread(call), call.model_name)


def _worded(stream: Iterator[InferResponse], model_name: str) -> Iterator[InferResponse]:
    try:
        yield from stream
    except errors.ServerError as exc:
        worded = bls_error(exc, model_name, decoupled=True)
        if worded is exc:
            raise
        raise worded from None


def bls_error(exc: errors.ServerError, model_name: str, decoupled: bool) -> errors.ServerError:
    """Triton's error for a BLS request the engine refused before the called model ran, else ``exc`` itself.

    The engine marks those errors (``refused_before_queue``, set by ``core.engine.mark_refused``). Triton's python
    backend words a request that ``TRITONSERVER_ServerInferAsync`` refuses as ``Model <name> - Error when running
    inference: <why>``, always with code INTERNAL; a model that cannot be had is "not ready" there, and a decoupled
    model called without ``decoupled=True`` gets its own hint. Errors from the called model's execution keep their
    own message.
    """
    if not exc.refused_before_queue:
        return exc
    prefix = f"Model {model_name} - Error when running inference: "
    if isinstance(exc, (errors.NotFoundError, errors.UnavailableError)):  # the model's look-up (``registry.get``)
        return errors.InternalError(
            f"{prefix}Failed for execute the inference request. Model '{model_name}' is not ready."
        )
    if isinstance(exc, errors.UnsupportedError) and not decoupled:  # the engine's only one before queuing
        return errors.InternalError(
            f"{prefix}Model {model_name} is using the decoupled. The current BLS request call doesn't "
            "support models using the decoupled transaction policy. Please use 'decoupled=True' argument to "
            "the 'exec' or 'async_exec' calls for decoupled models.'"
        )
    return errors.InternalError(prefix + exc.message)
