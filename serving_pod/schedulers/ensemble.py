"""Triton's ensemble scheduler: runs ``ensemble_scheduling`` steps as a DAG through the engine.

Neighbours: ``ensemble_graph.py`` (the steps, validated at load by the registry); ``ensemble_order.py`` (the
order of a response's outputs); the engine, whose ``infer`` runs each step on its composing model, so every
composing model keeps its own scheduler (dynamic batching, sequences...) and its own statistics. A step starts
as soon as all the ensemble tensors it reads exist, so independent steps run concurrently (one asyncio task per
ready step). As Triton, a request that asks for some of the outputs runs only the steps those outputs need.
The first failing step fails the ensemble request with that step's error, prefixed as Triton does
(``in ensemble 'NAME', ...``), and cancels the rest. Like Triton 2.51, every ensemble response carries the
request's sequence parameters (``sequence_id``, ``sequence_start``, ``sequence_end``; 0/false when the request
has none), whatever the steps are, and lists its outputs in Triton's order (``ensemble_order``).

Between a batching and a non-batching model (ensemble or step), a tensor gains or loses its batch dimension
as in Triton's ``ReshapeTensorDims``: into a batching model, a tensor that came from a non-batching one and
matches the input's dims gets a leading 1; into a non-batching model, a tensor of batch size 1 that does not
match the input's dims loses its leading dimension.

The ensemble's own statistics follow Triton's: one success and one execution of its batch size per request,
queue time up to the first step's dispatch, and as ``compute_input`` / ``compute_infer`` / ``compute_output``
the sums of what each step's request was charged by its model (a step request carries the ensemble's
``statistics.StepCompute`` as ``stats_sink``, which the instance pool charges with the request); a failed request
counts two failures, reason ``OTHER`` (Triton reports it once when it sends the error and once when it releases
the request), and leaves ``last_inference`` as it was.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import numpy as np

from serving_pod.core.errors import ServerError, UnavailableError
from serving_pod.core.statistics import StepCompute
from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from serving_pod.schedulers.ensemble_graph import EnsembleStep, ensemble_steps
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


def step_error(ensemble: str, error: ServerError) -> ServerError:
    """A step's error as the ensemble reports it: same class (so same status), Triton's prefix."""
    wrapped = copy.copy(error)  # a nested ensemble's step error reads "in ensemble 'outer', in ensemble 'inner', ..."
    wrapped.message = f"in ensemble '{ensemble}', " + error.message
    wrapped.args = (wrapped.message,)
    return wrapped


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

    async def submit(self, request: InferRequest) -> InferResponse:
        if self._closing:
            raise UnavailableError(f"model '{request.model_name}' is unloading")
        self._inflight += 1
        self._idle.clear()
        stats = self.model.stats
        wanted = set(self.output_names) if request.outputs is None else {output.name for output in request.outputs}
        compute = StepCompute()
        try:
            tensors, batch_of, dispatch_ns = await self._run(request, wanted, compute)
        except ServerError as error:
            # Triton counts it twice: when the error response goes out, and when the request is released
            stats.record_failure(time.monotonic_ns() - request.arrival_ns, "OTHER")
            stats.record_failure(time.monotonic_ns() - request.arrival_ns, "OTHER")
            raise step_error(self.model.config.name, error) from None
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
        done_ns = time.monotonic_ns()
        if request.stats_sink is not None:  # a step of an outer ensemble, which is charged these sums too
            request.stats_sink.add(compute.input_ns, compute.infer_ns, compute.output_ns)
        stats.record_execution(self.model.batch_size_of(request), compute.input_ns, compute.infer_ns, compute.output_ns)
        stats.record_success(done_ns - request.arrival_ns, dispatch_ns - request.arrival_ns,
                             compute.input_ns, compute.infer_ns, compute.output_ns)
        outputs = []
        for name in self.response_order:
            value = tensors.get(name)
            if value is not None and name in wanted:
                data = batch_reshaped(value.data, self._output_dims[name], self._batching, batch_of[name])
                outputs.append(Tensor(name, value.datatype, data))
        return InferResponse(request.model_name, request.model_version, outputs, request.id,
                             sequence_parameters(request))

    async def _run(
        self, request: InferRequest, wanted: set[str], compute: StepCompute
    ) -> tuple[dict[str, Tensor], dict[str, int], int]:
        """Run the steps ``wanted`` needs; returns the ensemble tensors, the batch size of the request that made
        each (0: a non-batching model) and when the first step was dispatched."""
        tensors: dict[str, Tensor] = {tensor.name: tensor for tensor in request.inputs}
        batch_size = request.inputs[0].data.shape[0] if self._batching and request.inputs else 0
        batch_of = dict.fromkeys(tensors, batch_size)
        # ensemble inputs the client left out (optional ones) are known to be absent, not pending
        absent = {tensor.name for tensor in self.model.config.input} - tensors.keys()
        parameters = {k: v for k, v in request.parameters.items() if k not in _OWN_PARAMETERS}
        waiting = list(self.steps if wanted >= set(self.output_names) else needed_steps(self.steps, wanted))
        running: dict[asyncio.Task, EnsembleStep] = {}
        dispatch_ns = 0

        def launch() -> None:
            nonlocal dispatch_ns
            for step in list(waiting):
                if all(tensor in tensors or tensor in absent for _, tensor in step.input_map):
                    waiting.remove(step)
                    if not dispatch_ns:
                        dispatch_ns = time.monotonic_ns()
                    task = asyncio.create_task(self._step(step, tensors, batch_of, request, parameters, compute))
                    running[task] = step

        launch()
        try:
            while running:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step = running.pop(task)
                    response, step_batch = task.result()  # a step's ServerError fails the ensemble
                    produced = {tensor.name: tensor for tensor in response.outputs}
                    for model_output, tensor in step.output_map:
                        value = produced.get(model_output)
                        if value is None:
                            absent.add(tensor)
                        else:
                            tensors[tensor] = Tensor(tensor, value.datatype, value.data)
                            batch_of[tensor] = step_batch
                launch()
        finally:
            for task in running:
                task.cancel()
        return tensors, batch_of, dispatch_ns or time.monotonic_ns()

    def _inputs_of(self, step: EnsembleStep) -> tuple[bool, dict[str, tuple[int, ...]]]:
        """Whether the step's model batches, and its input dims by name (looked up once per loaded version)."""
        config = self.engine.registry.get(step.model_name, step.model_version).config
        cached = self._step_inputs.get(step.index)
        if cached is None or cached[0] is not config:
            cached = self._step_inputs[step.index] = (config, {spec.name: tuple(spec.dims) for spec in config.input})
        return config.max_batch_size > 0, cached[1]

    async def _step(
        self, step: EnsembleStep, tensors: dict[str, Tensor], batch_of: dict[str, int], request: InferRequest,
        parameters: dict[str, Any], compute: StepCompute,
    ) -> tuple[InferResponse, int]:
        """Run one step; returns its response and its request's batch size (0 when its model does not batch)."""
        batching, dims = self._inputs_of(step)
        inputs = [
            Tensor(model_input, tensors[tensor].datatype,
                   batch_reshaped(tensors[tensor].data, dims.get(model_input, ()), batching, batch_of[tensor]))
            for model_input, tensor in step.input_map
            if tensor in tensors
        ]
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
        response = await self.engine.infer(step_request)
        return response, (inputs[0].data.shape[0] if batching and inputs else 0)
