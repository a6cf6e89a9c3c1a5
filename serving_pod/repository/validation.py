"""Checks a completed ``ModelConfig`` before any instance is created, with model-named errors.

Runs after the backend's auto-complete; what it accepts, the engine can rely on (data types known,
dims sane, batch settings coherent, version folders present). A bad ``max_batch_size`` or batcher setting is a
``PollRefused`` (Triton's ``ValidateModelConfig`` refuses it while polling the repository: ``core.load_errors``); a
version policy that leaves no version is a ``LoadFailed``, as Triton's.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.datatypes import WIRE_TO_NUMPY, config_to_wire
from serving_pod.core.errors import ModelLoadError
from serving_pod.core.load_errors import LoadFailed, PollRefused

log = logging.getLogger(__name__)

_TYPE_NAMES = mc.DataType.keys()


def validate_config(config: mc.ModelConfig) -> None:
    """Raise ModelLoadError describing the first problem found in ``config``."""
    name = config.name
    if config.max_batch_size < 0:
        raise PollRefused(
            f"model '{name}': max_batch_size must be >= 0, got {config.max_batch_size}"
        )
    is_ensemble = config.platform == "ensemble"
    if not is_ensemble and not config.output and config.backend != "python":  # Triton's python backend needs none
        raise ModelLoadError(f"model '{name}' must specify at least one output")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for tensor in tensors:
            _validate_tensor(name, kind, tensor)
            _validate_reshape(config, kind, tensor)
            if not is_ensemble and config.backend != "tensorrt":
                _validate_tensorrt_only(name, kind, tensor)
            if tensor.name in seen:
                raise ModelLoadError(f"model '{name}': duplicate {kind} name '{tensor.name}'")
            seen.add(tensor.name)
    _validate_batching(config)
    _validate_instance_groups(config)
    if "ferry_execution_mode" in config.parameters:
        mode = config.parameters["ferry_execution_mode"].string_value
        if mode not in ("auto", "thread", "inline"):
            raise ModelLoadError(
                f"model '{name}': parameter ferry_execution_mode must be auto, thread or inline, got '{mode}'"
            )


def _validate_tensor(model: str, kind: str, tensor) -> None:
    if not tensor.name:
        raise ModelLoadError(f"model '{model}': an {kind} has no name")
    type_name = mc.DataType.Name(tensor.data_type)
    if tensor.data_type == mc.TYPE_INVALID or config_to_wire(type_name) not in WIRE_TO_NUMPY:
        raise ModelLoadError(
            f"model '{model}': {kind} '{tensor.name}' has invalid data_type {type_name}; "
            f"expected one of {', '.join(t for t in _TYPE_NAMES if t != 'TYPE_INVALID')}"
        )
    if not tensor.dims:
        raise ModelLoadError(f"model '{model}': {kind} '{tensor.name}' must specify 'dims'")
    for dim in tensor.dims:
        if dim < -1 or dim == 0:
            raise ModelLoadError(
                f"model '{model}': {kind} '{tensor.name}' has invalid dims {list(tensor.dims)}: "
                "each dim must be -1 (variable) or a positive size"
            )
    image = kind == "input" and tensor.format in (mc.ModelInput.FORMAT_NHWC, mc.ModelInput.FORMAT_NCHW)
    if image and len(tensor.dims) != 3:
        raise ModelLoadError(
            f"model '{model}': input '{tensor.name}' has format {mc.ModelInput.Format.Name(tensor.format)}: "
            f"NHWC/NCHW require 3 dims, got {list(tensor.dims)}"
        )


def _validate_reshape(config: mc.ModelConfig, kind: str, tensor) -> None:
    """Triton's reshape rules: the same element count as ``dims`` (an empty reshape for a single element, in a
    batching model only), and with variable dims the same count between each pair of them."""
    if not tensor.HasField("reshape"):
        return
    dims, shape = list(tensor.dims), list(tensor.reshape.shape)
    where = f"model '{config.name}': {kind} '{tensor.name}' reshape {shape}"
    if not shape and config.max_batch_size == 0:
        raise ModelLoadError(
            f"{where}: cannot have empty reshape for non-batching model as scalar tensors are not supported"
        )
    dims_count, shape_count = _count(dims), _count(shape)
    if dims_count != shape_count and (shape_count != 0 or dims_count != 1):
        raise ModelLoadError(f"{where} has a different element count than dims {dims}")
    if dims_count == -1:
        dims_runs, shape_runs = _runs(dims), _runs(shape)
        if len(dims_runs) != len(shape_runs):
            raise ModelLoadError(f"{where} has a different number of variable-size dimensions than dims {dims}")
        if dims_runs != shape_runs:
            raise ModelLoadError(
                f"{where} has a different element count than dims {dims} between its variable-size dimensions"
            )


def _count(dims: list[int]) -> int:
    """Elements in ``dims`` as Triton counts them: -1 when any dim is variable, 0 for no dims."""
    if -1 in dims:
        return -1
    total = 1
    for dim in dims:
        total *= dim
    return total if dims else 0


def _runs(dims: list[int]) -> list[int]:
    """Element counts of the runs of fixed dims around each variable one (``[2, 4, -1, 6]`` -> ``[8, 6]``)."""
    runs, current = [], 1
    for dim in dims:
        if dim == -1:
            runs.append(current)
            current = 1
        else:
            current *= dim
    runs.append(current)
    return runs


def _validate_tensorrt_only(model: str, kind: str, tensor) -> None:
    """Tensor properties Triton allows on TensorRT models only."""
    if tensor.is_shape_tensor:
        raise ModelLoadError(
            f"model '{model}': {kind} '{tensor.name}': shape tensors are only supported for TensorRT platform"
        )
    if tensor.is_non_linear_format_io:
        raise ModelLoadError(
            f"model '{model}': {kind} '{tensor.name}': Non-linear IO format is only supported for the TensorRT "
            "platform"
        )


def _validate_batching(config: mc.ModelConfig) -> None:
    name = config.name
    if config.HasField("sequence_batching") and config.sequence_batching.HasField("oldest"):
        for size in config.sequence_batching.oldest.preferred_batch_size:
            if size <= 0 or size > config.max_batch_size:
                raise PollRefused(
                    f"model '{name}': sequence batching preferred batch size {size} must be in 1..max_batch_size "
                    f"({config.max_batch_size})"
                )
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        if config.max_batch_size == 0 and batching.preferred_batch_size:
            raise PollRefused(
                f"model '{name}': dynamic batching preferred_batch_size requires max_batch_size > 0"
            )
        for size in batching.preferred_batch_size:
            if size <= 0 or size > config.max_batch_size:
                raise PollRefused(
                    f"model '{name}': preferred batch size {size} must be in 1..max_batch_size "
                    f"({config.max_batch_size})"
                )
        if batching.preserve_ordering and batching.priority_levels > 1:
            raise PollRefused(
                f"model '{name}': only one priority level is allowed when 'preserve_ordering' is true "
                f"(priority_levels is {batching.priority_levels})"
            )
        if batching.priority_levels and not (
            0 < batching.default_priority_level <= batching.priority_levels
        ):
            raise PollRefused(
                f"model '{name}': default_priority_level {batching.default_priority_level} must be "
                f"in 1..priority_levels ({batching.priority_levels})"
            )
        for level in batching.priority_queue_policy:  # without priority levels Triton loads and ignores them
            if batching.priority_levels and not 0 < level <= batching.priority_levels:
                raise PollRefused(
                    f"model '{name}': priority_queue_policy for level {level} outside "
                    f"1..priority_levels ({batching.priority_levels})"
                )


def _validate_instance_groups(config: mc.ModelConfig) -> None:
    for group in config.instance_group:
        if group.count < 0:
            raise ModelLoadError(
                f"model '{config.name}': instance group '{group.name}' count must be >= 1, got {group.count}"
            )


def select_versions(config: mc.ModelConfig, model_dir: Path) -> list[int]:
    """Version numbers to load under the config's version policy, as Triton picks them: ``latest`` (1 by default)
    the highest ``num_versions`` folders, ``all`` every one, ``specific`` those of its versions that have a folder
    (a missing one is logged, as Triton logs it). None at all is Triton's load error."""
    available = sorted(
        int(entry.name)
        for entry in (model_dir.iterdir() if model_dir.is_dir() else [])
        if entry.is_dir() and entry.name.isdigit()
    )
    if not available and config.platform == "ensemble":
        return [1]
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    missing: list[int] = []
    if which == "all":
        chosen = available
    elif which == "specific":
        wanted = sorted(set(policy.specific.versions))
        missing = [v for v in wanted if v not in available]
        for version in missing:
            log.error("version %d is specified for model '%s', but the version directory is not present",
                      version, config.name)
        chosen = [v for v in wanted if v in available]
    else:
        count = policy.latest.num_versions if which == "latest" else 1
        chosen = available[-count:] if count > 0 else []
    if not chosen:  # Triton's words; what is missing goes to the log
        log.error("model '%s' has no version folder to load under its version policy in %s (numeric folders: %s)",
                  config.name, model_dir, available or "none")
        # a load failure, not a poll failure: an ensemble over it quotes it as a model "which has no loaded version"
        raise LoadFailed(config.name, "at least one version must be available under the version policy of model "
                                      f"'{config.name}'")
    return chosen
