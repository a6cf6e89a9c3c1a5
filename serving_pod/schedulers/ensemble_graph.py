"""An ensemble's ``ensemble_scheduling`` as a validated DAG of steps (pure functions, no I/O).

Neighbours: the registry calls ``validate_structure`` and ``validate_mapping`` when an ensemble
loads (after its composing models are loaded, since their configs are needed); ``ensemble.py``
runs the steps. Checks follow Triton's ``ValidateEnsembleSchedulingConfig`` and
``ValidateTensorMapping``: every error names the ensemble, the step (index and model) and the tensor, so a
broken config says exactly where it is broken. ``validate_structure``'s are ``PollRefused`` (Triton refuses the
ensemble's own config while polling the repository: HTTP 500), ``validate_mapping``'s ``ModelLoadError`` (the
registry words them as Triton's ``load failed for model '<ens>'``). As Triton's, an
ensemble over a decoupled composing model (at any depth) is itself served as decoupled
(``model_transaction_policy`` set by ``validate_mapping``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.errors import ModelLoadError
from serving_pod.core.load_errors import PollRefused


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One step: which model runs, fed from and writing to which ensemble tensors."""

    index: int
    model_name: str
    #: "" for the composing model's latest ready version (model_version -1, or left out)
    model_version: str
    #: (composing model input, ensemble tensor)
    input_map: tuple[tuple[str, str], ...]
    #: (composing model output, ensemble tensor)
    output_map: tuple[tuple[str, str], ...]

    @property
    def label(self) -> str:
        return f"step {self.index} (model '{self.model_name}')"


def ensemble_steps(config: mc.ModelConfig) -> tuple[EnsembleStep, ...]:
    steps = []
    for index, step in enumerate(config.ensemble_scheduling.step):
        version = "" if step.model_version <= 0 else str(step.model_version)  # -1 (or unset): latest
        steps.append(EnsembleStep(
            index, step.model_name, version,
            tuple(sorted(step.input_map.items())), tuple(sorted(step.output_map.items())),
        ))
    return tuple(steps)


def chain(steps: tuple[EnsembleStep, ...], inputs: frozenset[str],
          outputs: frozenset[str]) -> tuple[EnsembleStep, ...] | None:
    """The steps in the order they run when they form a chain (from the ensemble's ``inputs``, exactly one step
    can start at each point, and all the ``outputs`` are written in the end), else None. A chain's steps run
    one after the other whatever the scheduler does, so it can run them without the concurrent machinery."""
    available = set(inputs)
    left = list(steps)
    order = []
    while left:
        ready = [step for step in left if all(tensor in available for _, tensor in step.input_map)]
        if len(ready) != 1:
            return None
        order.append(ready[0])
        left.remove(ready[0])
        available.update(tensor for _, tensor in ready[0].output_map)
    return tuple(order) if outputs <= available else None


