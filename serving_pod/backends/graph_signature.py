"""Model config <-> a model's own signature: auto-complete a config from it, check a config against it.

Backend-neutral: the onnxruntime backend (graph inputs/outputs read by ``onnxruntime_session``) and
the tensorrt backend (engine I/O tensors) describe their model as ``TensorInfo`` values, call
``autocomplete`` from ``auto_complete`` and ``check_against_graph`` when an instance is created (so
configs are checked even with ``--disable-auto-complete-config``).

Rules follow Triton's onnxruntime backend: a graph "supports batching" when every input and output
has a dynamic first dim; then an unset ``max_batch_size`` becomes the backend's default (4) and
``dims`` leave out the batch dim; ``max_batch_size > 1`` with no scheduler turns on the dynamic
batcher. Sequence control inputs and implicit-state tensors are graph tensors the config does not
list as inputs/outputs, so they are neither auto-filled nor reported as missing. A -1 on either
side of a dim comparison matches anything. Errors name the model, the tensor and both values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.errors import ModelLoadError


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A model input or output as its framework reports it; ``shape`` has -1 for dynamic dims."""

    name: str
    #: Triton config type (``TYPE_FP32``), "" when the framework type has none
    config_type: str
    shape: tuple[int, ...]
    #: an input the model has a default for (ONNX overridable initializer)
    optional: bool = False
    #: the framework's own type name, for error messages
    source_type: str = ""


Infos = dict[str, TensorInfo]


def hidden_tensors(config: mc.ModelConfig) -> tuple[set[str], set[str]]:
    """Graph inputs/outputs the config does not declare: sequence controls and implicit state."""
    sequence = config.sequence_batching
    inputs = {control.name for control in sequence.control_input}
    inputs.update(state.input_name for state in sequence.state)
    return inputs, {state.output_name for state in sequence.state}


def is_complete(config: mc.ModelConfig) -> bool:
    """True when inputs and outputs are listed with data types and dims (nothing to auto-complete)."""
    if not config.input or not config.output:
        return False
    return all(
        tensor.data_type != mc.TYPE_INVALID and (tensor.dims or tensor.HasField("reshape"))
        for tensor in (*config.input, *config.output)
    )


def autocomplete(config: mc.ModelConfig, inputs: Infos, outputs: Infos, default_max_batch_size: int) -> None:
    """Fill max_batch_size, inputs and outputs (whole lists or missing fields of entries) from the graph."""
    hidden_in, hidden_out = hidden_tensors(config)
    visible_in = {name: info for name, info in inputs.items() if name not in hidden_in and not info.optional}
    visible_out = {name: info for name, info in outputs.items() if name not in hidden_out}
    if not config.input or not config.output:
        _complete_max_batch(config, [*visible_in.values(), *visible_out.values()], default_max_batch_size)
    _complete_tensors(config, "input", config.input, visible_in)
    _complete_tensors(config, "output", config.output, visible_out)


def _complete_max_batch(config: mc.ModelConfig, infos: list[TensorInfo], default: int) -> None:
    unbatched = [info for info in infos if not info.shape or info.shape[0] != -1]
    if infos and not unbatched:
        if config.max_batch_size == 0:
            config.max_batch_size = max(default, 0)
        if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    elif config.max_batch_size != 0:
        example = unbatched[0] if unbatched else None
        detail = f": tensor '{example.name}' has shape {list(example.shape)}" if example else ""
        raise ModelLoadError(
            f"autofill failed for model '{config.name}': model does not support batching while "
            f"non-zero max_batch_size {config.max_batch_size} is specified (every input and output "
            f"needs a dynamic first dimension{detail})"
        )


def _complete_tensors(config: mc.ModelConfig, kind: str, entries: Any, infos: Infos) -> None:
    if not entries:
        for info in infos.values():
            entry = entries.add(name=info.name, data_type=_data_type(config.name, kind, info))
            _fill_dims(entry, info, config.max_batch_size)
        return
    for entry in entries:
        found = infos.get(entry.name)
        if found is None:
            continue  # check_against_graph names the unknown tensor
        if entry.data_type == mc.TYPE_INVALID:
            entry.data_type = _data_type(config.name, kind, found)
        if not entry.dims and not entry.HasField("reshape"):
            _fill_dims(entry, found, config.max_batch_size)


