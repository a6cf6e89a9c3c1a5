"""Triton's ensemble scheduler: runs ``ensemble_scheduling`` steps as a DAG through the engine.

Neighbours: ``ensemble_graph.py`` (the steps, validated at load by the registry); the engine, whose
``infer`` runs each step on its composing model, so every composing model keeps its own scheduler
(dynamic batching, sequences...) and its own statistics. A step starts as soon as all the ensemble
tensors it reads exist, so independent steps run concurrently (one asyncio task per ready step).
The first failing step fails the ensemble request with that step's error, prefixed as Triton does
(``in ensemble 'NAME', ...``), and cancels the rest. Like Triton 2.51, every ensemble response carries
the request's sequence parameters (``sequence_id``, ``sequence_start``, ``sequence_end``; 0/false when the
request has none), whatever the steps are.

The ensemble's own statistics follow Triton's: one success (or failure) per request, queue time
up to the first step's dispatch, and as compute the time its steps took (charged as compute_infer,
summed over steps; the composing models' statistics hold the exact per-stage times).
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

from serving_pod.core.errors import ServerError, UnavailableError
from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from serving_pod.schedulers.ensemble_graph import EnsembleStep, ensemble_steps

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


class EnsembleScheduler:
    """Runs one ensemble model version's requests step by step through ``engine.infer``."""

    def __init__(self, model: Any, *, engine: Any) -> None:
        self.model = model
        self.engine = engine
        self.steps: tuple[EnsembleStep, ...] = ensemble_steps(model.config)
        self.output_names = [tensor.name for tensor in model.config.output]
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
        try:
            tensors, compute_ns, dispatch_ns = await self._run(request)
        except ServerError as error:
            stats.record_failure(time.monotonic_ns() - request.arrival_ns, "BACKEND")
            raise step_error(self.model.config.name, error) from None
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
        done_ns = time.monotonic_ns()
        stats.record_execution(self.model.batch_size_of(request), 0, compute_ns, 0)
        stats.record_success(done_ns - request.arrival_ns, dispatch_ns - request.arrival_ns, 0, compute_ns, 0)
        wanted = self.output_names if request.outputs is None else [o.name for o in request.outputs]
        outputs = [tensors[name] for name in wanted if name in tensors]
        return InferResponse(request.model_name, request.model_version, outputs, request.id,
                             sequence_parameters(request))

    async def _run(self, request: InferRequest) -> tuple[dict[str, Tensor], int, int]:
        """Run every step; returns the ensemble tensors, the steps' summed time and the first dispatch."""
        tensors: dict[str, Tensor] = {tensor.name: tensor for tensor in request.inputs}
        # ensemble inputs the client left out (optional ones) are known to be absent, not pending
        absent = {tensor.name for tensor in self.model.config.input} - tensors.keys()
        parameters = {k: v for k, v in request.parameters.items() if k not in _OWN_PARAMETERS}
        waiting = list(self.steps)
        running: dict[asyncio.Task, EnsembleStep] = {}
        compute_ns = 0
        dispatch_ns = 0

        def launch() -> None:
            nonlocal dispatch_ns
            for step in list(waiting):
                if all(tensor in tensors or tensor in absent for _, tensor in step.input_map):
                    waiting.remove(step)
                    if not dispatch_ns:
                        dispatch_ns = time.monotonic_ns()
                    task = asyncio.create_task(self._step(step, tensors, request, parameters))
                    running[task] = step

        launch()
        try:
            while running:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step = running.pop(task)
                    response, elapsed_ns = task.result()  # a step's ServerError fails the ensemble
                    compute_ns += elapsed_ns
                    produced = {tensor.name: tensor for tensor in response.outputs}
                    for model_output, tensor in step.output_map:
                        value = produced.get(model_output)
                        if value is None:
                            absent.add(tensor)
                        else:
                            tensors[tensor] = Tensor(tensor, value.datatype, value.data)
                launch()
        finally:
            for task in running:
                task.cancel()
        return tensors, compute_ns, dispatch_ns or time.monotonic_ns()

    async def _step(
        self, step: EnsembleStep, tensors: dict[str, Tensor], request: InferRequest, parameters: dict[str, Any]
    ) -> tuple[InferResponse, int]:
        inputs = [
            Tensor(model_input, tensors[tensor].datatype, tensors[tensor].data)
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
        )
        start_ns = time.monotonic_ns()
        response = await self.engine.infer(step_request)
        return response, time.monotonic_ns() - start_ns