def validate_structure(config: mc.ModelConfig) -> tuple[EnsembleStep, ...]:
    """Checks needing only the ensemble's own config: fields, tensor flow, cycles. Returns the steps."""
    name = config.name
    if config.instance_group:
        raise PollRefused(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise PollRefused(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise PollRefused(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise PollRefused(f"must specify 'step' for ensemble '{name}'")
    steps = ensemble_steps(config)
    inputs = {tensor.name for tensor in config.input}
    producer: dict[str, EnsembleStep] = {}
    for step in steps:
        for field, mapping in (("model_name", step.model_name), ("input_map", step.input_map), ("output_map", step.output_map)):
            if not mapping:
                raise PollRefused(f"must specify '{field}' in step {step.index} of ensemble '{name}'")
        if step.model_name == name:
            raise PollRefused(f"ensemble '{name}' {step.label} refers to the ensemble itself")
        for _, tensor in step.output_map:
            if tensor in producer:
                raise PollRefused(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble "
                    f"'{name}' step {step.index} (already written by {producer[tensor].label})"
                )
            if tensor in inputs:
                raise PollRefused(
                    f"in ensemble '{name}', {step.label} writes ensemble tensor '{tensor}', which is an "
                    "ensemble input"
                )
            producer[tensor] = step
    consumed: set[str] = set()
    for step in steps:
        for model_input, tensor in step.input_map:
            consumed.add(tensor)
            if tensor not in inputs and tensor not in producer:
                raise PollRefused(
                    f"in ensemble '{name}', {step.label}: input '{model_input}' is mapped from ensemble "
                    f"tensor '{tensor}', which is neither an ensemble input nor an output of any step"
                )
    _check_cycles(name, steps, producer)
    outputs = {tensor.name for tensor in config.output}
    for tensor in config.input:
        if tensor.name not in consumed:
            raise PollRefused(f"ensemble input '{tensor.name}' for ensemble '{name}' is not used")
    for tensor in config.output:
        if tensor.name not in producer:
            raise PollRefused(
                f"output '{tensor.name}' for ensemble '{name}' is not written: no step maps an output to it"
            )
    for tensor, step in producer.items():
        if tensor not in consumed and tensor not in outputs:
            raise PollRefused(
                f"ensemble tensor '{tensor}' is unused in ensemble '{name}' (written by {step.label}, "
                "read by no step and not an ensemble output)"
            )
    return steps


def _check_cycles(name: str, steps: tuple[EnsembleStep, ...], producer: dict[str, EnsembleStep]) -> None:
    """Depth-first search over step -> step edges; the first cycle found is reported in full."""
    edges = {
        step.index: [(tensor, producer[tensor].index) for _, tensor in step.input_map if tensor in producer]
        for step in steps
    }
    color = dict.fromkeys(edges, 0)  # 0 new, 1 on the path, 2 done
    path: list[tuple[int, str]] = []

    def visit(index: int) -> None:
        color[index] = 1
        for tensor, upstream in edges[index]:
            path.append((index, tensor))
            if color[upstream] == 1:
                start = next(i for i, (step, _) in enumerate(path) if step == upstream)
                hops = " <- ".join(f"{steps[s].label} reads '{t}'" for s, t in path[start:])
                raise PollRefused(
                    f"ensemble '{name}' has a cycle: {hops} <- written by {steps[upstream].label}"
                )
            if color[upstream] == 0:
                visit(upstream)
            path.pop()
        color[index] = 2

    for step in steps:
        if color[step.index] == 0:
            visit(step.index)


def _dims(dims, batching: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    dims = tuple(dims)
    return dims, ((-1,) + dims if batching else dims)


def _compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


@dataclass(frozen=True, slots=True)
class _Node:
    source: str
    data_type: int
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]


def validate_mapping(
    config: mc.ModelConfig, steps: tuple[EnsembleStep, ...], composing: Mapping[int, mc.ModelConfig]
) -> None:
    """Checks against the composing models' configs (``composing[step.index]``): names, types, shapes."""
    name = config.name
    batching = config.max_batch_size > 0
    tensors: dict[str, _Node] = {}
    for tensor in list(config.input) + list(config.output):
        dims = tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims
        plain, full = _dims(dims, batching)
        tensors[tensor.name] = _Node(f"ensemble '{name}'", tensor.data_type, plain, full)

    def merge(step: EnsembleStep, tensor: str, node: _Node) -> None:
        seen = tensors.get(tensor)
        if seen is None:
            tensors[tensor] = node
            return
        where = f"in ensemble '{name}', {step.label}, ensemble tensor '{tensor}': "
        if seen.data_type != node.data_type:
            raise ModelLoadError(
                where + f"inconsistent data type: {mc.DataType.Name(seen.data_type)} is inferred from "
                f"{seen.source} while {mc.DataType.Name(node.data_type)} is inferred from {node.source}"
            )
        if not _compatible(seen.dims, node.dims) and not _compatible(seen.full_dims, node.full_dims):
            raise ModelLoadError(
                where + f"inconsistent shape: {list(seen.full_dims)} is inferred from {seen.source} while "
                f"{list(node.full_dims)} is inferred from {node.source}"
            )

    for step in steps:
        model = composing[step.index]
        source = f"model '{step.model_name}'"
        if model.max_batch_size and model.max_batch_size < config.max_batch_size:
            raise ModelLoadError(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it contains "
                f"model {step.model_name} which only allows maximum batch size to be {model.max_batch_size}"
            )
        step_batching = model.max_batch_size > 0
        inputs = {tensor.name: tensor for tensor in model.input}
        mapped = dict(step.input_map)
        for model_input, tensor in step.input_map:
            spec = inputs.get(model_input)
            if spec is None:
                raise ModelLoadError(
                    f"in ensemble '{name}', {step.label}: ensemble tensor '{tensor}' is mapping to "
                    f"non-existing input '{model_input}' in model {step.model_name}"
                )
            merge(step, tensor, _Node(source, spec.data_type, *_dims(spec.dims, step_batching)))
        for spec in model.input:
            if spec.name not in mapped and not spec.optional:
                raise ModelLoadError(
                    f"in ensemble '{name}', {step.label}: input '{spec.name}' in model {step.model_name} "
                    "is not mapped to any ensemble tensors"
                )
        outputs = {tensor.name: tensor for tensor in model.output}
        for model_output, tensor in step.output_map:
            spec = outputs.get(model_output)
            if spec is None:
                raise ModelLoadError(
                    f"in ensemble '{name}', {step.label}: ensemble tensor '{tensor}' is mapped from "
                    f"non-existing output '{model_output}' in model {step.model_name}"
                )
            merge(step, tensor, _Node(source, spec.data_type, *_dims(spec.dims, step_batching)))
    decoupled = _decoupled_flow(config, steps, composing)
    # Triton's ensemble validation sets the policy from the steps (decoupled when one of them is): a
    # ``decoupled: true`` in config.pbtxt over non-decoupled steps is served, and runs, as not decoupled. With
    # the response cache enabled, Triton's cache check refuses a declared ``decoupled: true`` and a derived one
    # alike (cache.refuse_unsupported reads the value left here).
    declared = config.model_transaction_policy.decoupled
    config.model_transaction_policy.decoupled = decoupled or (declared and config.response_cache.enable)


def _decoupled_flow(
    config: mc.ModelConfig, steps: tuple[EnsembleStep, ...], composing: Mapping[int, mc.ModelConfig]
) -> bool:
    """Whether a decoupled step feeds the flow (Triton's decouple labels over the ensemble tensors): each output
    of a decoupled step starts a new label, other outputs inherit their inputs' one; a step whose inputs carry
    different labels (responses of different decoupled models, or one's responses and a tensor of the request)
    is refused, as Triton's ``ValidateEnsembleConfig`` refuses it."""
    name = config.name
    outputs = {tensor.name for tensor in config.output}
    label: dict[str, int] = {tensor.name: 0 for tensor in config.input}
    pending = list(steps)
    count = 0
    while pending:
        ready = [step for step in pending if all(tensor in label for _, tensor in step.input_map)]
        if not ready:
            break  # unreachable after validate_structure (every input is produced, no cycles)
        for step in ready:
            pending.remove(step)
            labels = {label[tensor] for _, tensor in step.input_map}
            if len(labels) > 1:
                source = name if any(t in outputs for _, t in step.output_map) else step.model_name
                raise ModelLoadError(
                    f"in ensemble {name}, step of model '{source}' receives inputs originated from different "
                    "decoupled models"
                )
            if composing[step.index].model_transaction_policy.decoupled:
                count += 1
                value = count
            else:
                value = labels.pop()
            for _, tensor in step.output_map:
                label[tensor] = value
    return count > 0
