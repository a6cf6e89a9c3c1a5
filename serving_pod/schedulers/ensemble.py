"""Triton's ensemble scheduler: runs ``ensemble_scheduling`` steps as a DAG through the engine.

Neighbours: ``ensemble_graph.py`` (the steps, validated at load by the registry); ``ensemble_order.py`` (the
order of a response's outputs); the engine, whose ``infer`` runs each step on its composing model, so every
composing model keeps its own scheduler (dynamic batching, sequences...) and its own statistics. A step starts
as soon as all the ensemble tensors it reads exist, so independent steps run concurrently (one asyncio task per
ready step). As Triton, a request that asks for some of the outputs runs only the steps those outputs need.
The first failing step fails the ensemble request with that step's error, prefixed as Triton does
(``in ensemble 'NAME', ...``), and cancels the rest.

A decoupled composing model makes the ensemble decoupled (``ensemble_graph.validate_mapping``), so it is run
through ``engine.stream_infer`` and answers through the request's ``responder``: as Triton's
``EnsembleContext``, each response of a decoupled step is a flow of its own through the steps after it (tensors
keep their values by iteration, ``_run``), each complete set of outputs is one ensemble response, and the final
flag goes with the response sent when no step is left in flight, or alone (an empty stream is the final flag
alone). A step's response with no outputs, final or not, is a flow whose tensors are all missing (Triton's
placeholders): a later step runs without those inputs, and at the end it is an ensemble response with no
outputs. An error response of a decoupled step, mid-stream or last, fails the ensemble as a step's error does;
the error ends the stream. Like Triton 2.51, every ensemble response with an output carries the request's
sequence parameters (``sequence_id``, ``sequence_start``, ``sequence_end``; 0/false when the request has none;
Triton sets them with each output, so a response with none has none), whatever the steps are, and lists its
outputs in Triton's order (``ensemble_order``).

Between a batching and a non-batching model (ensemble or step), a tensor gains or loses its batch dimension
as in Triton's ``ReshapeTensorDims``: into a batching model, a tensor that came from a non-batching one and
matches the input's dims gets a leading 1; into a non-batching model, a tensor of batch size 1 that does not
match the input's dims loses its leading dimension.

The ensemble's own statistics follow Triton's: one success and one execution of its batch size per request,
queue time from the request's hand-over to this scheduler (``queue_start_ns``, after its validation) to the first
step's dispatch, and as ``compute_input`` / ``compute_infer`` / ``compute_output`` the sums of what each step's
request was charged by its model (a step request carries the ensemble's
``statistics.StepCompute`` as ``stats_sink``, which the instance pool charges with the request). A failed request
leaves ``last_inference`` as it was and counts failures of reason ``OTHER`` as Triton 2.51 does: one when the
error goes out, and one more when the request is released, which 2.51 does only if no step was left in flight
(a step running in parallel, a decoupled step still to send its final flag, a flow still running, or a composing
ensemble that itself failed so): else it never releases the request, a leak fixed in later Triton. Ferry counts
the same (so once for a decoupled step's error response, twice for a failing last step) but releases every
request and cancels the steps left. A request whose client goes away while steps run (gRPC cancel or deadline, a
stream closed, an HTTP stream whose reader left) is cancelled with its steps and counts one failure of reason
``CANCELED``, as a request a scheduler drops for its client; Triton 2.51 runs the steps to the end and counts a
success. A step already executing finishes in its model and counts there; one not started is never sent.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from serving_pod.core.errors import (
    InternalError,
    InvalidArgumentError,
    ServerError,
    UnavailableError,
)
from serving_pod.core.statistics import StepCompute
from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from serving_pod.schedulers.ensemble_graph import EnsembleStep, chain, ensemble_steps
from serving_pod.schedulers.ensemble_order import response_order

#: request parameters that belong to the ensemble request only, not to its steps
_OWN_PARAMETERS = frozenset({"binary_data_output", "binary_data_size"})
#: response parameters Triton's ensemble scheduler always sets, from the request (else these defaults)
_SEQUENCE_PARAMETERS = (("sequence_id", 0), ("sequence_start", False), ("sequence_end", False))


def sequence_parameters(request: InferRequest) -> dict[str, Any]:
    """The ``sequence_*`` parameters of an ensemble's response: the request's, defaults where it has none."""
    parameters: dict[str, Any] = {}
    for key, default in _SEQUENCE_PARAMETERS:
        value = request.parameters.get(key, default)
        parameters[key] = bool(value) if isinstance(default, bool) else value
    return parameters


#: set on an ensemble's error when steps were left in flight: Triton 2.51 never releases that request, so an
#: ensemble above it, which counts its own second failure at release, never does either (module docstring)
_UNRELEASED = "ensemble_unreleased"


def step_error(ensemble: str, error: ServerError, unreleased: bool = False) -> ServerError:
    """A step's error as the ensemble reports it: same class (so same status), Triton's prefix; ``unreleased``
    marks a failure Triton 2.51 counts once (steps were left in flight)."""
    wrapped = copy.copy(error)  # a nested ensemble's step error reads "in ensemble 'outer', in ensemble 'inner', ..."
    wrapped.message = f"in ensemble '{ensemble}', " + error.message
    wrapped.args = (wrapped.message,)
    # the ensemble's own request was queued: a step refused before its queue is an error response of the ensemble
    # (Triton: on a gRPC stream named by the ensemble and its final flag; ``triton_grpc_error`` ends the stream)
    wrapped.refused_before_queue = False
    setattr(wrapped, _UNRELEASED, unreleased)
    return wrapped


class _StepFailed(Exception):
    """A step's error ending an ensemble request, with whether steps were left in flight when it came."""

    def __init__(self, error: ServerError, steps_left: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.steps_left = steps_left


def _matches(dims: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Triton's ``CompareDimsWithWildcard``."""
    return len(dims) == len(shape) and all(d == s or d == -1 or s == -1 for d, s in zip(dims, shape))


def batch_reshaped(data: np.ndarray, dims: tuple[int, ...], batching: bool, batch_size: int) -> np.ndarray:
    """``data`` as a model with ``dims`` (``batching``: max_batch_size > 0) receives it, given the batch size of the
    request that made it (0 from a non-batching model): Triton's ``ReshapeTensorDims`` (module docstring)."""
    if batching == (batch_size != 0):
        return data
    if batching:
        return data.reshape((1,) + data.shape) if _matches(dims, data.shape) else data
    if batch_size == 1 and not _matches(dims, data.shape):
        return data.reshape(data.shape[1:])
    return data


def needed_steps(steps: tuple[EnsembleStep, ...], wanted: set[str]) -> tuple[EnsembleStep, ...]:
    """The steps that the ensemble tensors in ``wanted`` depend on, in config order (Triton prunes the others)."""
    producer = {tensor: step for step in steps for _, tensor in step.output_map}
    needed: set[int] = set()
    pending = list(wanted)
    while pending:
        step = producer.get(pending.pop())
        if step is not None and step.index not in needed:
            needed.add(step.index)
            pending.extend(tensor for _, tensor in step.input_map)
    return tuple(step for step in steps if step.index in needed)


class EnsembleScheduler:
    """Runs one ensemble model version's requests step by step through ``engine.infer``."""

    def __init__(self, model: Any, *, engine: Any) -> None:
        self.model = model
        self.engine = engine
        config = model.config
        self.steps: tuple[EnsembleStep, ...] = ensemble_steps(config)
        #: config order; responses use ``response_order``
        self.output_names = [tensor.name for tensor in config.output]
        self.response_order = response_order(self.output_names)
        self._all_outputs = frozenset(self.output_names)
        #: the steps in order when they form a chain (``ensemble_graph.chain``): ``_run_chain`` runs those
        self._chain = chain(self.steps, frozenset(tensor.name for tensor in config.input), self._all_outputs)
        self._batching = config.max_batch_size > 0
        self._output_dims = {
            tensor.name: tuple(tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims)
            for tensor in config.output
        }
        #: step index -> (composing config, its input dims by name), refreshed when the composing model reloads
        self._step_inputs: dict[int, tuple[Any, dict[str, tuple[int, ...]]]] = {}
        self._inflight = 0
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()

    def pending(self) -> int:
        return 0  # an ensemble queues nothing itself: its steps queue in their own models

    async def drain(self) -> None:
        self._closing = True
        await self._idle.wait()

    async def submit(self, request: InferRequest) -> InferResponse | None:
        if self._closing:
            raise UnavailableError(f"model '{request.model_name}' is unloading")
        self._inflight += 1
        self._idle.clear()
        stats = self.model.stats
        wanted = self._all_outputs if request.outputs is None else {output.name for output in request.outputs}
        compute = StepCompute()
        responder = request.responder  # set for a decoupled ensemble (engine.stream_infer)
        responses: list[InferResponse] = []

        def emit(response: InferResponse | None, final: bool) -> None:
            if responder is not None:
                responder(response, final)
            elif response is not None:
                responses.append(response)

        try:
            if responder is None and self._chain is not None and wanted >= self._all_outputs and not any(
                    self._decoupled(step) for step in self._chain):
                dispatch_ns = await self._run_chain(self._chain, request, compute, emit)
            else:
                dispatch_ns = await self._run(request, wanted, compute, emit)
            if responder is None and not responses:  # Triton's words: no output was ever set
                raise InvalidArgumentError(
                    "unexpected deadlock, at least one output is not set while no more ensemble steps can be made")
        except (ServerError, _StepFailed) as failure:
            error, steps_left = (failure.error, failure.steps_left) if isinstance(failure, _StepFailed) else (
                failure, False)
            # once when the error goes out, once more at release: Triton 2.51 releases it only if no step was left
            for _ in range(1 if steps_left else 2):
                stats.record_failure(time.monotonic_ns() - request.arrival_ns, "OTHER")
            wrapped = step_error(self.model.config.name, error, steps_left)
            if responder is None:
                raise wrapped from None
            responder(wrapped, True)  # the error ends the stream
            return None
        except asyncio.CancelledError:  # the client went away: ``_run`` cancelled the steps left
            stats.record_failure(time.monotonic_ns() - request.arrival_ns, "CANCELED")
            raise
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
        done_ns = time.monotonic_ns()
        if request.stats_sink is not None:  # a step of an outer ensemble, which is charged these sums too
            request.stats_sink.add(compute.input_ns, compute.infer_ns, compute.output_ns)
        stats.record_execution(self.model.batch_size_of(request), compute.input_ns, compute.infer_ns, compute.output_ns)
        stats.record_success(done_ns - request.arrival_ns, dispatch_ns - (request.queue_start_ns or request.arrival_ns),
                             compute.input_ns, compute.infer_ns, compute.output_ns)
        return responses[0] if responses else None

    def _response(self, request: InferRequest, tensors: dict[str, Tensor | None], batch_of: dict[str, int],
                  wanted: set[str]) -> InferResponse:
        """One ensemble response from the output tensors of one flow (None: a step left that output out)."""
        outputs = []
        for name in self.response_order:
            value = tensors.get(name)
            if value is not None and name in wanted:
                data = batch_reshaped(value.data, self._output_dims[name], self._batching, batch_of[name])
                outputs.append(Tensor(name, value.datatype, data))
        # Triton sets the sequence parameters with each output: a flow whose outputs are all missing (a step's
        # response with none) is a response without them
        return InferResponse(request.model_name, request.model_version, outputs, request.id,
                             sequence_parameters(request) if outputs else {})

    def _step_parameters(self, request: InferRequest) -> dict[str, Any]:
        return {k: v for k, v in request.parameters.items() if k not in _OWN_PARAMETERS}

    async def _run_chain(
        self, steps: tuple[EnsembleStep, ...], request: InferRequest, compute: StepCompute,
        emit: Callable[[InferResponse | None, bool], None],
    ) -> int:
        """``_run`` for a chain of steps whose models are not decoupled, every output wanted: each step runs when
        the one before it has answered, so they run here one after the other, with the tensors by name (one
        iteration each). Returns when the first step was dispatched."""
        batch_size = request.inputs[0].data.shape[0] if self._batching and request.inputs else 0
        values: dict[str, Tensor | None] = {tensor.name: tensor for tensor in request.inputs}
        batch_of = dict.fromkeys(values, batch_size)
        for tensor in self.model.config.input:  # optional inputs the client left out are known to be absent
            if tensor.name not in values:
                values[tensor.name] = None
                batch_of[tensor.name] = batch_size
        parameters = self._step_parameters(request)
        answered: list[tuple] = []
        dispatch_ns = time.monotonic_ns()
        for step in steps:
            inputs = {source: values[source] for _, source in step.input_map}
            await self._step(step, inputs, batch_of, request, parameters, compute, answered.append)
            _, item, _, step_batch = answered.pop()
            if isinstance(item, ServerError):
                raise _StepFailed(item, getattr(item, _UNRELEASED, False))
            produced = {tensor.name: tensor for tensor in item.outputs}
            for model_output, tensor in step.output_map:
                value = produced.get(model_output)
                values[tensor] = None if value is None else Tensor(tensor, value.datatype, value.data)
                batch_of[tensor] = step_batch
        emit(self._response(request, values, batch_of, self._all_outputs), True)
        return dispatch_ns

    async def _run(
        self, request: InferRequest, wanted: set[str], compute: StepCompute,
        emit: Callable[[InferResponse | None, bool], None],
    ) -> int:
        """Run the steps ``wanted`` needs, ``emit``-ting each response (and the final flag); returns when the
        first step was dispatched. As Triton's ``EnsembleContext``, every ensemble tensor keeps its values by
        iteration (the n-th value written to it): a decoupled step's n responses write n iterations, a step
        runs once per iteration present in all its inputs, and a response goes out for an iteration present
        in all the requested outputs, with the final flag when no step is left in flight (else the final flag
        comes alone, once the last step ends)."""
        values: dict[str, dict[int, Tensor | None]] = {}
        batch_size = request.inputs[0].data.shape[0] if self._batching and request.inputs else 0
        batch_of: dict[str, int] = {}
        updated: list[tuple[str, int]] = []

        def add(name: str, value: Tensor | None, batch: int) -> None:
            column = values.setdefault(name, {})
            updated.append((name, len(column)))
            column[len(column)] = value
            batch_of[name] = batch

        for tensor in request.inputs:
            add(tensor.name, tensor, batch_size)
        # ensemble inputs the client left out (optional ones) are known to be absent, not pending
        for tensor in self.model.config.input:
            if tensor.name not in values:
                add(tensor.name, None, batch_size)
        parameters = self._step_parameters(request)
        steps = self.steps if wanted >= set(self.output_names) else needed_steps(self.steps, wanted)
        consumers: dict[str, list[EnsembleStep]] = {}
        for step in steps:
            for _, tensor in step.input_map:
                consumers.setdefault(tensor, []).append(step)
        events: asyncio.Queue = asyncio.Queue()
        running: set[asyncio.Task] = set()
        launched: set[tuple[int, int]] = set()
        dispatch_ns = 0
        in_flight = 0

        def launch() -> None:
            nonlocal dispatch_ns, in_flight
            for tensor, iteration in sorted(set(updated)):
                for step in consumers.get(tensor, ()):
                    if (step.index, iteration) in launched or not all(
                            iteration in values.get(source, {}) for _, source in step.input_map):
                        continue
                    launched.add((step.index, iteration))
                    inputs = {source: values[source][iteration] for _, source in step.input_map}
                    if not dispatch_ns:
                        dispatch_ns = time.monotonic_ns()
                    in_flight += 1
                    task = asyncio.create_task(
                        self._step(step, inputs, batch_of, request, parameters, compute, events.put_nowait))
                    running.add(task)
                    task.add_done_callback(running.discard)

        def ready_response() -> InferResponse | None:
            for tensor, iteration in updated:
                if tensor in wanted and all(iteration in values.get(name, {}) for name in wanted):
                    return self._response(
                        request, {name: values[name][iteration] for name in wanted}, batch_of, wanted)
            return None

        launch()
        updated.clear()
        try:
            while in_flight:
                step, item, final, step_batch = await events.get()
                if isinstance(item, ServerError):  # a step's error fails the ensemble (and the rest is cancelled)
                    raise _StepFailed(item, in_flight > final or getattr(item, _UNRELEASED, False))
                if final:
                    in_flight -= 1
                if item is not None:
                    produced = {tensor.name: tensor for tensor in item.outputs}
                    for model_output, tensor in step.output_map:
                        value = produced.get(model_output)
                        add(tensor, None if value is None else Tensor(tensor, value.datatype, value.data), step_batch)
                launch()
                response = ready_response()
                updated.clear()
                if response is not None:
                    emit(response, not in_flight)
                elif not in_flight:
                    emit(None, True)
        finally:
            for task in list(running):
                task.cancel()
        return dispatch_ns or time.monotonic_ns()

    def _decoupled(self, step: EnsembleStep) -> bool:
        """Whether the step's model is decoupled; False when it is not ready (``_step`` then reports why)."""
        try:
            return self.engine.registry.get(step.model_name, step.model_version).decoupled
        except ServerError:
            return False

    def _model_of(self, step: EnsembleStep) -> tuple[Any, dict[str, tuple[int, ...]]]:
        """The step's ready model and its input dims by name (looked up once per loaded version)."""
        model = self.engine.registry.get(step.model_name, step.model_version)
        config = model.config
        cached = self._step_inputs.get(step.index)
        if cached is None or cached[0] is not config:
            cached = self._step_inputs[step.index] = (config, {spec.name: tuple(spec.dims) for spec in config.input})
        return model, cached[1]

    async def _step(
        self, step: EnsembleStep, tensors: dict[str, Tensor | None], batch_of: dict[str, int],
        request: InferRequest, parameters: dict[str, Any], compute: StepCompute, put: Callable[[tuple], None],
    ) -> None:
        """Run one step on one iteration of its inputs; ``put``-s ``(step, response or error, final, batch size)``
        for each of its responses (batch size 0 when its model does not batch). A decoupled model's
        flag-only final response comes as None. Any error is put too (else ``_run`` would wait for ever)."""
        step_batch = 0
        try:
            model, dims = self._model_of(step)  # the composing model may have gone (unloaded) meanwhile
            batching = model.max_batch_size > 0
            inputs = [
                Tensor(model_input, value.datatype,
                       batch_reshaped(value.data, dims.get(model_input, ()), batching, batch_of[tensor]))
                for model_input, tensor in step.input_map
                if (value := tensors[tensor]) is not None
            ]
            step_batch = inputs[0].data.shape[0] if batching and inputs else 0
            step_request = InferRequest(
                step.model_name,
                step.model_version,
                inputs,
                [RequestedOutput(model_output) for model_output, _ in step.output_map],
                request.id,
                dict(parameters),
                cancelled=request.cancelled,
                custom_reserved=request.custom_reserved,
                stats_sink=compute,
                trace=request.trace,  # the engine traces the step as its child
            )
            if not model.decoupled:
                put((step, await self.engine.infer(step_request), True, step_batch))
                return
            async for item in self.engine.stream_infer(step_request):
                if isinstance(item, ServerError):
                    put((step, item, False, step_batch))
                    continue
                put((step, None if item.flag_only else item, item.final, step_batch))
        except ServerError as error:
            put((step, error, True, step_batch))
        except Exception as error:  # noqa: BLE001 - a fault here must fail the request, not hang it
            put((step, InternalError(f"{type(error).__name__}: {error}"), True, step_batch))