def _data_type(model: str, kind: str, info: TensorInfo) -> int:
    if not info.config_type:
        raise ModelLoadError(
            f"unable to load model '{model}': {kind} '{info.name}' has type {info.source_type}, "
            "which has no Triton data type"
        )
    return mc.DataType.Value(info.config_type)


def _fill_dims(entry: Any, info: TensorInfo, max_batch_size: int) -> None:
    dims = info.shape[1:] if max_batch_size > 0 else info.shape
    if dims:
        entry.dims.extend(dims)
        return
    # A scalar per batch element: Triton writes dims [1] with an empty reshape.
    entry.dims.append(1)
    if max_batch_size > 0:
        entry.reshape.SetInParent()


def check_against_graph(config: mc.ModelConfig, inputs: Infos, outputs: Infos) -> None:
    """Raise ``ModelLoadError`` when the config's tensors disagree with the graph's."""
    model, max_batch = config.name, config.max_batch_size
    for tensor in config.input:
        _check_tensor(model, "input", tensor.name, tensor.data_type, _config_shape(tensor), inputs, max_batch)
    for tensor in config.output:
        _check_tensor(model, "output", tensor.name, tensor.data_type, _config_shape(tensor), outputs, max_batch)
    for state in config.sequence_batching.state:
        shape = list(state.dims)
        _check_tensor(model, "state input", state.input_name, state.data_type, shape, inputs, max_batch)
        _check_tensor(model, "state output", state.output_name, state.data_type, shape, outputs, max_batch)
    for control in config.sequence_batching.control_input:
        if control.name not in inputs:
            raise ModelLoadError(
                f"unable to load model '{model}', sequence control input '{control.name}' is not an input "
                f"of the model; model inputs are: {_names(inputs)}"
            )
    declared = {tensor.name for tensor in config.input} | hidden_tensors(config)[0]
    missing = [name for name, info in inputs.items() if name not in declared and not info.optional]
    if missing:
        raise ModelLoadError(
            f"unable to load model '{model}', configuration expects {len(declared)} inputs, model "
            f"provides {len(inputs)}: model input(s) {_names(missing)} are not in the configuration"
        )


def _config_shape(tensor: Any) -> list[int]:
    return list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)


def _check_tensor(
    model: str, kind: str, name: str, data_type: int, dims: list[int], infos: Infos, max_batch: int
) -> None:
    info = infos.get(name)
    if info is None:
        raise ModelLoadError(
            f"unable to load model '{model}', unexpected inference {kind} '{name}', allowed "
            f"{kind.split()[-1]}s are: {_names(infos)}"
        )
    type_name = mc.DataType.Name(data_type)
    if info.config_type != type_name:
        raise ModelLoadError(
            f"unable to load model '{model}', configuration expects datatype {type_name} for {kind} "
            f"'{name}', model provides {info.config_type or info.source_type}"
        )
    shape = info.shape
    if not shape:
        if any(dim != 1 for dim in dims):
            raise ModelLoadError(
                f"unable to load model '{model}', scalar {kind} '{name}' should only have dims of 1 "
                f"in the model configuration, got {dims}"
            )
        return
    if max_batch > 0:
        if shape[0] != -1:
            raise ModelLoadError(
                f"unable to load model '{model}', model configuration supports batching (max_batch_size "
                f"{max_batch}) but the first dimension of {kind} '{name}' expected by the model is not "
                f"a variable-size batch dimension: model shape {list(shape)}, configuration dims {dims}"
            )
        shape = shape[1:]
    if len(shape) != len(dims) or not all(_dim_matches(m, c) for m, c in zip(shape, dims)):
        batch = f" (plus the batch dim, max_batch_size {max_batch})" if max_batch > 0 else ""
        raise ModelLoadError(
            f"unable to load model '{model}', {kind} '{name}': the model expects shape {list(shape)}"
            f"{batch} but the model configuration specifies {dims}"
        )


def _dim_matches(model_dim: int, config_dim: int) -> bool:
    return model_dim == -1 or config_dim == -1 or model_dim == config_dim


def _names(names: Iterable[str]) -> str:
    return ", ".join(f"'{name}'" for name in names)
