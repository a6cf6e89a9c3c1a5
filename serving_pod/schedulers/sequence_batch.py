"""What a sequence model sees: requests with control and implicit-state inputs, null fillers, state read-back.

Neighbours: ``sequence.py`` (the scheduler: slots, lanes, idle reaper) calls these once it has chosen
the requests of a batch; ``sequence_config.SequenceSpec`` builds the tensors. ``run_padded`` executes a
direct-strategy batch that holds null requests and charges it as Triton does: the execution at its full
(padded) batch size in ``batch_stats``, the requests and ``inference_count`` for the real requests only.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from serving_pod.schedulers import instances
from serving_pod.schedulers.sequence_config import SequenceKey, SequenceSpec


class StateIO:
    """Implicit state plumbing of one model: which outputs are states, and the outputs to request."""

    __slots__ = ("spec", "input_of", "all_outputs")

    def __init__(self, spec: SequenceSpec, config_outputs: list[str]) -> None:
        self.spec = spec
        #: state output name -> state input name
        self.input_of = {state.output_name: state.input_name for state in spec.states}
        self.all_outputs = config_outputs + [name for name in self.input_of if name not in config_outputs]

    def prepare(
        self, request: InferRequest, key: SequenceKey, start: bool, end: bool, states: dict[str, np.ndarray] | None
    ) -> tuple[InferRequest, dict[str, np.ndarray] | None]:
        """The request as the model sees it (controls, state inputs, state outputs requested), and the states fed."""
        spec = self.spec
        inputs = list(request.inputs)
        inputs.extend(spec.control_tensors(start, end, True, key))
        outputs = request.outputs
        if spec.states:
            if start or states is None:
                states = spec.initial_states()
            for state in spec.states:
                inputs.append(Tensor(state.input_name, state.datatype, states[state.input_name]))
            # state outputs must be requested, or backends (python) prune them as unrequested
            names = self.all_outputs if outputs is None else [o.name for o in outputs]
            outputs = [RequestedOutput(name) for name in names]
            outputs.extend(RequestedOutput(name) for name in self.input_of if name not in names)
        prepared = InferRequest(
            request.model_name, request.model_version, inputs, outputs, request.id,
            request.parameters, request.arrival_ns, request.responder, request.cancelled,
            stats_sink=request.stats_sink, queue_start_ns=request.queue_start_ns,
        )
        return prepared, states

    def null_request(self, template: InferRequest) -> InferRequest:
        """A READY=0 filler for an empty direct slot, shaped like ``template`` (a prepared request)."""
        spec = self.spec
        controls = {t.name: t for t in spec.control_tensors(False, False, False, 0)}
        initial = spec.initial_states()
        inputs = []
        for tensor in template.inputs:
            if tensor.name in controls:
                data = controls[tensor.name].data
            elif tensor.name in initial:
                data = initial[tensor.name]
            elif tensor.data.dtype == np.object_:
                data = np.full(tensor.data.shape, b"", np.object_)
            else:
                data = np.zeros_like(tensor.data)
            inputs.append(Tensor(tensor.name, tensor.datatype, data))
        return InferRequest(template.model_name, template.model_version, inputs, template.outputs)

    def take_states(self, result: Any, states: dict[str, np.ndarray] | None) -> None:
        """Move the state outputs of ``result`` into ``states``; the client never sees them."""
        if not self.input_of or not isinstance(result, InferResponse):
            return
        kept = []
        for tensor in result.outputs:
            input_name = self.input_of.get(tensor.name)
            if input_name is None:
                kept.append(tensor)
            elif states is not None:
                states[input_name] = tensor.data
        result.outputs = kept


async def run_padded(pool: instances.InstancePool, index: int, requests: list[InferRequest], real: set[int]) -> list[Any]:
    """Execute a batch holding null requests on instance ``index``; only ids in ``real`` are requests to charge.

    Uses the pool's worker thread directly: ``InstancePool.execute`` charges every request as a real one.
    """
    dispatch_ns = time.monotonic_ns()
    results, start_ns, end_ns, *_ = await pool.run_threaded(index, requests)
    charge_padded(pool, requests, results, real, dispatch_ns, start_ns, end_ns, time.monotonic_ns())
    return results


def charge_padded(
    pool: Any, requests: list[InferRequest], results: list[Any], real: set[int],
    dispatch_ns: int, start_ns: int, end_ns: int, done_ns: int,
) -> None:
    """``InstancePool.charge`` for a padded batch: Triton 2.51 puts a direct batch of 3 slots of which 2 hold
    requests under ``batch_stats`` size 3, and counts 2 in ``inference_count`` and the request statistics."""
    keep = [i for i, request in enumerate(requests) if id(request) in real]
    pool.charge([requests[i] for i in keep], [results[i] for i in keep], dispatch_ns, start_ns, end_ns, done_ns,
                executed_size=sum(pool.batch_size_of(request) for request in requests))
