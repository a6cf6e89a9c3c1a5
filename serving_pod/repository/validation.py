"""Checks a completed ``ModelConfig`` before any instance is created, with model-named errors.

Runs after the backend's auto-complete; what it accepts, the engine can rely on (data types known,
dims sane, batch settings coherent, version folders present).
"""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.datatypes import WIRE_TO_NUMPY, config_to_wire
from serving_pod.core.errors import ModelLoadError

_TYPE_NAMES = mc.DataType.keys()


def validate_config(config: mc.ModelConfig) -> None:
    """Raise ModelLoadError describing the first problem found in ``config``."""
    name = config.name
    if config.max_batch_size < 0:
        raise ModelLoadError(
            f"model '{name}': max_batch_size must be >= 0, got {config.max_batch_size}"
        )
    is_ensemble = config.platform == "ensemble"
    if not is_ensemble and not config.output:
        raise ModelLoadError(f"model '{name}' must specify at least one output")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for tensor in tensors:
            _validate_tensor(name, kind, tensor)
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
    for dim in tensor.dims:
        if dim < -1 or dim == 0:
            raise ModelLoadError(
                f"model '{model}': {kind} '{tensor.name}' has invalid dims {list(tensor.dims)}: "
                "each dim must be -1 (variable) or a positive size"
            )
    if tensor.HasField("reshape"):
        dims, shape = list(tensor.dims), list(tensor.reshape.shape)
        if -1 not in dims and -1 not in shape and _count(dims) != _count(shape):
            raise ModelLoadError(
                f"model '{model}': {kind} '{tensor.name}' reshape {shape} has a different element "
                f"count than dims {dims}"
            )


def _count(dims: list[int]) -> int:
    total = 1
    for dim in dims:
        total *= dim
    return total


def _validate_batching(config: mc.ModelConfig) -> None:
    name = config.name
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        if config.max_batch_size == 0 and batching.preferred_batch_size:
            raise ModelLoadError(
                f"model '{name}': dynamic batching preferred_batch_size requires max_batch_size > 0"
            )
        for size in batching.preferred_batch_size:
            if size <= 0 or size > config.max_batch_size:
                raise ModelLoadError(
                    f"model '{name}': preferred batch size {size} must be in 1..max_batch_size "
                    f"({config.max_batch_size})"
                )
        if batching.priority_levels and not (
            0 < batching.default_priority_level <= batching.priority_levels
        ):
            raise ModelLoadError(
                f"model '{name}': default_priority_level {batching.default_priority_level} must be "
                f"in 1..priority_levels ({batching.priority_levels})"
            )
        for level in batching.priority_queue_policy:
            if not 0 < level <= batching.priority_levels:
                raise ModelLoadError(
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
    """Version numbers to load under the config's version policy (Triton: latest 1 by default)."""
    available = sorted(
        int(entry.name)
        for entry in (model_dir.iterdir() if model_dir.is_dir() else [])
        if entry.is_dir() and entry.name.isdigit()
    )
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        chosen = available
    elif which == "specific":
        wanted = sorted(set(policy.specific.versions))
        missing = [v for v in wanted if v not in available]
        if missing:
            raise ModelLoadError(
                f"model '{config.name}': version policy names version(s) {missing} with no folder "
                f"in {model_dir}"
            )
        chosen = wanted
    else:
        count = policy.latest.num_versions if which == "latest" else 1
        chosen = available[-max(count, 1):]
    if not chosen and config.platform != "ensemble":
        raise ModelLoadError(
            f"model '{config.name}' has no numeric version folder in {model_dir}"
        )
    if not chosen:
        chosen = [1]
    return chosen
