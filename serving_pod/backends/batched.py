"""Instances that run a whole batch at once: merge inputs, one framework call, split outputs.

Neighbours: the onnxruntime and tensorrt backends subclass ``BatchedInstance`` and implement only
``_infer`` (one framework call on merged, converted inputs); ``schedulers/batching.py`` holds the
pure merge/split functions. ``build_plan`` precomputes, once per instance, everything ``execute``
needs (output datatypes, the default output list, per-tensor converters), so the hot path does no
config look-ups.

Semantics shared by those backends: only requested outputs are computed (the union over the batch),
plus implicit-state outputs, which are always returned (the sequence scheduler places each
``sequence_batching.state`` tensor in the request under its ``input_name`` and reads ``output_name``
back from the response). ``reshape`` in the config is applied to inputs before the call and undone
on outputs. Requests that cannot be concatenated after all run one by one. A batch whose call fails runs
again one request at a time, so that one request's data the framework cannot take (a string an ONNX ``Cast``
cannot read as a number, bytes that are not UTF-8) fails that request alone, not the others batched with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.backends.base import InstanceContext
from serving_pod.backends.graph_signature import Infos, TensorInfo
from serving_pod.core.datatypes import config_to_wire, wire_datatype
from serving_pod.core.errors import ServerError
from serving_pod.core.types import InferRequest, InferResponse, Tensor
from serving_pod.schedulers.batching import batch_size_of, merge_inputs, split_outputs

#: (array, batch rows) -> array; applied per tensor name around the framework call.
Converter = Callable[[np.ndarray, int], np.ndarray]
#: a backend's type conversions for one tensor (e.g. strings, BF16)
StepsFor = Callable[[TensorInfo], list[Converter]]


@dataclass(frozen=True, slots=True)
class InstancePlan:
    """What an instance precomputes once so ``execute`` does no config look-ups."""

    model_name: str
    model_version: str
    max_batch_size: int
    #: output name -> wire datatype (config outputs and state outputs)
    datatypes: dict[str, str]
    #: every config output, then state outputs: the names run when a request lists no outputs
    all_outputs: list[str]
    state_outputs: tuple[str, ...]
    input_converters: dict[str, tuple[Converter, ...]]
    output_converters: dict[str, tuple[Converter, ...]]


def _no_steps(info: TensorInfo) -> list[Converter]:
    return []


def build_plan(
    context: InstanceContext,
    inputs: Infos,
    outputs: Infos,
    *,
    input_steps: StepsFor = _no_steps,
    output_steps: StepsFor = _no_steps,
) -> InstancePlan:
    """The plan of one instance: config reshapes plus the backend's own type conversions."""
    config = context.config
    max_batch = config.max_batch_size
    config_outputs = [tensor.name for tensor in config.output]
    datatypes = {tensor.name: config_to_wire(mc.DataType.Name(tensor.data_type)) for tensor in config.output}
    states = tuple(state.output_name for state in config.sequence_batching.state)
    for state in config.sequence_batching.state:
        datatypes.setdefault(state.output_name, config_to_wire(mc.DataType.Name(state.data_type)))
    reshaped_inputs = {t.name: tuple(t.reshape.shape) for t in config.input if t.HasField("reshape")}
    reshaped_outputs = {
        t.name: tuple(t.dims) for t in config.output if t.HasField("reshape") and list(t.dims).count(-1) <= 1
    }
    input_converters: dict[str, tuple[Converter, ...]] = {}
    for name, info in inputs.items():
        steps = [reshaper(reshaped_inputs[name], max_batch)] if name in reshaped_inputs else []
        steps.extend(input_steps(info))
        if steps:
            input_converters[name] = tuple(steps)
    output_converters: dict[str, tuple[Converter, ...]] = {}
    for name, info in outputs.items():
        steps = output_steps(info)
        if name in reshaped_outputs:
            steps.append(reshaper(reshaped_outputs[name], max_batch))
        if steps:
            output_converters[name] = tuple(steps)
    return InstancePlan(
        model_name=context.model_name,
        model_version=context.model_version,
        max_batch_size=max_batch,
        datatypes=datatypes,
        all_outputs=[*config_outputs, *(name for name in states if name not in config_outputs)],
        state_outputs=states,
        input_converters=input_converters,
        output_converters=output_converters,
    )


def reshaper(shape: tuple[int, ...], max_batch: int) -> Converter:
    """A converter reshaping to ``shape`` (after the batch dim when the model batches)."""

    def reshape(array: np.ndarray, rows: int) -> np.ndarray:
        return array.reshape((rows, *shape) if max_batch > 0 else shape)

    return reshape


class BatchedInstance:
    """Executes a list of requests with one ``_infer`` call; subclasses implement ``_infer`` and ``close``."""

    _plan: InstancePlan

    def _infer(self, feeds: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
        """Run the model on converted ``feeds``; return the arrays of ``names`` in order."""
        raise NotImplementedError

    def execute(self, requests: list[InferRequest]) -> list[InferResponse | ServerError]:
        plan = self._plan
        if len(requests) == 1 or plan.max_batch_size == 0:
            return [self._execute_one(request) for request in requests]
        try:
            feeds = merge_inputs(requests)
        except ValueError:  # not batchable after all: keep every request's answer correct
            return [self._execute_one(request) for request in requests]
        names = self._union(requests)
        sizes = [batch_size_of(request, plan.max_batch_size) for request in requests]
        try:
            parts = split_outputs(self._run(feeds, names, sum(sizes)), sizes)
        except ServerError:  # one request's data may have failed the call: only what fails alone fails
            return [self._execute_one(request) for request in requests]
        return [self._respond(request, part) for request, part in zip(requests, parts)]

    def _execute_one(self, request: InferRequest) -> InferResponse | ServerError:
        try:
            feeds = {tensor.name: tensor.data for tensor in request.inputs}
            rows = batch_size_of(request, self._plan.max_batch_size)
            return self._respond(request, self._run(feeds, self._requested(request), rows))
        except ServerError as exc:
            return exc

    def _requested(self, request: InferRequest) -> list[str]:
        plan = self._plan
        if request.outputs is None:
            return plan.all_outputs
        names = [output.name for output in request.outputs]
        names.extend(name for name in plan.state_outputs if name not in names)
        return names

    def _union(self, requests: list[InferRequest]) -> list[str]:
        if all(request.outputs is None for request in requests):
            return self._plan.all_outputs
        names: dict[str, None] = {}
        for request in requests:
            names.update(dict.fromkeys(self._requested(request)))
        return list(names)

    def _run(self, feeds: dict[str, np.ndarray], names: list[str], rows: int) -> dict[str, np.ndarray]:
        plan = self._plan
        for name, steps in plan.input_converters.items():
            array = feeds.get(name)
            if array is not None:
                for step in steps:
                    array = step(array, rows)
                feeds[name] = array
        outputs = dict(zip(names, self._infer(feeds, names)))
        for name, steps in plan.output_converters.items():
            array = outputs.get(name)
            if array is not None:
                for step in steps:
                    array = step(array, rows)
                outputs[name] = array
        return outputs

    def _respond(self, request: InferRequest, outputs: dict[str, np.ndarray]) -> InferResponse:
        datatypes = self._plan.datatypes
        tensors = [
            Tensor(name, datatypes.get(name) or wire_datatype(outputs[name]), outputs[name])
            for name in self._requested(request)
        ]
        return InferResponse(request.model_name, self._plan.model_version, tensors, id=request.id)
